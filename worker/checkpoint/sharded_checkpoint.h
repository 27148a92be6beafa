// File: worker/checkpoint/sharded_checkpoint.h
//
// Distributed (sharded) checkpoints that reshard on load, in the spirit of Megatron's
// torch.distributed.checkpoint layout (megatron_parallel.md, distributed checkpointing): every
// rank writes only the shards it owns, in parallel, and a reader with ANY other mapping (or one
// process) reads, for each of its target shards, only the overlapping parts of the saved ones.
//
// A shard is a ShardSlice of a global tensor: per dimension a list of runs of global indices
// (local index order = run order, e.g. a TP shard of a fused gate/up fc1 is two runs of rows: its
// gate piece then its up piece), optionally cut to a flat range [flat_begin, flat_end) of the
// local row-major elements (a distributed optimizer's ZeRO shard of the fp32 master weights and
// Adam moments cuts tensors at arbitrary element boundaries). The global shape and the slice are
// all a reader needs: it never learns how TP, EP, ETP or DP cut the tensor, so a PP stage that
// holds a subset of the layers simply saves (and loads) a subset of the global names.
//
// On disk (one step directory of worker/checkpoint/checkpoint.h; same commit protocol):
//   shard_<r>.safetensors   rank r's shards: tensor "<i>" is entry i of its index (f32 or f64,
//                           1-D, the slice's elements in local row-major order)
//   (shard_<r>.index.json   rank r's index while the save runs: {"file", "size", "crc32c" of
//                           its safetensors file, "entries": [{"name", "key", "global_shape",
//                           "runs", "flat": [begin, end]}]} ("runs": per dim
//                           [[global_begin, length]...]); rank 0 folds every index into the
//                           manifest and deletes it)
//   manifest.json           written LAST by rank 0 after a barrier: every shard file with size
//                           and CRC32C, the metadata (step, data position, RNG, the mapping
//                           tp/cp/ep/etp/dp/pp/world: the caller's), and "tensors":
//                           {name: {"global_shape": [...], "shards": [{"file", "key", "runs",
//                           "flat"}...]}}: every shard of every tensor.
//   latest                  updated after the manifest (as CheckpointWriter's).
// Rank 0 checks, before the manifest, that the shards of every tensor hold exactly its number of
// elements (with disjoint shards: every element once). A rank killed before the manifest leaves
// only the temp directory: that step never loads and `latest` still names the previous one.
//
// Loading verifies as LoadCheckpoint does (manifest checksum; size and CRC32C of EVERY listed
// file, streamed, on every loading process), then maps the files; Read copies only the overlap
// of each saved shard with the target, so a rank touches (pages in) only what its shard needs
// and never holds a whole tensor it does not own. A checkpoint without a "tensors" index
// (CheckpointWriter's single-process format: model.safetensors, optimizer.safetensors, ...)
// reads as one whole-tensor shard per tensor name, so old checkpoints still load.
#ifndef SWITCHYARD_WORKER_CHECKPOINT_SHARDED_CHECKPOINT_H_
#define SWITCHYARD_WORKER_CHECKPOINT_SHARDED_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"
#include "worker/checkpoint/checkpoint.h"

namespace switchyard {

struct DimRun {
  int64_t global_begin = 0;
  int64_t length = 0;
};

struct ShardSlice {
  std::vector<int64_t> global_shape;
  // runs[d]: the global indices of dimension d this shard holds, in local order.
  std::vector<std::vector<DimRun>> runs;
  // The elements [flat_begin, flat_end) of the local row-major tensor; flat_end < 0: to the end.
  int64_t flat_begin = 0;
  int64_t flat_end = -1;

  // The whole tensor of `shape`.
  static ShardSlice Whole(const std::vector<int64_t>& shape);
  // Sum of run lengths per dimension.
  std::vector<int64_t> LocalShape() const;
  int64_t LocalNumel() const;
  // Elements stored: flat_end - flat_begin (flat_end resolved).
  int64_t NumElements() const;
};

// INVALID_ARGUMENT naming `what` and the rule when `s` is malformed: a dimension count that
// differs from global_shape's, a run outside [0, global_shape[d]) or of length <= 0, or a flat
// range outside [0, LocalNumel()].
absl::Status ValidateShardSlice(const ShardSlice& s, absl::string_view what);

// How the ranks of one save talk: `all_reduce_sum` sums a vector of doubles over the ranks
// (every rank calls it with the same length; it doubles as the barrier). One process: size 1,
// all_reduce_sum may be null.
struct CheckpointGroup {
  int rank = 0;
  int size = 1;
  std::function<absl::Status(std::vector<double>*)> all_reduce_sum;
};

// A save between its phases (ShardedCheckpointWriter::Begin / WriteOwn / Finish).
struct ShardedSave {
  std::string root;
  int64_t step = -1;
  std::string tmp_dir;  // <root>/.tmp_step_<step>_<rank 0's pid>
};

// Collects this rank's shards and the metadata, then commits one sharded checkpoint step with
// every rank of `group` (collective). AddShard keeps a VIEW of `data` (a CPU f32 or f64 tensor of
// slice.NumElements() elements): it must stay valid and unchanged until Commit returns. Argument
// errors are recorded and returned by Commit (which then still takes part in the collective
// steps, so the other ranks fail too instead of hanging). Not thread-safe.
class ShardedCheckpointWriter {
 public:
  void AddShard(std::string name, ShardSlice slice, const Tensor& data);
  void SetMetadata(std::string key, std::string value);
  void SetMetadata(std::string key, int64_t value);

