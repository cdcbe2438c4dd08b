// The public collectives: argument checks (the same verdict on every rank, before any
// message), `auto` resolution, and dispatch to the algorithm; MPI types for the peer.
#include "kiln/comm/collectives.h"

#include <climits>
#include <cstring>

#include "kiln/comm/cost_model.h"
#include "kiln/comm/detail.h"
#include "kiln/comm/work.h"
#include "kiln/core/trace.h"

namespace kiln::comm {

std::optional<Algo> parse_algo(std::string_view name) {
  for (const AlgoInfo& info : kAlgoInfos)
    if (info.name == name) return info.algo;
  return std::nullopt;
}
std::optional<CollOp> parse_coll_op(std::string_view name) {
  for (int i = 0; i < kNumCollOps; ++i)
    if (kCollOpNames[i] == name) return static_cast<CollOp>(i);
  return std::nullopt;
}
std::optional<ReduceOp> parse_reduce_op(std::string_view name) {
  for (size_t i = 0; i < kReduceOpNames.size(); ++i)
    if (kReduceOpNames[i] == name) return static_cast<ReduceOp>(i);
  return std::nullopt;
}

namespace detail {
namespace {

void combine_mpi(void* in, void* inout, int* len, DType dtype, ReduceOp op) {
  combine(dtype, op, inout, inout, in, static_cast<size_t>(*len));
}
void bf16_sum(void* in, void* io, int* n, MPI_Datatype*) { combine_mpi(in, io, n, DType::kBF16, ReduceOp::kSum); }
void bf16_max(void* in, void* io, int* n, MPI_Datatype*) { combine_mpi(in, io, n, DType::kBF16, ReduceOp::kMax); }
void f16_sum(void* in, void* io, int* n, MPI_Datatype*) { combine_mpi(in, io, n, DType::kF16, ReduceOp::kSum); }
void f16_max(void* in, void* io, int* n, MPI_Datatype*) { combine_mpi(in, io, n, DType::kF16, ReduceOp::kMax); }

struct MpiHalfTypes {
  MPI_Datatype half = MPI_DATATYPE_NULL;
  MPI_Op ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  MpiHalfTypes() {
    MPI_Type_contiguous(2, MPI_BYTE, &half);
    MPI_Type_commit(&half);
    MPI_Op_create(bf16_sum, 1, &ops[0]);
    MPI_Op_create(bf16_max, 1, &ops[1]);
    MPI_Op_create(f16_sum, 1, &ops[2]);
    MPI_Op_create(f16_max, 1, &ops[3]);
  }
};
MpiHalfTypes& half_types() {
  static MpiHalfTypes t;  // created after MPI_Init, on first use; freed by MPI_Finalize
  return t;
}

}  // namespace

Status check_dtype(const char* name, DType dtype) {
  if (!is_collective_dtype(dtype))
    return unimplemented("[{}] dtype {} is not supported (f32, bf16, f16)", name,
                         dtype_name(dtype));
  return Status::ok_status();
}

MPI_Datatype mpi_type(DType dtype) {
  return dtype == DType::kF32 ? MPI_FLOAT : half_types().half;
}

MPI_Op mpi_op(DType dtype, ReduceOp op) {
  const bool max = op == ReduceOp::kMax;
  if (dtype == DType::kF32) return max ? MPI_MAX : MPI_SUM;
  return half_types().ops[(dtype == DType::kF16 ? 2 : 0) + (max ? 1 : 0)];
}

}  // namespace detail

namespace {

using detail::RedSpec;

Status check_common(const char* name, const Communicator& comm, int64_t count, DType dtype,
                    int64_t messages_per_block) {
  KILN_RETURN_IF_ERROR(detail::check_dtype(name, dtype));
  if (count < 0) return invalid_argument("[{}] count must be >= 0, got {}", name, count);
  // One message carries at most a block (or the whole vector for the folding algorithms).
  const int64_t bytes = dtype_nbytes(dtype, count) * messages_per_block;
  if (bytes > INT_MAX)
    return out_of_range("[{}] {} elements of {} on {} ranks: {} bytes in one message (limit 2 GiB)",
                        name, count, dtype_name(dtype), comm.size(), bytes);
  return Status::ok_status();
}

Status check_algo(const char* name, Algo algo, CollOp op) {
  if (!algo_implements(algo, op))
    return invalid_argument("[{}] algorithm {} does not implement {}", name, algo_name(algo),
                            coll_op_name(op));
  return Status::ok_status();
}

RedSpec spec_of(DType dtype, ReduceOp op) {
  return {dtype, op == ReduceOp::kAvg ? ReduceOp::kSum : op, static_cast<size_t>(dtype_bits(dtype) / 8)};
}

}  // namespace

Algo resolve_algo(Communicator& comm, CollOp op, int64_t nbytes_total) {
  auto& cache = comm.auto_cache();
  if (auto it = cache.find(detail::auto_key(op, nbytes_total)); it != cache.end())
    return detail::cached_algo(it->second);
  return detail::auto_choice(comm, op, nbytes_total).algo;
}

AutoChoice auto_choice(Communicator& comm, CollOp op, int64_t nbytes_total) {
  return detail::auto_choice(comm, op, nbytes_total);
}

namespace {

// Runs `run(algo)`, resolving `auto` first (auto_probe.h) and reporting a probe call's end.
// Each call is one comm event (core/trace.h) on the thread that runs it, named by the op, with
// the algorithm that ran, the nccl-tests size and the ranks.
template <class Run>
void run_resolved(Communicator& comm, CollOp op, int64_t nbytes_total, Algo algo, Run&& run) {
  const char* name = coll_op_name(op).data();  // the names are literals
  auto traced = [&](Algo a) {
    trace::Scope ts(trace::Category::kComm, name, [&](trace::Event& e) {
      describe_comm(e, comm, name, algo_name(a).data(), static_cast<double>(nbytes_total));
    });
    run(a);
  };
  if (algo != Algo::kAuto) {
    traced(algo);
    return;
  }
  const detail::AutoTicket t = detail::auto_begin(comm, op, nbytes_total);
  traced(t.algo);
  detail::auto_finish(comm, op, t);
}

}  // namespace

Status all_reduce(Communicator& comm, const void* send, void* recv, int64_t count, DType dtype,
                  ReduceOp op, Algo algo) {
  if (Status routed; detail::run_on_comm_thread(comm, routed, [&] { return all_reduce(comm, send, recv, count, dtype, op, algo); })) return routed;
  KILN_RETURN_IF_ERROR(check_common("all_reduce", comm, count, dtype, 1));
  KILN_RETURN_IF_ERROR(check_algo("all_reduce", algo, CollOp::kAllReduce));
  if (count == 0) return Status::ok_status();
  const RedSpec s = spec_of(dtype, op);
  const int avg = op == ReduceOp::kAvg ? comm.size() : 0;
  auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  run_resolved(comm, CollOp::kAllReduce, count * s.esize, algo, [&](Algo algo) {
    switch (algo) {
      case Algo::kMpi: detail::allreduce_mpi(comm, in, out, count, s, avg); break;
      case Algo::kRing: detail::allreduce_ring(comm, in, out, count, s, avg); break;
      case Algo::kRecursiveDoubling: detail::allreduce_recursive_doubling(comm, in, out, count, s, avg); break;
      case Algo::kRabenseifner: detail::allreduce_rabenseifner(comm, in, out, count, s, avg); break;
      case Algo::kDoubleBinaryTree: detail::allreduce_double_binary_tree(comm, in, out, count, s, avg); break;
      case Algo::kHierarchical: detail::allreduce_hierarchical(comm, in, out, count, s, avg); break;
      default: KILN_CHECK_MSG(false, "all_reduce: unhandled algorithm {}", algo_name(algo));
    }
  });
  return Status::ok_status();
}

Status all_gather(Communicator& comm, const void* send, void* recv, int64_t count_per_rank,
                  DType dtype, Algo algo) {
  if (Status routed; detail::run_on_comm_thread(comm, routed, [&] { return all_gather(comm, send, recv, count_per_rank, dtype, algo); })) return routed;
  KILN_RETURN_IF_ERROR(check_common("all_gather", comm, count_per_rank, dtype, comm.size()));
  KILN_RETURN_IF_ERROR(check_algo("all_gather", algo, CollOp::kAllGather));
  if (count_per_rank == 0) return Status::ok_status();
  const size_t es = dtype_bits(dtype) / 8;
  auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  run_resolved(comm, CollOp::kAllGather, count_per_rank * es * comm.size(), algo, [&](Algo algo) {
    switch (algo) {
      case Algo::kMpi: detail::allgather_mpi(comm, in, out, count_per_rank, es); break;
      case Algo::kRing: detail::allgather_ring(comm, in, out, count_per_rank, es); break;
      case Algo::kRecursiveDoubling: detail::allgather_recursive_doubling(comm, in, out, count_per_rank, es); break;
      default: KILN_CHECK_MSG(false, "all_gather: unhandled algorithm {}", algo_name(algo));
    }
  });
  return Status::ok_status();
}

Status reduce_scatter(Communicator& comm, const void* send, void* recv, int64_t count_per_rank,
                      DType dtype, ReduceOp op, Algo algo) {
  if (Status routed; detail::run_on_comm_thread(comm, routed, [&] { return reduce_scatter(comm, send, recv, count_per_rank, dtype, op, algo); })) return routed;
  KILN_RETURN_IF_ERROR(check_common("reduce_scatter", comm, count_per_rank, dtype, comm.size()));
  KILN_RETURN_IF_ERROR(check_algo("reduce_scatter", algo, CollOp::kReduceScatter));
  if (count_per_rank == 0) return Status::ok_status();
  const RedSpec s = spec_of(dtype, op);
  const int avg = op == ReduceOp::kAvg ? comm.size() : 0;
  auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  run_resolved(comm, CollOp::kReduceScatter, count_per_rank * s.esize * comm.size(), algo, [&](Algo algo) {
    switch (algo) {
      case Algo::kMpi: detail::reducescatter_mpi(comm, in, out, count_per_rank, s, avg); break;
      case Algo::kRing: detail::reducescatter_ring(comm, in, out, count_per_rank, s, avg); break;
      case Algo::kRecursiveHalving: detail::reducescatter_recursive_halving(comm, in, out, count_per_rank, s, avg); break;
      default: KILN_CHECK_MSG(false, "reduce_scatter: unhandled algorithm {}", algo_name(algo));
    }
  });
  return Status::ok_status();
}

Status all_to_all(Communicator& comm, const void* send, void* recv, int64_t count_per_rank,
                  DType dtype, Algo algo) {
  if (Status routed; detail::run_on_comm_thread(comm, routed, [&] { return all_to_all(comm, send, recv, count_per_rank, dtype, algo); })) return routed;
  KILN_RETURN_IF_ERROR(check_common("all_to_all", comm, count_per_rank, dtype, comm.size()));
  KILN_RETURN_IF_ERROR(check_algo("all_to_all", algo, CollOp::kAllToAll));
  if (count_per_rank == 0) return Status::ok_status();
  const size_t es = dtype_bits(dtype) / 8;
  auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  run_resolved(comm, CollOp::kAllToAll, count_per_rank * es * comm.size(), algo, [&](Algo algo) {
    switch (algo) {
      case Algo::kMpi: detail::alltoall_mpi(comm, in, out, count_per_rank, es); break;
      case Algo::kPairwise: detail::alltoall_pairwise(comm, in, out, count_per_rank, es); break;
      case Algo::kScattered: detail::alltoall_scattered(comm, in, out, count_per_rank, es); break;
      default: KILN_CHECK_MSG(false, "all_to_all: unhandled algorithm {}", algo_name(algo));
    }
  });
  return Status::ok_status();
}

Status broadcast(Communicator& comm, void* buf, int64_t count, DType dtype, int root, Algo algo) {
  if (Status routed; detail::run_on_comm_thread(comm, routed, [&] { return broadcast(comm, buf, count, dtype, root, algo); })) return routed;
  KILN_RETURN_IF_ERROR(check_common("broadcast", comm, count, dtype, 1));
  KILN_RETURN_IF_ERROR(check_algo("broadcast", algo, CollOp::kBroadcast));
  if (root < 0 || root >= comm.size())
    return invalid_argument("[broadcast] root {} is not a rank of a communicator of size {}", root,
                            comm.size());
  if (count == 0) return Status::ok_status();
  const size_t nbytes = dtype_nbytes(dtype, count);
  auto* b = static_cast<std::byte*>(buf);
  run_resolved(comm, CollOp::kBroadcast, nbytes, algo, [&](Algo algo) {
    switch (algo) {
      case Algo::kMpi: detail::bcast_mpi(comm, b, nbytes, root); break;
      case Algo::kBinomialTree: detail::bcast_binomial(comm, b, nbytes, root); break;
      case Algo::kChain: detail::bcast_chain(comm, b, nbytes, root); break;
      default: KILN_CHECK_MSG(false, "broadcast: unhandled algorithm {}", algo_name(algo));
    }
  });
  return Status::ok_status();
}

}  // namespace kiln::comm
