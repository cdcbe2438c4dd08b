#!/usr/bin/env bash
# The profiler under mpirun (issue 22's done-when): `kiln train --dp 2 --profile` writes one
# Chrome trace holding both ranks (pids 0 and 1, each named, with their threads), prints the
# ping-pong clock offsets and their error, and records the gradient all-reduce with its peers;
# `kiln roofline --profile` reads it back and prints the summary (MFU/HFU, exposed communication
# and step times of both ranks) and writes the roofline SVG; `kiln profile` does both in one
# command; `kiln profile` without a command fails with one message.
# Usage: profile_mpi_check.sh KILN MPIEXEC
set -u
kiln=$1
mpiexec=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# shellcheck source=tests/parallel/mpi_check_lib.sh
source "$(dirname "$0")/mpi_check_lib.sh"
small=(--preset llama-tiny --batch 4 --seq 32 --data "$dir/data" --eval-every 0)
prepare_corpus

"${mpi[@]}" -np 2 "$kiln" train "${small[@]}" --dp 2 --steps 3 --out "$dir/dp" --profile "$dir/dp2.json" \
  > "$dir/train.log" 2>&1 || { cat "$dir/train.log"; fail "train --dp 2 --profile"; }
[ "$(grep -c '^profile: ' "$dir/train.log")" -eq 1 ] || { cat "$dir/train.log"; fail "not one profile line (rank 0's)"; }
grep -Eq "clock offsets to rank 0 \(ping-pong, fastest round\): rank 1 [-+][0-9.]+ us \(± [0-9.]+ us\)" "$dir/train.log" ||
  { cat "$dir/train.log"; fail "no clock offset of rank 1"; }
t="$dir/dp2.json"
grep -q '"displayTimeUnit":"ns"' "$t" || fail "no displayTimeUnit"
for r in 0 1; do
  grep -q "\"name\":\"process_name\",\"pid\":$r,\"tid\":0,\"args\":{\"name\":\"rank $r\"}" "$t" || fail "rank $r has no named track"
  grep -q "\"ph\":\"X\",\"name\":\"step\",\"cat\":\"train\",\"pid\":$r," "$t" || fail "rank $r has no step events"
  grep -q "\"ph\":\"X\",\"name\":\"gemm\",\"cat\":\"kernel\",\"pid\":$r," "$t" || fail "rank $r has no kernel events"
done
grep -q '"op":"allreduce".*"peers":"0,1"' "$t" || fail "no all-reduce between ranks 0 and 1"
grep -q '"name":"comm thread' "$t" || fail "the communication thread is not named"

"$kiln" roofline --profile "$t" --svg "$dir/roof.svg" > "$dir/summary.txt" 2>&1 || { cat "$dir/summary.txt"; fail "roofline --profile"; }
for want in "^gemm +kernel" "MFU .* HFU .* analytic MFU" "exposed communication .* rank 0: .* rank 1: " \
            "step times \(median\): rank 0 .* rank 1 " "^straggler: rank [01]" "^roofline: $dir/roof.svg"; do
  grep -Eq "$want" "$dir/summary.txt" || { cat "$dir/summary.txt"; fail "summary lacks: $want"; }
done
grep -q "<svg" "$dir/roof.svg" && grep -q ">gemm<" "$dir/roof.svg" && grep -q "DRAM" "$dir/roof.svg" || fail "roofline SVG"

"${mpi[@]}" -np 2 "$kiln" profile --out "$dir/p.json" --svg "$dir/p.svg" train "${small[@]}" --dp 2 --steps 2 --out "$dir/p" \
  > "$dir/profile.log" 2>&1 || { cat "$dir/profile.log"; fail "kiln profile train"; }
[ "$(grep -c '^MFU .* HFU' "$dir/profile.log")" -eq 1 ] || { cat "$dir/profile.log"; fail "kiln profile: not one summary"; }
[ -f "$dir/p.svg" ] || fail "kiln profile wrote no SVG"

check_bad "kiln profile: name the command to profile" "$kiln" profile --out "$dir/x.json" info
echo "ok: one trace of 2 ranks with offsets, summary and roofline, kiln profile"
