#!/usr/bin/env bash
# kiln's pipeline-parallel training step beside PyTorch's (BENCH.md W7 on W1a / W1b): for every
# workload, `kiln bench pp` under mpirun -np P, then bench/torch_pp.py (torch.distributed.pipelining
# over gloo) under torchrun, on the same shapes, global batch, M micro-batches, V chunks a rank
# for interleaved, the same layer splits (kiln's defaults, read from its output) and 1 thread per
# rank; prints both mean step times
# and `ratio: X` per schedule (torch ms / kiln ms: > 1 means kiln is faster). One run each: repeat
# the script for min-max. The machines are shared: run it as
#   flock /tmp/kiln-timing.lock bench/compare_torch_pp.sh
#
# Env: WORKLOADS (default "W1a W1b"), SCHEDULE ("all", or gpipe | 1f1b | interleaved | zb-h1),
#      P (2), M (4), V (2),
#      STEPS (5), STEPS_W1B (3: its steps are slow here), WARMUP (2), KILN (build/kiln),
#      PY (/work/V/bin/python3; torchrun next to it), JSON (a prefix: kiln's rows go to PREFIX.W1a.json ...).
# Both sides run with OMP_NUM_THREADS=1 and BENCH.md's malloc settings (no mmap, no trim).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

WORKLOADS="${WORKLOADS:-W1a W1b}"; SCHEDULE="${SCHEDULE:-all}"; P="${P:-2}"; M="${M:-4}"; V="${V:-2}"
STEPS="${STEPS:-5}"; STEPS_W1B="${STEPS_W1B:-3}"; WARMUP="${WARMUP:-2}"; JSON="${JSON:-}"
KILN="${KILN:-build/kiln}"; PY="${PY:-/work/V/bin/python3}"; TORCHRUN="$(dirname "$PY")/torchrun"
export OMP_NUM_THREADS=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736

if ! torch_version=$("$PY" -c 'import torch.distributed.pipelining, torch; print(torch.__version__)' 2>/dev/null) ||
   [[ ! -x "$TORCHRUN" ]]; then
  echo "compare_torch_pp.sh: skipped: $PY cannot import torch.distributed.pipelining (or $TORCHRUN is missing)"
  exit 0
fi
[[ -x "$KILN" ]] || { echo "compare_torch_pp.sh: $KILN not built"; exit 2; }
if [[ "$SCHEDULE" == all ]]; then schedules="gpipe 1f1b interleaved zb-h1"; else schedules="$SCHEDULE"; fi
echo "torch $torch_version ($PY); kiln $KILN; P $P M $M V $V warmup $WARMUP; $(lscpu | grep 'Model name' | sed 's/  */ /g')"

for w in $WORKLOADS; do
  steps="$STEPS"; [[ "$w" == W1b ]] && steps="$STEPS_W1B"
  kiln_out=$(mpirun -np "$P" --oversubscribe --allow-run-as-root --mca btl self,vader \
             -x OMP_NUM_THREADS -x MALLOC_MMAP_MAX_ -x MALLOC_TRIM_THRESHOLD_ \
             "$KILN" bench pp --workload "$w" --schedule "$SCHEDULE" --micro-batches "$M" --virtual-stages "$V" --steps "$steps" \
             --warmup "$WARMUP" --threads 1 ${JSON:+--json "$JSON.$w.json"} 2>&1)
  rc=$?
  echo "$kiln_out" | grep -E '^\||order:' | sed 's/^/  kiln:  /'
  ((rc == 0)) || { echo "$w: kiln failed (exit $rc):"; tail -n 3 <<<"$kiln_out" | sed 's/^/    /'; continue; }
  # kiln's default splits, `# W1b gpipe: ... blocks per stage 8,4`: torch cuts the model at the same blocks.
  split() { grep -m1 "^# $w $1: " <<<"$kiln_out" | grep -oE 'blocks per stage [0-9,]+' | cut -d' ' -f4; }
  layers=$(split gpipe); [[ -n "$layers" ]] || layers=$(split 1f1b); [[ -n "$layers" ]] || layers=$(split zb-h1)
  ilayers=$(split interleaved)
  torch_out=$("$TORCHRUN" --standalone --nproc-per-node "$P" bench/torch_pp.py --workload "$w" --schedule "$SCHEDULE" \
              --micro-batches "$M" --virtual-stages "$V" ${layers:+--layers "$layers"} \
              ${ilayers:+--interleaved-layers "$ilayers"} \
              --threads 1 --steps "$steps" --warmup "$WARMUP" 2>&1)
  rc=$?
  grep '^torch_pp ' <<<"$torch_out" | sed 's/^/  torch: /'
  ((rc == 0)) || echo "$w: torch exit $rc: $(grep -m1 -iE 'error' <<<"$torch_out" || tail -n 1 <<<"$torch_out")"
  for s in $schedules; do
    # The table row `| W1a | gpipe | 3,3 | <mean ms> | ...` and torch's `schedule=gpipe ... step_ms=<ms>`.
    kiln_ms=$(awk -F'|' -v w="$w" -v s="$s" '{ gsub(/ /, "", $2); gsub(/ /, "", $3); gsub(/ /, "", $5) }
                                             $2 == w && $3 == s { print $5 }' <<<"$kiln_out")
    torch_ms=$(grep "^torch_pp schedule=$s " <<<"$torch_out" | grep -oE 'step_ms=[0-9.]+' | cut -d= -f2)
    row="$w $s P=$P M=$M"
    if [[ -z "$kiln_ms" || -z "$torch_ms" ]]; then
      echo "$row: no ratio (kiln ${kiln_ms:-none} ms, torch ${torch_ms:-none} ms)"
      continue
    fi
    awk -v r="$row" -v k="$kiln_ms" -v t="$torch_ms" \
      'BEGIN { printf "%s: kiln %.1f ms | torch %.1f ms | ratio: %.2f\n", r, k, t, t / k }'
  done
done
