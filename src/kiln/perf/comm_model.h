// A model of collectives at scale: time, algbw and busbw of each algorithm on named
// topologies (8xH100 NVLink nodes, those nodes over 400 Gb/s InfiniBand, TPU-style 2D/3D
// tori) for up to 65,536 ranks, from the alpha-beta model per link. No MPI: pure arithmetic.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/status.h"

namespace kiln::perf {

struct LinkSpec {
  double bw_bytes_per_s = 0;  // one direction
  double latency_s = 0;       // alpha: per message (step)
};

enum class TopologyKind { kSwitched, kTorus };

struct Topology {
  std::string_view name;
  std::string_view description;
  TopologyKind kind;
  int ranks_per_node;  // switched: GPUs behind one NVSwitch (1 for a torus)
  LinkSpec intra;      // switched: NVLink per GPU
  LinkSpec inter;      // switched: the GPU's own NIC (rail-optimized, non-blocking fabric)
  int torus_dims;      // torus: 2 or 3
  LinkSpec torus_link; // torus: one link between neighbours
  int max_ranks;
  // One device's dense bf16/fp16 matmul peak (FLOP/s; `kiln plan tp`); 0 where the topology
  // names no device (the TPU-style tori: give --tflops).
  double peak_flops = 0;
};

const std::vector<Topology>& topologies();
std::optional<Topology> find_topology(std::string_view name);
// find_topology, or InvalidArgument "unknown topology X (known: a, b, ...)".
Expected<Topology> find_topology_or_error(std::string_view name);

enum class ModelOp { kAllReduce, kAllGather, kReduceScatter, kAllToAll };
std::optional<ModelOp> parse_model_op(std::string_view name);
std::string_view model_op_name(ModelOp op);
double busbw_factor(ModelOp op, int p);

struct CommPrediction {
  std::string algo;
  double seconds = 0;
  double algbw = 0;  // bytes / seconds (bytes/s)
  double busbw = 0;  // algbw * the nccl-tests factor
  std::string note;  // e.g. which link bounds it
};

// Every algorithm the model knows for `op` on `p` ranks of `topo`, moving `nbytes` (the
// nccl-tests size: vector for all-reduce, output for all-gather, input for reduce-scatter,
// send buffer for all-to-all). Errors name the topology, p and the size.
Expected<std::vector<CommPrediction>> predict_comm(const Topology& topo, ModelOp op, int p,
                                                   double nbytes);

// The torus shape used for p ranks: `dims` near-equal factors of p, largest first.
std::vector<int> torus_shape(int p, int dims);
// Bytes per second across the worst bisection of p ranks of `topo` (one direction).
double bisection_bandwidth(const Topology& topo, int p);

// "1024", "4K", "4KiB", "1.5MB", "256MiB", "1G", "1GiB": decimal units for kB/MB/GB,
// binary for K/M/G and KiB/MiB/GiB.
Expected<double> parse_bytes(std::string_view text);

}  // namespace kiln::perf
