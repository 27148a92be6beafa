// File: worker/train/resume.h
//
// Where a run resumes from: the one rule for standalone runs (RunStandalone) and the agent's
// generations (worker/agent/generation.cc), which had two copies with different precedence.
//
//   1. The job's own checkpoints (training.save) win when there is one: a restarted run or
//      generation continues its own progress instead of going back to its starting point.
//   2. Otherwise a training.load that names another directory must load: a missing or
//      unreadable one is an error with the path and errno (FAILED_PRECONDITION), or the
//      checkpoint's own error; it never trains from scratch in silence. A training.load ending
//      in step_<N> loads that step; otherwise its `latest` (with the fallback of
//      worker/checkpoint/checkpoint.h).
//   3. Otherwise nothing: training starts from scratch.
//
// `own_must_be_empty` (the agent's generation 1): finding a checkpoint in training.save is
// FAILED_PRECONDITION naming it. That checkpoint is an earlier job's with the same id (a
// coordinator store created anew over an old checkpoint volume); resuming it would silently
// continue that job.
//
// Whether training.save holds a checkpoint is decided by HasCheckpoint (a directory listing, no
// file read); the checkpoint itself is read and CRC-verified once, by Trainer::Load.
#ifndef SWITCHYARD_WORKER_TRAIN_RESUME_H_
#define SWITCHYARD_WORKER_TRAIN_RESUME_H_

#include <string>

#include "absl/status/statusor.h"
#include "switchyard/v1/config.pb.h"
#include "worker/train/trainer.h"

namespace switchyard::train {

struct ResumeOptions {
  bool own_must_be_empty = false;
};

// Loads per the rule above into `trainer` (collective when it is distributed: every rank calls
// it with the same spec). Returns the log line to print ("resumed from <save> at step N",
// "loaded <load> at step N"), or "" when training starts from scratch.
absl::StatusOr<std::string> ResumeTraining(Trainer* trainer, const v1::TrainingConfig& training,
                                           const ResumeOptions& options = {});

}  // namespace switchyard::train

#endif  // SWITCHYARD_WORKER_TRAIN_RESUME_H_
