#!/usr/bin/env bash
# kiln's data-parallel training step beside PyTorch's (BENCH.md W7 on W1a / W1b): for every
# layout, workload and P, `kiln bench dp` under mpirun, then bench/torch_dp.py under torchrun, on
# the same shapes, global batch and 1 thread per rank; prints both tokens/s and
# `ratio: X` (kiln / torch tokens/s). One run each: repeat the script for min-max.
#
# Env: LAYOUTS (default "ddp fsdp"), WORKLOADS ("W1a W1b"), PS ("1 2"), STEPS (10), WARMUP (3, torch),
#      KILN (build/kiln), PY (/work/V/bin/python3; torchrun next to it).
# Both sides run with OMP_NUM_THREADS=1 and BENCH.md's malloc settings (no mmap, no trim).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

LAYOUTS="${LAYOUTS:-ddp fsdp}"; WORKLOADS="${WORKLOADS:-W1a W1b}"; PS="${PS:-1 2}"
STEPS="${STEPS:-10}"; WARMUP="${WARMUP:-3}"
KILN="${KILN:-build/kiln}"; PY="${PY:-/work/V/bin/python3}"; TORCHRUN="$(dirname "$PY")/torchrun"
export OMP_NUM_THREADS=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736

if ! torch_version=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null) || [[ ! -x "$TORCHRUN" ]]; then
  echo "compare_torch_ddp.sh: skipped: $PY cannot import torch (or $TORCHRUN is missing)"
  exit 0
fi
kiln_ok=1
[[ -x "$KILN" ]] || { echo "compare_torch_ddp.sh: $KILN not built: kiln rows skipped"; kiln_ok=0; }
echo "torch $torch_version ($PY); kiln $KILN; steps $STEPS"

# The number after KEY in the last line that has it: `KEY 12.3`, `KEY=12.3` or `KEY: 12.3`.
value() {
  awk -v k="$1" '{ for (i = 1; i <= NF; i++) {
      if (($i == k || $i == k ":") && i < NF) v = $(i + 1)
      else if (index($i, k "=") == 1) v = substr($i, length(k) + 2) } }
    END { if (v ~ /^[0-9.eE+-]+$/) print v }'
}

for layout in $LAYOUTS; do
  for w in $WORKLOADS; do
    for p in $PS; do
      row="$w $layout P=$p"
      kiln_tps=""
      if ((kiln_ok)); then
        out=$(mpirun -np "$p" --oversubscribe --allow-run-as-root --mca btl self,vader \
              -x OMP_NUM_THREADS -x MALLOC_MMAP_MAX_ -x MALLOC_TRIM_THRESHOLD_ \
              "$KILN" bench dp --workload "$w" --layout "$layout" --steps "$STEPS" --threads 1 2>&1)
        rc=$?
        kiln_tps=$(value tokens_per_s <<<"$out")
        if ((rc != 0)) || [[ -z "$kiln_tps" ]]; then
          echo "$row: kiln failed (exit $rc, no tokens_per_s):"
          { grep -m1 -i 'error' <<<"$out" || tail -n 3 <<<"$out"; } | sed 's/^/    /'
          kiln_tps=""
        else
          grep tokens_per_s <<<"$out" | tail -n 1 | sed 's/^/  kiln:  /'
        fi
      fi
      out=$("$TORCHRUN" --standalone --nproc-per-node "$p" bench/torch_dp.py --layout "$layout" --workload "$w" \
            --threads 1 --steps "$STEPS" --warmup "$WARMUP" 2>&1)
      rc=$?
      torch_tps=$(value tokens_per_s <<<"$out")
      if ((rc != 0)) || [[ -z "$torch_tps" ]]; then
        echo "$row: torch failed (exit $rc): $(grep -m1 -i 'error' <<<"$out" || tail -n 1 <<<"$out")"
        continue
      fi
      grep '^torch ' <<<"$out" | sed 's/^/  torch: /'
      if [[ -n "$kiln_tps" ]]; then
        awk -v r="$row" -v k="$kiln_tps" -v t="$torch_tps" \
          'BEGIN { printf "%s: kiln %.1f tokens/s | torch %.1f tokens/s | ratio: %.2f\n", r, k, t, k / t }'
      else
        echo "$row: torch $torch_tps tokens/s (no kiln figure)"
      fi
    done
  done
done
