#!/usr/bin/env bash
# Disaggregated serving end to end under mpirun: `kiln serve --disaggregate 1:1` answers as one
# process does (greedy text, /metrics with the transfers); a prefill rank that stops answering
# (SIGSTOP) fails the request it holds with an error naming it within --disagg-timeout, later
# requests are prefilled on the decode rank, and SIGTERM then ends the job with a message; a
# prefill rank killed mid-request does the same under mpirun --enable-recovery, and without it
# ends the job (the client sees the connection close, not a hang); bad --disaggregate specs
# fail with one message.
# Usage: disagg_mpi_check.sh KILN MPIEXEC
set -u
kiln=$1
mpiexec=$2
dir=$(mktemp -d)
server=""
cleanup() {
  [ -n "$server" ] && kill -CONT $(pgrep -P "$server") 2> /dev/null
  [ -n "$server" ] && kill "$server" 2> /dev/null && wait "$server" 2> /dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
# shellcheck source=tests/parallel/mpi_check_lib.sh
source "$(dirname "$0")/mpi_check_lib.sh"
prepare_corpus
"$kiln" --threads 1 train --preset llama-tiny --batch 2 --seq 64 --steps 3 --data "$dir/data" --eval-every 0 \
  --out "$dir/model" > "$dir/train.log" 2>&1 || { cat "$dir/train.log"; fail "train the model"; }
prompts=("In the beginning" "And the earth was without form" "God")
serve=(--threads 1 serve --model "$dir/model" --port 0 --kv-cache-mem 32M)

# The decode rank answers the first prompt with the one-process text (a prefix of it).
same_text_as_one_process() {  # $1: what happened before, for the message
  serve_text "$port" "${prompts[0]}" > "$dir/after.txt"
  [ "$(cat "$dir/after.txt")" = "$(head -c "$(wc -c < "$dir/after.txt")" "$dir/one.txt")" ] ||
    { cat "$dir/after.txt"; fail "after $1 the text differs"; }
}
# SIGTERM to rank 0 with a prefill rank given up on: the job ends within 30 s with a message
# (MPI_Abort: mpirun exits non-zero, but with --enable-recovery, which reports 0).
sigterm_ends_the_job() {  # $1: the prefill rank's state, for the messages; $2: "nonzero" to check the exit
  local target rc=0
  target=$(rank_pid "$server" 0)
  kill -TERM "$target"
  for _ in $(seq 1 300); do kill -0 "$server" 2> /dev/null || break; sleep 0.1; done
  kill -0 "$server" 2> /dev/null && fail "the job still runs 30 s after SIGTERM with a $1 prefill rank"
  wait "$server" || rc=$?
  server=""
  [ "${2:-}" = nonzero ] && [ "$rc" -eq 0 ] && fail "the job exited 0 with a $1 prefill rank"
  grep -q "a prefill rank stopped answering; ending the job" "$dir/serve.log" || { cat "$dir/serve.log"; fail "no message on ending the job"; }
}
# A request held by the prefill rank (stopped first, so it surely holds it) when the rank is
# killed; the client's reply in $dir/killed.txt; fails if the client waits more than 30 s.
kill_prefill_mid_request() {
  local prefill client start
  prefill=$(rank_pid "$server" 1)
  [ -n "$prefill" ] || fail "no rank 1 process"
  kill -STOP "$prefill"
  curl -s --max-time 60 "http://127.0.0.1:$port/v1/completions" -d '{"prompt": "In the beginning", "max_tokens": 64}' \
    > "$dir/killed.txt" 2>&1 &
  client=$!
  sleep 1
  kill -9 "$prefill"
  start=$(date +%s)
  wait "$client"
  [ $(( $(date +%s) - start )) -le 30 ] || fail "the client waited more than 30 s after the prefill rank died"
}

start_server "$kiln" "${serve[@]}"
for p in "${prompts[@]}"; do serve_text "$port" "$p" >> "$dir/one.txt"; done
stop_server
start_server "${mpi[@]}" -np 2 "$kiln" "${serve[@]}" --disaggregate 1:1 --disagg-timeout 2
grep -q "disaggregated: 1 prefill rank" "$dir/serve.log" || { cat "$dir/serve.log"; fail "no disaggregated line"; }
for p in "${prompts[@]}"; do serve_text "$port" "$p" >> "$dir/two.txt"; done
[ -s "$dir/one.txt" ] || fail "no completions from the one-process server"
cmp -s "$dir/one.txt" "$dir/two.txt" || { diff "$dir/one.txt" "$dir/two.txt"; fail "--disaggregate 1:1 differs from one process"; }
curl -s "http://127.0.0.1:$port/metrics" | grep -Eq "^kiln_disagg_prefills_total [1-9]" ||
  { curl -s "http://127.0.0.1:$port/metrics" | grep disagg; fail "no prefills handed over in /metrics"; }

# The prefill rank stops answering: its request fails with an error naming it, then the decode
# rank prefills by itself and answers as before.
prefill=$(rank_pid "$server" 1)
[ -n "$prefill" ] || fail "no rank 1 process"
kill -STOP "$prefill"
start=$(date +%s)
reply=$(curl -s --max-time 30 "http://127.0.0.1:$port/v1/completions" -d '{"prompt": "In the beginning", "max_tokens": 12, "temperature": 0}')
echo "$reply" | grep -q "prefill rank 1 sent nothing for 2 s" || { echo "$reply"; fail "no error naming the silent prefill rank"; }
[ $(( $(date +%s) - start )) -le 15 ] || fail "the failed request took more than 15 s"
same_text_as_one_process "giving up on the prefill rank"
curl -s "http://127.0.0.1:$port/metrics" | grep -q "^kiln_disagg_prefill_workers_alive 0" || fail "the silent rank is not given up on"
kill -CONT "$prefill"
sigterm_ends_the_job "given-up" nonzero

# A prefill rank killed outright under mpirun --enable-recovery: the request it holds fails with
# an error naming it, the server goes on (prefilling on the decode rank) with the same text.
start_server "${mpi[@]}" --enable-recovery -np 2 "$kiln" "${serve[@]}" --disaggregate 1:1 --disagg-timeout 2
grep -q "a prefill rank that dies fails the requests it holds; the others go on" "$dir/serve.log" ||
  { cat "$dir/serve.log"; fail "no line saying a dead prefill rank is survived"; }
kill_prefill_mid_request
grep -q "prefill rank 1 sent nothing for 2 s" "$dir/killed.txt" || { cat "$dir/killed.txt"; fail "no error naming the dead prefill rank"; }
kill -0 "$server" 2> /dev/null || { cat "$dir/serve.log"; fail "the job ended with a dead prefill rank under --enable-recovery"; }
same_text_as_one_process "a prefill rank died"
sigterm_ends_the_job "dead"

# Without it: the job ends (OpenMPI 4 has no ULFM), said at startup; the client does not hang.
start_server "${mpi[@]}" -np 2 "$kiln" "${serve[@]}" --disaggregate 1:1
grep -q "a prefill rank that dies ends the job (mpirun --enable-recovery" "$dir/serve.log" ||
  { cat "$dir/serve.log"; fail "no line saying a dead prefill rank ends the job"; }
kill_prefill_mid_request
for _ in $(seq 1 300); do kill -0 "$server" 2> /dev/null || break; sleep 0.1; done
kill -0 "$server" 2> /dev/null && fail "the job still runs 30 s after a prefill rank died"
wait "$server" && fail "the job exited 0 after a prefill rank died"
server=""

check_bad "needs 3 ranks" "${mpi[@]}" -np 2 "$kiln" "${serve[@]}" --disaggregate 2:1
check_bad "one decode rank" "${mpi[@]}" -np 3 "$kiln" "${serve[@]}" --disaggregate 1:2
check_bad "must be P:D" "${mpi[@]}" -np 2 "$kiln" "${serve[@]}" --disaggregate 1-1
check_bad "without --tp" "${mpi[@]}" -np 2 "$kiln" "${serve[@]}" --disaggregate 1:1 --tp 2
echo "ok: --disaggregate 1:1 serves as one process, a silent or (--enable-recovery) dead prefill rank fails its request and is given up on, a dead one ends the job otherwise, bad specs"
