#include "kiln/perf/roofline.h"

#include <algorithm>

namespace kiln::perf {

double Roofline::attainable(double intensity) const {
  if (intensity <= 0 || peak_gflops <= 0 || bw_gbs <= 0) return 0;
  return std::min(peak_gflops, intensity * bw_gbs);
}

}  // namespace kiln::perf
