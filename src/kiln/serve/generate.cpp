// See generate.h: add the request, step the engine until its stream ends, hand each token to
// the callback as it comes.
#include "kiln/serve/generate.h"

#include <chrono>

namespace kiln {

namespace {
SpeculativeStats minus(const SpeculativeStats& a, const SpeculativeStats& b) {
  SpeculativeStats d;
  d.num_generated = a.num_generated - b.num_generated;
  d.num_target_passes = a.num_target_passes - b.num_target_passes;
  d.num_draft_passes = a.num_draft_passes - b.num_draft_passes;
  d.num_proposed = a.num_proposed - b.num_proposed;
  d.num_accepted = a.num_accepted - b.num_accepted;
  d.num_rejected = a.num_rejected - b.num_rejected;
  return d;
}
}  // namespace

Expected<Generated> generate(Engine& engine, std::vector<int32_t> prompt, const GenerationParams& params,
                             const SampleCallback& on_token) {
  const auto t0 = std::chrono::steady_clock::now();
  const SpeculativeStats before = engine.metrics().spec;
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<RequestStream> stream, engine.add_request(std::move(prompt), params));
  Generated out;
  out.samples.resize(static_cast<size_t>(params.n));
  std::vector<uint8_t> stopped(static_cast<size_t>(params.n), 0);
  std::vector<TokenEvent> events;
  for (;;) {
    const bool busy = engine.step();
    events.clear();
    const bool open = stream->wait(events, std::chrono::milliseconds(0));
    for (const TokenEvent& e : events) {
      const auto i = static_cast<size_t>(e.index);
      GeneratedSample& s = out.samples[i];
      if (e.token >= 0 && !stopped[i]) {
        s.tokens.push_back(e.token);
        if (on_token && !on_token(e.index, e.token)) {
          stopped[i] = 1;
          engine.finish_sample(stream->id(), e.index, FinishReason::kStop);
        }
      }
      if (e.finish != FinishReason::kNone) s.finish = e.finish;
    }
    if (!open) break;
    KILN_CHECK_MSG(busy || !events.empty(), "[generate] the engine is idle but request {} is open", stream->id());
  }
  for (const GeneratedSample& s : out.samples)
    if (s.finish == FinishReason::kError) return internal_error("{}", stream->error());
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.spec = minus(engine.metrics().spec, before);
  out.spec.seconds = out.seconds;
  return out;
}

}  // namespace kiln
