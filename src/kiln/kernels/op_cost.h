// The work of one kernel call — floating-point operations and bytes that must move through
// memory at least once — so the profiler and the roofline can place it (STYLE.md rule 10).
// Family headers give constexpr *_cost(shape) functions returning this.
#pragma once

#include <type_traits>

namespace kiln {

struct OpCost {
  double flops = 0;  // adds, multiplies, divides, sqrt and exp each count as 1
  double bytes = 0;  // each input read once and each output written once (compulsory traffic)
  constexpr double intensity() const { return bytes > 0 ? flops / bytes : 0; }  // FLOP/byte
};

}  // namespace kiln

// In a family header: checks that kiln::ref::fn and kiln::cpu::fn have the same signature.
#define KILN_SAME_SIGNATURE(fn) \
  static_assert(std::is_same_v<decltype(&ref::fn), decltype(&cpu::fn)>, #fn)
