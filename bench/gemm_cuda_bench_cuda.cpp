// `kiln bench gemm --device cuda` (gemm_cuda_bench.h): the CUDA GEMM ladder beside cuBLAS.
// Compiled only with the CUDA backend; cuBLAS is linked into bench/ alone, never the engine.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/cuda_bench_util.h"
#include "bench/gemm_cuda_bench.h"
#include "kiln/core/device.h"
#include "kiln/core/rng.h"
#include "kiln/core/tensor.h"
#include "kiln/kernels/cuda/kernels.h"

namespace kiln::bench {
namespace {

// Median ms of up to opt.reps runs after one warm-up, fewer when a run is slow.
template <class F>
double median_ms(const GemmCudaBenchOptions& opt, F&& fn) {
  const float warm = cuda_event_ms(fn);
  const int reps = std::clamp(
      static_cast<int>(opt.max_seconds_per_rung * 1e3 / std::max(warm, 1e-3f)), 1, opt.reps);
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) ms.push_back(cuda_event_ms(fn));
  return summarize(ms).median;
}

struct Row {
  std::string dtype, kernel, status;
  int size = 0;
  double ms = 0, gflops = 0, vs_peer = 0, nmse = 0;
};

void print_row(const Row& r, bool json) {
  if (json) {
    std::printf(
        "%s\n",
        fmt::format(
            "{{\"bench\": \"gemm_cuda\", \"dtype\": \"{}\", \"size\": {}, \"kernel\": \"{}\", "
            "\"ms\": {:.4f}, \"gflops\": {:.1f}, \"vs_cublas\": {:.3f}, \"nmse\": {:.3g}, "
            "\"status\": \"{}\"}}",
            r.dtype, r.size, r.kernel, r.ms, r.gflops, r.vs_peer, r.nmse, r.status)
            .c_str());
  } else {
    std::printf("%-5s %6d  %-15s %10.3f %11.1f %9.3f %10.2e  %s\n", r.dtype.c_str(), r.size,
                r.kernel.c_str(), r.ms, r.gflops, r.vs_peer, r.nmse, r.status.c_str());
  }
  std::fflush(stdout);
}

// One size and dtype: cuBLAS first (the peer and the expected values), then every rung.
int bench_one(cublasHandle_t handle, int size, DType dtype, const GemmCudaBenchOptions& opt) {
  const int64_t n = size;
  Rng rng(static_cast<uint64_t>(size));
  std::vector<float> values(static_cast<size_t>(n * n));
  const auto make = [&] {
    for (float& v : values) v = rng.uniform(-1.0f, 1.0f);
    return Tensor::from_floats({n, n}, values, dtype).value().to(Device::kCuda).value();
  };
  const Tensor a = make(), b = make();  // A (m, k), B (n, k)
  Tensor c = Tensor::zeros({n, n}).to(Device::kCuda).value();
  const double flops = 2.0 * n * n * n;
  const cudaDataType_t t = dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  const float one = 1.0f, zero = 0.0f;
  // cuBLAS is column-major: row-major C (m, n) is its C^T (n, m) = B (n, k) · A^T (k, m). Its
  // view of row-major B (n, k) is a (k, n) matrix, so op T; of row-major A (m, k) a (k, m), op N.
  cublasStatus_t cs = CUBLAS_STATUS_SUCCESS;
  const double peer_ms = median_ms(opt, [&] {
    cs = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(n),
                      static_cast<int>(n), &one, b.raw_data(), t, static_cast<int>(n), a.raw_data(),
                      t, static_cast<int>(n), &zero, c.raw_data(), CUDA_R_32F, static_cast<int>(n),
                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  });
  if (cs != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasGemmEx failed: %s\n", cublasGetStatusString(cs));
    return 1;
  }
  const std::vector<float> expected = host_floats(c);
  print_row({std::string(dtype_name(dtype)), "cublas", "peer", size, peer_ms,
             flops / (peer_ms * 1e6), 1.0, 0.0},
            opt.json);

  int failures = 0;
  for (cuda::GemmKernel rung : cuda::kGemmLadder) {
    GemmParams p;
    p.m = p.n = p.k = n;
    p.a = a.raw_data(), p.b = b.raw_data(), p.c = c.data<float>();
    p.lda = p.ldb = p.ldc = n;
    p.a_dtype = p.b_dtype = dtype;
    p.trans_b = true;
    Row row{std::string(dtype_name(dtype)), std::string(cuda::gemm_kernel_name(rung)), "ok", size};
    if (const Status s = cuda::gemm_supports(p, rung); !s.ok()) {
      row.status = "n/a: " + s.message();
      print_row(row, opt.json);
      continue;
    }
    cudaMemset(c.raw_data(), 0, static_cast<size_t>(c.nbytes()));
    Status st;
    st = cuda::gemm(p, rung);  // the validation run
    if (st.ok()) st = cuda_runtime::synchronize();
    if (!st.ok()) {
      row.status = "FAILED: " + st.message();
      print_row(row, opt.json);
      ++failures;
      continue;
    }
    row.nmse = nmse(expected, host_floats(c));
    // f32 accumulation in another order: ~1e-12; a wrong index or race: ~1.
    if (row.nmse > 1e-6) {
      row.status = "WRONG";
      ++failures;
    }
    row.ms = median_ms(opt, [&] { (void)cuda::gemm(p, rung); });
    row.gflops = flops / (row.ms * 1e6);
    row.vs_peer = peer_ms / row.ms;
    print_row(row, opt.json);
  }
  return failures;
}

}  // namespace

int run_gemm_cuda_bench(const GemmCudaBenchOptions& opt) {
  if (!cuda_available()) {
    std::fprintf(stderr, "kiln bench gemm --device cuda: %s\n",
                 cuda_runtime::unavailable_reason().c_str());
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "kiln bench gemm --device cuda: cublasCreate failed\n");
    return 1;
  }
  if (!opt.json) {
    std::printf(
        "GEMM ladder on %s (sm_%d%d): C (n, n) = A (n, n) . B^T, f32 accumulate; cuBLAS = "
        "cublasGemmEx, COMPUTE_32F\n",
        prop.name, prop.major, prop.minor);
    std::printf("%-5s %6s  %-15s %10s %11s %9s %10s  %s\n", "dtype", "n", "kernel", "ms", "GFLOP/s",
                "vs cuBLAS", "nmse", "status");
  }
  int failures = 0;
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    if (opt.dtype != "all" && opt.dtype != dtype_name(dtype)) continue;
    for (int size : opt.sizes) failures += bench_one(handle, size, dtype, opt);
  }
  cublasDestroy(handle);
  if (failures)
    std::fprintf(stderr, "kiln bench gemm --device cuda: %d rung(s) failed validation\n", failures);
  return failures ? 1 : 0;
}

}  // namespace kiln::bench
