// File: coordinator/planner/planner.cc
#include "coordinator/planner/planner.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config/config_defaults.h"
#include "common/config/validate.h"
#include "common/model/engine_support.h"
#include "common/model/model_math.h"
#include "common/model/parallel_state.h"
#include "common/status.h"
#include "coordinator/planner/cost_model.h"

namespace switchyard::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

absl::Status ValidateCluster(const v1::Cluster& c) {
  if (c.num_gpus() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster.num_gpus (", c.num_gpus(), ") must be positive"));
  }
  if (c.gpus_per_node() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster.gpus_per_node (", c.gpus_per_node(), ") must be positive"));
  }
  const std::pair<const char*, double> positive[] = {
      {"cluster.gpu_memory_bytes", c.gpu_memory_bytes()},
      {"cluster.intra_node_bandwidth_bytes_per_second", c.intra_node_bandwidth_bytes_per_second()},
      {"cluster.inter_node_bandwidth_bytes_per_second", c.inter_node_bandwidth_bytes_per_second()},
      {"cluster.peak_flops", c.peak_flops()},
  };
  for (const auto& [field, value] : positive) {
    if (!(std::isfinite(value) && value > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " (", value, ") must be positive and finite"));
    }
  }
  return absl::OkStatus();
}

namespace {

std::vector<int64_t> Divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

// The values an axis may take: the spec's value when set, else every divisor of `n`.
std::vector<int64_t> Choices(bool fixed, int64_t value, int64_t n) {
  if (!fixed) return Divisors(n);
  if (value > 0 && n % value == 0) return {value};
  return {};
}

// What the request fixes (see planner.h).
struct Constraints {
  std::optional<int64_t> tp, cp, pp, ep, etp;
  bool moe = false;
  int64_t mbs = 1;
  std::optional<int64_t> global_batch;
};

Constraints ConstraintsOf(const v1::JobSpec& raw, const ModelShape& model) {
  const v1::ParallelConfig& p = raw.parallel();
  Constraints c;
  if (p.has_tensor_model_parallel_size()) c.tp = p.tensor_model_parallel_size();
  if (p.has_context_parallel_size()) c.cp = p.context_parallel_size();
  if (p.has_pipeline_model_parallel_size()) c.pp = p.pipeline_model_parallel_size();
  if (p.has_expert_model_parallel_size()) c.ep = p.expert_model_parallel_size();
  if (p.has_expert_tensor_parallel_size()) c.etp = p.expert_tensor_parallel_size();
  c.moe = model.num_moe_layers() > 0;
  if (raw.training().has_micro_batch_size()) c.mbs = raw.training().micro_batch_size();
  if (raw.training().has_global_batch_size()) c.global_batch = raw.training().global_batch_size();
  return c;
}

auto RankKey(const v1::PlanCandidate& c) {
  const v1::Mapping& m = c.mapping();
  return std::make_tuple(RankingSeconds(c), c.memory().total(), m.tensor_model_parallel_size(),
                         m.context_parallel_size(), m.data_parallel_size(),
                         m.pipeline_model_parallel_size(), m.expert_tensor_parallel_size(),
                         m.expert_model_parallel_size(), m.expert_data_parallel_size());
}

struct Search {
  std::vector<v1::PlanCandidate> feasible;
  std::vector<v1::PlanCandidate> rejected;
  int64_t fit_failures = 0;  // candidates that passed the rules but not the memory check
  std::optional<v1::PlanCandidate> smallest_unfit;  // by peak (steady state or during Create)
  double smallest_unfit_peak = 0;
};

void Reject(Search* s, v1::PlanCandidate c, std::string why) {
  c.set_rejection(std::move(why));
  if (static_cast<int>(s->rejected.size()) < kMaxListedCandidates) {
    s->rejected.push_back(std::move(c));
  }
}

// Evaluates one mapping of `world` ranks and files it under feasible or rejected.
void Evaluate(const v1::PlanRequest& request, const ModelShape& model, const Constraints& k,
              int64_t world, int64_t global_batch, v1::Mapping mapping, Search* s) {
  v1::PlanCandidate c;
  const int64_t dp = mapping.data_parallel_size();
  const int64_t per_step = k.mbs * dp;
  mapping.set_micro_batch_size(static_cast<int32_t>(k.mbs));
  mapping.set_num_micro_batches(
      static_cast<int32_t>(global_batch % per_step == 0 ? global_batch / per_step : 0));
  *c.mutable_mapping() = mapping;
  std::optional<ParallelLayout> layout;
  std::string why = RuleViolations(request.spec(), world, global_batch, mapping, &layout);
  if (!why.empty()) return Reject(s, std::move(c), std::move(why));

  EngineMemory detail;
  *c.mutable_memory() = EstimateMemory(model, mapping, nullptr, EngineMemoryOptions{}, &detail);
  const double limit = request.cluster().gpu_memory_bytes();
  // The peak during Trainer::Create (create_transient: 0 since the distributed optimizer's shards
  // are initialised directly; kept so that a transient the engine may hold again is checked).
  const double peak = c.memory().total() + detail.create_transient;
  if (c.memory().total() > limit || peak > limit) {
    ++s->fit_failures;
    const v1::MemoryEstimate& e = c.memory();
    const std::string at_create =
        peak > e.total() ? absl::StrFormat(", %.2f GiB during Trainer::Create", peak / kGiB) : "";
    c.set_rejection(absl::StrFormat(
        "memory: per-rank estimate %.2f GiB (weights %.2f, gradients %.2f, optimizer states "
        "%.2f, activations %.2f, runtime %.2f GiB%s) exceeds cluster.gpu_memory_bytes (%.2f GiB)",
        e.total() / kGiB, e.weights() / kGiB, e.gradients() / kGiB, e.optimizer_states() / kGiB,
        e.activations() / kGiB, detail.runtime / kGiB, at_create, limit / kGiB));
    if (!s->smallest_unfit || peak < s->smallest_unfit_peak) {
      s->smallest_unfit = c;
      s->smallest_unfit_peak = peak;
    }
    std::string why = c.rejection();
    return Reject(s, std::move(c), std::move(why));
  }
  *c.mutable_time() = EstimateTime(model, request.cluster(), mapping, *layout);
  s->feasible.push_back(std::move(c));
}

// Every candidate mapping of `world` ranks.
void SearchWorld(const v1::PlanRequest& request, const ModelShape& model, const Constraints& k,
                 int64_t world, Search* s) {
  const int64_t global_batch = k.global_batch.value_or(k.mbs * world);
  // The optimizer is what the worker runs (worker/agent/generation.cc creates process groups
  // exactly when W > 1, and Trainer shards its optimizer whenever it has them): DistributedAdamW
  // for W > 1, replicated AdamW for W = 1 (MakeMapping). An explicit
  // parallel.use_distributed_optimizer false rejects every W > 1 mapping (RuleViolations).
  for (int64_t tp : Choices(k.tp.has_value(), k.tp.value_or(0), world)) {
    for (int64_t cp : Choices(k.cp.has_value(), k.cp.value_or(0), world / tp)) {
      for (int64_t pp : Choices(k.pp.has_value(), k.pp.value_or(0), world / tp / cp)) {
        const int64_t dp = world / tp / cp / pp;
        // The expert grid: (ETP, EP, EDP) over the W / PP ranks of a stage.
        std::vector<std::array<int64_t, 3>> experts;
        if (!k.moe) {
          experts.push_back({tp, 1, world / pp / tp});
        } else {
          for (int64_t etp : Choices(k.etp.has_value(), k.etp.value_or(0), world / pp)) {
            for (int64_t ep : Choices(k.ep.has_value(), k.ep.value_or(0), world / pp / etp)) {
              experts.push_back({etp, ep, world / pp / etp / ep});
            }
          }
        }
        for (const auto& [etp, ep, edp] : experts) {
          Evaluate(request, model, k, world, global_batch,
                   MakeMapping(tp, cp, dp, pp, etp, ep, edp), s);
        }
      }
    }
  }
}

// Why no candidate exists at all: the sizes the spec fixes do not factor the world.
std::string FixedSizesText(const v1::ParallelConfig& p) {
  std::vector<std::string> fixed;
  if (p.has_tensor_model_parallel_size()) {
    fixed.push_back(absl::StrCat("tensor_model_parallel_size ", p.tensor_model_parallel_size()));
  }
  if (p.has_context_parallel_size()) {
    fixed.push_back(absl::StrCat("context_parallel_size ", p.context_parallel_size()));
  }
  if (p.has_pipeline_model_parallel_size()) {
    fixed.push_back(
        absl::StrCat("pipeline_model_parallel_size ", p.pipeline_model_parallel_size()));
  }
  if (p.has_expert_tensor_parallel_size()) {
    fixed.push_back(absl::StrCat("expert_tensor_parallel_size ", p.expert_tensor_parallel_size()));
  }
  if (p.has_expert_model_parallel_size()) {
    fixed.push_back(absl::StrCat("expert_model_parallel_size ", p.expert_model_parallel_size()));
  }
  return absl::StrCat("the sizes fixed in parallel (", absl::StrJoin(fixed, ", "),
                      ") do not divide the world size (TP * CP * PP and ETP * EP * PP must)");
}

}  // namespace

