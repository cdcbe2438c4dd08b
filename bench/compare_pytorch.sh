#!/usr/bin/env bash
# kiln's training step beside PyTorch's (BENCH.md W1a / W1b, fp32 or bf16, AdamW), interleaved in one
# run: for every workload and thread count, `rounds` times kiln then PyTorch, each run a median
# of --steps steps after warm-up; prints tokens/s and MFU for both and `ratio: X` (kiln / torch,
# median tokens/s over the rounds).
#
#   bench/compare_pytorch.sh [--presets "w1a w1b"] [--threads "1 2"] [--rounds 2] [--steps 5]
#                            [--precision fp32|bf16] [--lock FILE]  (each timed run under `flock FILE`)
# bf16: kiln's bf16 mode (bf16 GEMMs, fp32 master weights and AdamW) beside torch.autocast(cpu,
# bfloat16) (oneDNN's bf16 matmuls, AMX where the CPU has it); MFU then against kiln's bf16 peak.
# Env: KILN (default build/kiln), PYTHON (default .venv-torch/bin/python: PyPI's torch 2.x with
# MKL, the peer BENCH.md names; set it up once with
#   python3 -m venv .venv-torch && .venv-torch/bin/pip install torch numpy
# without that venv, /usr/bin/python3 and Debian's older python3-torch, said in the header). The peer runs with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
# unset (the machine presets pin OpenBLAS to its AVX2 kernel), OMP_NUM_THREADS =
# OPENBLAS_NUM_THREADS = N, and OMP_WAIT_POLICY=PASSIVE: Debian's torch runs its elementwise ops
# on OpenMP threads and its GEMMs on OpenBLAS's own pthreads; with libgomp's default spinning
# the two pools fight over the cores (measured here at 2 threads, W1a: 1081 tokens/s spinning,
# 1720 passive).
set -euo pipefail
cd "$(dirname "$0")/.."

presets="w1a w1b"; threads_list="1 2"; rounds=2; steps=5; lock=""; precision=fp32
while [[ $# -gt 0 ]]; do
  case "$1" in
    --presets) presets="$2"; shift 2 ;;
    --threads) threads_list="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --lock) lock="$2"; shift 2 ;;
    --precision) precision="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "compare_pytorch.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ "$precision" == fp32 || "$precision" == bf16 ]] || { echo "compare_pytorch.sh: --precision $precision: expected fp32 or bf16" >&2; exit 2; }
KILN="${KILN:-build/kiln}"
if [[ -z "${PYTHON:-}" ]]; then
  PYTHON=.venv-torch/bin/python
  [[ -x "$PYTHON" ]] || { PYTHON=/usr/bin/python3; echo "compare_pytorch.sh: no .venv-torch (see --help): the peer is $PYTHON's torch"; }
fi
[[ -x "$KILN" ]] || { echo "compare_pytorch.sh: $KILN not built (cmake --build build --target kiln)" >&2; exit 2; }
"$PYTHON" -c "import torch" 2>/dev/null || { echo "compare_pytorch.sh: $PYTHON cannot import torch" >&2; exit 2; }
locked() { if [[ -n "$lock" ]]; then flock "$lock" "$@"; else "$@"; fi; }

results=$(mktemp)
trap 'rm -f "$results"' EXIT
echo "kiln: $("$KILN" info 2>/dev/null | head -1 || true)"
echo "torch: $("$PYTHON" -c 'import torch; print(torch.__version__, torch.__file__)')"
for preset in $presets; do
  for n in $threads_list; do
    for ((r = 1; r <= rounds; r++)); do
      locked env OMP_NUM_THREADS="$n" "$KILN" bench train --preset "$preset" --threads "$n" --steps "$steps" --precision "$precision" --json \
        | tee -a "$results" | sed 's/^/  /'
      locked env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS="$n" OPENBLAS_NUM_THREADS="$n" \
        OMP_WAIT_POLICY=PASSIVE \
        "$PYTHON" bench/train_torch.py --preset "$preset" --threads "$n" --steps "$steps" --precision "$precision" --json \
        | tee -a "$results" | sed 's/^/  /'
    done
  done
done

"$PYTHON" - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
groups = {}
for r in rows:
    groups.setdefault((r["workload"], r["threads"]), {}).setdefault(r["impl"], []).append(r)
print()
for (w, n), g in groups.items():
    k, t = g.get("kiln", []), g.get("torch", [])
    if not k or not t:
        continue
    kt = statistics.median(r["tokens_per_s"] for r in k)
    tt = statistics.median(r["tokens_per_s"] for r in t)
    peak = k[0]["peak_gflops"]
    kg = statistics.median(r["gflops"] for r in k)
    tg = statistics.median(r["gflops"] for r in t)
    print(f"{w} {n} thread(s): kiln {kt:9.1f} tokens/s ({kg:6.1f} GFLOP/s, MFU {100 * kg / peak:4.1f}%)"
          f" [{min(r['tokens_per_s'] for r in k):.1f}-{max(r['tokens_per_s'] for r in k):.1f}]"
          f" | torch {t[0]['version']} {tt:9.1f} tokens/s ({tg:6.1f} GFLOP/s, MFU {100 * tg / peak:4.1f}%)"
          f" [{min(r['tokens_per_s'] for r in t):.1f}-{max(r['tokens_per_s'] for r in t):.1f}]"
          f" OpenBLAS core {t[0]['openblas_core']}; MFU against kiln's measured {k[0].get('precision', 'fp32')} peak {peak:.0f} GFLOP/s"
          + (" (the products its bf16 GEMM issues: AMX tiles where used)" if k[0].get('precision') == 'bf16' else ""))
    print(f"ratio: {kt / tt:.2f}  ({w}, {n} thread(s), {k[0].get('precision', 'fp32')}, kiln / torch tokens/s)")
EOF
