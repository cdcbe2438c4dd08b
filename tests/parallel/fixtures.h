// What the layout tests of tests/parallel share: a random token stream, the relative difference
// of a layout's flat vector from the single-process one, and a checkpoint directory per test
// and P (CTest runs the np variants as parallel processes).
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "kiln/comm/communicator.h"
#include "kiln/core/rng.h"
#include "kiln/train/data.h"

namespace kiln::parallel::testing {

inline TokenShard random_tokens(int32_t vocab, uint64_t seed, int n) {
  TokenShard d;
  d.vocab_size = vocab;
  Rng rng(seed);
  for (int i = 0; i < n; ++i) d.tokens.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
  return d;
}

// ‖got − ref‖ / ‖ref‖, and max |got − ref| / max |ref|.
struct Diff {
  double rel_rms = 0, max_rel = 0;
};
inline Diff diff(const std::vector<float>& got, std::span<const float> ref) {
  double sq = 0, ref_sq = 0, most = 0, ref_max = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    sq += d * d;
    ref_sq += static_cast<double>(ref[i]) * ref[i];
    most = std::max(most, std::abs(d));
    ref_max = std::max(ref_max, std::abs(static_cast<double>(ref[i])));
  }
  return {std::sqrt(sq / std::max(ref_sq, 1e-300)), most / std::max(ref_max, 1e-300)};
}

inline std::string checkpoint_dir(const std::string& name) {
  return std::string(KILN_BINARY_DIR) + "/test_" + name + "_p" + std::to_string(comm::Communicator::world().size());
}

}  // namespace kiln::parallel::testing
