// File: coordinator/jobs/placement.cc
#include "coordinator/jobs/placement.h"

#include <algorithm>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "coordinator/jobs/job_registry.h"

namespace switchyard::jobs {

std::vector<cluster::WorkerInfo> EligibleFor(const std::string& job,
                                             const std::vector<cluster::WorkerInfo>& workers) {
  std::vector<cluster::WorkerInfo> out;
  for (const cluster::WorkerInfo& w : workers) {
    if (w.scope == job) out.push_back(w);
  }
  for (const cluster::WorkerInfo& w : workers) {
    if (w.scope.empty()) out.push_back(w);
  }
  return out;
}

v1::PlanRequest PlanRequestFor(const v1::JobSpec& stored, int32_t min_workers,
                               const std::vector<cluster::WorkerInfo>& workers,
                               const ClusterDefaults& defaults) {
  const int32_t k = static_cast<int32_t>(workers.size());
  v1::PlanRequest request;
  v1::JobSpec& spec = *request.mutable_spec();
  spec = stored;
  v1::ParallelConfig& p = *spec.mutable_parallel();
  p.clear_world_size();
  PinWorkerParallelism(&p);
  spec.set_min_workers(std::min(min_workers, k));
  spec.set_max_workers(k);
  // The scheduler always has a checkpoint root (SchedulerOptions), so an empty save is the job's
  // directory here.
  StandInJobDirectory(/*has_checkpoint_root=*/true, &spec);

  v1::Cluster& cluster = *request.mutable_cluster();
  cluster.set_num_gpus(k);
  double memory = std::numeric_limits<double>::infinity();
  std::map<std::string, int> per_host;
  for (const cluster::WorkerInfo& w : workers) {
    const bool gpu = w.gpu.has_value() && w.gpu->memory_bytes() > 0;
    memory = std::min(memory, gpu ? static_cast<double>(w.gpu->memory_bytes())
                                  : defaults.cpu_worker_memory_bytes);
    ++per_host[w.host];
  }
  if (workers.empty()) memory = defaults.cpu_worker_memory_bytes;
  int gpus_per_node = 1;
  for (const auto& [host, n] : per_host) gpus_per_node = std::max(gpus_per_node, n);
  cluster.set_gpu_memory_bytes(memory);
  cluster.set_gpus_per_node(gpus_per_node);
  cluster.set_intra_node_bandwidth_bytes_per_second(defaults.intra_node_bandwidth_bytes_per_second);
  cluster.set_inter_node_bandwidth_bytes_per_second(defaults.inter_node_bandwidth_bytes_per_second);
  cluster.set_peak_flops(defaults.peak_flops);
  return request;
}

absl::StatusOr<v1::JobSpec> AssignedSpec(const v1::JobSpec& stored, const v1::Mapping& mapping,
                                         int32_t world, const std::string& job_name,
                                         const JobRoots& roots) {
  SY_ASSIGN_OR_RETURN(const int64_t id, jobs::ParseJobName(job_name));
  v1::JobSpec assigned = stored;
  v1::ParallelConfig& p = *assigned.mutable_parallel();
  p.set_world_size(world);
  // The planned grids: TP, CP, PP, ETP and EP as the mapping says (1 for a mapping without TP /
  // CP / PP / ETP).
  p.set_tensor_model_parallel_size(std::max(1, mapping.tensor_model_parallel_size()));
  p.set_context_parallel_size(std::max(1, mapping.context_parallel_size()));
  p.set_pipeline_model_parallel_size(std::max(1, mapping.pipeline_model_parallel_size()));
  p.set_expert_tensor_parallel_size(std::max(1, mapping.expert_tensor_parallel_size()));
  PinWorkerParallelism(&p);
  p.set_expert_model_parallel_size(mapping.expert_model_parallel_size());
  p.set_use_distributed_optimizer(mapping.use_distributed_optimizer());
  v1::TrainingConfig& t = *assigned.mutable_training();
  t.set_micro_batch_size(mapping.micro_batch_size());
  t.set_global_batch_size(mapping.micro_batch_size() * mapping.num_micro_batches() *
                          mapping.data_parallel_size());
  SY_RETURN_IF_ERROR(ResolveJobSpecPaths(roots, id, &assigned));
  return assigned;
}

}  // namespace switchyard::jobs
