#!/usr/bin/env python3
"""Triton beside kiln's hand-written CUDA kernels: the same tile decomposition, written in Triton.

Triton is a Python language for GPU kernels in which one *program instance* computes one tile:
the programmer writes what a tile does with whole blocks (tl.load of a BM x BK block, tl.dot,
tl.store), and the compiler decides what each warp and thread does inside it, the shared-memory
staging, the tensor-core instructions and the software pipelining. kiln's CUDA GEMM
(src/kiln/kernels/cuda/gemm.cu) makes the same outer decision -- one thread block per tile of C,
a loop over K -- and then writes the inside by hand, one rung of the ladder at a time (coalescing,
shared-memory tiles, register tiles, bank-conflict-free layouts, mma.sync, cp.async).

Two kernels, each with its grid printed as programs and tiles:
  * gemm: C = A.B (fp32 accumulate), one BM x BN tile of C per program, programs ordered in
    groups of GROUP_M tile rows so that neighbouring programs share A and B tiles in L2;
  * rmsnorm: one row per program (the row-wise kernels' shape: softmax, the norms, RoPE).

  --check  runs both in Triton's interpreter (TRITON_INTERPRET=1, NumPy on the CPU: no GPU needed)
           on odd shapes against a float64 reference, and exits 1 on a mismatch. CTest runs it
           (tests/CMakeLists.txt: triton_check); exit 77 without torch or triton.
  --bench  on a CUDA GPU: the Triton GEMM and RMSNorm beside torch (cuBLAS; torch's own kernels),
           bf16 and fp32, with the ratio (scripts/cuda-device-check.sh runs it where torch and
           triton are installed); exit 77 without a GPU.
"""
import argparse
import os
import sys


def import_triton(interpret):
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    try:
        import numpy  # noqa: F401
        import torch
        import triton
        import triton.language as tl
    except ImportError as e:
        print(f"triton_kernels: skipped: {e}", file=sys.stderr)
        sys.exit(77)
    return torch, triton, tl


def define_kernels(triton, tl):
    @triton.jit
    def gemm_kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
        # Which tile of C this program computes: programs run in groups of GROUP_M tile rows,
        # column by column within a group, so a group's programs reuse the same B tiles.
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BM)
        tiles_n = tl.cdiv(N, BN)
        per_group = GROUP_M * tiles_n
        group = pid // per_group
        first_m = group * GROUP_M
        rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)
        tile_m = first_m + (pid % per_group) % rows_in_group
        tile_n = (pid % per_group) // rows_in_group
        rm = tile_m * BM + tl.arange(0, BM)
        rn = tile_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):  # the K loop: one BM x BK block of A and BK x BN of B a step
            ka = k0 + rk
            a_blk = tl.load(a + rm[:, None] * sam + ka[None, :] * sak,
                            mask=(rm[:, None] < M) & (ka[None, :] < K), other=0.0)
            b_blk = tl.load(b + ka[:, None] * sbk + rn[None, :] * sbn,
                            mask=(ka[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc += tl.dot(a_blk, b_blk)  # tensor cores where the dtypes allow
        tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(c.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))

    @triton.jit
    def rmsnorm_kernel(x, w, y, N, stride, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)  # one row per program
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        v = tl.load(x + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / N + eps)
        g = tl.load(w + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y + row * stride + cols, (v * rstd * g).to(y.dtype.element_ty), mask=mask)

    return gemm_kernel, rmsnorm_kernel


def gemm(triton, kernel, a, b, BM=64, BN=64, BK=32, GROUP_M=8):
    import torch
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
    kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                 BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M)
    return c, grid[0]


def rmsnorm(triton, kernel, x, w, eps=1e-5):
    import torch
    y = torch.empty_like(x)
    block = triton.next_power_of_2(x.shape[1])
    kernel[(x.shape[0],)](x, w, y, x.shape[1], x.stride(0), eps, BLOCK=block)
    return y, x.shape[0]


def check():
    torch, triton, tl = import_triton(interpret=True)
    gemm_kernel, rmsnorm_kernel = define_kernels(triton, tl)
    import numpy as np
    rng = np.random.default_rng(3)
    bad = 0
    # Odd shapes: partial tiles in M, N and K, a single row, a single column, K below BK.
    for (M, N, K) in [(1, 1, 1), (17, 33, 5), (64, 64, 64), (100, 70, 129), (130, 1, 40), (3, 200, 31)]:
        a = rng.standard_normal((M, K)).astype(np.float32)
        b = rng.standard_normal((K, N)).astype(np.float32)
        c, programs = gemm(triton, gemm_kernel, torch.from_numpy(a), torch.from_numpy(b), BM=32, BN=32, BK=16,
                           GROUP_M=2)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        # fp32 products and sums: |error| <= K * u * sum|a||b| with u = 2^-24, bounded per element.
        bound = K * 2.0 ** -24 * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)) * 2 + 1e-30
        err = np.abs(c.numpy().astype(np.float64) - ref)
        ok = bool(np.all(err <= bound))
        bad += not ok
        print(f"gemm    {M:4d} x {N:4d} x {K:4d}: {programs:3d} programs of 32 x 32 tiles, max |err| {err.max():.2e} "
              f"(bound {bound.max():.2e}) {'ok' if ok else 'MISMATCH'}")
    for (rows, n) in [(1, 1), (5, 33), (7, 64), (3, 1000)]:
        x = rng.standard_normal((rows, n)).astype(np.float32)
        w = rng.standard_normal(n).astype(np.float32)
        y, programs = rmsnorm(triton, rmsnorm_kernel, torch.from_numpy(x), torch.from_numpy(w))
        x64 = x.astype(np.float64)
        ref = x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + 1e-5) * w
        err = np.abs(y.numpy() - ref).max()
        ok = bool(err <= 1e-5 * max(1.0, np.abs(ref).max()))
        bad += not ok
        print(f"rmsnorm {rows:4d} x {n:4d}: {programs:3d} programs (one row each), max |err| {err:.2e} "
              f"{'ok' if ok else 'MISMATCH'}")
    print("triton_kernels --check:", "all match the float64 reference" if bad == 0 else f"{bad} MISMATCHED")
    return 1 if bad else 0


