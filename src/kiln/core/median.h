// The median of timed repetitions, the statistic every benchmark and the profiler report.
#pragma once

#include <algorithm>
#include <vector>

namespace kiln {

// 0 for no values; the mean of the middle two for an even count.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace kiln