std::string RuleViolations(const v1::JobSpec& raw, int64_t world, int64_t global_batch,
                           const v1::Mapping& m, std::optional<ParallelLayout>* layout) {
  v1::JobSpec spec = raw;
  v1::ParallelConfig* p = spec.mutable_parallel();
  p->set_world_size(static_cast<int32_t>(world));
  p->set_tensor_model_parallel_size(m.tensor_model_parallel_size());
  p->set_context_parallel_size(m.context_parallel_size());
  p->set_pipeline_model_parallel_size(m.pipeline_model_parallel_size());
  p->set_expert_model_parallel_size(m.expert_model_parallel_size());
  p->set_expert_tensor_parallel_size(m.expert_tensor_parallel_size());
  p->set_sequence_parallel(m.tensor_model_parallel_size() > 1);
  // An explicit parallel.use_distributed_optimizer is the user's and is validated as given
  // (false is rejected for W > 1); unset, the mapping's choice (sharded exactly when W > 1).
  if (!raw.parallel().has_use_distributed_optimizer()) {
    p->set_use_distributed_optimizer(m.use_distributed_optimizer());
  }
  spec.mutable_training()->set_global_batch_size(static_cast<int32_t>(global_batch));
  ApplyDefaults(&spec);
  std::vector<std::string> violations = AllViolations(spec);
  // Every mapping the planner returns must run in the workers: what the engine does not run
  // (common/model/engine_support.h; nothing the layout rules accept today) is a rejection too.
  if (std::string why = UnsupportedJobSpec("", spec); !why.empty()) violations.push_back(why);
  // The sequence-length rule of CP (2·CP·TP) is one of AllViolations' (common/config).
  if (violations.empty()) {
    ParallelDims dims;
    dims.world_size = world;
    dims.tensor_model_parallel_size = m.tensor_model_parallel_size();
    dims.context_parallel_size = m.context_parallel_size();
    dims.pipeline_model_parallel_size = m.pipeline_model_parallel_size();
    dims.expert_model_parallel_size = m.expert_model_parallel_size();
    dims.expert_tensor_parallel_size = m.expert_tensor_parallel_size();
    absl::StatusOr<ParallelLayout> created = ParallelLayout::Create(dims);
    if (!created.ok()) {
      violations.push_back(std::string(created.status().message()));
    } else {
      layout->emplace(*std::move(created));
    }
  }
  return absl::StrJoin(violations, "; ");
}

