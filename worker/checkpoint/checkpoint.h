// File: worker/checkpoint/checkpoint.h
//
// Atomic, verified save and load of a training state (weights, optimizer states, data position,
// RNG state). A checkpoint is a directory
//
//   <root>/step_<N>/
//       <file>            one or more safetensors files (common/safetensors.h), named by the caller
//       manifest.json     written LAST: {"format": "switchyard-checkpoint", "version": 1,
//                         "step": N, "files": [{"name", "size", "crc32c"}...],
//                         "metadata": {key: string | integer},
//                         "tensors": {...}   only in a sharded checkpoint: its shard index
//                                            (worker/checkpoint/sharded_checkpoint.h)
//                         "manifest_crc32c": CRC32C of the compact JSON of all other keys}
//   <root>/latest         one line "step_<N>", replaced atomically (temp + fsync + rename)
//
// Checkpoints are private to the user that writes them: every directory Commit creates (the root
// and its missing parents included) is 0700, every file 0600.
//
// Commit protocol (crash-safe at every point):
//   1. write every file into <root>/.tmp_step_<N>_<pid>/ (each file fsynced),
//   2. checksum what is on disk (CRC32C of the bytes read back), write manifest.json, fsync it
//      and the temp directory,
//   3. rename the temp directory to step_<N>, fsync <root>,
//   4. update <root>/latest (temp + fsync + rename + fsync <root>).
// A process killed before 3 leaves only a ".tmp_step_*" directory, which Load never reads (it
// may be deleted by hand or with RemoveStaleCheckpointTempDirs). A process killed between 3 and
// 4 leaves a complete step_<N> that `latest` does not name yet; Load keeps following `latest`.
//
// Load verifies before it trusts: the manifest must parse, match its own checksum (so a flipped
// digit in the metadata is caught) and name its own step, every listed
// file must exist with the listed size and CRC32C, and must then open as a valid safetensors
// file. Without an explicit step, Load reads `latest`; if `latest` is missing, malformed, or
// names a directory that is missing or fails verification, it logs a WARNING and falls back to
// the highest step_<N> that verifies (each rejected directory is logged with its reason).
//
// One process writes a CheckpointWriter checkpoint. A distributed job writes a sharded one
// (worker/checkpoint/sharded_checkpoint.h): every rank writes its own files into the same temp
// directory, and one rank writes the manifest after a barrier, with the three functions
// BeginCheckpointTempDir / SealCheckpointFile / FinishCheckpointTempDir below.
#ifndef SWITCHYARD_WORKER_CHECKPOINT_CHECKPOINT_H_
#define SWITCHYARD_WORKER_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/safetensors.h"
#include "common/tensor.h"

namespace switchyard {

// CRC32C (Castagnoli, reflected polynomial 0x82F63B78, as in iSCSI / ext4 / LevelDB) of `data`,
// continuing from `crc` (the CRC of the preceding bytes; 0 to start). Crc32c("123456789") ==
// 0xE3069283. Table-driven (slicing-by-8), no hardware instructions.
uint32_t Crc32c(absl::string_view data, uint32_t crc = 0);

// A metadata value: an integer (data position, seeds) or a string (e.g. a serialized
// std::mt19937_64, or a uint64 written in decimal).
using CheckpointValue = std::variant<int64_t, std::string>;

// Collects tensors (grouped into files) and metadata, then commits one checkpoint step.
//
// `AddTensor` keeps a VIEW (like SafetensorsWriter::Add): the memory must stay valid and
// unchanged until Commit returns. Argument errors (a bad file name, a CUDA tensor, a duplicate
// name in one file) are recorded and returned by Commit, which then writes nothing.
// Not thread-safe. Reusable: Commit may be called again for another step.
class CheckpointWriter {
 public:
  // Adds CPU tensor `name` to file `file`. `file` is a plain file name: 1-255 characters from
  // [A-Za-z0-9._-], not starting with '.', not "manifest.json" (e.g. "model.safetensors").
  void AddTensor(const std::string& file, std::string name, const Tensor& cpu_tensor);
  // Sets metadata `key` (non-empty) to `value`; the last call for a key wins.
  void SetMetadata(std::string key, std::string value);
  void SetMetadata(std::string key, const char* value) { SetMetadata(key, std::string(value)); }
  void SetMetadata(std::string key, int64_t value);

  // Writes checkpoint `step` (>= 0) under `root` (created if missing) following the protocol in
  // the file comment, and returns the path of the new step directory. kAlreadyExists if
  // <root>/step_<step> exists (a step is immutable); kInvalidArgument for recorded argument
  // errors or step < 0; other codes for I/O errors (the message names the path). On an error
  // before the rename the temp directory is removed (best effort) and `latest` is untouched; an
  // error after it (fsync of <root>, update of `latest`) leaves step_<step> complete on disk.
  // Cost: every file is written once and read back once (page cache) for its checksum.
  absl::StatusOr<std::string> Commit(const std::string& root, int64_t step) const;

