// The enumerations of the collectives layer, each with one table: reduce ops, collective
// ops and algorithms (with the ops each algorithm implements). Names are the CLI's names.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include "kiln/core/dtype.h"

namespace kiln::comm {

enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kCount };
inline constexpr std::array<std::string_view, 3> kReduceOpNames = {"sum", "avg", "max"};
static_assert(kReduceOpNames.size() == static_cast<size_t>(ReduceOp::kCount));

enum class CollOp : uint8_t { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast, kCount };
inline constexpr std::array<std::string_view, 5> kCollOpNames = {
    "allreduce", "allgather", "reducescatter", "alltoall", "bcast"};
static_assert(kCollOpNames.size() == static_cast<size_t>(CollOp::kCount));
inline constexpr int kNumCollOps = static_cast<int>(CollOp::kCount);

enum class Algo : uint8_t {
  kAuto,               // least predicted time under the alpha-beta model
  kMpi,                // the MPI library's own collective: the peer
  kRing,               // all-reduce, all-gather, reduce-scatter
  kRecursiveDoubling,  // all-reduce (small messages), all-gather
  kRabenseifner,       // all-reduce: recursive halving reduce-scatter + doubling all-gather
  kDoubleBinaryTree,   // all-reduce: two trees, each reducing and broadcasting half
  kHierarchical,       // all-reduce: reduce-scatter in node, all-reduce across, all-gather in node
  kRecursiveHalving,   // reduce-scatter
  kPairwise,           // all-to-all: pairwise exchange, p-1 blocking steps
  kScattered,          // all-to-all: every exchange posted at once (non-blocking, windowed)
  kBinomialTree,       // broadcast
  kChain,              // broadcast: pipelined chain
  kCount
};
inline constexpr int kNumAlgos = static_cast<int>(Algo::kCount);

struct AlgoInfo {
  Algo algo;
  std::string_view name;
  // Bit i set: implements CollOp i.
  uint32_t ops;
};
constexpr uint32_t op_bit(CollOp op) { return 1u << static_cast<int>(op); }
inline constexpr uint32_t kAllOps = (1u << kNumCollOps) - 1;

inline constexpr AlgoInfo kAlgoInfos[] = {
    {Algo::kAuto, "auto", kAllOps},
    {Algo::kMpi, "mpi", kAllOps},
    {Algo::kRing, "ring",
     op_bit(CollOp::kAllReduce) | op_bit(CollOp::kAllGather) | op_bit(CollOp::kReduceScatter)},
    {Algo::kRecursiveDoubling, "recursive_doubling",
     op_bit(CollOp::kAllReduce) | op_bit(CollOp::kAllGather)},
    {Algo::kRabenseifner, "rabenseifner", op_bit(CollOp::kAllReduce)},
    {Algo::kDoubleBinaryTree, "double_binary_tree", op_bit(CollOp::kAllReduce)},
    {Algo::kHierarchical, "hierarchical", op_bit(CollOp::kAllReduce)},
    {Algo::kRecursiveHalving, "recursive_halving", op_bit(CollOp::kReduceScatter)},
    {Algo::kPairwise, "pairwise", op_bit(CollOp::kAllToAll)},
    {Algo::kScattered, "scattered", op_bit(CollOp::kAllToAll)},
    {Algo::kBinomialTree, "binomial_tree", op_bit(CollOp::kBroadcast)},
    {Algo::kChain, "chain", op_bit(CollOp::kBroadcast)},
};
static_assert(std::size(kAlgoInfos) == static_cast<size_t>(Algo::kCount),
              "every Algo needs a row in kAlgoInfos");
consteval bool algo_table_in_order() {
  for (size_t i = 0; i < std::size(kAlgoInfos); ++i)
    if (static_cast<size_t>(kAlgoInfos[i].algo) != i) return false;
  return true;
}
static_assert(algo_table_in_order(), "kAlgoInfos rows must follow the Algo enum order");

constexpr std::string_view algo_name(Algo a) { return kAlgoInfos[static_cast<int>(a)].name; }
constexpr std::string_view coll_op_name(CollOp op) { return kCollOpNames[static_cast<int>(op)]; }
constexpr std::string_view reduce_op_name(ReduceOp op) { return kReduceOpNames[static_cast<int>(op)]; }
constexpr bool algo_implements(Algo a, CollOp op) {
  return (kAlgoInfos[static_cast<int>(a)].ops & op_bit(op)) != 0;
}
constexpr bool is_reducing(CollOp op) {
  return op == CollOp::kAllReduce || op == CollOp::kReduceScatter;
}

std::optional<Algo> parse_algo(std::string_view name);
std::optional<CollOp> parse_coll_op(std::string_view name);
std::optional<ReduceOp> parse_reduce_op(std::string_view name);

// The dtypes the collectives move and reduce (16-bit floats are reduced in f32).
constexpr bool is_collective_dtype(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}

}  // namespace kiln::comm
