// The f32 kernels behind combine() and divide() (reduce.cpp), one per SIMD target, picked at
// run time with the one Dispatch idiom. GCC 12 at -O2 leaves these loops scalar (its cheap
// vectorizer cost model refuses the aliasing check that dst == a needs), so they are written
// out: a 2 KiB reduction is ~0.1 us scalar, a tenth of a small all-reduce here.
#pragma once

#include <cstddef>

#include "kiln/comm/types.h"

namespace kiln::comm::detail {

// dst[i] = a[i] (op) b[i]; dst may alias a or b (the same element only). op: sum or max
// (max as reduce.h specifies: NaN-propagating, canonical NaN, max(+0, -0) = +0).
using CombineF32Fn = void (*)(ReduceOp op, float* dst, const float* a, const float* b, size_t n);
// x[i] = x[i] / d.
using DivideF32Fn = void (*)(float* x, size_t n, float d);

void combine_f32_scalar(ReduceOp op, float* dst, const float* a, const float* b, size_t n);
void combine_f32_avx2(ReduceOp op, float* dst, const float* a, const float* b, size_t n);
void divide_f32_scalar(float* x, size_t n, float d);
void divide_f32_avx2(float* x, size_t n, float d);

}  // namespace kiln::comm::detail
