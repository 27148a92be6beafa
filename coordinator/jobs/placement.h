// File: coordinator/jobs/placement.h
//
// The scheduler's pure decisions about one job (scheduler.h "Policy"), apart from any I/O so
// they can be tested directly: the elastic worker range of a spec, the workers that may run it
// (job scope), the parallel sizes the workers cannot run, the planner request for a set of idle
// workers, and the spec every rank of a generation is assigned.
#ifndef SWITCHYARD_COORDINATOR_WORKERS_PLACEMENT_H_
#define SWITCHYARD_COORDINATOR_WORKERS_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/job_paths.h"
#include "common/config/worker_range.h"
#include "coordinator/cluster/worker_registry.h"
#include "coordinator/jobs/resolve_spec.h"
#include "switchyard/v1/config.pb.h"
#include "switchyard/v1/plan.pb.h"

namespace switchyard::jobs {

// [min, max] workers of a stored (defaulted) spec (common/config/worker_range.h: one definition
// with syctl k8s-workers).
using ::switchyard::WorkerRange;

// The workers of `workers` that may run the job named `job`: those scoped to it
// (WorkerInfo::scope, switchyard-worker --job) first, then the unscoped ones, each group in the
// given order; workers scoped to another job never.
std::vector<cluster::WorkerInfo> EligibleFor(const std::string& job,
                                             const std::vector<cluster::WorkerInfo>& workers);

// The rule lives with the submit rules (coordinator/jobs/resolve_spec.h).

// What the planner is told about machines that the workers do not report.
struct ClusterDefaults {
  double cpu_worker_memory_bytes = 64.0 * (1ull << 30);
  double intra_node_bandwidth_bytes_per_second = 450e9;
  double inter_node_bandwidth_bytes_per_second = 50e9;
  double peak_flops = 989e12;
};

// kJobDirectoryPlaceholder (common/config/job_paths.h) stands for the job's directory in a spec
// planned before its paths are resolved.
using ::switchyard::kJobDirectoryPlaceholder;

// The planner request for `stored` on `workers` (k = workers.size() >= 1): the spec with
// world_size cleared, the spec's TP (1 when unset) and ETP (1 when unset), CP as `stored` fixes it
// (else 1: the planner picks CP only when asked, the CUDA attention does not run it yet), PP as
// `stored` fixes it (else 1: the planner does not pick PP on its own), sequence parallelism exactly
// when TP > 1, min_workers = `min_workers`, max_workers = k, an empty training.save set to
// kJobDirectoryPlaceholder; a cluster of k GPUs whose memory is the smallest GpuInfo memory_bytes
// (cpu_worker_memory_bytes for a worker without one) and whose gpus_per_node is the largest number
// of the workers on one host.
v1::PlanRequest PlanRequestFor(const v1::JobSpec& stored, int32_t min_workers,
                               const std::vector<cluster::WorkerInfo>& workers,
                               const ClusterDefaults& defaults);

// The spec every rank of a generation runs: `stored` with parallel.world_size = `world`,
// the mapping's TP (sequence parallelism on exactly when it is > 1), CP, PP, ETP and EP,
// optimizer and micro-batch size, global batch = micro_batch_size × num_micro_batches × DP, and
// its paths resolved under `roots` for the job of `job_name` ("jobs/{id}") by ResolveJobSpecPaths
// (common/config/job_paths.h): training.save = <checkpoint_root>/jobs/<id>[/<save>],
// training.load = the same directory when empty (resume) or <checkpoint_root>/<load>, data paths
// and tokenizer_model under <data_root>. INVALID_ARGUMENT naming the field when a stored path
// breaks the rules (a spec stored before they existed) or `job_name` is not a job name.
absl::StatusOr<v1::JobSpec> AssignedSpec(const v1::JobSpec& stored, const v1::Mapping& mapping,
                                         int32_t world, const std::string& job_name,
                                         const JobRoots& roots);

}  // namespace switchyard::jobs

#endif  // SWITCHYARD_COORDINATOR_WORKERS_PLACEMENT_H_
