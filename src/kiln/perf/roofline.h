// The roofline model: a kernel of arithmetic intensity I (FLOPs per byte of memory traffic) on a
// machine with compute peak P (GFLOP/s) and memory bandwidth B (GB/s) can reach at most
// min(P, I * B). The ridge point P / B is the intensity where the two roofs meet: below it a
// kernel is memory-bound (its bound is I * B), above it compute-bound. `kiln bench gemm` places
// each row on the roof of the ceilings it measured (the FMA peak, the DRAM read rate).
#pragma once

#include <string>
#include <string_view>
#include <vector>

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

// The hierarchical roofline: one bandwidth ceiling per level of the memory hierarchy, each
// measured with a working set of half that level (peak.h: measure_hierarchical_roofline). A
// call whose compulsory bytes (OpCost) fit in a level can stream them from it, so the profiler
// places it under the ceiling of the smallest level that holds them (DRAM when none does).
struct MemoryCeiling {
  std::string name;  // "L1", "L2", "L3", "DRAM"
  double gbs = 0;
  int64_t capacity_bytes = 0;  // the level's size (L3: shared by every thread); 0 for DRAM
};
struct HierarchicalRoofline {
  double peak_gflops = 0;
  std::vector<MemoryCeiling> memory;  // fastest first; DRAM last
  int threads = 0;
  bool empty() const { return peak_gflops <= 0 || memory.empty(); }
  Roofline dram() const { return {peak_gflops, memory.empty() ? 0.0 : memory.back().gbs}; }
  // The ceiling of the smallest level that holds `bytes` (DRAM when none does or none is known).
  const MemoryCeiling* level_for(double bytes) const;
  Roofline roof_for(double bytes) const;
};

}  // namespace kiln::perf
