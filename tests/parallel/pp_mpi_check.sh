#!/usr/bin/env bash
# Pipeline parallelism end to end under mpirun: `kiln train --pp 2 --micro-batches 4 --schedule
# 1f1b --timeline` trains with the per-rank progress line, reports the measured bubble beside
# the ideal and the formula and each stage's peak activations beside the bound, draws the
# timeline, and saves a checkpoint and a model that one-process `kiln generate` reads (the same
# greedy text from both); zb-h1 and gpipe train too; a killed stage ends the job with a message;
# flags that do not fit fail with one message before any step.
# Usage: pp_mpi_check.sh KILN MPIEXEC
set -u
kiln=$1
mpiexec=$2
dir=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT
# shellcheck source=tests/parallel/mpi_check_lib.sh
source "$(dirname "$0")/mpi_check_lib.sh"
small=(--preset llama-tiny --batch 4 --seq 32 --data "$dir/data" --eval-batches 1)
prepare_corpus

"${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --pp 2 --micro-batches 4 --schedule 1f1b --steps 12 --lr 3e-3 \
  --timeline "$dir/pp.svg" --out "$dir/pp" > "$dir/pp.log" 2>&1 || { cat "$dir/pp.log"; fail "pp 2 run"; }
grep -q "pipeline parallel: pp 2 (1f1b, 4 micro-batches" "$dir/pp.log" || { cat "$dir/pp.log"; fail "no pipeline line"; }
grep -Eq "step +12/12 .*MiB/rank .*exposed" "$dir/pp.log" || { cat "$dir/pp.log"; fail "no per-rank progress line"; }
grep -Eq "bubble measured [0-9.]+% \| at these stages. costs [0-9.]+% .* \| ideal [0-9.]+% .* formula 20.0%" "$dir/pp.log" ||
  { cat "$dir/pp.log"; fail "no bubble line (1F1B at P 2, M 4: formula 1/5)"; }
grep -q "stage 0 blocks \[0, .*peak 2 micro-batches' activations (bound 2)" "$dir/pp.log" || { cat "$dir/pp.log"; fail "stage 0's peak"; }
grep -q "stage 1 blocks .*peak 1 micro-batches' activations (bound 1)" "$dir/pp.log" || { cat "$dir/pp.log"; fail "stage 1's peak"; }
grep -q "<svg" "$dir/pp.svg" && grep -q "measured" "$dir/pp.svg" && grep -q "ideal" "$dir/pp.svg" || fail "no timeline"
[ -f "$dir/pp/checkpoint/manifest.json" ] || fail "no checkpoint"
gen=(generate --model "$dir/pp" --max-tokens 12 --temperature 0 --prompt "In the")
"$kiln" "${gen[@]}" > "$dir/gen_model.txt" || fail "generate cannot read the model"
"$kiln" "${gen[@]}" --checkpoint "$dir/pp/checkpoint" > "$dir/gen_ckpt.txt" || fail "generate cannot read the checkpoint"
cmp -s "$dir/gen_model.txt" "$dir/gen_ckpt.txt" || fail "the pp checkpoint generates other text than the exported model"

for s in gpipe zb-h1; do
  "${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --pp 2 --micro-batches 4 --schedule $s --steps 3 --out "$dir/$s" \
    > "$dir/$s.log" 2>&1 || { cat "$dir/$s.log"; fail "pp 2 $s run"; }
  grep -Eq "step +3/3 " "$dir/$s.log" || { cat "$dir/$s.log"; fail "$s did not train"; }
done
grep -q "peak 4 micro-batches' activations (bound 4)" "$dir/gpipe.log" || { cat "$dir/gpipe.log"; fail "gpipe holds all M"; }

# A killed stage: its neighbour's receive ends the job within KILN_COMM_TIMEOUT, with a message.
KILN_COMM_TIMEOUT=5 kill_a_rank "$dir/dead.log" "${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --pp 2 \
  --micro-batches 4 --steps 100000 --out "$dir/dead"
grep -Eq "exited on signal 9|a neighbouring stage's rank is gone" "$dir/dead.log" || { cat "$dir/dead.log"; fail "no message naming the dead rank"; }

check_bad "sums to 2 blocks, but the model has" "${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --pp 2 --pp-layers 1,1 --steps 2 --out "$dir/bad"
check_bad "does not divide the 2 ranks" "${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --pp 3 --steps 2 --out "$dir/bad"
check_bad "--micro-batches 3" "${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --pp 2 --micro-batches 3 --steps 2 --out "$dir/bad"
check_bad "--schedule" "${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --pp 2 --schedule fifo --steps 2 --out "$dir/bad"
check_bad "--timeline draws a pipeline" "$kiln" train "${small[@]}" --timeline "$dir/x.svg" --steps 2 --out "$dir/bad"
echo "ok: pp 2 1f1b training with its bubble, peaks and timeline, checkpoint read by one process, gpipe and zb-h1, a dead stage, bad flags"
