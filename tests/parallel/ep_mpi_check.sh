#!/usr/bin/env bash
# Expert parallelism end to end under mpirun: `kiln train --preset llama-moe-tiny --ep 2` gives
# the single-process run's losses (printed to 4 decimals) with its routing line (aux, z, load,
# drops, the all-to-all's exposed share); its checkpoint and exported model are the
# single-process model's (one-process `kiln generate` reads both, the same greedy text), and
# `kiln serve` answers from it; a rank killed mid-run ends the job; flags that do not fit fail
# with one message before any step.
# Usage: ep_mpi_check.sh KILN MPIEXEC
set -u
kiln=$1
mpiexec=$2
dir=$(mktemp -d)
server=""
cleanup() {
  [ -n "$server" ] && kill "$server" 2> /dev/null && wait "$server" 2> /dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
# shellcheck source=tests/parallel/mpi_check_lib.sh
source "$(dirname "$0")/mpi_check_lib.sh"
small=(--preset llama-moe-tiny --batch 2 --seq 32 --data "$dir/data" --eval-batches 1 --lr 3e-3)
prepare_corpus

"$kiln" --threads 1 train "${small[@]}" --steps 12 --out "$dir/one" > "$dir/one.log" 2>&1 ||
  { cat "$dir/one.log"; fail "one-process MoE run"; }
"${mpi[@]}" -np 2 "$kiln" --threads 1 train "${small[@]}" --steps 12 --ep 2 --ep-chunks 2 --out "$dir/ep" \
  > "$dir/ep.log" 2>&1 || { cat "$dir/ep.log"; fail "ep 2 run"; }
grep -q "expert parallel: ep 2 × edp 1" "$dir/ep.log" || { cat "$dir/ep.log"; fail "no expert-parallel line"; }
grep -Eq "step +12/12 .*aux [0-9.]+ z [0-9.]+ load [0-9.]+x drop 0.0% .*a2a [0-9]+ ms, exposed" "$dir/ep.log" ||
  { cat "$dir/ep.log"; fail "no routing and all-to-all fields on the progress line"; }
losses() { grep -Eo '^step +[0-9]+/12 \| loss [0-9.]+' "$1"; }
[ "$(losses "$dir/one.log" | wc -l)" -ge 3 ] || { cat "$dir/one.log"; fail "no losses in the one-process log"; }
cmp -s <(losses "$dir/one.log") <(losses "$dir/ep.log") ||
  { diff <(losses "$dir/one.log") <(losses "$dir/ep.log"); fail "ep 2 losses differ from one process"; }
[ -f "$dir/ep/checkpoint/manifest.json" ] || fail "no checkpoint"
gen=(generate --max-tokens 12 --temperature 0 --prompt "In the")
"$kiln" "${gen[@]}" --model "$dir/ep" > "$dir/gen_ep.txt" || fail "generate cannot read the ep model"
"$kiln" "${gen[@]}" --model "$dir/ep" --checkpoint "$dir/ep/checkpoint" > "$dir/gen_ckpt.txt" ||
  fail "generate cannot read the ep checkpoint"
"$kiln" "${gen[@]}" --model "$dir/one" > "$dir/gen_one.txt" || fail "generate the one-process model"
cmp -s "$dir/gen_ep.txt" "$dir/gen_ckpt.txt" || fail "the ep checkpoint generates other text than its model"
cmp -s "$dir/gen_ep.txt" "$dir/gen_one.txt" || { diff "$dir/gen_ep.txt" "$dir/gen_one.txt"; fail "ep model text differs"; }

# kiln serve serves the MoE model (the completion is the greedy text generate gives).
start_server "$kiln" --threads 1 serve --model "$dir/ep" --port 0 --kv-cache-mem 32M
curl -s "http://127.0.0.1:$port/v1/completions" -d '{"prompt": "In the", "max_tokens": 12, "temperature": 0}' \
  > "$dir/completion.json" || fail "no completion"
grep -q '"text"' "$dir/completion.json" || { cat "$dir/completion.json"; fail "no text in the completion"; }
stop_server

kill_a_rank "$dir/killed.log" "${mpi[@]}" -np 2 "$kiln" --threads 1 train "${small[@]}" --steps 100000 --ep 2 \
  --out "$dir/killed"

check_bad "--ep 3 does not divide the 2 ranks" "${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --ep 3 --steps 2 --out "$dir/bad"
check_bad "this model has none" "${mpi[@]}" -np 2 "$kiln" train --preset llama-tiny --batch 2 --seq 32 \
  --data "$dir/data" --ep 2 --steps 2 --out "$dir/bad"
check_bad "ZeRO/FSDP over expert shards is not implemented" "${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --ep 2 \
  --zero 1 --steps 2 --out "$dir/bad"
check_bad "composes with data parallelism only" "${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --ep 2 --tp 2 \
  --steps 2 --out "$dir/bad"
echo "ok: ep 2 training equals one process, checkpoint and model read by one process, served, a dead rank, bad flags"
