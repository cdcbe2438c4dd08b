#!/usr/bin/env bash
# Tensor parallelism end to end under mpirun: `kiln train --tp 2 --sp` trains with the per-rank
# progress line and saves a checkpoint (the single-process model's layout) and a model, which
# one-process `kiln generate` both read (the same greedy text); `kiln generate --tp 2` and
# `kiln serve --tp 2` give the greedy text of one process on several prompts; flags that do not
# fit fail with one message before any step or request.
# Usage: tp_mpi_check.sh KILN MPIEXEC
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
small=(--preset llama-tiny --batch 2 --data "$dir/data" --eval-batches 1)
prepare_corpus

"${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --seq 32 --tp 2 --sp --steps 12 --lr 3e-3 --out "$dir/tp" > "$dir/tp.log" 2>&1 ||
  { cat "$dir/tp.log"; fail "tp 2 + sp run"; }
grep -q "tensor parallel: ddp dp 1 × tp 2 + sequence parallel" "$dir/tp.log" || { cat "$dir/tp.log"; fail "no tensor-parallel line"; }
grep -Eq "step +12/12 .*MiB/rank .*exposed" "$dir/tp.log" || { cat "$dir/tp.log"; fail "no per-rank progress line"; }
[ -f "$dir/tp/checkpoint/manifest.json" ] || fail "no checkpoint"
gen=(generate --model "$dir/tp" --max-tokens 12 --temperature 0)
"$kiln" "${gen[@]}" --prompt "In the" > "$dir/gen_model.txt" || fail "generate cannot read the model"
"$kiln" "${gen[@]}" --prompt "In the" --checkpoint "$dir/tp/checkpoint" > "$dir/gen_ckpt.txt" || fail "generate cannot read the checkpoint"
cmp -s "$dir/gen_model.txt" "$dir/gen_ckpt.txt" || fail "the tp checkpoint generates other text than the exported model"

# Greedy decoding at tp 2 equals tp 1, prompt by prompt.
prompts=("In the" "And the earth" "God created the heaven" "void. And")
for p in "${prompts[@]}"; do
  "$kiln" "${gen[@]}" --prompt "$p" > "$dir/one.txt" || fail "generate '$p'"
  "${mpi[@]}" -np 2 "$kiln" "${gen[@]}" --tp 2 --prompt "$p" > "$dir/two.txt" 2>&1 || { cat "$dir/two.txt"; fail "generate --tp 2 '$p'"; }
  cmp -s "$dir/one.txt" "$dir/two.txt" || { diff "$dir/one.txt" "$dir/two.txt"; fail "greedy text at tp 2 differs for '$p'"; }
done

# A kiln-quantized model (int4, groups of 64: whole groups on each rank's columns) decodes the
# same greedy text at tp 2: its codes and scales are sliced, not requantized.
"$kiln" quantize --model "$dir/tp" --out "$dir/q4" --bits 4 --group 64 > /dev/null || fail "quantize"
"$kiln" generate --model "$dir/q4" --max-tokens 12 --temperature 0 --prompt "In the" > "$dir/one.txt" || fail "generate q4"
"${mpi[@]}" -np 2 "$kiln" generate --model "$dir/q4" --max-tokens 12 --temperature 0 --prompt "In the" --tp 2 \
  > "$dir/two.txt" 2>&1 || { cat "$dir/two.txt"; fail "generate --tp 2 of the quantized model"; }
cmp -s "$dir/one.txt" "$dir/two.txt" || { diff "$dir/one.txt" "$dir/two.txt"; fail "the quantized model at tp 2 differs"; }

