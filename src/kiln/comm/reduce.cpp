// Reduction kernels of the collectives: the reduction reads two buffers and writes one, so it
// is memory-bound; f32 goes to the SIMD kernels (reduce_kernels.h), 16-bit floats are plain
// loops through f32.
#include "kiln/comm/reduce.h"

#include <cstring>
#include <limits>

#include "kiln/core/status.h"
#include "kiln/comm/reduce_kernels.h"
#include "kiln/kernels/dispatch.h"

namespace kiln::comm {
namespace {

// max that is symmetric bit for bit (a max b == b max a), so every rank of a collective ends
// with the same bits whatever order it combined in: a NaN in either operand gives the
// canonical quiet NaN, and max(+0, -0) is +0 (the AND of the equal values' bits).
inline float max_f32(float x, float y) {
  if (x != x || y != y) return std::numeric_limits<float>::quiet_NaN();
  if (x > y) return x;
  if (y > x) return y;
  uint32_t bx, by;
  std::memcpy(&bx, &x, 4);
  std::memcpy(&by, &y, 4);
  const uint32_t b = bx & by;
  float out;
  std::memcpy(&out, &b, 4);
  return out;
}

template <class Load, class Store>
void combine_16(ReduceOp op, uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n,
                Load load, Store store) {
  if (op == ReduceOp::kMax) {
    for (size_t i = 0; i < n; ++i) {
      dst[i] = store(max_f32(load(a[i]), load(b[i])));
    }
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = store(load(a[i]) + load(b[i]));
  }
}

}  // namespace

namespace detail {

void combine_f32_scalar(ReduceOp op, float* d, const float* x, const float* y, size_t n) {
  if (op == ReduceOp::kMax) {
    for (size_t i = 0; i < n; ++i) d[i] = max_f32(x[i], y[i]);
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = x[i] + y[i];
  }
}

void divide_f32_scalar(float* x, size_t n, float d) {
  for (size_t i = 0; i < n; ++i) x[i] = x[i] / d;
}

}  // namespace detail

void combine(DType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t n) {
  switch (dtype) {
    case DType::kF32: {
      const detail::CombineF32Fn fn =
          Dispatch<detail::CombineF32Fn>{detail::combine_f32_scalar, detail::combine_f32_avx2,
                                         nullptr}
              .pick();
      fn(op, static_cast<float*>(dst), static_cast<const float*>(a), static_cast<const float*>(b), n);
      return;
    }
    case DType::kBF16:
      combine_16(op, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                 static_cast<const uint16_t*>(b), n, bf16_to_f32, f32_to_bf16);
      return;
    case DType::kF16:
      combine_16(op, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                 static_cast<const uint16_t*>(b), n, f16_to_f32, f32_to_f16);
      return;
    default:
      KILN_CHECK_MSG(false, "combine: dtype {} is not a collective dtype", dtype_name(dtype));
  }
}

void divide(DType dtype, void* buf, size_t n, int divisor) {
  const float d = static_cast<float>(divisor);
  switch (dtype) {
    case DType::kF32: {
      Dispatch<detail::DivideF32Fn>{detail::divide_f32_scalar, detail::divide_f32_avx2, nullptr}
          .pick()(static_cast<float*>(buf), n, d);
      return;
    }
    case DType::kBF16: {
      uint16_t* x = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < n; ++i) x[i] = f32_to_bf16(bf16_to_f32(x[i]) / d);
      return;
    }
    case DType::kF16: {
      uint16_t* x = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < n; ++i) x[i] = f32_to_f16(f16_to_f32(x[i]) / d);
      return;
    }
    default:
      KILN_CHECK_MSG(false, "divide: dtype {} is not a collective dtype", dtype_name(dtype));
  }
}

}  // namespace kiln::comm
