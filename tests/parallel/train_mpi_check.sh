#!/usr/bin/env bash
# `kiln train` under mpirun, end to end: ZeRO-3 on 2 ranks trains with the per-rank progress
# line and writes a sharded checkpoint and a model, which `kiln generate` both read (the same
# greedy text); one process resumes from the shards; flags that do not fit fail with one
# message before any step; a rank killed mid-run ends the job within 30 s with mpirun's
# message naming it, never a hang.
# Usage: train_mpi_check.sh KILN MPIEXEC
set -u
kiln=$1
mpiexec=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# shellcheck source=tests/parallel/mpi_check_lib.sh
source "$(dirname "$0")/mpi_check_lib.sh"
small=(--preset llama-tiny --batch 2 --seq 32 --data "$dir/data" --eval-batches 1)
prepare_corpus

"${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --zero 3 --steps 10 --out "$dir/z3" > "$dir/z3.log" 2>&1 || { cat "$dir/z3.log"; fail "zero 3 run"; }
grep -q "data parallel: fsdp dp 2" "$dir/z3.log" || fail "no data-parallel line"
grep -Eq "step +10/10 .*MiB/rank .*exposed" "$dir/z3.log" || { cat "$dir/z3.log"; fail "no per-rank progress line"; }
[ "$(grep -c '^step ' "$dir/z3.log")" -eq 2 ] || fail "progress printed by more than one rank"
[ -f "$dir/z3/checkpoint/manifest.json" ] && [ -f "$dir/z3/checkpoint/shard-00001-of-00002.bin" ] || fail "no sharded checkpoint"
"$kiln" generate --model "$dir/z3" --prompt "In the" --max-tokens 6 --temperature 0 > "$dir/gen_model.txt" || fail "generate cannot read the model"
"$kiln" generate --model "$dir/z3" --checkpoint "$dir/z3/checkpoint" --prompt "In the" --max-tokens 6 --temperature 0 \
  > "$dir/gen_ckpt.txt" || fail "generate cannot read the sharded checkpoint"
cmp -s "$dir/gen_model.txt" "$dir/gen_ckpt.txt" || fail "the sharded checkpoint generates other text than the exported model"
"$kiln" train "${small[@]}" --steps 12 --out "$dir/z3" --resume > "$dir/resume.log" 2>&1 || { cat "$dir/resume.log"; fail "one-process resume"; }
grep -q "resumed from $dir/z3/checkpoint at step 10" "$dir/resume.log" || fail "did not resume from the shards"

# Bad flags: one message (rank 0's), non-zero exit, no step.
"${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --hsdp 3 --steps 2 --out "$dir/bad" > "$dir/bad.log" 2>&1 && fail "--hsdp 3 at 2 ranks was accepted"
[ "$(grep -c 'kiln train: --hsdp 3 does not divide --dp 2' "$dir/bad.log")" -eq 1 ] || { cat "$dir/bad.log"; fail "not one clear message"; }
grep -q '^step ' "$dir/bad.log" && fail "a step ran with bad flags"

# A rank dies mid-run.
kill_a_rank "$dir/dead.log" "${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --steps 100000 --out "$dir/dead"
grep -Eq "process rank [0-9]+ .*exited on signal 9" "$dir/dead.log" || { cat "$dir/dead.log"; fail "no message naming the dead rank"; }
echo "ok: zero 3 run, sharded resume, bad flags, dead rank ($killed_after s)"
