# What the end-to-end mpirun checks of tests/parallel share (sourced after `kiln`, `mpiexec`
# and `dir` are set): the mpirun command, a small corpus, the failure exit, one clear message
# for bad flags, and a rank killed mid-run.
mpi=("$mpiexec" --oversubscribe --allow-run-as-root --mca btl self,vader)
fail() { echo "FAIL: $*"; exit 1; }

# A small corpus in $dir/data, prepared once by one process (every rank reads it).
prepare_corpus() {
  yes "In the beginning God created the heaven and the earth. And the earth was without form, and void." |
    head -c 100000 > "$dir/text.txt"
  "$kiln" data prepare --text "$dir/text.txt" --out "$dir/data" --vocab-size 512 > /dev/null || fail "data prepare"
}

# check_bad MESSAGE COMMAND...: the command fails, prints MESSAGE exactly once and runs no step.
check_bad() {
  local want=$1
  shift
  "$@" > "$dir/bad.log" 2>&1 && fail "accepted: $*"
  [ "$(grep -c -- "$want" "$dir/bad.log")" -eq 1 ] || { cat "$dir/bad.log"; fail "not one clear message for: $*"; }
  grep -q '^step ' "$dir/bad.log" && fail "a step ran with bad flags: $*"
}

# kill_a_rank LOG COMMAND...: starts the job, kills its last rank once LOG shows a step, and
# fails unless the job ends within 30 s, with a non-zero exit. Sets `killed_after` to the seconds
# it took.
kill_a_rank() {
  local log=$1
  shift
  : > "$log"  # emptied here: the background job's own redirect may come after the first poll
  "$@" > "$log" 2>&1 &
  local job=$!
  for _ in $(seq 1 600); do grep -q '^step ' "$log" && break; sleep 0.1; done
  local victim
  victim=$(pgrep -P "$job" | sort -n | tail -1)
  [ -n "$victim" ] || fail "no rank process found"
  kill -9 "$victim"
  local start
  start=$(date +%s)
  while kill -0 "$job" 2> /dev/null; do
    [ $(( $(date +%s) - start )) -le 30 ] || { kill -9 "$job"; fail "the job still runs 30 s after a rank died"; }
    sleep 0.2
  done
  killed_after=$(( $(date +%s) - start ))
  wait "$job" && fail "the job exited 0 after a rank died"
  return 0
}

# A server in the background (the caller's cleanup kills $server): its completions' text, start
# (sets server and port, from the "listening on" line of $dir/serve.log) and stop.
serve_text() {  # $1: port, $2: prompt -> the completion's text
  curl -s "http://127.0.0.1:$1/v1/completions" -d "{\"prompt\": \"$2\", \"max_tokens\": 12, \"temperature\": 0}" |
    sed -E 's/.*"text":"([^"]*)".*/\1/'
}
start_server() {  # $@: the command; sets server and port
  # Emptied before the job starts: its own redirect truncates the file only once the child runs,
  # and a poll before that would read the previous server's port (and a later grep an empty log).
  : > "$dir/serve.log"
  "$@" > "$dir/serve.log" 2>&1 &
  server=$!
  port=""
  for _ in $(seq 1 300); do
    port=$(sed -nE 's/.*listening on http:\/\/[^:]+:([0-9]+).*/\1/p' "$dir/serve.log")
    [ -n "$port" ] && return 0
    kill -0 "$server" 2> /dev/null || break
    sleep 0.1
  done
  cat "$dir/serve.log"
  fail "the server did not start"
}
rank_pid() {  # $1: mpirun's pid, $2: a rank -> that rank's process id (empty when none)
  local pid
  for pid in $(pgrep -P "$1"); do
    tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && echo "$pid"
  done
}
stop_server() {  # SIGTERM to the serving process (under mpirun: rank 0, which stops the others)
  local target
  target=$(rank_pid "$server" 0)
  kill -TERM "${target:-$server}"
  wait "$server" || { cat "$dir/serve.log"; fail "the server did not stop cleanly"; }
  server=""
}
