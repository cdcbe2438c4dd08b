#include "kiln/perf/roofline.h"

#include <algorithm>

namespace kiln::perf {

double Roofline::attainable(double intensity) const {
  if (intensity <= 0 || peak_gflops <= 0 || bw_gbs <= 0) return 0;
  return std::min(peak_gflops, intensity * bw_gbs);
}

const MemoryCeiling* HierarchicalRoofline::level_for(double bytes) const {
  if (memory.empty()) return nullptr;
  for (const MemoryCeiling& m : memory)
    if (m.capacity_bytes > 0 && m.gbs > 0 && bytes <= static_cast<double>(m.capacity_bytes)) return &m;
  return &memory.back();
}

Roofline HierarchicalRoofline::roof_for(double bytes) const {
  const MemoryCeiling* m = level_for(bytes);
  return {peak_gflops, m ? m->gbs : 0.0};
}

}  // namespace kiln::perf
