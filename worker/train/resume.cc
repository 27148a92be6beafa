// File: worker/train/resume.cc
#include "worker/train/resume.h"

#include <dirent.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/config/job_paths.h"
#include "common/status.h"
#include "worker/checkpoint/checkpoint.h"

namespace switchyard::train {
namespace {

// FAILED_PRECONDITION "training.load (\"<path>\"): cannot be read: <strerror> (errno N)" when
// `path` cannot be read as a directory.
absl::Status CheckReadableDirectory(const std::string& path) {
  DIR* d = opendir(path.c_str());
  if (d == nullptr) {
    const int err = errno;
    return absl::FailedPreconditionError(absl::StrCat("training.load (\"", path,
                                                      "\"): cannot be read: ", std::strerror(err),
                                                      " (errno ", err, ")"));
  }
  closedir(d);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ResumeTraining(Trainer* trainer, const v1::TrainingConfig& tr,
                                           const ResumeOptions& options) {
  if (!tr.save().empty()) {
    // No directory yet, or one without a committed checkpoint: nothing of our own. Anything else
    // (no permission, I/O) must not be papered over by training from scratch.
    absl::StatusOr<std::optional<int64_t>> own = LatestCommittedStep(tr.save());
    if (!own.ok()) {
      return Annotate(own.status(), absl::StrCat("training.save (\"", tr.save(), "\")"));
    }
    if (own->has_value() && options.own_must_be_empty) {
      return absl::FailedPreconditionError(absl::StrCat(
          "training.save (\"", tr.save(), "\") already holds a checkpoint (step ", **own,
          ") although this is the job's first generation: it belongs to an earlier job with the "
          "same id (was the coordinator's store created anew over an old checkpoint volume?); "
          "move that directory away, or restart the coordinator on its store's backup"));
    }
    if (own->has_value()) {
      SY_RETURN_IF_ERROR(
          Annotate(trainer->Load(tr.save()), absl::StrCat("resuming from ", tr.save())));
      return absl::StrCat("resumed from ", tr.save(), " at step ", trainer->step());
    }
  }
  if (tr.load().empty() || tr.load() == tr.save()) return std::string();
  std::string root = tr.load();
  int64_t step = -1;
  if (auto split = SplitStepDirectory(tr.load()); split.has_value()) {
    root = split->first;
    step = split->second;
  }
  SY_RETURN_IF_ERROR(CheckReadableDirectory(tr.load()));
  SY_RETURN_IF_ERROR(
      Annotate(trainer->Load(root, step), absl::StrCat("training.load (\"", tr.load(), "\")")));
  return absl::StrCat("loaded ", tr.load(), " at step ", trainer->step());
}

}  // namespace switchyard::train
