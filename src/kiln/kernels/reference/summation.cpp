// Reference summation (summation.h): naive, pairwise, Kahan and Neumaier exactly as the
// textbooks write them, element by element, with an fp32 or bf16 accumulator; and the
// double-double sum every error is measured against.
#include <cmath>

#include "kiln/core/status.h"
#include "kiln/kernels/summation.h"

namespace kiln::ref {
namespace {

void check_accum(DType accum) {
  KILN_CHECK_MSG(accum == DType::kF32 || accum == DType::kBF16,
                 "summation accumulates in f32 or bf16, not {}", dtype_name(accum));
}

// Pairwise: split at n/2 down to single elements; every partial sum rounded to the accumulator.
float pairwise(const float* x, int64_t n, DType accum) {
  if (n == 0) return 0.0f;
  if (n == 1) return round_accum(x[0], accum);
  const int64_t h = n / 2;
  return round_accum(pairwise(x, h, accum) + pairwise(x + h, n - h, accum), accum);
}

}  // namespace

void sum_continue(SumState& st, const float* x, int64_t n, SumMethod method, DType accum) {
  check_accum(accum);
  float s = st.s, c = st.c;
  switch (method) {
    case SumMethod::kNaive:
      for (int64_t i = 0; i < n; ++i) s = round_accum(s + x[i], accum);
      break;
    case SumMethod::kKahan:
      for (int64_t i = 0; i < n; ++i) {
        const float y = x[i] - c;          // apply the correction to the next term
        const float t = round_accum(s + y, accum);
        c = round_accum((t - s) - y, accum);  // what t lost of y (negated)
        s = t;
      }
      break;
    case SumMethod::kNeumaier:
      for (int64_t i = 0; i < n; ++i) {
        const float t = round_accum(s + x[i], accum);
        // The low part lost by the add, taken from the smaller operand: stays right when the
        // new term is larger than the running sum, where Kahan's correction fails.
        const float lost = std::fabs(s) >= std::fabs(x[i]) ? (s - t) + x[i] : (x[i] - t) + s;
        c = round_accum(c + lost, accum);
        s = t;
      }
      break;
    default: KILN_CHECK_MSG(false, "sum_continue: {} is not sequential", sum_method_name(method));
  }
  st.s = s;
  st.c = c;
}

float sum_value(const SumState& st, SumMethod method, DType accum) {
  return method == SumMethod::kNeumaier ? round_accum(st.s + st.c, accum) : st.s;
}

float sum(const float* x, int64_t n, SumMethod method, DType accum) {
  check_accum(accum);
  if (method == SumMethod::kPairwise) return pairwise(x, n, accum);
  SumState st;
  sum_continue(st, x, n, method, accum);
  return sum_value(st, method, accum);
}

void ExactSum::add(const float* x, int64_t n) {
  double h = hi, l = lo;
  for (int64_t i = 0; i < n; ++i) {
    // TwoSum (Knuth): h + v == s + e exactly.
    const double v = x[i], s = h + v, bv = s - h, e = (h - (s - bv)) + (v - bv);
    h = s;
    l += e;
  }
  hi = h;
  lo = l;
}

double sum_exact(const float* x, int64_t n) {
  ExactSum e;
  e.add(x, n);
  return e.value();
}

}  // namespace kiln::ref
