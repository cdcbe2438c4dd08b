// Where a disaggregated serving engine's prompts are prefilled: the engine (serve/engine.h)
// hands a sequence's prompt, less its last token, to a RemotePrefill, which computes its K/V
// elsewhere and writes it back, layer by layer, into the sequence's blocks; the engine then runs
// the last prompt token itself (its logits give the first sample, with the request's own
// generator). serve/disaggregated.h implements it over MPI; tests use an in-process one.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

class RemotePrefill {
 public:
  virtual ~RemotePrefill() = default;

  // One layer's K rows (and V rows; null for latent attention, whose cache has no V) of a
  // sequence's positions [pos, pos + n): the engine copies them into the sequence's blocks.
  using KvWriter =
      std::function<void(int64_t seq_id, int64_t layer, int64_t pos, int64_t n, const float* k, const float* v)>;

  // Starts computing the K/V of `tokens` (positions 0..) for sequence seq_id. False when no
  // prefill worker can take it: the engine prefills the sequence itself.
  virtual bool submit(int64_t seq_id, std::span<const int32_t> tokens) = 0;
  // Forget a sequence (aborted): what still arrives for it is dropped. Unknown ids are ignored.
  virtual void cancel(int64_t seq_id) = 0;

  struct Progress {
    std::vector<int64_t> done;                            // every row of these sequences was written
    std::vector<std::pair<int64_t, std::string>> failed;  // sequences that will not get their K/V, and why
  };
  // Writes what has arrived through `write` and reports sequences completed or failed; does not
  // wait for anything.
  virtual void poll(const KvWriter& write, Progress& progress) = 0;
  // Sequences submitted and neither done nor failed nor cancelled.
  virtual int64_t num_pending() const = 0;

  struct Stats {
    int64_t submitted = 0, completed = 0, failed = 0;
    int64_t bytes = 0;  // K/V payload received
    int workers = 0, workers_alive = 0;
  };
  virtual Stats stats() const = 0;
  virtual std::string describe() const = 0;
};

}  // namespace kiln
