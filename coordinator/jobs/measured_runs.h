// File: coordinator/jobs/measured_runs.h
//
// The planner's estimates next to what the coordinator's own jobs measured (issue 14 "planner
// proven": `syctl plan` prints estimated and, where available, measured columns). A job's stored
// plan (Job.plan: the mapping its current generation runs) and rank 0's latest step report
// (Job.last_step: step time and device memory) are a measurement of that mapping for that job's
// workload; AttachMeasuredRuns puts the newest one of each mapping on the matching candidates of
// a new plan for the same workload.
//
// Same workload (SameWorkload): equal resolved ModelConfig (every field: shape, MoE, recompute,
// dtypes) and equal training.global_batch_size and training.bf16; the micro-batch size is part
// of the Mapping. Step reports before step kMinMeasuredStep are ignored (the first steps carry
// the warm-up: allocator growth, cuBLAS/cuDNN plans). The GPU kind is not compared: a user
// planning for another cluster sees the job name and can look it up.
//
// Calibration (AttachMeasurements, the coordinator's Plan): every mapping measured for the
// workload, not only those of the new plan (the coordinator's plan pins the spec's sizes, so it
// holds one mapping, while the jobs of an EP sweep ran several), is one point of
// coordinator/planner/calibration.h's fit: its newest step time against the model's terms of that
// mapping for the plan's request (planner EstimateMappingTime: the same spec, cluster and code as
// the candidates it corrects; a measured mapping that request's rules refuse, e.g. a PP its
// uneven layout does not fit, is left out). The fitted factors then give each ranked candidate its
// calibrated step time and rank them (ApplyCalibration); Plan.calibration says which.
//
// Cost: one pass over the store's jobs (keyset pages of kMeasuredRunsPageSize), specs and plans
// parsed; the coordinator's store holds its jobs until they are deleted.
#ifndef SWITCHYARD_COORDINATOR_JOBS_MEASURED_RUNS_H_
#define SWITCHYARD_COORDINATOR_JOBS_MEASURED_RUNS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/store/store.h"
#include "switchyard/v1/config.pb.h"
#include "switchyard/v1/plan.pb.h"

namespace switchyard::jobs {

inline constexpr int64_t kMinMeasuredStep = 3;
inline constexpr int kMeasuredRunsPageSize = 200;

// Whether two resolved specs train the same workload (see the file comment).
bool SameWorkload(const v1::JobSpec& a, const v1::JobSpec& b);

// One mapping that jobs of a workload ran, with the newest one's measurement (MeasuredRun.runs:
// how many ran it).
struct MeasuredMapping {
  v1::Mapping mapping;
  v1::MeasuredRun run;
};

// Every mapping some job of the same workload as `spec` ran (step reports from
// kMinMeasuredStep on), in the order the store first lists a job of each. Errors: the store's.
absl::StatusOr<std::vector<MeasuredMapping>> MeasuredMappings(store::Store* store,
                                                              const v1::JobSpec& spec);

// Sets PlanCandidate.measured on plan->best and every alternative whose mapping some job of the
// same workload as `spec` (resolved, as the plan was made from) ran; clears it elsewhere.
// Rejected candidates are left alone. Errors: the store's.
absl::Status AttachMeasuredRuns(store::Store* store, const v1::JobSpec& spec, v1::Plan* plan);

// The coordinator's Plan: AttachMeasuredRuns for `request`'s spec (resolved, as the plan was made
// from), then, when some mapping of the workload was measured, the calibration fitted on all of
// them (file comment) applied to `plan`: Plan.calibration, each ranked candidate's
// calibrated_step_seconds, the ranking by it. Nothing measured: no calibration, and the plan's
// calibration fields are cleared. Errors: the store's.
absl::Status AttachMeasurements(store::Store* store, const v1::PlanRequest& request,
                                v1::Plan* plan);

}  // namespace switchyard::jobs

#endif  // SWITCHYARD_COORDINATOR_JOBS_MEASURED_RUNS_H_
