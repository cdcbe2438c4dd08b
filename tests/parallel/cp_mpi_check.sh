#!/usr/bin/env bash
# Context parallelism end to end under mpirun: `kiln train --cp 2` (ring over the zig-zag layout,
# and Ulysses; with --tp 2 on 4 ranks; past the preset's context) gives the one-process run's
# losses (printed to 4 decimals), its model generates the one-process text; flags that do not fit
# fail with one message before any step.
# Usage: cp_mpi_check.sh KILN MPIEXEC
set -u
kiln=$1
mpiexec=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# shellcheck source=tests/parallel/mpi_check_lib.sh
source "$(dirname "$0")/mpi_check_lib.sh"
base=(--preset llama-tiny --batch 2 --data "$dir/data" --eval-batches 1 --lr 3e-3 --steps 12)
small=("${base[@]}" --seq 64)
prepare_corpus

"$kiln" --threads 1 train "${small[@]}" --out "$dir/one" > "$dir/one.log" 2>&1 || { cat "$dir/one.log"; fail "one-process run"; }
losses() { grep -Eo '^step +[0-9]+/12 \| loss [0-9.]+( val [0-9.]+)?' "$1"; }
[ "$(losses "$dir/one.log" | wc -l)" -ge 3 ] || { cat "$dir/one.log"; fail "no losses in the one-process log"; }
for method in ring ulysses; do
  "${mpi[@]}" -np 2 "$kiln" --threads 1 train "${small[@]}" --cp 2 --cp-method "$method" --out "$dir/$method" \
    > "$dir/$method.log" 2>&1 || { cat "$dir/$method.log"; fail "cp 2 $method run"; }
  grep -q "context parallel: dp 1 × cp 2 ($method, zigzag T 64 over 2 ranks" "$dir/$method.log" ||
    { cat "$dir/$method.log"; fail "no context-parallel line ($method)"; }
  cmp -s <(losses "$dir/one.log") <(losses "$dir/$method.log") ||
    { diff <(losses "$dir/one.log") <(losses "$dir/$method.log"); fail "cp 2 $method losses differ from one process"; }
done
# cp 2 × tp 2 on 4 ranks: the attention of each tensor shard's heads over the cp group.
"${mpi[@]}" -np 4 "$kiln" --threads 1 train "${small[@]}" --cp 2 --tp 2 --out "$dir/cptp" > "$dir/cptp.log" 2>&1 ||
  { cat "$dir/cptp.log"; fail "cp 2 × tp 2 run"; }
grep -q "context parallel: dp 1 × cp 2 × tp 2 (ring" "$dir/cptp.log" || { cat "$dir/cptp.log"; fail "no cp × tp line"; }
cmp -s <(losses "$dir/one.log") <(losses "$dir/cptp.log") ||
  { diff <(losses "$dir/one.log") <(losses "$dir/cptp.log"); fail "cp 2 × tp 2 losses differ from one process"; }
# Past the preset's context (llama-tiny: 256): RoPE positions extend to --seq-len.
long=(--preset llama-tiny --batch 1 --data "$dir/data" --eval-every 0 --lr 3e-3 --steps 3 --seq-len 512)
lossesn() { grep -Eo '^step +[0-9]+/3 \| loss [0-9.]+' "$1"; }
"$kiln" --threads 1 train "${long[@]}" --out "$dir/long1" > "$dir/long1.log" 2>&1 || { cat "$dir/long1.log"; fail "one-process --seq-len 512"; }
grep -q "context: 512 tokens" "$dir/long1.log" || { cat "$dir/long1.log"; fail "no widened-context line"; }
"${mpi[@]}" -np 2 "$kiln" --threads 1 train "${long[@]}" --cp 2 --out "$dir/long2" > "$dir/long2.log" 2>&1 ||
  { cat "$dir/long2.log"; fail "cp 2 --seq-len 512"; }
[ "$(lossesn "$dir/long1.log" | wc -l)" -ge 2 ] || { cat "$dir/long1.log"; fail "no losses at --seq-len 512"; }
cmp -s <(lossesn "$dir/long1.log") <(lossesn "$dir/long2.log") ||
  { diff <(lossesn "$dir/long1.log") <(lossesn "$dir/long2.log"); fail "cp 2 losses at --seq-len 512 differ"; }
gen=(generate --max-tokens 12 --temperature 0 --prompt "In the")
"$kiln" "${gen[@]}" --model "$dir/one" > "$dir/gen_one.txt" || fail "generate the one-process model"
"$kiln" "${gen[@]}" --model "$dir/ring" > "$dir/gen_cp.txt" || fail "generate the cp model"
cmp -s "$dir/gen_one.txt" "$dir/gen_cp.txt" || { diff "$dir/gen_one.txt" "$dir/gen_cp.txt"; fail "the cp model's text differs"; }
"$kiln" "${gen[@]}" --model "$dir/cptp" > "$dir/gen_cptp.txt" || fail "generate the cp × tp model (its shards gathered)"
cmp -s "$dir/gen_one.txt" "$dir/gen_cptp.txt" ||
  { diff "$dir/gen_one.txt" "$dir/gen_cptp.txt"; fail "the cp × tp model's text differs"; }

check_bad "--cp 3 does not divide the 2 ranks" "${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --cp 3 --out "$dir/bad"
check_bad "must be a multiple of 4" "${mpi[@]}" -np 2 "$kiln" train "${base[@]}" --cp 2 --seq 66 --out "$dir/bad"
check_bad "composes with data and tensor parallelism only" "${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --cp 2 --pp 2 --out "$dir/bad"
check_bad "dp × cp × tp must be the world" "${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --cp 2 --tp 2 --out "$dir/bad"
check_bad "fewer than one --seq 512 window" "$kiln" train --preset llama-tiny --data "$dir/data" --seq-len 512 --out "$dir/bad"
check_bad "ring, ulysses or hybrid" "${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --cp 2 --cp-method star --out "$dir/bad"
echo "ok: cp 2 ring and Ulysses, cp 2 × tp 2 and cp 2 at --seq-len 512 train as one process does, the model generates its text, bad flags"
