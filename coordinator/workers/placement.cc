// File: coordinator/workers/placement.cc
#include "coordinator/workers/placement.h"

#include <algorithm>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "coordinator/jobs/job_registry.h"

namespace switchyard::workers {

std::pair<int32_t, int32_t> WorkerRange(const v1::JobSpec& spec) {
  const bool has_world = spec.parallel().has_world_size();
  const int32_t world = spec.parallel().world_size();
  const int32_t min = spec.has_min_workers() ? spec.min_workers() : (has_world ? world : 1);
  const int32_t max = spec.has_max_workers()
                          ? spec.max_workers()
                          : (has_world ? world : std::numeric_limits<int32_t>::max());
  return {std::max(min, 1), max};
}

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

v1::PlanRequest PlanRequestFor(const v1::JobSpec& stored, int32_t min_workers,
                               const std::vector<WorkerInfo>& workers,
                               const ClusterDefaults& defaults) {
  const int32_t k = static_cast<int32_t>(workers.size());
  v1::PlanRequest request;
  v1::JobSpec& spec = *request.mutable_spec();
  spec = stored;
  v1::ParallelConfig& p = *spec.mutable_parallel();
  p.clear_world_size();
  p.set_tensor_model_parallel_size(1);
  p.set_context_parallel_size(1);
  p.set_pipeline_model_parallel_size(1);
  p.set_expert_tensor_parallel_size(1);
  p.set_sequence_parallel(false);
  spec.set_min_workers(std::min(min_workers, k));
  spec.set_max_workers(k);

  v1::Cluster& cluster = *request.mutable_cluster();
  cluster.set_num_gpus(k);
  double memory = std::numeric_limits<double>::infinity();
  std::map<std::string, int> per_host;
  for (const WorkerInfo& w : workers) {
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

v1::JobSpec AssignedSpec(const v1::JobSpec& stored, const v1::Mapping& mapping, int32_t world,
                         const std::string& job_name, const std::string& checkpoint_root) {
  v1::JobSpec assigned = stored;
  v1::ParallelConfig& p = *assigned.mutable_parallel();
  p.set_world_size(world);
  p.set_tensor_model_parallel_size(1);
  p.set_context_parallel_size(1);
  p.set_pipeline_model_parallel_size(1);
  p.set_expert_tensor_parallel_size(1);
  p.set_expert_model_parallel_size(mapping.expert_model_parallel_size());
  p.set_sequence_parallel(false);
  p.set_use_distributed_optimizer(mapping.use_distributed_optimizer());
  v1::TrainingConfig& t = *assigned.mutable_training();
  t.set_micro_batch_size(mapping.micro_batch_size());
  t.set_global_batch_size(mapping.micro_batch_size() * mapping.num_micro_batches() *
                          mapping.data_parallel_size());
  if (t.save().empty()) {
    absl::StatusOr<int64_t> id = jobs::ParseJobName(job_name);
    const std::string dir = id.ok() ? jobs::JobCheckpointDir(checkpoint_root, *id)
                                    : absl::StrCat(checkpoint_root, "/", job_name);
    t.set_save(dir);
    t.set_load(dir);
  } else if (t.load().empty()) {
    t.set_load(t.save());
  }
  return assigned;
}

}  // namespace switchyard::workers