absl::StatusOr<ModelShape> PlannedModelShape(const v1::JobSpec& defaulted) {
  SY_ASSIGN_OR_RETURN(ModelShape model, ModelShape::FromProto(defaulted.model()));
  // An uneven pipeline layout sizes each stage (memory follows the largest, step time the
  // slowest), and the spec's virtual stages (interleaved 1F1B) shorten the bubble. Both are the
  // spec's: the planner searches neither, and a candidate PP they do not fit is rejected by the
  // layout rules (RuleViolations).
  const v1::ParallelConfig& par = defaulted.parallel();
  if (par.has_decoder_first_pipeline_num_layers()) {
    model.pipeline_first_layers = par.decoder_first_pipeline_num_layers();
  }
  if (par.has_decoder_last_pipeline_num_layers()) {
    model.pipeline_last_layers = par.decoder_last_pipeline_num_layers();
  }
  if (par.has_virtual_pipeline_model_parallel_size()) {
    model.pipeline_virtual_stages = par.virtual_pipeline_model_parallel_size();
  }
  return model;
}

std::string MappingToString(const v1::Mapping& m) {
  return absl::StrCat("TP", m.tensor_model_parallel_size(), " CP", m.context_parallel_size(), " DP",
                      m.data_parallel_size(), " PP", m.pipeline_model_parallel_size(), " | ETP",
                      m.expert_tensor_parallel_size(), " EP", m.expert_model_parallel_size(),
                      " EDP", m.expert_data_parallel_size(), " | ",
                      m.use_distributed_optimizer() ? "dist-opt" : "replicated-opt", " | mbs ",
                      m.micro_batch_size(), " x ", m.num_micro_batches());
}

