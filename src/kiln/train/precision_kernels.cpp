// Scalar reference of the mixed-precision rounding kernels (bitwise the conversions of
// core/dtype.h and core/fp8.h) and the threaded, dispatched entry points.
#include "kiln/train/precision_kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>

#include "kiln/core/dtype.h"
#include "kiln/core/fp8.h"
#include "kiln/core/thread_pool.h"

namespace kiln {
namespace precision_detail::scalar {
namespace {
void to_bf16(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}
int64_t round_f16(float* dst, const float* src, int64_t n) {
  int64_t flushed = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float x = src[i];
    const float r = f16_to_f32(f32_to_f16(x));
    flushed += (x != 0.0f && r == 0.0f) ? 1 : 0;
    dst[i] = r;
  }
  return flushed;
}
float amax(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return x[i];
    m = std::max(m, std::fabs(x[i]));
  }
  return m;
}
void qdq_fp8(float* dst, const float* src, int64_t n, float scale, Fp8Kind kind) {
  const float inv = 1.0f / scale;
  for (int64_t i = 0; i < n; ++i) {
    const float s = src[i] * scale;
    const float q = kind == Fp8Kind::kE4M3 ? f8e4m3_to_f32(f32_to_f8e4m3(s, true)) : f8e5m2_to_f32(f32_to_f8e5m2(s, true));
    dst[i] = q * inv;
  }
}
}  // namespace
const Kernels kKernels = {&to_bf16, &round_f16, &amax, &qdq_fp8};
}  // namespace precision_detail::scalar

const precision_detail::Kernels& precision_kernels_scalar() { return precision_detail::scalar::kKernels; }

const precision_detail::Kernels& precision_kernels_picked() {
  static const precision_detail::Kernels* k =
      Dispatch<const precision_detail::Kernels*>{&precision_detail::scalar::kKernels, nullptr,
                                                 &precision_detail::avx512::kKernels}
          .pick();
  return *k;
}

namespace {
// Elementwise and memory-bound: chunks of 64 Ki elements (256 KiB of f32 read, an L2's worth on
// the 2-core Zen 5 these were run on) split work over threads without per-chunk overhead showing.
constexpr int64_t kGrain = 1 << 16;
}  // namespace

void convert_to_bf16(uint16_t* dst, const float* src, int64_t n) {
  const auto& k = precision_kernels_picked();
  parallel_for(n, kGrain, [&](int64_t i0, int64_t i1) { k.to_bf16(dst + i0, src + i0, i1 - i0); });
}

int64_t round_through_f16(float* dst, const float* src, int64_t n) {
  const auto& k = precision_kernels_picked();
  std::atomic<int64_t> flushed{0};
  parallel_for(n, kGrain, [&](int64_t i0, int64_t i1) { flushed += k.round_f16(dst + i0, src + i0, i1 - i0); });
  return flushed.load();
}

float abs_max(const float* x, int64_t n) {
  const auto& k = precision_kernels_picked();
  std::mutex mu;
  float m = 0.0f;
  parallel_for(n, kGrain, [&](int64_t i0, int64_t i1) {
    const float v = k.amax(x + i0, i1 - i0);
    std::lock_guard<std::mutex> lock(mu);
    if (std::isnan(v) || std::isnan(m)) m = std::isnan(m) ? m : v;
    else m = std::max(m, v);
  });
  return m;
}

void fp8_quantize_dequantize(float* dst, const float* src, int64_t n, float scale, Fp8Kind kind) {
  const auto& k = precision_kernels_picked();
  parallel_for(n, kGrain, [&](int64_t i0, int64_t i1) { k.qdq_fp8(dst + i0, src + i0, i1 - i0, scale, kind); });
}

float fp8_max(Fp8Kind kind) { return kind == Fp8Kind::kE4M3 ? f8e4m3_to_f32(Fp8E4M3::kMaxFinite) : f8e5m2_to_f32(Fp8E5M2::kMaxFinite); }

}  // namespace kiln
