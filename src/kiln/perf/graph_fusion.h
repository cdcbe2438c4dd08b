// The fusion pass over a captured graph (core/graph.h), TorchInductor's idea on the CPU: a run of
// consecutive elementwise nodes (add, scale, accumulate, GELU / SiLU / SwiGLU forward) over
// arrays of one length, each after the first reading a value the run computed, becomes one node
// that runs a generated, JIT-compiled kernel (perf/fusion.h). A value only the run reads (not
// kept, not touched by a later node) is never written: one pass over memory instead of one per
// op. Without a compiler the run's nodes stay as they are (one warning).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/core/graph.h"
#include "kiln/perf/fusion.h"

namespace kiln::perf {

struct FusionReport {
  int chains = 0;       // runs replaced by one fused node
  int nodes_fused = 0;  // nodes they replaced
  std::vector<std::string> fused;  // each chain's ops, e.g. "add > gelu_forward > scale > add"
  std::string fallback;            // why nothing was compiled (no compiler), else empty
};

// Call after keep() and before plan(). Transcendental ops use Math::kPolynomial (kiln::cpu's
// formulas, within a few ulp of the eager kernels; add, scale and accumulate are bitwise).
FusionReport fuse_elementwise(graph::Graph& g, fusion::KernelCache& cache);

// The pass as a graph hook for the layers above (EngineConfig / TrainOptions::graph_pass): one
// process-wide kernel cache (perf::fusion::default_cache_dir()); its report goes to `log`.
graph::GraphPass fusion_pass(std::function<void(const FusionReport&)> log = {});

}  // namespace kiln::perf
