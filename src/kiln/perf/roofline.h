// The roofline model: a kernel of arithmetic intensity I (FLOPs per byte of memory traffic) on a
// machine with compute peak P (GFLOP/s) and memory bandwidth B (GB/s) can reach at most
// min(P, I * B). The ridge point P / B is the intensity where the two roofs meet: below it a
// kernel is memory-bound (its bound is I * B), above it compute-bound. `kiln bench gemm` places
// each row on the roof of the ceilings it measured (the FMA peak, the DRAM read rate).
#pragma once

#include <string_view>

namespace kiln::perf {

struct Roofline {
  double peak_gflops = 0;  // compute roof
  double bw_gbs = 0;       // memory roof's slope, GB/s = bytes per ns

  // FLOP/byte where the roofs meet; 0 when the bandwidth is unknown.
  double ridge() const { return bw_gbs > 0 ? peak_gflops / bw_gbs : 0; }
  // The highest GFLOP/s a kernel of `intensity` FLOP/byte can reach.
  double attainable(double intensity) const;
  bool memory_bound(double intensity) const { return intensity < ridge(); }
  std::string_view bound_name(double intensity) const { return memory_bound(intensity) ? "memory" : "compute"; }
};

}  // namespace kiln::perf
