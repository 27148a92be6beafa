// File: coordinator/jobs/resolve_spec.cc
#include "coordinator/jobs/resolve_spec.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/config/config_defaults.h"
#include "common/config/job_paths.h"
#include "common/config/validate.h"
#include "common/model/engine_support.h"
#include "common/status.h"

namespace switchyard::jobs {
namespace {

bool ReadsDefaultCorpus(const v1::JobSpec& spec) {
  return !spec.data().mock_data() && spec.data().data_path_size() == 0;
}

absl::Status CheckVocabSize(const v1::JobSpec& spec) {
  if (spec.model().has_vocab_size()) return absl::OkStatus();
  if (spec.data().mock_data()) {
    return absl::InvalidArgumentError(
        "model.vocab_size is required with data.mock_data (no tokenizer decides it)");
  }
  if (!ReadsDefaultCorpus(spec)) {
    return absl::InvalidArgumentError(
        "model.vocab_size is required with data.data_path (the coordinator does not read the "
        "dataset's tokenizer; give its vocabulary size)");
  }
  return absl::InvalidArgumentError(
      "model.vocab_size is required: the job reads the default corpus, which this coordinator "
      "did not find (run tools/setup.sh on its machine, or set model.vocab_size)");
}

}  // namespace

std::string UnsupportedParallelism(const v1::ParallelConfig& p) {
  return UnsupportedByEngine("parallel.", p.tensor_model_parallel_size(), p.context_parallel_size(),
                             p.pipeline_model_parallel_size(), p.expert_tensor_parallel_size());
}

absl::StatusOr<v1::JobSpec> ResolveJobSpec(const v1::JobSpec& spec,
                                           const CoordinatorContext& context, int64_t job_id) {
  v1::JobSpec resolved = spec;
  ApplyDefaults(&resolved);
  if (!resolved.model().has_vocab_size() && ReadsDefaultCorpus(resolved) &&
      context.default_vocab_size > 0) {
    resolved.mutable_model()->set_vocab_size(context.default_vocab_size);
  }
  // Rules that need a checkpoint directory (save_interval) see an empty training.save as the
  // job's own directory, which the coordinator provides when it has a checkpoint root; the
  // returned spec keeps the user's (relative) paths, which AssignedSpec resolves under the roots.
  v1::JobSpec checked = resolved;
  if (checked.training().save().empty() && !context.checkpoint_root.empty()) {
    checked.mutable_training()->set_save(job_id == kUnassignedJobId
                                             ? std::string(kJobDirectoryPlaceholder)
                                             : JobDirectory(context.checkpoint_root, job_id));
  }

  SY_RETURN_IF_ERROR(ValidateJobSpec(checked));
  SY_RETURN_IF_ERROR(CheckVocabSize(resolved));
  if (std::string why = UnsupportedParallelism(resolved.parallel()); !why.empty()) {
    return absl::InvalidArgumentError(why);
  }
  SY_RETURN_IF_ERROR(CheckJobSpecPaths(resolved));  // common/config/job_paths.h
  return resolved;
}

absl::StatusOr<v1::PlanRequest> ResolvePlanRequest(const v1::PlanRequest& request,
                                                   const CoordinatorContext& context) {
  v1::PlanRequest resolved = request;
  if (!request.has_spec()) return absl::InvalidArgumentError("spec: required");
  SY_ASSIGN_OR_RETURN(*resolved.mutable_spec(), ResolveJobSpec(request.spec(), context));
  v1::ParallelConfig& p = *resolved.mutable_spec()->mutable_parallel();
  // As PlanRequestFor: the spec's TP (its default is 1), PP = 1, sequence parallelism
  // exactly with TP > 1; CP runs in the workers but is planned only when the spec fixes it (the
  // CUDA attention does not run the context-parallel mask yet, so the planner must not pick it).
  if (!p.has_context_parallel_size()) p.set_context_parallel_size(1);
  p.set_pipeline_model_parallel_size(1);
  // TP and ETP run in the workers: the spec's are planned (ETP 1 when unset); sequence
  // parallelism exactly when TP > 1 (Megatron requires it for MoE).
  if (!p.has_expert_tensor_parallel_size()) p.set_expert_tensor_parallel_size(1);
  p.set_sequence_parallel(p.tensor_model_parallel_size() > 1);
  // As the scheduler (jobs/placement.h WorkerRange): without a world size or min_workers, any
  // world from the cluster's size down to 1 may run, so smaller worlds are planned too.
  v1::JobSpec& spec = *resolved.mutable_spec();
  if (!spec.has_min_workers() && !p.has_world_size()) spec.set_min_workers(1);
  // As the scheduler (jobs/placement.h PlanRequestFor): an empty training.save is the job's
  // directory, so a save_interval without it is planned.
  if (spec.training().save().empty() && !context.checkpoint_root.empty()) {
    spec.mutable_training()->set_save(kJobDirectoryPlaceholder);
  }
  return resolved;
}

}  // namespace switchyard::jobs
