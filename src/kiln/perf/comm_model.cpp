// The collectives' cost model on topologies. Each algorithm's time is a sum of alpha-beta
// terms per step, with the link that step crosses: NVLink inside a node, the GPU's own NIC
// across nodes, one torus link per hop. Link figures are the vendors' published per-direction
// bandwidths; latencies are assumptions (stated in the table) of a few microseconds; local-shm is
// this VM's shared memory as the collectives layer measured it.
// One model with the collectives layer's: where every step crosses the same link (one switched
// node), an algorithm's steps and bytes are comm::algo_cost's, the terms `auto` selects with on
// this machine; across nodes and on tori the steps are priced per link as below.
#include "kiln/perf/comm_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include "kiln/comm/cost_model.h"
#include "kiln/comm/detail.h"

namespace kiln::perf {
namespace {

constexpr double kGB = 1e9;
// H100 SXM dense BF16 tensor-core peak (NVIDIA's datasheet: 1,979 TFLOP/s with 2:4 sparsity).
constexpr double kH100Flops = 989e12;

int ceil_log2(int x) {
  int l = 0;
  while ((1 << l) < x) ++l;
  return l;
}
int floor_pow2(int p) {
  int q = 1;
  while (q * 2 <= p) q *= 2;
  return q;
}

LinkSpec vader_link() {
  const comm::AlphaBeta ab = comm::AlphaBetaTable{}.link;
  return {1.0 / ab.beta_s_per_byte, ab.alpha_s};
}

struct Step {
  double alpha, bw;
};

using comm::Algo;
std::string name_of(Algo a) { return std::string(comm::algo_name(a)); }

comm::CollOp coll_op_of(ModelOp op) {
  switch (op) {
    case ModelOp::kAllReduce: return comm::CollOp::kAllReduce;
    case ModelOp::kAllGather: return comm::CollOp::kAllGather;
    case ModelOp::kReduceScatter: return comm::CollOp::kReduceScatter;
    case ModelOp::kAllToAll: return comm::CollOp::kAllToAll;
  }
  return comm::CollOp::kAllReduce;
}

// The collectives layer's terms priced on one link (the reduction's arithmetic is not a link
// cost: GPUs reduce at far above link speed).
double on_one_link(ModelOp op, Algo a, int p, double n, const Step& link) {
  const comm::AlgoCost c = comm::algo_cost(coll_op_of(op), a, p, n);
  return c.steps * link.alpha + c.bw_bytes / link.bw;
}

CommPrediction make(std::string algo, double seconds, double nbytes, ModelOp op, int p,
                    std::string note = "") {
  CommPrediction c;
  c.algo = std::move(algo);
  c.seconds = seconds;
  c.algbw = nbytes / seconds;
  c.busbw = c.algbw * busbw_factor(op, p);
  c.note = std::move(note);
  return c;
}

}  // namespace

const std::vector<Topology>& topologies() {
  static const std::vector<Topology> kTopologies = {
      {"h100-node", "one node: 8 x H100 SXM, NVLink 4 through NVSwitch, 450 GB/s per direction "
                    "per GPU, alpha 2 us (assumed)",
       TopologyKind::kSwitched, 8, {450 * kGB, 2e-6}, {450 * kGB, 2e-6}, 0, {}, 8, kH100Flops},
      {"h100-ib", "nodes of 8 x H100 (NVLink 450 GB/s) joined by one 400 Gb/s (50 GB/s) "
                  "InfiniBand NIC per GPU, rail-optimized non-blocking fat tree; alpha 2 us in "
                  "node, 5 us across (assumed)",
       TopologyKind::kSwitched, 8, {450 * kGB, 2e-6}, {50 * kGB, 5e-6}, 0, {}, 65536, kH100Flops},
      // Megatron-LM's 2019 scaling runs (kiln plan tp): DGX-2H servers of 16 V100 SXM3; its
      // blog gives "300 GB/sec bandwidth between GPUs inside a server" (6 NVLink 2 links x 25
      // GB/s each way) and 39 TFLOP/s as 30% of a GPU's peak, so ~130 TFLOP/s.
      {"dgx2-v100", "one DGX-2H: 16 x V100 SXM3, NVLink 2 through NVSwitch, 150 GB/s per "
                    "direction per GPU, alpha 3 us (assumed)",
       TopologyKind::kSwitched, 16, {150 * kGB, 3e-6}, {150 * kGB, 3e-6}, 0, {}, 16, 130e12},
      {"tpu-torus-2d", "TPU-style 2D torus (4 links per chip), 50 GB/s per link per direction, "
                       "alpha 1 us per hop (assumed)",
       TopologyKind::kTorus, 1, {}, {}, 2, {50 * kGB, 1e-6}, 65536, 0},
      {"tpu-torus-3d", "TPU-style 3D torus (6 links per chip, as TPU v4/v5p), 50 GB/s per link "
                       "per direction, alpha 1 us per hop (assumed)",
       TopologyKind::kTorus, 1, {}, {}, 3, {50 * kGB, 1e-6}, 65536, 0},
      // This VM (`kiln plan cp --check`): MPI ranks over OpenMPI's shared memory. The link is the
      // collectives layer's ping-pong fit on it (comm/cost_model.h's AlphaBetaTable defaults).
      {"local-shm", "this machine: MPI ranks over OpenMPI shared memory (vader), alpha 1 us and "
                    "8 GB/s per direction (the collectives layer's ping-pong fit, comm/cost_model.h)",
       TopologyKind::kSwitched, 64, vader_link(), vader_link(), 0, {}, 64, 0},
  };
  return kTopologies;
}

std::optional<Topology> find_topology(std::string_view name) {
  for (const Topology& t : topologies())
    if (t.name == name) return t;
  return std::nullopt;
}

Expected<Topology> find_topology_or_error(std::string_view name) {
  if (auto t = find_topology(name)) return *t;
  std::string names;
  for (const Topology& t : topologies()) names += (names.empty() ? "" : ", ") + std::string(t.name);
  return invalid_argument("unknown topology {} (known: {})", name, names);
}

std::optional<ModelOp> parse_model_op(std::string_view name) {
  if (name == "allreduce") return ModelOp::kAllReduce;
  if (name == "allgather") return ModelOp::kAllGather;
  if (name == "reducescatter") return ModelOp::kReduceScatter;
  if (name == "alltoall") return ModelOp::kAllToAll;
  return std::nullopt;
}

std::string_view model_op_name(ModelOp op) {
  switch (op) {
    case ModelOp::kAllReduce: return "allreduce";
    case ModelOp::kAllGather: return "allgather";
    case ModelOp::kReduceScatter: return "reducescatter";
    case ModelOp::kAllToAll: return "alltoall";
  }
  return "?";
}

double busbw_factor(ModelOp op, int p) {
  return op == ModelOp::kAllReduce ? 2.0 * (p - 1) / p : (p - 1.0) / p;
}

std::vector<int> torus_shape(int p, int dims) {
  std::vector<int> shape;
  int rest = p;
  for (int i = dims; i >= 1; --i) {
    if (i == 1) {
      shape.push_back(rest);
      break;
    }
    // The divisor of `rest` closest to rest^(1/i).
    const double target = std::pow(static_cast<double>(rest), 1.0 / i);
    int best = 1;
    for (int d = 1; d <= rest; ++d) {
      if (static_cast<double>(d) * d > 4.0 * rest) break;
      if (rest % d == 0 && std::abs(d - target) < std::abs(best - target)) best = d;
    }
    shape.push_back(best);
    rest /= best;
  }
  std::sort(shape.rbegin(), shape.rend());
  return shape;
}

double bisection_bandwidth(const Topology& t, int p) {
  if (t.kind == TopologyKind::kSwitched) {
    // Non-blocking switches: half the ranks talk to the other half at full injection rate.
    return (p / 2.0) * (p <= t.ranks_per_node ? t.intra.bw_bytes_per_s : t.inter.bw_bytes_per_s);
  }
  const std::vector<int> shape = torus_shape(p, t.torus_dims);
  const int k = shape.front();  // cut across the longest dimension
  const double links = (k > 2 ? 2.0 : 1.0) * (static_cast<double>(p) / k);  // wrap-around doubles
  return links * t.torus_link.bw_bytes_per_s;
}

Expected<std::vector<CommPrediction>> predict_comm(const Topology& t, ModelOp op, int p,
                                                   double n) {
  if (p < 2 || p > t.max_ranks)
    return invalid_argument("[plan comm] topology {} takes 2..{} ranks, got {}", t.name,
                            t.max_ranks, p);
  if (!(n > 0)) return invalid_argument("[plan comm] size must be > 0 bytes, got {}", n);
  std::vector<CommPrediction> out;
  const double fp = (p - 1.0) / p;
  const int p2 = floor_pow2(p);

  if (t.kind == TopologyKind::kSwitched) {
    const int g = t.ranks_per_node;
    const bool multi = p > g;
    const int nodes = (p + g - 1) / g;
    const Step in{t.intra.latency_s, t.intra.bw_bytes_per_s};
    const Step across{t.inter.latency_s, t.inter.bw_bytes_per_s};
    // A ring crosses nodes through g NICs at once (one ring per rail), NVLink inside.
    const Step ring{multi ? across.alpha : in.alpha,
                    multi ? std::min(in.bw, g * across.bw) : in.bw};
    const std::string ring_note = multi ? "NICs bound it (8 rails x 50 GB/s)" : "NVLink";
    // Recursive halving / doubling: the partner at distance d is in another node when d >= g.
    auto halving = [&](double bytes0) {  // one pass: distances p2/2 .. 1, bytes halving
      double s = 0, bytes = bytes0;
      for (int d = p2 / 2; d >= 1; d /= 2) {
        bytes /= 2;
        const Step& st = (multi && d >= g) ? across : in;
        s += st.alpha + bytes / st.bw;
      }
      return s;
    };
    const double fold = p > p2 ? 2 * (in.alpha + n / in.bw) : 0;  // neighbours share a node
    if (op == ModelOp::kAllReduce) {
      out.push_back(make(name_of(Algo::kRing), multi ? 2 * (p - 1) * ring.alpha + 2 * fp * n / ring.bw
                                                      : on_one_link(op, Algo::kRing, p, n, in),
                         n, op, p, ring_note));
      // NCCL-style tree: binary trees across nodes (alpha_inter per level), in-node levels on
      // NVLink; each rank moves ~2n in total.
      const int levels = ceil_log2(p), inter_levels = multi ? ceil_log2(nodes) : 0;
      const double tree_alpha = inter_levels * across.alpha + (levels - inter_levels) * in.alpha;
      out.push_back(make(name_of(Algo::kDoubleBinaryTree), 2 * tree_alpha + 2 * n / ring.bw, n, op, p,
                         "NCCL-style trees, depth lg p: latency grows like lg p"));
      out.push_back(make(name_of(Algo::kRabenseifner),
                         multi ? 2 * halving(n) + fold : on_one_link(op, Algo::kRabenseifner, p, n, in), n, op, p,
                         multi ? "far partners use one NIC (50 GB/s)" : "NVLink"));
      double doubling = fold;  // lg p rounds, the whole vector each
      for (int d = p2 / 2; d >= 1; d /= 2) {
        const Step& st = (multi && d >= g) ? across : in;
        doubling += st.alpha + n / st.bw;
      }
      out.push_back(make(name_of(Algo::kRecursiveDoubling),
                         multi ? doubling : on_one_link(op, Algo::kRecursiveDoubling, p, n, in), n, op, p,
                         "the whole vector every round: for small messages"));
      if (multi) {
        // Reduce-scatter in the node (NVLink), all-reduce of the 1/g shard across nodes on the
        // GPU's own NIC, all-gather in the node. The phases overlap in chunks (as NCCL's do),
        // so the latency terms add and the bandwidth term is the slower of the two links.
        const double shard = n / g;
        const double intra_bw = 2 * (g - 1.0) / g * n / in.bw;
        const double ring_bw = 2.0 * (nodes - 1) / nodes * shard / across.bw;
        const double tree_bw = 2 * shard / across.bw;
        const double inter_ring = 2 * (nodes - 1) * across.alpha + std::max(intra_bw, ring_bw);
        const double inter_tree = 2 * ceil_log2(nodes) * across.alpha + std::max(intra_bw, tree_bw);
        const bool tree_wins = inter_tree < inter_ring;
        out.push_back(make(name_of(Algo::kHierarchical), 2 * (g - 1) * in.alpha + std::min(inter_ring, inter_tree),
                           n, op, p,
                           tree_wins ? "RS/AG in node, tree across nodes: 2(g-1) + 2 lg N steps"
                                     : "RS/AG in node, ring across nodes: 2(g-1) + 2(N-1) steps"));
      }
    } else if (op == ModelOp::kAllGather || op == ModelOp::kReduceScatter) {
      out.push_back(make(name_of(Algo::kRing), multi ? (p - 1) * ring.alpha + fp * n / ring.bw
                                                      : on_one_link(op, Algo::kRing, p, n, in),
                         n, op, p, ring_note));
      const Algo rd = op == ModelOp::kAllGather ? Algo::kRecursiveDoubling : Algo::kRecursiveHalving;
      out.push_back(make(name_of(rd), multi ? halving(n) + fold / 2 : on_one_link(op, rd, p, n, in), n, op, p,
                         multi ? "far partners use one NIC (50 GB/s)" : "NVLink"));
    } else {  // all-to-all: pairwise (p - 1 exchanges in turn) or scattered (a window at once)
      const double inter_part = multi ? static_cast<double>(p - g) / p * n / across.bw : 0;
      const double intra_part = (std::min(p, g) - 1.0) / p * n / in.bw;
      const double bisect = p * n / 4 / bisection_bandwidth(t, p);
      for (const Algo a : {Algo::kPairwise, Algo::kScattered}) {
        const double steps = comm::algo_cost(comm::CollOp::kAllToAll, a, p, n).steps;
        const double injection = steps * (multi ? across.alpha : in.alpha) + std::max(inter_part, intra_part);
        out.push_back(make(name_of(a), std::max(injection, bisect), n, op, p,
                           bisect > injection ? "bisection-bound" : "injection-bound"));
      }
    }
    return out;
  }

  // Torus: bidirectional rings use both directions of a link (2 x its bandwidth).
  const std::vector<int> shape = torus_shape(p, t.torus_dims);
  const double a = t.torus_link.latency_s, B = t.torus_link.bw_bytes_per_s;
  std::string shape_s;
  for (int k : shape) shape_s += (shape_s.empty() ? "" : "x") + std::to_string(k);
  // Dimension-ordered rings: reduce-scatter along each dimension in turn on a shrinking shard.
  auto dim_rings = [&]() {
    double s = 0, bytes = n;
    for (int k : shape) {
      if (k > 1) s += (k - 1) * a + (k - 1.0) / k * bytes / (2 * B);
      bytes /= k;
    }
    return s;
  };
  if (op == ModelOp::kAllReduce) {
    out.push_back(make(name_of(Algo::kRing), 2 * (p - 1) * a + 2 * fp * n / (2 * B), n, op, p,
                       "one ring snaking through all " + shape_s + " chips"));
    out.push_back(make("torus_rings", 2 * dim_rings(), n, op, p,
                       "a bidirectional ring per dimension of " + shape_s));
    out.push_back(make(name_of(Algo::kDoubleBinaryTree), 2 * ceil_log2(p) * a + 2 * n / B, n, op, p,
                       "depth lg p, one link per edge"));
    const double fold = p > p2 ? 2 * (a + n / B) : 0;
    out.push_back(make(name_of(Algo::kRecursiveDoubling), std::log2(p2) * (a + n / B) + fold, n, op, p,
                       "the whole vector every round; assumes far partners' paths do not contend"));
    out.push_back(make(name_of(Algo::kRabenseifner), 2 * std::log2(p2) * a + 2.0 * (p2 - 1) / p2 * n / B + fold,
                       n, op, p, "assumes far partners' paths do not contend"));
  } else if (op == ModelOp::kAllGather || op == ModelOp::kReduceScatter) {
    out.push_back(make(name_of(Algo::kRing), (p - 1) * a + fp * n / (2 * B), n, op, p, "one ring through all chips"));
    const double fold = p > p2 ? a + n / B : 0;
    out.push_back(make(name_of(op == ModelOp::kAllGather ? Algo::kRecursiveDoubling : Algo::kRecursiveHalving),
                       std::log2(p2) * a + (p2 - 1.0) / p2 * n / B + fold, n, op, p,
                       "assumes far partners' paths do not contend"));
    out.push_back(make("torus_rings", dim_rings(), n, op, p, "a ring per dimension of " + shape_s));
  } else {
    const double inj = 2.0 * t.torus_dims * B;  // every link of the chip
    const double bisect = p * n / 4 / bisection_bandwidth(t, p);
    for (const Algo alg : {Algo::kPairwise, Algo::kScattered}) {
      const double injection = comm::algo_cost(comm::CollOp::kAllToAll, alg, p, n).steps * a + fp * n / inj;
      out.push_back(make(name_of(alg), std::max(injection, bisect), n, op, p,
                         bisect > injection ? "bisection-bound (" + shape_s + ")" : "injection-bound"));
    }
  }
  return out;
}

Expected<double> parse_bytes(std::string_view text) {
  std::string s(text);
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    return invalid_argument("[plan comm] size '{}' is not a number of bytes", text);
  }
  std::string unit = s.substr(pos);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kib") mult = 1024.0;
  else if (unit == "m" || unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "gb") mult = 1e9;
  else return invalid_argument("[plan comm] unknown size unit '{}' in '{}'", unit, text);
  if (!(v > 0)) return invalid_argument("[plan comm] size must be > 0, got '{}'", text);
  return v * mult;
}

}  // namespace kiln::perf