# kiln serve --tp 2 answers as one process does.
start_server "$kiln" --threads 1 serve --model "$dir/tp" --port 0 --kv-cache-mem 32M
for p in "${prompts[@]}"; do serve_text "$port" "$p" >> "$dir/serve_one.txt"; done
stop_server
start_server "${mpi[@]}" -np 2 "$kiln" --threads 1 serve --tp 2 --model "$dir/tp" --port 0 --kv-cache-mem 32M
for p in "${prompts[@]}"; do serve_text "$port" "$p" >> "$dir/serve_two.txt"; done
curl -s "http://127.0.0.1:$port/metrics" | grep -q "kiln_" || fail "no /metrics at tp 2"
stop_server
# Speculative decoding at tp 2: the draft (here a copy of the model) runs whole on rank 0, the
# sharded target verifies; greedy text is the plain greedy text.
start_server "${mpi[@]}" -np 2 "$kiln" --threads 1 serve --tp 2 --model "$dir/tp" --draft-model "$dir/tp" --port 0 \
  --kv-cache-mem 32M
for p in "${prompts[@]}"; do serve_text "$port" "$p" >> "$dir/serve_spec.txt"; done
curl -s "http://127.0.0.1:$port/metrics" | grep -Eq "^kiln_spec[a-z_]*accepted[a-z_]* [1-9]" ||
  { curl -s "http://127.0.0.1:$port/metrics" | grep spec; fail "no accepted draft tokens at tp 2"; }
stop_server
cmp -s "$dir/serve_one.txt" "$dir/serve_spec.txt" || { diff "$dir/serve_one.txt" "$dir/serve_spec.txt"; fail "speculative serve --tp 2 differs"; }
[ -s "$dir/serve_one.txt" ] || fail "no completions from the one-process server"
cmp -s "$dir/serve_one.txt" "$dir/serve_two.txt" || { diff "$dir/serve_one.txt" "$dir/serve_two.txt"; fail "serve --tp 2 differs"; }
grep -q "stopped" "$dir/serve.log" || fail "serve --tp 2 did not drain and stop"

# A follower rank dies while rank 0 serves: the job ends within 30 s with mpirun's message.
start_server "${mpi[@]}" -np 2 "$kiln" --threads 1 serve --tp 2 --model "$dir/tp" --port 0 --kv-cache-mem 32M
victim=""
for pid in $(pgrep -P "$server"); do
  tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && victim=$pid
done
[ -n "$victim" ] || fail "no rank 1 process found"
kill -9 "$victim"
start=$(date +%s)
while kill -0 "$server" 2> /dev/null; do
  [ $(( $(date +%s) - start )) -le 30 ] || { kill -9 "$server"; fail "serve --tp 2 still runs 30 s after a rank died"; }
  sleep 0.2
done
wait "$server" && fail "serve --tp 2 exited 0 after a rank died"
server=""
grep -Eq "process rank 1 .*exited on signal 9|exited on signal 9" "$dir/serve.log" || { cat "$dir/serve.log"; fail "no message naming the dead rank"; }

# Bad flags: one message (rank 0's), non-zero exit, no step.
check_bad "--tp 3 does not divide the 2 ranks" "${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --seq 32 --tp 3 --steps 2 --out "$dir/bad"
check_bad "--sp splits the sequence over the --tp ranks" "${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --seq 32 --sp --steps 2 --out "$dir/bad"
check_bad "--seq 31 must be a multiple" "${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --tp 2 --sp --seq 31 --steps 2 --out "$dir/bad"
"$kiln" quantize --model "$dir/tp" --out "$dir/q4g128" --bits 4 --group 128 > /dev/null || fail "quantize g128"
check_bad "groups do not split into 192 of its 384 input columns" "${mpi[@]}" -np 2 "$kiln" generate --tp 2 \
  --model "$dir/q4g128" --prompt "In the" --max-tokens 2
check_bad "--tp 3 must be the number of ranks" "${mpi[@]}" -np 2 "$kiln" serve --tp 3 --model "$dir/tp" --port 0
echo "ok: tp 2 + sp training, checkpoint read by one process, greedy generate, serve and speculative serve at tp 2 equal tp 1, a dead serving rank, bad flags"
