// File: coordinator/jobs/resolve_spec.cc
#include "coordinator/jobs/resolve_spec.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/config_defaults.h"
#include "common/status.h"
#include "common/validate.h"

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

// Rules on paths (job_paths) plug in here: one call, after the spec rules.
absl::Status CheckJobPathRules(const v1::JobSpec& /*resolved*/,
                               const CoordinatorContext& /*context*/) {
  return absl::OkStatus();
}

}  // namespace

std::string UnsupportedParallelism(const v1::ParallelConfig& p) {
  const std::pair<const char*, int32_t> sizes[] = {
      {"tensor_model_parallel_size", p.tensor_model_parallel_size()},
      {"context_parallel_size", p.context_parallel_size()},
      {"pipeline_model_parallel_size", p.pipeline_model_parallel_size()},
      {"expert_tensor_parallel_size", p.expert_tensor_parallel_size()},
  };
  for (const auto& [name, value] : sizes) {
    if (value > 1) {
      return absl::StrCat("parallel.", name, " (", value,
                          ") must be 1: workers run data and expert parallelism only");
    }
  }
  return "";
}

absl::StatusOr<v1::JobSpec> ResolveJobSpec(const v1::JobSpec& spec,
                                           const CoordinatorContext& context, int64_t job_id) {
  v1::JobSpec resolved = spec;
  ApplyDefaults(&resolved);
  if (!resolved.model().has_vocab_size() && ReadsDefaultCorpus(resolved) &&
      context.default_vocab_size > 0) {
    resolved.mutable_model()->set_vocab_size(context.default_vocab_size);
  }
  v1::TrainingConfig& t = *resolved.mutable_training();
  if (t.save().empty() && !context.checkpoint_root.empty()) {
    t.set_save(absl::StrCat(context.checkpoint_root, "/",
                            job_id == kUnassignedJobId ? "<job id>" : absl::StrCat(job_id)));
  }
  if (t.load().empty() && !t.save().empty()) t.set_load(t.save());

  SY_RETURN_IF_ERROR(ValidateJobSpec(resolved));
  SY_RETURN_IF_ERROR(CheckVocabSize(resolved));
  if (std::string why = UnsupportedParallelism(resolved.parallel()); !why.empty()) {
    return absl::InvalidArgumentError(why);
  }
  SY_RETURN_IF_ERROR(CheckJobPathRules(resolved, context));
  return resolved;
}

absl::StatusOr<v1::PlanRequest> ResolvePlanRequest(const v1::PlanRequest& request,
                                                   const CoordinatorContext& context) {
  v1::PlanRequest resolved = request;
  if (!request.has_spec()) return absl::InvalidArgumentError("spec: required");
  SY_ASSIGN_OR_RETURN(*resolved.mutable_spec(), ResolveJobSpec(request.spec(), context));
  v1::ParallelConfig& p = *resolved.mutable_spec()->mutable_parallel();
  p.set_tensor_model_parallel_size(1);
  p.set_context_parallel_size(1);
  p.set_pipeline_model_parallel_size(1);
  p.set_expert_tensor_parallel_size(1);
  p.set_sequence_parallel(false);
  // As the scheduler (workers/placement.h WorkerRange): without a world size or min_workers, any
  // world from the cluster's size down to 1 may run, so smaller worlds are planned too.
  v1::JobSpec& spec = *resolved.mutable_spec();
  if (!spec.has_min_workers() && !p.has_world_size()) spec.set_min_workers(1);
  return resolved;
}

v1::JobSpec StoredSpec(const v1::JobSpec& submitted, v1::JobSpec resolved) {
  if (submitted.training().save().empty()) {
    resolved.mutable_training()->clear_save();
    if (submitted.training().load().empty()) resolved.mutable_training()->clear_load();
  }
  return resolved;
}

}  // namespace switchyard::jobs