double RankingSeconds(const v1::PlanCandidate& c) {
  return c.has_calibrated_step_seconds() ? c.calibrated_step_seconds() : c.time().total();
}

bool RanksBefore(const v1::PlanCandidate& a, const v1::PlanCandidate& b) {
  return RankKey(a) < RankKey(b);
}

namespace {

// What PlanJob checks of a request before the search, and the model shape it estimates with.
absl::StatusOr<ModelShape> CheckedModelShape(const v1::PlanRequest& request) {
  SY_RETURN_IF_ERROR(ValidateCluster(request.cluster()));
  const v1::JobSpec& raw = request.spec();
  // The planner decides sequence parallelism (on exactly when TP > 1), so the spec's flag is
  // replaced before validation, here and for every candidate.
  v1::JobSpec defaulted = raw;
  defaulted.mutable_parallel()->set_sequence_parallel(
      raw.parallel().has_tensor_model_parallel_size() &&
      raw.parallel().tensor_model_parallel_size() > 1);
  ApplyDefaults(&defaulted);
  SY_RETURN_IF_ERROR(ValidateJobSpec(defaulted));
  return PlannedModelShape(defaulted);
}

}  // namespace

absl::StatusOr<v1::TimeEstimate> EstimateMappingTime(const v1::PlanRequest& request,
                                                     const v1::Mapping& mapping) {
  const v1::Mapping& m = mapping;
  const std::pair<const char*, int64_t> sizes[] = {
      {"tensor_model_parallel_size", m.tensor_model_parallel_size()},
      {"context_parallel_size", m.context_parallel_size()},
      {"data_parallel_size", m.data_parallel_size()},
      {"pipeline_model_parallel_size", m.pipeline_model_parallel_size()},
      {"expert_tensor_parallel_size", m.expert_tensor_parallel_size()},
      {"expert_model_parallel_size", m.expert_model_parallel_size()},
      {"expert_data_parallel_size", m.expert_data_parallel_size()},
      {"micro_batch_size", m.micro_batch_size()},
      {"num_micro_batches", m.num_micro_batches()},
  };
  for (const auto& [field, value] : sizes) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("mapping.", field, " (", value, ") must be positive"));
    }
  }
  const int64_t world = int64_t{m.tensor_model_parallel_size()} * m.context_parallel_size() *
                        m.data_parallel_size() * m.pipeline_model_parallel_size();
  const int64_t expert_grid = int64_t{m.expert_tensor_parallel_size()} *
                              m.expert_model_parallel_size() * m.expert_data_parallel_size() *
                              m.pipeline_model_parallel_size();
  if (expert_grid != world) {
    return absl::InvalidArgumentError(absl::StrCat("mapping: ETP * EP * EDP * PP (", expert_grid,
                                                   ") must equal TP * CP * DP * PP (", world, ")"));
  }
  SY_ASSIGN_OR_RETURN(const ModelShape model, CheckedModelShape(request));
  // The mapping's rules with its own micro-batch size and world: the request's worker range
  // (min/max_workers; world_size is replaced by RuleViolations) says which worlds to plan, not
  // what a mapping of another world costs.
  v1::JobSpec spec = request.spec();
  spec.mutable_training()->set_micro_batch_size(m.micro_batch_size());
  spec.clear_min_workers();
  spec.clear_max_workers();
  const int64_t global_batch =
      int64_t{m.micro_batch_size()} * m.num_micro_batches() * m.data_parallel_size();
  std::optional<ParallelLayout> layout;
  if (std::string why = RuleViolations(spec, world, global_batch, m, &layout); !why.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(MappingToString(m), ": ", why));
  }
  return EstimateTime(model, request.cluster(), m, *layout);
}

