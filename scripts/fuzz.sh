#!/usr/bin/env bash
# Runs each libFuzzer target of a -DKILN_FUZZ=ON build for FUZZ_SECONDS (default 300) over its
# committed seeds (fuzz/corpus/<parser>/). A crash, leak, sanitizer report, timeout or OOM fails
# the run; its input is kept under fuzz/crashes/<parser>/ and printed with the command that
# replays it. New inputs the fuzzer finds go to BUILD/fuzz-corpus/<parser>/ (not committed).
# Usage: scripts/fuzz.sh [BUILD_DIR] [parser...]     e.g. scripts/fuzz.sh build-asan gguf
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-asan}
[ $# -gt 0 ] && shift
seconds=${FUZZ_SECONDS:-300}
parsers=("$@")
if [ ${#parsers[@]} -eq 0 ]; then
  for f in "$build"/fuzz/fuzz_*; do [ -x "$f" ] && parsers+=("$(basename "$f" | sed 's/^fuzz_//')"); done
fi
if [ ${#parsers[@]} -eq 0 ]; then
  echo "fuzz.sh: no fuzz targets in $build/fuzz (configure with -DKILN_FUZZ=ON and clang)" >&2
  exit 1
fi
# Leaks count as findings; an input that allocates over 2 GiB, or runs over 10 s, is one too.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for p in "${parsers[@]}"; do
  bin="$build/fuzz/fuzz_$p"
  seeds="fuzz/corpus/$p"
  work="$build/fuzz-corpus/$p"
  crashes="fuzz/crashes/$p"
  mkdir -p "$work" "$crashes" "$seeds"
  log="$build/fuzz-$p.log"
  echo "fuzz.sh: $p for ${seconds}s (seeds $seeds)"
  before=$(ls "$crashes" | wc -l)
  dict=()  # the JSON parsers share one dictionary of structure and keys
  [ "$p" != gguf ] && [ "$p" != safetensors ] && [ "$p" != checkpoint ] && dict=(-dict=fuzz/json.dict)
  if "$bin" "${dict[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -print_funcs=0 \
      -artifact_prefix="$crashes/" "$work" "$seeds" > "$log" 2>&1; then
    grep -E "^stat::number_of_executed_units|^#[0-9]+ +DONE" "$log" | tail -2 | sed "s/^/  /"
  else
    failed+=("$p")
    echo "fuzz.sh: $p FAILED; the end of $log:"
    grep -v -e "^#[0-9]" -e "NEW_FUNC" "$log" | tail -60
    for c in $(ls -t "$crashes" | head -$(( $(ls "$crashes" | wc -l) - before ))); do
      echo "fuzz.sh: reproducer $crashes/$c ($(stat -c %s "$crashes/$c") bytes); replay: $bin $crashes/$c"
      head -c 512 "$crashes/$c" | od -A d -c | head -20
    done
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: findings in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: no findings (${#parsers[@]} targets, ${seconds}s each)"
