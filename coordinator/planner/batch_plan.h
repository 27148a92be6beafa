// File: coordinator/planner/batch_plan.h
//
// The micro-batch of a job whose parallel mapping is fixed (issue 16: "pick the benchmark's
// default batch by the planner, not by hand"). PlanJob (planner.h) takes micro_batch_size from
// the spec and chooses the mapping; PlanMicroBatch keeps the spec's mapping (MappingOfSpec: its
// world and parallel sizes) and its global batch, and chooses how the batch is split:
//
//   candidates  micro_batch_size ∈ the divisors of GBS / DP (num_micro_batches = GBS / (mbs·DP)),
//               each with the selective-recompute modules none, "moe_act", "moe_act" +
//               "layernorm" (model.recompute_modules under granularity "selective"; MoE models
//               and BatchPlanOptions::recompute only; otherwise the spec's own recompute setting);
//   rules       each candidate spec passes the planner's rules (RuleViolations: common/config
//               validation, the engine's support, the parallel layout) or is listed with them;
//   memory      EstimateMemory (cost_model.h) of the largest stage, the CUDA bf16 engine;
//               fits when it and the peak during Trainer::Create are at most
//               (1 − headroom) · cluster.gpu_memory_bytes;
//   time        EstimateTime (cost_model.h): the micro-batch enters through the experts' GEMM
//               efficiency (rows per expert, kExpertGemmHalfRows) and the pipeline bubble, the
//               recompute modules through their re-run cost (kFlopsPerHbmByte);
//   choice      the fitting candidate of the most estimated tokens/s (GBS · S / step time); ties
//               by less memory, fewer recompute modules, the smaller micro-batch.
//
// The headroom covers what the estimate does not hold: the alltoall dispatcher's buffers grow
// past their estimated initial size (1.25x the balanced receipt) under uneven routing, and the
// CUDA allocator's fragmentation. The estimate itself is the engine's buffers to the byte on the
// CPU (bench/memory_estimate_test); on an H200 it was within 0.3 % of cudaMemGetInfo for the
// benchmark model at micro-batch 2 (model_math.h, kCudaRuntimeBytes), and at micro-batch 8 the
// run held 87.2 GiB where that code estimated 86.9 GiB (bench/README.md). Both runs
// predate the shared MoE backward buffers (MoEGradScratch); no GPU has run the estimate since.
#ifndef SWITCHYARD_COORDINATOR_PLANNER_BATCH_PLAN_H_
#define SWITCHYARD_COORDINATOR_PLANNER_BATCH_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_math.h"
#include "switchyard/v1/plan.pb.h"

namespace switchyard::planner {

// The fraction of cluster.gpu_memory_bytes PlanMicroBatch keeps free by default (see above).
inline constexpr double kDefaultBatchHeadroom = 0.10;

struct BatchPlanOptions {
  double headroom = kDefaultBatchHeadroom;  // in [0, 1)
  // Also vary the selective-recompute modules (MoE models); false keeps the spec's.
  bool recompute = true;
};

struct BatchCandidate {
  int64_t micro_batch_size = 0;
  std::vector<std::string> recompute_modules;  // empty: no recompute
  v1::Mapping mapping;
  // Empty when the candidate passes the rules; then memory and time are its estimates.
  std::string rule_violations;
  EngineMemory memory;  // per rank, the largest stage
  v1::TimeEstimate time;
  double tokens_per_second = 0;  // estimated: GBS · S / time.total
  bool fits = false;
};

struct BatchPlan {
  // Micro-batch ascending; per micro-batch the recompute variants in the order above.
  std::vector<BatchCandidate> candidates;
  size_t best = 0;          // index into candidates
  double memory_limit = 0;  // (1 − headroom) · cluster.gpu_memory_bytes, bytes
};

// The batch plan of `request.spec` on `request.cluster`, or
// - INVALID_ARGUMENT naming the field and the rule: a cluster field PlanJob rejects, the spec
//   failing ValidateJobSpec, training.global_batch_size unset (the plan splits a fixed global
//   batch) or not a multiple of the data-parallel size, parallel sizes that do not divide the
//   world (MappingOfSpec), a headroom outside [0, 1);
// - RESOURCE_EXHAUSTED when no candidate that passes the rules fits; the message gives the
//   limit and the smallest candidate's estimate.
absl::StatusOr<BatchPlan> PlanMicroBatch(const v1::PlanRequest& request,
                                         const BatchPlanOptions& options = {});

// "mbs 4, recompute moe_act+layernorm" (or "recompute none"): for tables and messages.
std::string BatchCandidateName(const BatchCandidate& candidate);

}  // namespace switchyard::planner

#endif  // SWITCHYARD_COORDINATOR_PLANNER_BATCH_PLAN_H_
