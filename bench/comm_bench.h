// `kiln bench comm` (W4): kiln's collective algorithms beside MPI's own collective in the same
// run, nccl-tests columns (size, count, type, redop, time, algbw, busbw, #wrong); and
// `--calibrate`, which measures the alpha-beta parameters that `--algo auto` uses.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::bench {

struct CommBenchOptions {
  std::string op = "allreduce";  // allreduce | allgather | reducescatter | alltoall | bcast
  std::string algo = "all";      // an algorithm name, `auto`, `mpi`, or `all` (every one + mpi)
  std::string dtype = "f32";     // f32 | bf16 | f16
  std::string redop = "sum";     // sum | avg | max
  int64_t min_bytes = 8;
  int64_t max_bytes = int64_t{256} << 20;
  int reps = 5;                  // at least this many interleaved timing rounds per size (more
                                 // when they fit in the per-size time budget); median, min-max
  int ranks_per_node = 0;        // hierarchical: 0 = automatic (communicator.h), n = forced
  bool json = false;             // one JSON object per line instead of the table
  bool calibrate = false;        // measure alpha, beta (+ per-algorithm fits) and cache them
  bool pool = false;             // with calibrate: fit through the per-size medians over this
                                 // and the last stored launches (cost_model.h, pool_launches)
  int64_t chunk_bytes = 0;       // pipeline chunk override for sweeps (0 = per-size defaults)
  bool auto_probe = true;        // `auto` probes close calls in-process (auto_probe.h);
                                 // --no-auto-probe: the model's pick alone
};

// Collective over MPI_COMM_WORLD (initializes MPI if needed, finalizes at the end); prints on
// rank 0. Returns a process exit code.
int run_comm_bench(const CommBenchOptions& opt);

}  // namespace kiln::bench
