// File: coordinator/planner/cost_model.cc
#include "coordinator/planner/cost_model.h"

#include <algorithm>
#include <cassert>
#include <vector>

namespace switchyard::planner {
namespace {

struct Sizes {
  double tp, cp, dp, pp, etp, ep, edp, mbs, m;
};

Sizes SizesOf(const v1::Mapping& p) {
  return Sizes{static_cast<double>(p.tensor_model_parallel_size()),
               static_cast<double>(p.context_parallel_size()),
               static_cast<double>(p.data_parallel_size()),
               static_cast<double>(p.pipeline_model_parallel_size()),
               static_cast<double>(p.expert_tensor_parallel_size()),
               static_cast<double>(p.expert_model_parallel_size()),
               static_cast<double>(p.expert_data_parallel_size()),
               static_cast<double>(p.micro_batch_size()),
               static_cast<double>(p.num_micro_batches())};
}

int64_t LayersPerStage(const ModelShape& model, const v1::Mapping& p) {
  return model.num_layers / p.pipeline_model_parallel_size();
}

// Activation bytes per token of the rank's sequence shard for one micro-batch of `stage`.
double ActivationBytesPerToken(const ModelShape& model, const v1::Mapping& p, int64_t stage) {
  const Sizes z = SizesOf(p);
  const double h = model.hidden_size, hq = model.num_heads, hkv = model.num_kv_heads,
               d = model.head_dim, f = model.ffn_hidden_size, e = model.num_experts,
               k = model.moe_topk, fe = model.moe_ffn_hidden_size, ssh = model.shared_ffn_size;
  const double attention = 2 * 2 * h + 2 * (2 * hq + 2 * hkv) * d + 4 * hq;
  const double dense = 2 * 2 * h + 2 * 3 * f;
  const double moe = 2 * 2 * h + 4 * 2 * e + 2 * k * (2 * z.etp * h + 3 * fe) + 2 * 3 * ssh;
  const int64_t per_stage = LayersPerStage(model, p);
  double bytes = 0;
  for (int64_t l = stage * per_stage; l < (stage + 1) * per_stage; ++l) {
    bytes += attention + (model.is_moe(l) ? moe : dense);
  }
  if (stage == p.pipeline_model_parallel_size() - 1) bytes += 2 * 2 * h + 4.0 * model.vocab_size;
  return bytes / z.tp;
}

double Ring(double n) { return (n - 1) / n; }

}  // namespace

StageParams ParamsOfStage(const ModelShape& model, const v1::Mapping& p, int64_t stage) {
  const Sizes z = SizesOf(p);
  const int64_t pp = p.pipeline_model_parallel_size();
  const int64_t per_stage = LayersPerStage(model, p);
  StageParams s;
  for (int64_t l = stage * per_stage; l < (stage + 1) * per_stage; ++l) {
    s.dense += AttentionMatrixParams(model) / z.tp + LayerNormParams(model);
    if (model.is_moe(l)) {
      const double shared_gate = model.shared_expert_gate ? model.hidden_size : 0;
      s.dense +=
          RouterParams(model) + (SharedExpertParams(model) - shared_gate) / z.tp + shared_gate;
      s.expert += RoutedExpertParams(model) / z.ep / z.etp;
    } else {
      s.dense += DenseMlpParams(model) / z.tp;
    }
  }
  const double vocab = EmbeddingParams(model) / z.tp;
  if (pp == 1) {
    s.dense += vocab * (model.untie_embeddings ? 2 : 1) + model.hidden_size;
  } else if (stage == 0) {
    s.dense += vocab;
  } else if (stage == pp - 1) {
    s.dense += vocab + model.hidden_size;
  }
  return s;
}

v1::MemoryEstimate EstimateMemory(const ModelShape& model, const v1::Mapping& p,
                                  int64_t* stage_out) {
  const Sizes z = SizesOf(p);
  const int64_t pp = p.pipeline_model_parallel_size();
  const double tokens = z.mbs * model.seq_length / z.cp;
  v1::MemoryEstimate best;
  int64_t best_stage = -1;
  for (int64_t s = 0; s < pp; ++s) {
    const StageParams params = ParamsOfStage(model, p, s);
    const double n = params.dense + params.expert;
    v1::MemoryEstimate e;
    e.set_weights(kWeightBytesPerParam * n);
    e.set_gradients(kGradBytesPerParam * n);
    e.set_optimizer_states(
        kOptimizerBytesPerParam *
        (p.use_distributed_optimizer() ? params.dense / (z.dp * z.cp) + params.expert / z.edp : n));
    const double in_flight = std::min<double>(static_cast<double>(pp - s), z.m);
    e.set_activations(tokens * ActivationBytesPerToken(model, p, s) * in_flight);
    e.set_total(e.weights() + e.gradients() + e.optimizer_states() + e.activations() +
                kWorkspaceBytes);
    if (best_stage < 0 || e.total() > best.total()) {
      best = e;
      best_stage = s;
    }
  }
  if (stage_out != nullptr) *stage_out = best_stage;
  return best;
}

double GroupBandwidth(const v1::Cluster& cluster, const ParallelLayout& layout,
                      ParallelGroup group) {
  const int per_node = cluster.gpus_per_node();
  for (const std::vector<int>& members : layout.AllGroups(group)) {
    for (int r : members) {
      if (r / per_node != members.front() / per_node) {
        return cluster.inter_node_bandwidth_bytes_per_second();
      }
    }
  }
  return cluster.intra_node_bandwidth_bytes_per_second();
}

v1::TimeEstimate EstimateTime(const ModelShape& model, const v1::Cluster& cluster,
                              const v1::Mapping& p, const ParallelLayout& layout) {
  const Sizes z = SizesOf(p);
  const double world = z.tp * z.cp * z.dp * z.pp;
  assert(world == layout.world_size());
  const double h = model.hidden_size;
  const double gbs = z.mbs * z.m * z.dp;
  const double t = z.mbs * model.seq_length / z.cp;  // tokens per micro-batch on a rank
  const double layers = model.num_layers / z.pp;
  const double moe_layers = model.num_moe_layers() / z.pp;
  auto bw = [&](ParallelGroup g) { return GroupBandwidth(cluster, layout, g); };

  v1::TimeEstimate e;
  e.set_compute(TrainingFlopsPerToken(model) * gbs * model.seq_length /
                (world * cluster.peak_flops() * kComputeEfficiency));

  double tp = 0;
  if (z.tp > 1) {
    tp += z.m * (4 * layers + 4 * (layers - moe_layers)) * Ring(z.tp) * 2 * t * h /
          bw(ParallelGroup::kTensor);
  }
  if (z.cp > 1) {
    tp += z.m * layers * 3 * (z.cp - 1) * 2 * 2 * t * model.num_kv_heads * model.head_dim / z.tp /
          bw(ParallelGroup::kContext);
  }
  e.set_tp_communication(tp);

  double ep = 0;
  if (moe_layers > 0 && (z.ep > 1 || z.etp > 1)) {
    const double routed_bytes = 2 * model.moe_topk * (t / z.tp) * h;
    double per_byte = 0;
    if (z.ep > 1) per_byte += Ring(z.ep) / bw(ParallelGroup::kExpert);
    if (z.etp > 1) per_byte += (z.etp - 1) / bw(ParallelGroup::kExpertTensor);
    ep = z.m * moe_layers * 4 * routed_bytes * per_byte;
  }
  e.set_ep_communication(ep);

  e.set_pp_communication(z.pp > 1 ? z.m * 2 * 2 * t * h / z.tp / bw(ParallelGroup::kPipeline) : 0);

  int64_t stage = 0;
  EstimateMemory(model, p, &stage);
  const StageParams params = ParamsOfStage(model, p, stage);
  double dp = 0;
  const double nd = z.dp * z.cp;
  if (nd > 1) dp += 2 * Ring(nd) * 4 * params.dense / bw(ParallelGroup::kDataContext);
  if (z.edp > 1 && params.expert > 0) {
    dp += 2 * Ring(z.edp) * 4 * params.expert / bw(ParallelGroup::kExpertData);
  }
  e.set_dp_communication(dp);

  const double work =
      e.compute() + e.tp_communication() + e.ep_communication() + e.pp_communication();
  e.set_pipeline_bubble(work * (z.pp - 1) / z.m);
  e.set_total(work + e.dp_communication() + e.pipeline_bubble());
  return e;
}

}  // namespace switchyard::planner
