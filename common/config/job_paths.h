// File: common/config/job_paths.h
//
// Where a job's files may be, shared by the coordinator (rules at CreateJob and Plan, resolution
// when the assigned spec is built) and the worker agent (re-check before it opens a file).
//
// Under a coordinator every path of a job spec is RELATIVE and is resolved under a root the
// operator configures (switchyard-coordinator and switchyard-worker --checkpoint-root and
// --data-root, the same paths on every machine):
//
//   training.save         relative to the job's own directory <checkpoint root>/jobs/<id>;
//                         empty = the job directory itself.
//   training.load         empty = the job's own checkpoints (training.save, to resume); otherwise
//                         a job's checkpoint named relative to the checkpoint root, "jobs/<id>"
//                         (its latest checkpoint) or "jobs/<id>/<dir>[/step_<N>]": a job may read
//                         another job's checkpoint only by naming it.
//   data.data_path        each dataset prefix relative to the data root (read-only); the weights
//                         of the weighted form ("0.7", "a", "0.3", "b") are not paths; an empty
//                         list keeps meaning the worker's default corpus.
//   data.tokenizer_model  relative to the data root; empty = none.
//
// The rule for a relative path: not absolute, no empty component ("a//b", a trailing '/'), no "."
// or ".." component, no NUL or other control character (C0, DEL or C1: validate.h
// FirstControlCharacter).
//
// The worker re-checks the assigned (absolute) paths when it opens files: each must be a clean
// absolute path (same component rules) whose resolution (realpath of its deepest existing
// ancestor, symlinks followed, the rest appended) lies inside the resolved root. A dangling
// symlink on the way is refused (writing through it could create a file anywhere). This checks
// names at open time; it is no defense against a process that races to swap a directory for a
// symlink afterwards (jobs write checkpoints, they cannot create symlinks).
//
// Standalone worker runs (--standalone, --rank) do not use this file: their paths are free.
#ifndef SWITCHYARD_COMMON_CONFIG_JOB_PATHS_H_
#define SWITCHYARD_COMMON_CONFIG_JOB_PATHS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "switchyard/v1/config.pb.h"

namespace switchyard {

// The operator's roots (absolute paths, no trailing '/' needed).
struct JobRoots {
  std::string checkpoint_root = "/checkpoints";
  std::string data_root = "/data";
};

// Stands for the job's directory in a spec that is checked or planned before its paths are
// resolved (an empty training.save is the job's directory, which rules such as save_interval
// must see as set).
inline constexpr char kJobDirectoryPlaceholder[] = "<job directory>";

// "" when `path` satisfies the relative-path rule above, else the rule it breaks (e.g.
// "must not be absolute").
std::string RelativePathViolation(absl::string_view path);

// The indices of data.data_path that are dataset prefixes (all, or the odd ones of the weighted
// form, common/config/validate.h IsWeightedDataPath).
std::vector<int> DataPathIndices(const v1::DataConfig& data);

// OK, or INVALID_ARGUMENT naming the first offending field, its value and the rule, e.g.
//   training.save ("/etc/cron.d") must be a relative path under the job's checkpoint directory:
//   must not be absolute
// Checks training.save, training.load, data.data_path and data.tokenizer_model of a spec as a
// client submits it (CreateJob, Plan).
absl::Status CheckJobSpecPaths(const v1::JobSpec& spec);

// "jobs/<id>" of the job whose checkpoint training.load names ("jobs/3" for "jobs/3/step_600"),
// or "" when load is empty (the job's own checkpoints). INVALID_ARGUMENT as CheckJobSpecPaths
// words it for training.load when load breaks the rules (relative, no "..", jobs/<id> first).
// The one parser: CheckJobSpecPaths and syctl k8s-workers (which mounts that job's directory).
absl::StatusOr<std::string> LoadedJobName(const v1::JobSpec& spec);

// <checkpoint_root>/jobs/<job_id>.
std::string JobDirectory(const std::string& checkpoint_root, int64_t job_id);

// Rewrites the paths of `spec` (which must pass CheckJobSpecPaths; re-checked: a spec stored
// before the rules existed gets INVALID_ARGUMENT) to absolute paths under `roots` for job
// `job_id`: save = JobDirectory[/save]; load = save when empty, else <checkpoint_root>/<load>;
// data paths and tokenizer_model = <data_root>/<path>.
absl::Status ResolveJobSpecPaths(const JobRoots& roots, int64_t job_id, v1::JobSpec* spec);

// The resolution of absolute `path` on disk: realpath of its deepest existing ancestor with the
// missing components appended. INVALID_ARGUMENT for a path that is not absolute or has ".", ".."
// or empty components; FAILED_PRECONDITION naming the path and errno when an existing component
// cannot be resolved (a dangling symlink, a loop, no permission).
absl::StatusOr<std::string> ResolveOnDisk(const std::string& path);

// OK when ResolveOnDisk(path) is `root` (resolved the same way) or inside it; otherwise
// INVALID_ARGUMENT "<field> (\"<path>\") resolves to <resolved>, outside <what> <root>", or the
// resolution error prefixed with the field.
absl::Status CheckInsideRoot(absl::string_view field, const std::string& path,
                             const std::string& root, absl::string_view what);

// The worker's re-check of an assigned spec: training.save and training.load inside
// roots.checkpoint_root; every dataset prefix (and its .bin and .idx) and data.tokenizer_model
// inside roots.data_root. Empty paths are not checked (they name nothing).
absl::Status CheckAssignedSpecPaths(const v1::JobSpec& spec, const JobRoots& roots);

// {"<dir>", N} when the last component of `path` is "step_<N>" (a checkpoint step directory),
// else nullopt (a checkpoint root, loaded at its latest step).
std::optional<std::pair<std::string, int64_t>> SplitStepDirectory(const std::string& path);

// The id of a job name "jobs/<id>" (id a positive integer of at most 18 digits, no leading
// zero); INVALID_ARGUMENT naming `name` when malformed. The one parser: the coordinator's API
// (coordinator/jobs/job_registry.h) and the worker's --job use it.
absl::StatusOr<int64_t> ParseJobName(absl::string_view name);

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_CONFIG_JOB_PATHS_H_