def bench(sizes, reps):
    torch, triton, tl = import_triton(interpret=False)
    if not torch.cuda.is_available():
        print("triton_kernels: skipped: no CUDA GPU for --bench", file=sys.stderr)
        return 77
    gemm_kernel, rmsnorm_kernel = define_kernels(triton, tl)
    from triton.testing import do_bench
    print(f"device: {torch.cuda.get_device_name()}; triton {triton.__version__}, torch {torch.__version__}")
    print("| kernel | dtype | shape | Triton ms | torch ms | torch / Triton time |")
    print("|---|---|---|---|---|---|")
    for dtype in (torch.bfloat16, torch.float32):
        for n in sizes:
            a = torch.randn(n, n, device="cuda", dtype=dtype)
            b = torch.randn(n, n, device="cuda", dtype=dtype)
            blocks = dict(BM=128, BN=128, BK=64 if dtype == torch.bfloat16 else 32, GROUP_M=8)
            c, _ = gemm(triton, gemm_kernel, a, b, **blocks)
            torch.testing.assert_close(c.float(), (a.float() @ b.float()), rtol=2e-2, atol=2e-2 * n ** 0.5)
            t_tr = do_bench(lambda: gemm(triton, gemm_kernel, a, b, **blocks), rep=reps)
            t_th = do_bench(lambda: a @ b, rep=reps)
            print(f"| gemm | {str(dtype)[6:]} | {n}^3 | {t_tr:.3f} ({2 * n ** 3 / t_tr / 1e9:.0f} TFLOP/s) | "
                  f"{t_th:.3f} | {t_th / t_tr:.2f} |")
    for rows, n in [(8192, 4096), (32768, 8192)]:
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        t_tr = do_bench(lambda: rmsnorm(triton, rmsnorm_kernel, x, w), rep=reps)
        t_th = do_bench(lambda: torch.nn.functional.rms_norm(x, (n,), w, 1e-5), rep=reps)
        gbs = 2 * x.numel() * x.element_size() / t_tr / 1e6
        print(f"| rmsnorm | bfloat16 | {rows} x {n} | {t_tr:.3f} ({gbs:.0f} GB/s) | {t_th:.3f} | {t_th / t_tr:.2f} |")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="interpreter run against float64 (CPU)")
    mode.add_argument("--bench", action="store_true", help="time beside torch on a CUDA GPU")
    p.add_argument("--sizes", default="1024,2048,4096,8192", help="--bench: square GEMM sizes")
    p.add_argument("--rep-ms", type=int, default=100, help="--bench: milliseconds per measurement")
    a = p.parse_args()
    if a.check:
        return check()
    try:
        sizes = [int(s) for s in a.sizes.split(",")]
    except ValueError:
        p.error(f"--sizes {a.sizes!r}: comma-separated integers")
    if any(s <= 0 for s in sizes):
        p.error(f"--sizes {a.sizes!r}: every size must be > 0")
    return bench(sizes, a.rep_ms)


if __name__ == "__main__":
    sys.exit(main())
