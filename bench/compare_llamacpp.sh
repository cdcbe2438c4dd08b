#!/usr/bin/env bash
# kiln beside llama.cpp's llama-bench on the same GGUF files (BENCH.md W2-S / W2-L): decode
# (tg, tokens/s) and prefill (pp128, tokens/s) for every file at every thread count, in one
# run, alternating the two programs; prints a table and `ratio: X` (kiln / llama.cpp) per row.
# Builds nothing: it takes the directory of an existing llama.cpp build (llama-bench in it).
#
#   bench/compare_llamacpp.sh --llama DIR [--threads "1 2"] [--tokens 128] [--reps 3]
#                             [--lock FILE] FILE.gguf...
#   bench/compare_llamacpp.sh --llama DIR --model KILN_MODEL_DIR --out DIR [...]
#                             (first writes DIR/<name>-{f32,f16,q8_0,q4_0}.gguf with kiln convert)
# kiln's row is the file as every kiln command loads it (Q8_0 / Q4_0 on the block kernels with
# int8 activations per block, as llama.cpp runs them; F16 kept as halves). kiln decodes after a
# 16-token prompt, llama-bench's tg from an empty context; both time only the decoded tokens.
# Env: KILN (default build/kiln).
set -euo pipefail
cd "$(dirname "$0")/.."

llama=""; threads_list="1 2"; tokens=128; reps=3; lock=""; model=""; out=""; files=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --llama) llama="$2"; shift 2 ;;
    --threads) threads_list="$2"; shift 2 ;;
    --tokens) tokens="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --lock) lock="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) echo "compare_llamacpp.sh: unknown argument $1" >&2; exit 2 ;;
    *) files+=("$1"); shift ;;
  esac
done
KILN="${KILN:-build/kiln}"
[[ -x "$KILN" ]] || { echo "compare_llamacpp.sh: $KILN not built (cmake --build build --target kiln)" >&2; exit 2; }
[[ -n "$llama" ]] || { echo "compare_llamacpp.sh: --llama DIR (a llama.cpp build: DIR/llama-bench or DIR/bin/llama-bench) is required" >&2; exit 2; }
LB="$llama/llama-bench"; [[ -x "$LB" ]] || LB="$llama/bin/llama-bench"
[[ -x "$LB" ]] || { echo "compare_llamacpp.sh: no executable llama-bench in $llama or $llama/bin" >&2; exit 2; }
if [[ -n "$model" ]]; then
  [[ -n "$out" ]] || { echo "compare_llamacpp.sh: --model needs --out DIR for the GGUF files" >&2; exit 2; }
  mkdir -p "$out"
  name=$(basename "$model")
  for t in f32 f16 q8_0 q4_0; do
    f="$out/$name-$t.gguf"
    [[ -f "$f" ]] || "$KILN" convert --model "$model" --out "$f" --type "$t" >&2
    files+=("$f")
  done
fi
[[ ${#files[@]} -gt 0 ]] || { echo "compare_llamacpp.sh: no GGUF files (give FILE.gguf... or --model DIR --out DIR)" >&2; exit 2; }
for f in "${files[@]}"; do [[ -f "$f" ]] || { echo "compare_llamacpp.sh: $f does not exist" >&2; exit 2; }; done
locked() { if [[ -n "$lock" ]]; then flock "$lock" "$@"; else "$@"; fi; }

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "kiln: $KILN; llama.cpp: $LB ($("$LB" --version 2>&1 | grep -m1 -i version || true))"
printf "%-28s %3s %-7s %12s %12s %8s\n" file thr test kiln llama.cpp ratio
for f in "${files[@]}"; do
  for t in $threads_list; do
    # kiln: the file as served ("kept-a8" row: decode tok/s, then prefill tok/s in the last column).
    k=$(locked "$KILN" --threads "$t" bench quant-decode --gguf "$f" --tokens "$tokens" --prefill 128 --reps "$reps" |
        awk '$1 == "kept-a8" { print $2, $NF }')
    # llama.cpp: tg<tokens> and pp128, median of reps (its JSON's avg_ts).
    l=$(locked "$LB" -m "$f" -t "$t" -p 128 -n "$tokens" -r "$reps" -o json 2>/dev/null | python3 -c '
import json, sys
tg = pp = 0.0
for r in json.load(sys.stdin):
    if r.get("n_gen", 0) > 0: tg = r["avg_ts"]
    elif r.get("n_prompt", 0) > 0: pp = r["avg_ts"]
print(tg, pp)')
    read -r k_tg k_pp <<< "$k"
    read -r l_tg l_pp <<< "$l"
    for row in "tg$tokens $k_tg $l_tg" "pp128 $k_pp $l_pp"; do
      read -r test kv lv <<< "$row"
      ratio=$(python3 -c "print(f'{$kv / $lv:.2f}' if $lv > 0 else '-')")
      printf "%-28s %3s %-7s %12.1f %12.1f %8s   ratio: %s\n" "$(basename "$f")" "$t" "$test" "$kv" "$lv" "$ratio" "$ratio"
    done
  done
done
