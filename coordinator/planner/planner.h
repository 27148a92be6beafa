// File: coordinator/planner/planner.h
//
// The coordinator's planner: picks the parallel mapping of a job (DESIGN.md "Plan once, run
// many"). PlanJob enumerates every folding of the world into the attention grid TP×CP×DP×PP and
// the expert grid ETP×EP×EDP×PP (megatron_moe.md §5.1), rejects those that break a rule or do not
// fit in GPU memory, estimates the step time of the rest (coordinator/planner/cost_model.h holds
// every formula and constant) and returns the fastest with the ranked alternatives.
//
// Rules come from the shared code, so the planner and the job validator agree by construction:
// each candidate is written into a copy of the job spec (parallel sizes, world size,
// sequence_parallel = TP > 1, use_distributed_optimizer, the global batch) and checked by
// common/config/validate.h (§5.2 divisibility, heads and query groups by TP, experts by EP, layers
// by PP, global batch by micro-batch × DP, ...) and common/model/parallel_state.h
// (ParallelLayout::Create). One planner rule is added: context parallelism splits each sequence
// into 2·CP chunks (causal load balancing), so model.seq_length must be divisible by 2 * CP when CP
// > 1.
//
// What the request fixes and what the planner chooses:
// - World size: parallel.world_size when set (at most cluster.num_gpus). Otherwise the largest
//   W <= min(cluster.num_gpus, max_workers) is tried first; only when no mapping of W is
//   feasible are smaller worlds tried, down to min_workers (default: no smaller world).
// - Parallel sizes set in the spec (tensor/context/pipeline/expert-model/expert-tensor parallel
//   size) restrict the enumeration to that value; unset ones are enumerated (ETP independently
//   of TP). For a dense model (no model.num_experts) the expert grid is not enumerated: EP = 1,
//   ETP = TP. The coordinator's requests fix PP (jobs/resolve_spec.h PinWorkerParallelism: the
//   spec's, 1 when unset), so PP > 1 is planned when a job asks for it.
// - Every returned mapping runs in the workers: a candidate the engine does not run
//   (common/model/engine_support.h UnsupportedJobSpec; none today) is
//   rejected with that rule, as is one that breaks a common/config rule (e.g. a PP that does not
//   divide model.num_layers, or fewer micro-batches than PP).
// - The optimizer is the engine's, not the request's: every candidate of W > 1 ranks has
//   use_distributed_optimizer = true and is estimated with DistributedAdamW's shards, because the
//   worker shards its optimizer whenever it runs more than one rank (worker/agent/generation.cc
//   creates process groups exactly when W > 1; Trainer then always uses DistributedAdamW); a
//   world of 1 is one process with replicated AdamW (use_distributed_optimizer = false, 12 bytes
//   per parameter). parallel.use_distributed_optimizer is an optional bool: unset takes that
//   choice; an explicit false rejects every W > 1 candidate (there is no replicated optimizer
//   across ranks; common/config/validate_knobs.cc) and true with W = 1 is the same computation.
// - parallel.sequence_parallel is decided by the planner: on exactly when TP > 1 (Megatron
//   requires it for MoE with TP > 1 and forbids it with TP = 1); the spec's flag is ignored.
// - micro_batch_size from the spec (default 1; batch_plan.h chooses it for a fixed mapping). The
// global batch from the spec; when unset it is
//   micro_batch_size × W (what pure data parallelism would run), so every candidate trains the
//   same number of sequences per step and step times compare. num_micro_batches = GBS / (mbs·DP).
// - Pipeline layouts are the spec's: parallel.virtual_pipeline_model_parallel_size (interleaved
//   1F1B: the step time's bubble and PP traffic, cost_model.h) and decoder_first/last_pipeline_
//   num_layers (each stage's layers) are kept in every candidate, not searched; a candidate PP
//   they do not fit breaks a layout rule and is rejected. Multiple distributed-optimizer
//   instances are not modelled.
//
// Fit: a mapping fits when its per-rank estimate (cost_model.h EstimateMemory: the steady state
// of the worker's buffers plus the runtime term) and the peak during Trainer::Create (the same
// since the distributed optimizer's shards are initialised directly: create_transient 0) are
// both within cluster.gpu_memory_bytes.
//
// Ranking: feasible candidates by TimeEstimate.total, ties by MemoryEstimate.total, then by the
// mapping's sizes (TP, CP, DP, PP, ETP, EP, EDP) so plans are deterministic. Plan.best is the
// first, Plan.alternatives the rest, Plan.rejected every rejected candidate with its rule text;
// each list holds at most kMaxListedCandidates entries. The coordinator re-ranks by the same rule
// with the calibrated step time in place of TimeEstimate.total (RanksBefore; calibration.h).
#ifndef SWITCHYARD_COORDINATOR_PLANNER_PLANNER_H_
#define SWITCHYARD_COORDINATOR_PLANNER_PLANNER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/model/model_math.h"
#include "common/model/parallel_state.h"
#include "switchyard/v1/plan.pb.h"

