// Tensor-parallel serving's step broadcast (tensor_parallel.h).
#include "kiln/serve/tensor_parallel.h"

#include "kiln/model/packed_linear.h"

#include <mpi.h>

#include <chrono>
#include <thread>

namespace kiln {

namespace {
// The steps' messages on the tp communicator: a header of six int64 (op and its sizes), then
// for a forward one int32 payload: tokens, num_cached, num_new, the block table, logit rows.
constexpr int kTagHeader = 0x7e51, kTagPayload = 0x7e52;
enum Op : int64_t { kCache = 1, kForward = 2, kCopy = 3, kStop = 4 };

[[noreturn]] void mpi_failed(const char* what) { comm::abort_job(fmt::format("tensor-parallel serving: {} failed", what)); }
}  // namespace

Expected<std::unique_ptr<Transformer>> shard_for_serving(Transformer& full, comm::Communicator& world, int tp,
                                                         const quant::QuantizedState* quantized) {
  if (tp != world.size())
    return invalid_argument("--tp {} must be the number of ranks (mpirun -np {}): one tensor-parallel group serves", tp,
                            world.size());
  if (Status s = check_tensor_split(full.config(), tp); !s.ok()) return invalid_argument("--tp {}: {}", tp, s.message());
  for (Linear* l : full.linears())
    if (l->backend != nullptr && (quantized == nullptr || !quantized->weights.contains(l->name)))
      return invalid_argument("--tp: {} has a backend other than its quantized weight, which cannot be sliced", l->name);
  TensorShard shard;
  shard.rank = world.rank();
  shard.size = tp;
  shard.comm = tp > 1 ? &world : nullptr;
  KILN_ASSIGN_OR_RETURN(auto model, Transformer::create(full.config(), 0, shard));
  model->load_from_full(full.params());  // a quantized model's masters hold its dequantized weights
  if (quantized != nullptr && !quantized->weights.empty()) {
    auto sliced = quant::shard_quantized_state(*quantized, model->param_entries());
    if (!sliced.ok()) return invalid_argument("--tp {}: {}", tp, sliced.status().message());
    quant::install_backends(*model, *sliced);
  }
  return model;
}

TensorParallelLeader::~TensorParallelLeader() { send({kStop, 0, 0, 0, 0, 0}, {}); }

void TensorParallelLeader::send(const int64_t (&header)[6], const std::vector<int32_t>& payload) {
  for (int r = 1; r < tp_.size(); ++r) {
    if (MPI_Send(header, 6, MPI_INT64_T, r, kTagHeader, tp_.handle()) != MPI_SUCCESS) mpi_failed("a step header");
    if (!payload.empty() &&
        MPI_Send(payload.data(), static_cast<int>(payload.size()), MPI_INT32_T, r, kTagPayload, tp_.handle()) != MPI_SUCCESS)
      mpi_failed("a step payload");
  }
}

void TensorParallelLeader::cache(int64_t num_blocks, int64_t block_size, bool packed_weights) {
  send({kCache, num_blocks, block_size, packed_weights ? 1 : 0, 0, 0}, {});
}

void TensorParallelLeader::copy_block(int32_t src, int32_t dst, int64_t num_tokens) {
  send({kCopy, src, dst, num_tokens, 0, 0}, {});
}

void TensorParallelLeader::forward(const PagedBatch& b) {
  payload_.clear();
  for (std::span<const int32_t> part : {b.tokens, b.num_cached, b.num_new, b.block_table, b.logit_rows})
    payload_.insert(payload_.end(), part.begin(), part.end());
  send({kForward, static_cast<int64_t>(b.tokens.size()), static_cast<int64_t>(b.num_new.size()), b.max_blocks_per_seq,
        static_cast<int64_t>(b.logit_rows.size()), 0},
       payload_);
}

Status follow_tensor_parallel_steps(Transformer& model) {
  comm::Communicator* tp = model.tensor_shard().comm;
  if (tp == nullptr || tp->rank() == 0) return invalid_argument("[serve] only tp ranks 1.. follow rank 0's steps");
  PagedKvCache cache;
  std::vector<int32_t> payload;
  for (;;) {
    int64_t h[6] = {};
    MPI_Request req;
    if (MPI_Irecv(h, 6, MPI_INT64_T, 0, kTagHeader, tp->handle(), &req) != MPI_SUCCESS) mpi_failed("a step header");
    // Idle servers wait here: poll and sleep, so a waiting rank leaves the cores to rank 0's
    // HTTP threads (a spinning receive would take one of them). Between the steps of a busy
    // engine the sleeps stay short (at most 50 us late to the step's first collective); after
    // 100 ms without a step they grow to 1 ms.
    const auto idle_since = std::chrono::steady_clock::now();
    for (int flag = 0, sleep_us = 5;;) {
      if (MPI_Test(&req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) mpi_failed("waiting for a step");
      if (flag) break;
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      const bool idle = std::chrono::steady_clock::now() - idle_since > std::chrono::milliseconds(100);
      sleep_us = std::min(sleep_us * 2, idle ? 1000 : 50);
    }
    switch (h[0]) {
      case kStop:
        return {};
      case kCache:
        cache = model.make_paged_kv_cache(h[1], h[2]);
        if (h[3] != 0) install_packed_weights(model);  // as rank 0's engine did: the ranks keep pace
        break;
      case kCopy:
        cache.copy_block(static_cast<int32_t>(h[1]), static_cast<int32_t>(h[2]), h[3]);
        break;
      case kForward: {
        const int64_t N = h[1], S = h[2], maxb = h[3], M = h[4];
        payload.resize(static_cast<size_t>(N + 2 * S + S * maxb + M));
        if (MPI_Recv(payload.data(), static_cast<int>(payload.size()), MPI_INT32_T, 0, kTagPayload, tp->handle(),
                     MPI_STATUS_IGNORE) != MPI_SUCCESS)
          mpi_failed("a step payload");
        const int32_t* p = payload.data();
        PagedBatch b;
        b.tokens = {p, static_cast<size_t>(N)};
        b.num_cached = {p + N, static_cast<size_t>(S)};
        b.num_new = {p + N + S, static_cast<size_t>(S)};
        b.block_table = {p + N + 2 * S, static_cast<size_t>(S * maxb)};
        b.max_blocks_per_seq = maxb;
        b.logit_rows = {p + N + 2 * S + S * maxb, static_cast<size_t>(M)};
        (void)model.forward_paged(b, cache);  // an error is rank 0's too, on the same batch
        break;
      }
      default:
        return internal_error("[serve] unknown tensor-parallel step {}", h[0]);
    }
  }
}

}  // namespace kiln
