// One request run to its end on the calling thread, through the serving engine's own steps
// (scheduler, paged KV cache, sampler, speculative verification when the engine has a draft):
// the decode loop of `kiln generate`, the same one `kiln serve` runs for every request.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/serve/engine.h"

namespace kiln {

struct GeneratedSample {
  std::vector<int32_t> tokens;  // every sampled token, a stop token included
  FinishReason finish = FinishReason::kNone;
};

struct Generated {
  std::vector<GeneratedSample> samples;  // (n,)
  double seconds = 0;                    // wall time, prefill included
  SpeculativeStats spec;                 // this request's share of the engine's counters
};

// Called with each sampled token of sample `index` in order; false ends that sample (a stop
// string): the engine frees its sequence and it finishes kStop.
using SampleCallback = std::function<bool(int64_t index, int32_t token)>;

// The engine's background loop must not run (the steps run here). Errors: the request's own
// (Engine::add_request's), or the engine's when a step failed it.
Expected<Generated> generate(Engine& engine, std::vector<int32_t> prompt, const GenerationParams& params,
                             const SampleCallback& on_token = {});

}  // namespace kiln
