// Sharded checkpoints for the data-parallel layouts (ZeRO-1/2/3, FSDP): every rank writes the
// flat ranges of params, AdamW m and v it owns to a file of its own and rank 0 writes a manifest
// last; any number of ranks in any layout reads them back (resharding), and so does one process.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/comm/communicator.h"
#include "kiln/core/status.h"
#include "kiln/train/checkpoint.h"

namespace kiln {

// On disk, a directory (little-endian):
//   shard-RRRRR-of-PPPPP.bin, one per saving rank r of P:
//     "KILNSHRD" | u64 n | header JSON (n bytes) | u32 CRC-32C of the 16 + n bytes before it |
//     params | m | v     (f32 each: the rank's ranges concatenated in range order)
//     header JSON: format "kiln-shard-1", shard, num_shards, num_params, ranges [[begin, end],
//     ...], sections [{name, bytes, crc32c}] for params, m, v.
//   manifest.json, written by rank 0 after every shard file was written (temporary file + rename):
//     format "kiln-sharded-checkpoint-1"; the run metadata under CheckpointHeader's key names
//     (step, num_params, model, options, loss_scale, loss_scale_good_steps, time_budget_steps);
//     num_shards; shards: per file {file, bytes (the file's size), header_crc32c, ranges,
//     sections [{name, offset, bytes, crc32c}]}. The shards' ranges tile [0, num_params).
// A manifest present means the checkpoint is complete; a save first removes the old one, so
// saving into a directory replaces what was there and a save that fails leaves no checkpoint
// (save each step to a new directory to keep the last good one). Files the manifest does not
// name (shards of an earlier save at another rank count) are never read. Every rank must see
// the directory: a load reads whichever shard files hold its ranges.
constexpr std::string_view kShardedCheckpointFormat = "kiln-sharded-checkpoint-1";
constexpr std::string_view kShardFileFormat = "kiln-shard-1";
constexpr std::string_view kManifestFileName = "manifest.json";
constexpr int kMaxShards = 99999;                          // the five digits of the file names
constexpr int64_t kMaxManifestBytes = int64_t{256} << 20;  // ~10M ranges of JSON
constexpr uint64_t kMaxShardHeaderBytes = uint64_t{64} << 20;

// [begin, end) of the flat parameter vector, in elements.
struct FlatRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const FlatRange&) const = default;
};

// One rank's training state: `ranges` of the flat vector of num_params elements (sorted,
// disjoint, begin <= end, inside [0, num_params)) and, for each of params, m, v, the values of
// those ranges concatenated in range order (sum of the range sizes elements each).
struct ShardView {
  int64_t num_params = 0;  // the whole flat vector; a checkpoint of another size is refused
  std::vector<FlatRange> ranges;
  std::span<float> params, m, v;
};

// "shard-00003-of-00008.bin" for shard 3 of 8.
std::string shard_file_name(int shard, int num_shards);

// Collective over comm. Makes `dir` a directory holding one shard file per rank and, once every
// rank wrote its file, the manifest. `meta` gives the run metadata (its sections are not used;
// meta.num_params must equal mine.num_params). Every rank returns the same verdict: the error
// of the lowest failing rank (a bad view, a write that failed, shards that do not tile
// [0, num_params)), in which case no manifest is left.
Status save_sharded_checkpoint(comm::Communicator& comm, const std::string& dir,
                               const CheckpointHeader& meta, const ShardView& mine);

// Collective over comm. `path` is a sharded directory written at any number of ranks, or a
// single-process checkpoint file (train/checkpoint.h). Reads this rank's ranges, whatever the
// layout that wrote them, from the files that hold them, verifying every section CRC-32C of
// each file it reads, and returns the run metadata (sections empty for a directory). A
// missing or damaged file, a missing manifest or a num_params other than mine.num_params is
// an error naming the file; every rank then returns the error of the lowest failing rank, and
// nothing in `mine` is overwritten unless every rank verified all it read. Staging costs one
// more copy of this rank's params, m and v while it runs.
Expected<CheckpointHeader> load_sharded_checkpoint(comm::Communicator& comm,
                                                   const std::string& path, const ShardView& mine);

// One process, no communicator: a sharded directory (or a single file) read whole, verified
// as load_sharded_checkpoint does (for `kiln generate` and export). num_params is bounded by
// the sizes of the files on disk before anything is allocated.
struct FullCheckpoint {
  CheckpointHeader meta;
  std::vector<float> params, m, v;  // (num_params,) each
};
Expected<FullCheckpoint> load_checkpoint_whole(const std::string& path);

// One process: the single-file format (train/checkpoint.h) from a view of everything
// (ranges exactly {[0, num_params)}, or none when num_params is 0), written atomically.
Status save_checkpoint_file(const std::string& path, const CheckpointHeader& meta,
                            const ShardView& all);

}  // namespace kiln