namespace switchyard::planner {

inline constexpr int kMaxListedCandidates = 1000;

// The plan for `request`, or
// - INVALID_ARGUMENT naming the field and the rule for a bad request: a cluster field that is
//   not positive (cluster.num_gpus, gpu_memory_bytes, gpus_per_node, the two bandwidths,
//   peak_flops), a job spec that fails ValidateJobSpec after ApplyDefaults, a missing
//   model.vocab_size, parallel.world_size or min_workers above cluster.num_gpus; or when no
//   mapping of any allowed world size satisfies the rules (the message quotes one rejection);
// - RESOURCE_EXHAUSTED when mappings satisfy the rules but none fits in
//   cluster.gpu_memory_bytes; the message gives the smallest peak (the steady state), its
//   mapping and its breakdown.
absl::StatusOr<v1::Plan> PlanJob(const v1::PlanRequest& request);

// The step-time estimate of one given `mapping` for `request`, as PlanJob computes it for its
// candidates (the same defaulted spec, model shape, rules and EstimateTime): for the mappings
// that jobs measured (calibration.h). The world is the mapping's (TP·CP·DP·PP, whatever
// cluster.num_gpus, parallel.world_size and min/max_workers say), the global batch mbs·m·DP and
// the micro-batch size the mapping's; memory is not checked (the mapping ran). INVALID_ARGUMENT as
// PlanJob for a bad request, or naming the rule when the mapping breaks one (e.g. a PP the spec's
// layout does not fit) or its sizes are inconsistent (a size not positive, EDP != W / (ETP·EP·PP)).
absl::StatusOr<v1::TimeEstimate> EstimateMappingTime(const v1::PlanRequest& request,
                                                     const v1::Mapping& mapping);

// The step time a candidate ranks by: PlanCandidate.calibrated_step_seconds when set, else
// TimeEstimate.total.
double RankingSeconds(const v1::PlanCandidate& candidate);
// The ranking rule (above): whether `a` ranks before `b` (step time by RankingSeconds, then
// memory, then the sizes).
bool RanksBefore(const v1::PlanCandidate& a, const v1::PlanCandidate& b);

// "TP2 CP1 DP4 PP1 | ETP1 EP8 EDP1 | dist-opt | mbs 1 x 4": for messages and logs.
std::string MappingToString(const v1::Mapping& mapping);

// The pieces of PlanJob that other planner functions share (batch_plan.h):
// INVALID_ARGUMENT naming the field when a cluster field PlanJob needs is not positive.
absl::Status ValidateCluster(const v1::Cluster& cluster);
// The model shape PlanJob estimates a defaulted, valid spec with: ModelShape::FromProto plus the
// spec's pipeline layout (decoder_first/last_pipeline_num_layers, virtual stages).
absl::StatusOr<ModelShape> PlannedModelShape(const v1::JobSpec& defaulted);
// The rules `mapping` of `world` ranks breaks for `spec` (its parallel sizes, sequence
// parallelism = TP > 1, the optimizer unless the spec sets it, and `global_batch` written into a
// copy, defaulted, then common/config validation, the engine's support and
// ParallelLayout::Create), joined by "; "; empty when none, and then `layout` holds the layout.
std::string RuleViolations(const v1::JobSpec& spec, int64_t world, int64_t global_batch,
                           const v1::Mapping& mapping, std::optional<ParallelLayout>* layout);

}  // namespace switchyard::planner

#endif  // SWITCHYARD_COORDINATOR_PLANNER_PLANNER_H_