  // Writes step `step` under `root` (see the file comment) and returns its directory. Every rank
  // returns the same outcome: OK only when the manifest and `latest` were written; else the
  // first failing rank's error (its own) or FAILED_PRECONDITION naming the rank that failed.
  absl::StatusOr<std::string> Commit(const std::string& root, int64_t step,
                                     const CheckpointGroup& group) const;

  // Commit in three phases, for an asynchronous save that writes in a background thread:
  //   Begin   collective: rank 0 creates the temp directory, every rank learns its name;
  //   WriteOwn  NOT collective (no call of group.all_reduce_sum; may run on another thread):
  //           writes and fsyncs this rank's shard file and index;
  //   Finish  collective: every rank reports WriteOwn's status (`own_write`); if all succeeded,
  //           rank 0 writes the manifest and `latest`. Same outcome on every rank as Commit.
  // Commit(root, step, group) == Finish(Begin(...), WriteOwn(...), group).
  absl::StatusOr<ShardedSave> Begin(const std::string& root, int64_t step,
                                    const CheckpointGroup& group) const;
  absl::Status WriteOwn(const ShardedSave& save, const CheckpointGroup& group) const;
  absl::StatusOr<std::string> Finish(const ShardedSave& save, const absl::Status& own_write,
                                     const CheckpointGroup& group) const;

 private:
  struct Entry {
    std::string name;
    ShardSlice slice;
    Tensor data;
  };
  std::vector<Entry> entries_;
  std::map<std::string, CheckpointValue> metadata_;
  absl::Status error_;
};

// Test hook: called on every rank after it wrote and fsynced its shard file, before its index
// and the barrier (a test kills a rank here to tear a save). Null by default; process-wide.
void SetShardedSaveHookForTest(std::function<void(int rank)> hook);

// A loaded, verified checkpoint (sharded, or CheckpointWriter's whole-tensor format) read by
// global tensor name. Thread-safe for concurrent const calls.
class ShardedCheckpointReader {
 public:
  // Parses the shard index of `ckpt` (kDataLoss naming the manifest if it is malformed: a shard
  // that is not a valid slice, an unknown file or key, shards that do not add up to the tensor).
  static absl::StatusOr<ShardedCheckpointReader> Open(Checkpoint ckpt);
  // LoadCheckpoint(root, step) then Open.
  static absl::StatusOr<ShardedCheckpointReader> Load(const std::string& root,
                                                      std::optional<int64_t> step = std::nullopt);

  const Checkpoint& checkpoint() const { return ckpt_; }
  bool Has(absl::string_view name) const;
  // kNotFound naming the checkpoint and the tensor.
  absl::StatusOr<std::vector<int64_t>> GlobalShape(absl::string_view name) const;
  std::vector<std::string> Names() const;
  // The dtype the tensor was saved in (its first shard's; f32 or f64).
  absl::StatusOr<DType> StoredDType(absl::string_view name) const;
  // Fills `out` (a CPU f32 or f64 tensor of target.NumElements() elements; converted from the
  // stored dtype) with `target`'s elements of tensor `name`, copying only the overlap of each
  // saved shard with it. FAILED_PRECONDITION when the global shapes differ (naming both) or the
  // saved shards do not cover every target element; INVALID_ARGUMENT for a bad target or out.
  absl::Status Read(absl::string_view name, const ShardSlice& target, const Tensor& out) const;

 private:
  struct Shard {
    std::string file, key;
    ShardSlice slice;
  };
  struct TensorIndex {
    std::vector<int64_t> global_shape;
    std::vector<Shard> shards;
  };
  Checkpoint ckpt_;
  std::map<std::string, TensorIndex, std::less<>> tensors_;
};

}  // namespace switchyard

#endif  // SWITCHYARD_WORKER_CHECKPOINT_SHARDED_CHECKPOINT_H_
