#!/usr/bin/env bash
# `kiln train --offload-optimizer DIR` end to end: the AdamW moments in a file give the losses
# and the saved weights of the run that keeps them in memory, bitwise (one process, and ZeRO-1
# on 2 ranks under mpirun, whose sharded checkpoint one offloaded process resumes from); the
# progress line shows the traffic; a directory that does not exist, and the combination with
# graph capture, are one clear error before any step (on every rank alike).
# Usage: offload_cli_check.sh KILN MPIEXEC
set -u
kiln=$1
mpiexec=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# shellcheck source=tests/parallel/mpi_check_lib.sh
source "$(dirname "$0")/../parallel/mpi_check_lib.sh"
small=(--preset llama-tiny --batch 2 --seq 32 --data "$dir/data" --eval-every 0)
prepare_corpus
mkdir -p "$dir/moments"
losses() { grep -o '^step .*| loss [0-9.]*' "$1" | sed 's/ *|.*loss / /'; }

"$kiln" train "${small[@]}" --steps 10 --out "$dir/mem" > "$dir/mem.log" 2>&1 || { cat "$dir/mem.log"; fail "in-memory run"; }
"$kiln" train "${small[@]}" --steps 10 --out "$dir/off" --offload-optimizer "$dir/moments" > "$dir/off.log" 2>&1 ||
  { cat "$dir/off.log"; fail "offloaded run"; }
grep -q "optimizer state offloaded: AdamW m and v" "$dir/off.log" || { cat "$dir/off.log"; fail "no offload line"; }
grep -Eq "step +10/10 .*\| offload [0-9]+ MiB, [0-9.]+ GB/s, exposed [0-9]+ ms" "$dir/off.log" ||
  { cat "$dir/off.log"; fail "no offload traffic in the progress line"; }
[ -n "$(losses "$dir/mem.log")" ] || fail "no losses found"
[ "$(losses "$dir/mem.log")" = "$(losses "$dir/off.log")" ] || { diff <(losses "$dir/mem.log") <(losses "$dir/off.log"); fail "offloaded losses differ"; }
cmp -s "$dir/mem/model.safetensors" "$dir/off/model.safetensors" || fail "offloaded weights differ"
[ -z "$(ls -A "$dir/moments")" ] || fail "the moments' file was left behind"

# ZeRO-1 on 2 ranks: each rank streams its shard of the moments; a sharded checkpoint resumes
# in one offloaded process.
"${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --steps 10 --zero 1 --out "$dir/z1" > "$dir/z1.log" 2>&1 || { cat "$dir/z1.log"; fail "zero 1"; }
"${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --steps 10 --zero 1 --out "$dir/z1off" --offload-optimizer "$dir/moments" \
  > "$dir/z1off.log" 2>&1 || { cat "$dir/z1off.log"; fail "zero 1 offloaded"; }
[ "$(losses "$dir/z1.log")" = "$(losses "$dir/z1off.log")" ] || { diff <(losses "$dir/z1.log") <(losses "$dir/z1off.log"); fail "zero 1 offloaded losses differ"; }
cmp -s "$dir/z1/model.safetensors" "$dir/z1off/model.safetensors" || fail "zero 1 offloaded weights differ"
"$kiln" train "${small[@]}" --steps 12 --out "$dir/z1off" --resume --offload-optimizer "$dir/moments" \
  > "$dir/resume.log" 2>&1 || { cat "$dir/resume.log"; fail "offloaded resume from the shards"; }
grep -q "resumed from $dir/z1off/checkpoint at step 10" "$dir/resume.log" || { cat "$dir/resume.log"; fail "did not resume"; }

check_bad "--offload-optimizer $dir/none: not an existing directory" \
  "$kiln" train "${small[@]}" --steps 2 --out "$dir/bad" --offload-optimizer "$dir/none"
check_bad "--offload-optimizer $dir/none: not an existing directory" \
  "${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --steps 2 --out "$dir/bad" --offload-optimizer "$dir/none"
check_bad "--offload-optimizer does not combine with --graph capture" \
  "$kiln" train "${small[@]}" --steps 2 --out "$dir/bad" --offload-optimizer "$dir/moments" --graph capture
echo "ok: offloaded losses and weights bitwise those in memory (1 process, zero 1 on 2 ranks), resume, bad flags"
