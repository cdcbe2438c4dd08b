// Element-wise reduction of two buffers for the collectives: f32 directly, bf16 and f16
// converted to f32, combined, and rounded back (round to nearest even) once per step.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kiln/core/dtype.h"
#include "kiln/comm/types.h"

namespace kiln::comm {

// dst[i] = a[i] (op) b[i] for n elements; dst may alias a or b. avg combines as sum.
// max keeps the larger value; a NaN in either operand gives a NaN (the canonical quiet NaN, so
// the result's bits do not depend on the operand order), and max(+0, -0) = +0.
void combine(DType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t n);
// buf[i] = buf[i] / divisor: the last step of avg, done once by the rank that owns a result.
void divide(DType dtype, void* buf, size_t n, int divisor);

inline size_t elem_bytes(DType dtype) { return static_cast<size_t>(dtype_bits(dtype) / 8); }

// Partition of n elements into p blocks as even as possible: the first n % p blocks get one
// more element. Block i covers [block_begin(i), block_begin(i + 1)).
inline int64_t block_begin(int64_t n, int p, int i) {
  const int64_t base = n / p, rem = n % p;
  return i * base + (i < rem ? i : rem);
}

}  // namespace kiln::comm
