// File: coordinator/planner/batch_plan.cc
#include "coordinator/planner/batch_plan.h"

#include <cmath>
#include <optional>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config/config_defaults.h"
#include "common/config/validate.h"
#include "common/model/parallel_state.h"
#include "common/status.h"
#include "coordinator/planner/cost_model.h"
#include "coordinator/planner/planner.h"

namespace switchyard::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// `spec` with micro_batch_size `mbs` and, unless `keep_recompute`, selective recompute of
// `modules` (none: recompute off).
v1::JobSpec VariantSpec(const v1::JobSpec& spec, int64_t mbs, bool keep_recompute,
                        const std::vector<std::string>& modules) {
  v1::JobSpec v = spec;
  v.mutable_training()->set_micro_batch_size(static_cast<int32_t>(mbs));
  if (keep_recompute) return v;
  v1::ModelConfig* m = v.mutable_model();
  m->clear_recompute_modules();
  m->clear_recompute_granularity();
  if (!modules.empty()) {
    m->set_recompute_granularity("selective");
    for (const std::string& module : modules) m->add_recompute_modules(module);
  }
  return v;
}

// Estimates one candidate (rules, memory, time) into `c`. Errors are the request's (a shape or
// mapping the spec itself cannot have), not the candidate's.
absl::Status Evaluate(const v1::PlanRequest& request, const v1::JobSpec& variant, int64_t world,
                      int64_t global_batch, double limit, BatchCandidate* c) {
  v1::JobSpec defaulted = variant;
  // As PlanJob: sequence parallelism exactly when TP > 1.
  defaulted.mutable_parallel()->set_sequence_parallel(
      variant.parallel().tensor_model_parallel_size() > 1);
  ApplyDefaults(&defaulted);
  SY_ASSIGN_OR_RETURN(c->mapping, MappingOfSpec(defaulted));
  std::optional<ParallelLayout> layout;
  c->rule_violations = RuleViolations(defaulted, world, global_batch, c->mapping, &layout);
  if (!c->rule_violations.empty()) return absl::OkStatus();
  SY_ASSIGN_OR_RETURN(const ModelShape model, PlannedModelShape(defaulted));
  EstimateMemory(model, c->mapping, nullptr, EngineMemoryOptions{}, &c->memory);
  c->time = EstimateTime(model, request.cluster(), c->mapping, *layout);
  c->tokens_per_second = static_cast<double>(global_batch) * model.seq_length / c->time.total();
  c->fits = c->memory.total() + c->memory.create_transient <= limit;
  return absl::OkStatus();
}

// Larger is better: tokens/s, then less memory, fewer modules, the smaller micro-batch.
auto Preference(const BatchCandidate& c) {
  return std::make_tuple(c.tokens_per_second, -c.memory.total(),
                         -static_cast<int64_t>(c.recompute_modules.size()), -c.micro_batch_size);
}

}  // namespace

std::string BatchCandidateName(const BatchCandidate& c) {
  return absl::StrCat(
      "mbs ", c.micro_batch_size, ", recompute ",
      c.recompute_modules.empty() ? "none" : absl::StrJoin(c.recompute_modules, "+"));
}

absl::StatusOr<BatchPlan> PlanMicroBatch(const v1::PlanRequest& request,
                                         const BatchPlanOptions& options) {
  SY_RETURN_IF_ERROR(ValidateCluster(request.cluster()));
  if (!(options.headroom >= 0 && options.headroom < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch plan headroom (", options.headroom, ") must be in [0, 1)"));
  }
  const v1::JobSpec& raw = request.spec();
  v1::JobSpec defaulted = raw;
  defaulted.mutable_parallel()->set_sequence_parallel(raw.parallel().tensor_model_parallel_size() >
                                                      1);
  ApplyDefaults(&defaulted);
  SY_RETURN_IF_ERROR(ValidateJobSpec(defaulted));
  if (!raw.training().has_global_batch_size()) {
    return absl::InvalidArgumentError(
        "training.global_batch_size must be set: the batch plan splits a fixed global batch into "
        "micro-batches");
  }
  SY_ASSIGN_OR_RETURN(const v1::Mapping base, MappingOfSpec(defaulted));
  SY_ASSIGN_OR_RETURN(const ModelShape model, PlannedModelShape(defaulted));
  const int64_t gbs = raw.training().global_batch_size(), dp = base.data_parallel_size();
  const int64_t world = static_cast<int64_t>(base.tensor_model_parallel_size()) *
                        base.context_parallel_size() * dp * base.pipeline_model_parallel_size();
  if (gbs <= 0 || gbs % dp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("training.global_batch_size (", gbs,
                                                   ") must be a positive multiple of the "
                                                   "data-parallel size (",
                                                   dp, ")"));
  }
  const bool vary_recompute = options.recompute && model.num_moe_layers() > 0;
  const std::vector<std::vector<std::string>> variants =
      vary_recompute
          ? std::vector<std::vector<std::string>>{{}, {"moe_act"}, {"moe_act", "layernorm"}}
          : std::vector<std::vector<std::string>>{{}};

  BatchPlan plan;
  plan.memory_limit = (1 - options.headroom) * request.cluster().gpu_memory_bytes();
  std::optional<size_t> best;
  for (int64_t mbs = 1; mbs <= gbs / dp; ++mbs) {
    if ((gbs / dp) % mbs != 0) continue;
    for (const std::vector<std::string>& modules : variants) {
      BatchCandidate c;
      c.micro_batch_size = mbs;
      if (vary_recompute) c.recompute_modules = modules;
      const v1::JobSpec variant = VariantSpec(raw, mbs, !vary_recompute, modules);
      SY_RETURN_IF_ERROR(Evaluate(request, variant, world, gbs, plan.memory_limit, &c));
      if (c.fits && (!best || Preference(c) > Preference(plan.candidates[*best]))) {
        best = plan.candidates.size();
      }
      plan.candidates.push_back(std::move(c));
    }
  }
  if (!best) {
    const BatchCandidate* smallest = nullptr;
    for (const BatchCandidate& c : plan.candidates) {
      if (c.rule_violations.empty() &&
          (smallest == nullptr || c.memory.total() < smallest->memory.total())) {
        smallest = &c;
      }
    }
    if (smallest == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("no micro-batch of the global batch passes the rules; e.g. ",
                       BatchCandidateName(plan.candidates.front()), ": ",
                       plan.candidates.front().rule_violations));
    }
    return absl::ResourceExhaustedError(absl::StrFormat(
        "no micro-batch fits in %.2f GiB ((1 - headroom %.2f) x cluster.gpu_memory_bytes "
        "%.2f GiB): the smallest, %s, is estimated at %.2f GiB",
        plan.memory_limit / kGiB, options.headroom, request.cluster().gpu_memory_bytes() / kGiB,
        BatchCandidateName(*smallest), smallest->memory.total() / kGiB));
  }
  plan.best = *best;
  return plan;
}

}  // namespace switchyard::planner
