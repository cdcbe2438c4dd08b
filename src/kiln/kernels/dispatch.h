// The one idiom for run-time SIMD dispatch: a kernel family lists its implementation per
// target (a null entry means "none for this target"); pick() returns the strongest one the
// active target allows. Per-target code lives in files named *_avx512.cpp / *_avx2.cpp.
#pragma once

#include "kiln/core/cpu_features.h"

namespace kiln {

template <class Fn>
struct Dispatch {
  Fn scalar = nullptr;
  Fn avx2 = nullptr;
  Fn avx512 = nullptr;

  SimdTarget picked_target() const {
    const SimdTarget t = active_simd_target();
    if (t >= SimdTarget::kAvx512 && avx512) return SimdTarget::kAvx512;
    if (t >= SimdTarget::kAvx2 && avx2) return SimdTarget::kAvx2;
    return SimdTarget::kScalar;
  }
  Fn pick() const {
    switch (picked_target()) {
      case SimdTarget::kAvx512: return avx512;
      case SimdTarget::kAvx2: return avx2;
      default: return scalar;
    }
  }
};

}  // namespace kiln
