// File: coordinator/jobs/resolve_spec.cc
#include "coordinator/jobs/resolve_spec.h"

#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config/config_defaults.h"
#include "common/config/job_paths.h"
#include "common/config/validate.h"
#include "common/config/worker_range.h"
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

// Rule e (resolve_spec.h).
absl::Status CheckQueue(const v1::JobSpec& spec, const CoordinatorContext& context) {
  const std::string queue = QueueOf(spec);
  if (queue != kDefaultQueue && context.queue_quotas.count(queue) == 0) {
    std::vector<std::string> names = {kDefaultQueue};
    for (const auto& [name, quota] : context.queue_quotas) {
      if (name != kDefaultQueue) names.push_back(name);
    }
    return absl::InvalidArgumentError(
        absl::StrCat("queue (\"", absl::CHexEscape(queue),
                     "\") must be one of this coordinator's queues: ", absl::StrJoin(names, ", ")));
  }
  if (spec.priority() < -kMaxPriority || spec.priority() > kMaxPriority) {
    return absl::InvalidArgumentError(absl::StrCat("priority (", spec.priority(),
                                                   ") must be within [", -kMaxPriority, ", ",
                                                   kMaxPriority, "]"));
  }
  if (std::optional<int32_t> quota = QueueQuota(context, queue); quota.has_value()) {
    const int32_t min_workers = WorkerRange(spec).first;
    if (min_workers > *quota) {
      return absl::InvalidArgumentError(
          absl::StrCat("min_workers (", min_workers,
                       ", or parallel.world_size when unset) must be at most the "
                       "worker quota of queue ",
                       queue, " (", *quota, "): the job could never be admitted"));
    }
  }
  return absl::OkStatus();
}

bool IsDns1123Label(absl::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-')) return false;
  }
  return s.front() != '-' && s.back() != '-';
}

}  // namespace

std::string QueueOf(const v1::JobSpec& spec) {
  return spec.queue().empty() ? std::string(kDefaultQueue) : spec.queue();
}

std::optional<int32_t> QueueQuota(const CoordinatorContext& context, const std::string& queue) {
  auto it = context.queue_quotas.find(queue);
  if (it == context.queue_quotas.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<std::map<std::string, int32_t>> ParseQueueQuotas(absl::string_view flag) {
  std::map<std::string, int32_t> quotas;
  if (flag.empty()) return quotas;
  for (absl::string_view entry : absl::StrSplit(flag, ',')) {
    const size_t eq = entry.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--queues: entry \"", absl::CHexEscape(entry),
                       "\" must be NAME=WORKERS (e.g. --queues=a=2,b=2)"));
    }
    const std::string name(entry.substr(0, eq));
    const absl::string_view value = entry.substr(eq + 1);
    if (!IsDns1123Label(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--queues: queue name \"", absl::CHexEscape(name),
          "\" must be a DNS-1123 label (lower-case letters, digits and '-', at most 63, "
          "alphanumeric at both ends)"));
    }
    int32_t quota = 0;
    if (!absl::SimpleAtoi(value, &quota) || quota < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--queues: quota of queue ", name, " (\"",
                                                     absl::CHexEscape(value),
                                                     "\") must be a non-negative worker count"));
    }
    if (!quotas.emplace(name, quota).second) {
      return absl::InvalidArgumentError(absl::StrCat("--queues: queue ", name, " is listed twice"));
    }
  }
  return quotas;
}

std::string UnsupportedParallelism(const v1::ParallelConfig& p) {
  return UnsupportedByEngine("parallel.", p.tensor_model_parallel_size(), p.context_parallel_size(),
                             p.pipeline_model_parallel_size(), p.expert_tensor_parallel_size(),
                             p.virtual_pipeline_model_parallel_size());
}

void PinWorkerParallelism(v1::ParallelConfig* p) {
  if (!p->has_tensor_model_parallel_size()) p->set_tensor_model_parallel_size(1);
  if (!p->has_expert_tensor_parallel_size()) p->set_expert_tensor_parallel_size(1);
  // CP runs in the workers (on the CPU; a CUDA model refuses it for now) but is planned only when
  // the spec fixes it: the planner must not pick it on its own.
  if (!p->has_context_parallel_size()) p->set_context_parallel_size(1);
  // PP runs in the workers (1F1B, worker/train/trainer.h) and, like CP, is the spec's choice:
  // the planner plans the spec's PP (1 when unset) and never picks one on its own.
  if (!p->has_pipeline_model_parallel_size()) p->set_pipeline_model_parallel_size(1);
  p->set_sequence_parallel(p->tensor_model_parallel_size() > 1);
}

void StandInJobDirectory(bool has_checkpoint_root, v1::JobSpec* spec) {
  if (has_checkpoint_root && spec->training().save().empty()) {
    spec->mutable_training()->set_save(kJobDirectoryPlaceholder);
  }
}

absl::StatusOr<v1::JobSpec> ResolveJobSpec(const v1::JobSpec& spec,
                                           const CoordinatorContext& context) {
  v1::JobSpec resolved = spec;
  ApplyDefaults(&resolved);
  if (resolved.queue().empty()) resolved.set_queue(kDefaultQueue);
  if (!resolved.model().has_vocab_size() && ReadsDefaultCorpus(resolved) &&
      context.default_vocab_size > 0) {
    resolved.mutable_model()->set_vocab_size(context.default_vocab_size);
  }
  // Rules that need a checkpoint directory (save_interval) see an empty training.save as the
  // job's own directory, which the coordinator provides when it has a checkpoint root; the
  // returned spec keeps the user's (relative) paths, which AssignedSpec resolves under the roots.
  v1::JobSpec checked = resolved;
  StandInJobDirectory(!context.checkpoint_root.empty(), &checked);

  SY_RETURN_IF_ERROR(ValidateJobSpec(checked));
  SY_RETURN_IF_ERROR(CheckVocabSize(resolved));
  if (std::string why = UnsupportedJobSpec("", resolved); !why.empty()) {
    return absl::InvalidArgumentError(why);
  }
  SY_RETURN_IF_ERROR(CheckJobSpecPaths(resolved));  // common/config/job_paths.h
  SY_RETURN_IF_ERROR(CheckQueue(resolved, context));
  return resolved;
}

absl::StatusOr<v1::PlanRequest> ResolvePlanRequest(const v1::PlanRequest& request,
                                                   const CoordinatorContext& context) {
  v1::PlanRequest resolved = request;
  if (!request.has_spec()) return absl::InvalidArgumentError("spec: required");
  SY_ASSIGN_OR_RETURN(*resolved.mutable_spec(), ResolveJobSpec(request.spec(), context));
  v1::ParallelConfig& p = *resolved.mutable_spec()->mutable_parallel();
  PinWorkerParallelism(&p);
  // As the scheduler (jobs/placement.h WorkerRange): without a world size or min_workers, any
  // world from the cluster's size down to 1 may run, so smaller worlds are planned too.
  v1::JobSpec& spec = *resolved.mutable_spec();
  if (!spec.has_min_workers() && !p.has_world_size()) spec.set_min_workers(1);
  // As the scheduler (jobs/placement.h PlanRequestFor): an empty training.save is the job's
  // directory, so a save_interval without it is planned.
  StandInJobDirectory(!context.checkpoint_root.empty(), &spec);
  return resolved;
}

}  // namespace switchyard::jobs
