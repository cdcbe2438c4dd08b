#!/usr/bin/env bash
# The CUDA backend's check on a machine with an NVIDIA GPU (sm_80 or sm_90): builds kiln with
# CUDA, runs the CUDA tests (ctest -L cuda: every kernel against its scalar reference) and the
# GEMM ladder beside cuBLAS at 1024..8192, bf16 and f32, the flash attention forward and
# forward+backward (beside PyTorch's SDPA on the GPU where python has torch), the launch-cost table (launches,
# syncs, CUDA graph replay, pinned copies, a copy beside a GEMM on two streams), and Triton's GEMM
# and RMSNorm beside torch where python has both (bench/triton_kernels.py). Meant to finish in
# about 10 minutes on an H200. Exits 77 (with the reason) when there is no GPU to check on.
#   scripts/cuda-device-check.sh [build-dir]      (default build-cuda; JOBS=n for the build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-cuda}
JOBS=${JOBS:-$(nproc)}
SIZES=${SIZES:-1024,2048,4096,8192}

if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  echo "cuda-device-check: no NVIDIA GPU here (nvidia-smi finds none); nothing to check" >&2
  exit 77
fi
nvidia-smi -L

start=$(date +%s)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON > /dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target kiln test_cuda test_kernels
echo "cuda-device-check: build $(( $(date +%s) - start )) s"

status=0
start=$(date +%s)
(cd "$BUILD_DIR" && ctest -L cuda --output-on-failure) || status=1
"$BUILD_DIR/tests/test_kernels" --gtest_filter='CudaCatalog.*' || status=1
echo "cuda-device-check: tests $(( $(date +%s) - start )) s"

start=$(date +%s)
"$BUILD_DIR/kiln" bench gemm --device cuda --shapes "$SIZES" --reps 5 || status=1
echo "cuda-device-check: GEMM ladder $(( $(date +%s) - start )) s"

start=$(date +%s)
"$BUILD_DIR/kiln" bench attention --device cuda --seq 1024,2048,4096 --reps 5 || status=1
echo "cuda-device-check: flash attention $(( $(date +%s) - start )) s"

start=$(date +%s)
"$BUILD_DIR/kiln" bench launch --device cuda --launches 2000 --reps 5 || status=1
echo "cuda-device-check: launch cost, graphs, streams $(( $(date +%s) - start )) s"

# PyTorch's SDPA beside kiln's flash attention, and Triton's GEMM and RMSNorm beside torch
# (cuBLAS), where this machine's python has them (PYTHON=... picks the interpreter).
PYTHON=${PYTHON:-python3}
if "$PYTHON" -c "import torch" 2> /dev/null; then
  start=$(date +%s)
  rc=0
  "$PYTHON" bench/attention_torch.py --device cuda --impl sdpa --kiln "$BUILD_DIR/kiln" --seq 1024,2048,4096 \
    --reps 5 || rc=$?
  [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || status=1
  echo "cuda-device-check: flash attention vs SDPA $(( $(date +%s) - start )) s"
else
  echo "cuda-device-check: SDPA rows skipped ($PYTHON lacks torch)"
fi
if "$PYTHON" -c "import torch, triton" 2> /dev/null; then
  start=$(date +%s)
  "$PYTHON" bench/triton_kernels.py --bench --sizes "$SIZES" || status=1
  echo "cuda-device-check: Triton $(( $(date +%s) - start )) s"
else
  echo "cuda-device-check: Triton rows skipped ($PYTHON lacks torch or triton)"
fi

if [ "$status" -ne 0 ]; then
  echo "cuda-device-check: FAILED (see above)" >&2
else
  echo "cuda-device-check: all passed"
fi
exit "$status"
