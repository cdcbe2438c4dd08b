// Reduction kernels of the collectives. Plain loops: the reduction reads two buffers and
// writes one, so it is memory-bound; -O2 vectorizes the f32 loops with SSE2.
#include "kiln/dist/reduce.h"

#include "kiln/core/status.h"

namespace kiln::dist {
namespace {

template <class Load, class Store>
void combine_16(ReduceOp op, uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n,
                Load load, Store store) {
  if (op == ReduceOp::kMax) {
    for (size_t i = 0; i < n; ++i) {
      const float x = load(a[i]), y = load(b[i]);
      dst[i] = store(y > x ? y : x);
    }
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = store(load(a[i]) + load(b[i]));
  }
}

}  // namespace

void combine(DType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t n) {
  switch (dtype) {
    case DType::kF32: {
      float* d = static_cast<float*>(dst);
      const float* x = static_cast<const float*>(a);
      const float* y = static_cast<const float*>(b);
      if (op == ReduceOp::kMax) {
        for (size_t i = 0; i < n; ++i) d[i] = y[i] > x[i] ? y[i] : x[i];
      } else {
        for (size_t i = 0; i < n; ++i) d[i] = x[i] + y[i];
      }
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
      float* x = static_cast<float*>(buf);
      for (size_t i = 0; i < n; ++i) x[i] = x[i] / d;
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

}  // namespace kiln::dist
