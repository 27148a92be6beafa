// File: coordinator/jobs/resolve_spec.cc
#include "coordinator/jobs/resolve_spec.h"

#include <algorithm>
#include <string>
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
#include "common/model/model_math.h"
#include "common/status.h"
#include "coordinator/planner/planner.h"

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

namespace {

// The parallel sizes a search may vary (plan.proto PlanSearch), in SearchScope.varied's order;
// `expert` marks those of the expert grid, which a dense model does not have.
struct SearchableSize {
  const char* field;
  bool expert;
  bool (v1::ParallelConfig::*has)() const;
  int32_t (v1::ParallelConfig::*get)() const;
  void (v1::ParallelConfig::*clear)();
};
constexpr SearchableSize kSearchableSizes[] = {
    {"tensor_model_parallel_size", false, &v1::ParallelConfig::has_tensor_model_parallel_size,
     &v1::ParallelConfig::tensor_model_parallel_size,
     &v1::ParallelConfig::clear_tensor_model_parallel_size},
    {"context_parallel_size", false, &v1::ParallelConfig::has_context_parallel_size,
     &v1::ParallelConfig::context_parallel_size, &v1::ParallelConfig::clear_context_parallel_size},
    {"pipeline_model_parallel_size", false, &v1::ParallelConfig::has_pipeline_model_parallel_size,
     &v1::ParallelConfig::pipeline_model_parallel_size,
     &v1::ParallelConfig::clear_pipeline_model_parallel_size},
    {"expert_tensor_parallel_size", true, &v1::ParallelConfig::has_expert_tensor_parallel_size,
     &v1::ParallelConfig::expert_tensor_parallel_size,
     &v1::ParallelConfig::clear_expert_tensor_parallel_size},
    {"expert_model_parallel_size", true, &v1::ParallelConfig::has_expert_model_parallel_size,
     &v1::ParallelConfig::expert_model_parallel_size,
     &v1::ParallelConfig::clear_expert_model_parallel_size},
};

// The search of `request` (plan.proto PlanSearch) applied to `resolved` (request resolved by
// ResolveJobSpec): its world checked and made the only one planned, the sizes the user left unset
// in request.spec cleared again (ResolveJobSpec's defaults set them: EP to 1, ...), so that the
// planner enumerates them. `scope` gets what was searched.
absl::Status ApplySearch(const v1::PlanRequest& request, v1::PlanRequest* resolved,
                         v1::SearchScope* scope) {
  const v1::ParallelConfig& raw = request.spec().parallel();
  const v1::PlanSearch& search = request.search();
  v1::JobSpec& spec = *resolved->mutable_spec();
  v1::ParallelConfig& p = *spec.mutable_parallel();
  const int64_t gpus = request.cluster().num_gpus();

  // The world: the request's, else the spec's, else the largest the cluster and max_workers
  // allow. `what` names where it came from in the messages.
  int64_t world = 0;
  std::string what;
  if (search.has_world_size()) {
    world = search.world_size();
    what = "search.world_size";
    if (world <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("search.world_size (", world, ") must be positive"));
    }
    if (raw.has_world_size() && raw.world_size() != world) {
      return absl::InvalidArgumentError(absl::StrCat(
          "search.world_size (", world, ") must equal parallel.world_size (", raw.world_size(),
          ") when the spec sets it (a size the spec sets stays pinned)"));
    }
    if (gpus > 0 && world > gpus) {
      return absl::InvalidArgumentError(absl::StrCat(
          "search.world_size (", world, ") must be at most cluster.num_gpus (", gpus, ")"));
    }
  } else if (raw.has_world_size()) {
    world = raw.world_size();
    what = "parallel.world_size";
  } else {
    // The cluster's size must be valid before it becomes the world (its other fields are the
    // planner's to check, planner.h ValidateCluster).
    if (gpus <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster.num_gpus (", gpus, ") must be positive"));
    }
    world = spec.has_max_workers() ? std::min<int64_t>(gpus, spec.max_workers()) : gpus;
    what = absl::StrCat("the searched world (search.world_size unset: cluster.num_gpus",
                        spec.has_max_workers() ? " capped by max_workers" : "", ")");
  }
  const auto [min_workers, max_workers] = WorkerRange(spec);
  if (world < min_workers || world > max_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " (", world, ") must be within the spec's worker range [", min_workers, ", ",
        max_workers, "] (min_workers, max_workers; the scheduler runs no other world)"));
  }

  // The sizes the spec pins must divide the world (each grid: megatron_moe.md §5.1).
  SY_ASSIGN_OR_RETURN(const ModelShape model, planner::PlannedModelShape(spec));
  const bool moe = model.num_moe_layers() > 0;
  // A size the user pinned in `raw` (the spec as sent, before ResolveJobSpec's defaults); 1 when
  // unset: some candidate has 1, so the world need only be divisible by the pinned ones.
  auto pinned = [&](const SearchableSize& s) -> int64_t {
    return (raw.*s.has)() ? (raw.*s.get)() : 1;
  };
  const int64_t tp = pinned(kSearchableSizes[0]), cp = pinned(kSearchableSizes[1]),
                pp = pinned(kSearchableSizes[2]), etp = pinned(kSearchableSizes[3]),
                ep = pinned(kSearchableSizes[4]);
  if (world % (tp * cp * pp) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " (", world,
        ") must be divisible by the attention grid the spec pins: tensor_model_parallel_size * "
        "context_parallel_size * pipeline_model_parallel_size (",
        tp, " * ", cp, " * ", pp, " = ", tp * cp * pp, "; an unset size counts as 1)"));
  }
  if (moe && world % (etp * ep * pp) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " (", world,
        ") must be divisible by the expert grid the spec pins: expert_tensor_parallel_size * "
        "expert_model_parallel_size * pipeline_model_parallel_size (",
        etp, " * ", ep, " * ", pp, " = ", etp * ep * pp, "; an unset size counts as 1)"));
  }

  scope->Clear();
  scope->set_world_size(static_cast<int32_t>(world));
  for (const SearchableSize& s : kSearchableSizes) {
    if ((raw.*s.has)()) continue;  // pinned: ResolveJobSpec kept the user's value
    (p.*s.clear)();
    // A dense model has no expert grid: the planner fixes EP 1 and ETP = TP.
    if (!s.expert || moe) scope->add_varied(s.field);
  }
  // The world as the worker range [W, W] when the spec sets no parallel.world_size (PlanJob then
  // plans exactly W): a parallel.world_size would make the planner validate the spec with its
  // unset sizes as 1 at W (planner.cc CheckedModelShape), refusing the whole search when that
  // one mapping breaks a rule (e.g. the global batch not divisible by micro-batch x DP = W) while
  // others of W do not; each candidate is validated on its own instead.
  if (!p.has_world_size()) {
    spec.set_min_workers(static_cast<int32_t>(world));
    spec.set_max_workers(static_cast<int32_t>(world));
  }
  // The planner decides sequence parallelism per candidate (on exactly when TP > 1).
  p.set_sequence_parallel(p.has_tensor_model_parallel_size() && p.tensor_model_parallel_size() > 1);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::PlanRequest> ResolvePlanRequest(const v1::PlanRequest& request,
                                                   const CoordinatorContext& context,
                                                   v1::SearchScope* scope) {
  v1::PlanRequest resolved = request;
  if (!request.has_spec()) return absl::InvalidArgumentError("spec: required");
  SY_ASSIGN_OR_RETURN(*resolved.mutable_spec(), ResolveJobSpec(request.spec(), context));
  v1::ParallelConfig& p = *resolved.mutable_spec()->mutable_parallel();
  v1::JobSpec& spec = *resolved.mutable_spec();
  if (request.has_search()) {
    v1::SearchScope ignored;
    SY_RETURN_IF_ERROR(ApplySearch(request, &resolved, scope != nullptr ? scope : &ignored));
  } else {
    PinWorkerParallelism(&p);
    // As the scheduler (jobs/placement.h WorkerRange): without a world size or min_workers, any
    // world from the cluster's size down to 1 may run, so smaller worlds are planned too.
    if (!spec.has_min_workers() && !p.has_world_size()) spec.set_min_workers(1);
  }
  // As the scheduler (jobs/placement.h PlanRequestFor): an empty training.save is the job's
  // directory, so a save_interval without it is planned.
  StandInJobDirectory(!context.checkpoint_root.empty(), &spec);
  return resolved;
}

}  // namespace switchyard::jobs