absl::StatusOr<v1::Plan> PlanJob(const v1::PlanRequest& request) {
  SY_ASSIGN_OR_RETURN(const ModelShape model, CheckedModelShape(request));
  const v1::JobSpec& raw = request.spec();

  const int64_t gpus = request.cluster().num_gpus();
  int64_t max_world = gpus, min_world = gpus;
  if (raw.parallel().has_world_size()) {
    if (raw.parallel().world_size() > gpus) {
      return absl::InvalidArgumentError(
          absl::StrCat("parallel.world_size (", raw.parallel().world_size(),
                       ") must be at most cluster.num_gpus (", gpus, ")"));
    }
    max_world = min_world = raw.parallel().world_size();
  } else {
    if (raw.has_max_workers()) max_world = std::min<int64_t>(max_world, raw.max_workers());
    if (raw.has_min_workers() && raw.min_workers() > gpus) {
      return absl::InvalidArgumentError(absl::StrCat(
          "min_workers (", raw.min_workers(), ") must be at most cluster.num_gpus (", gpus, ")"));
    }
    min_world = raw.has_min_workers() ? std::min<int64_t>(raw.min_workers(), max_world) : max_world;
  }

  const Constraints k = ConstraintsOf(raw, model);
  Search search;
  for (int64_t world = max_world; world >= min_world && search.feasible.empty(); --world) {
    SearchWorld(request, model, k, world, &search);
  }

  if (search.feasible.empty()) {
    if (search.smallest_unfit) {
      const v1::PlanCandidate& c = *search.smallest_unfit;
      return absl::ResourceExhaustedError(absl::StrFormat(
          "no parallel mapping fits in cluster.gpu_memory_bytes (%.2f GiB): %d mapping(s) pass "
          "the rules; the smallest peak is %.2f GiB, %s for a model of %d parameters: %s",
          request.cluster().gpu_memory_bytes() / kGiB, search.fit_failures,
          search.smallest_unfit_peak / kGiB, MappingToString(c.mapping()), TotalParams(model),
          c.rejection()));
    }
    std::string example = search.rejected.empty()
                              ? FixedSizesText(raw.parallel())
                              : absl::StrCat(MappingToString(search.rejected.front().mapping()),
                                             ": ", search.rejected.front().rejection());
    return absl::InvalidArgumentError(
        absl::StrCat("no parallel mapping of world size ", min_world == max_world ? "" : "in [",
                     min_world == max_world ? absl::StrCat(max_world)
                                            : absl::StrCat(min_world, ", ", max_world, "]"),
                     " satisfies the rules; e.g. ", example));
  }

  std::stable_sort(search.feasible.begin(), search.feasible.end(), RanksBefore);
  v1::Plan plan;
  *plan.mutable_best() = search.feasible.front();
  for (size_t i = 1; i < search.feasible.size() && plan.alternatives_size() < kMaxListedCandidates;
       ++i) {
    *plan.add_alternatives() = std::move(search.feasible[i]);
  }
  for (v1::PlanCandidate& c : search.rejected) *plan.add_rejected() = std::move(c);
  return plan;
}

}  // namespace switchyard::planner