 private:
  std::map<std::string, SafetensorsWriter> files_;
  std::map<std::string, CheckpointValue> metadata_;
  absl::Status error_;
};

// A loaded, verified checkpoint. Tensors are read-only views into memory-mapped files (see
// SafetensorsFile); they stay valid while this object (or a copy) lives.
// Thread-safety: all methods are const and may be called concurrently.
class Checkpoint {
 public:
  int64_t step() const { return step_; }
  // The step directory, e.g. "<root>/step_100".
  const std::string& dir() const { return dir_; }
  // File names in the manifest, sorted.
  std::vector<std::string> Files() const;
  // The opened file `file`; kNotFound naming it if the checkpoint has no such file.
  absl::StatusOr<const SafetensorsFile*> File(absl::string_view file) const;
  // Tensor `name` of file `file` (a CPU view); kNotFound naming the file and tensor.
  absl::StatusOr<Tensor> Get(absl::string_view file, absl::string_view name) const;

  const std::map<std::string, CheckpointValue>& metadata() const { return metadata_; }
  // The manifest's "tensors" object (the shard index of a sharded checkpoint,
  // worker/checkpoint/sharded_checkpoint.h) as compact JSON; empty for a checkpoint without one
  // (CheckpointWriter's: whole tensors by file and name).
  const std::string& tensors_json() const { return tensors_json_; }
  // Metadata `key` as a string / an integer: kNotFound if absent, kInvalidArgument if it holds
  // the other type.
  absl::StatusOr<std::string> GetString(absl::string_view key) const;
  absl::StatusOr<int64_t> GetInt(absl::string_view key) const;

 private:
  friend absl::StatusOr<Checkpoint> OpenCheckpointDir(const std::string& dir,
                                                      std::optional<int64_t> expected_step);
  int64_t step_ = -1;
  std::string dir_;
  std::map<std::string, SafetensorsFile> files_;
  std::map<std::string, CheckpointValue> metadata_;
  std::string tensors_json_;
};

// Loads checkpoint `step` of `root` (no fallback: any problem is an error), or, without a step,
// the one named by <root>/latest with fallback to the highest verifying step_<N> (see the file
// comment). Errors: kNotFound if the step directory (or, without a step, any complete
// checkpoint) does not exist; kDataLoss if the manifest is missing or malformed, or a file is
// missing or has the wrong size or checksum (the message names the file); kInvalidArgument if a
// file is not valid safetensors.
absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& root,
                                          std::optional<int64_t> step = std::nullopt);

// <root>/step_<N>: the directory CheckpointWriter::Commit(root, step) creates.
std::string CheckpointStepDir(const std::string& root, int64_t step);

// Opens and verifies one step directory (`expected_step`, if given, must match the manifest).
absl::StatusOr<Checkpoint> OpenCheckpointDir(const std::string& dir,
                                             std::optional<int64_t> expected_step = std::nullopt);

// The step of the newest COMMITTED checkpoint of `root` without reading or verifying it: the
// step `latest` names when that directory has a manifest.json, else the highest step_<N> with a
// manifest.json (a directory listing and a few stat calls; no file is read but `latest`).
// nullopt when `root` does not exist or holds no committed step. Other errors (EACCES, ENOTDIR)
// are returned naming the path. For "is there anything to resume?" and "is step N saved?":
// LoadCheckpoint then reads and verifies once.
absl::StatusOr<std::optional<int64_t>> LatestCommittedStep(const std::string& root);
// Whether <root>/step_<N>/manifest.json exists (committed by CheckpointWriter; not verified).
bool HasCommittedStep(const std::string& root, int64_t step);

// The commit protocol in pieces, for writers that are several processes
// (worker/checkpoint/sharded_checkpoint.h); CheckpointWriter::Commit is these three in a row.
//
// Step 1: creates `root` (mkdir -p, 0700) and the empty temp directory
// <root>/.tmp_step_<step>_<token> (0700); returns its path. `token` tells concurrent commits
// apart and is a live pid of this host (RemoveStaleCheckpointTempDirs removes the directory once
// that process is gone). kAlreadyExists if step_<step> exists, kInvalidArgument if step < 0.
absl::StatusOr<std::string> BeginCheckpointTempDir(const std::string& root, int64_t step,
                                                   uint64_t token);
struct CheckpointFileDigest {
  std::string name;
  uint64_t size = 0;
  uint32_t crc32c = 0;
};
// Step 2, per file, by whichever process wrote (and fsynced) <dir>/<name>: makes it 0600 and
// returns its size and the CRC32C of its bytes as read back. kInvalidArgument for a bad name.
absl::StatusOr<CheckpointFileDigest> SealCheckpointFile(const std::string& dir,
                                                        const std::string& name);
// Step 3, by one process once every file is sealed: writes manifest.json (listing `files`, the
// metadata and, when `tensors_json` is not empty, that JSON object under "tensors"), renames the
// temp directory to step_<step> and updates `latest`; returns the step directory. On an error
// before the rename the temp directory is removed (best effort) and `latest` is untouched.
absl::StatusOr<std::string> FinishCheckpointTempDir(
    const std::string& root, int64_t step, const std::string& tmp_dir,
    const std::vector<CheckpointFileDigest>& files,
    const std::map<std::string, CheckpointValue>& metadata, const std::string& tensors_json);

// Removes every ".tmp_step_*" directory under `root` whose owning process (the pid in its name)
// is not alive, and returns how many were removed. Call only when no other process on another
// host may be writing into `root` (the pid test is host-local).
absl::StatusOr<int> RemoveStaleCheckpointTempDirs(const std::string& root);

}  // namespace switchyard

#endif  // SWITCHYARD_WORKER_CHECKPOINT_CHECKPOINT_H_
