// File: coordinator/planner/cost_model.cc
#include "coordinator/planner/cost_model.h"

#include <algorithm>
#include <cassert>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

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

double Ring(double n) { return (n - 1) / n; }

}  // namespace

StageParams ParamsOfStage(const ModelShape& model, const v1::Mapping& p, int64_t stage) {
  const StageParamElements e = StageLayoutElements(model, p, stage);
  return StageParams{static_cast<double>(e.dense), static_cast<double>(e.expert)};
}

v1::MemoryEstimate EstimateMemory(const ModelShape& model, const v1::Mapping& mapping,
                                  int64_t* stage_out, const EngineMemoryOptions& options,
                                  EngineMemory* detail) {
  // The worker shards its optimizer exactly when it runs more than one rank.
  v1::Mapping p = mapping;
  p.set_use_distributed_optimizer(p.tensor_model_parallel_size() * p.context_parallel_size() *
                                      p.data_parallel_size() * p.pipeline_model_parallel_size() >
                                  1);
  v1::MemoryEstimate best;
  EngineMemory best_detail;
  int64_t best_stage = -1;
  for (int64_t s = 0; s < p.pipeline_model_parallel_size(); ++s) {
    const EngineMemory m = EstimateEngineMemory(model, p, s, options);
    if (best_stage < 0 || m.total() > best_detail.total()) {
      best_detail = m;
      best_stage = s;
    }
  }
  best.set_weights(best_detail.weights);
  best.set_gradients(best_detail.gradients);
  best.set_optimizer_states(best_detail.optimizer_states);
  best.set_activations(best_detail.activations());
  best.set_total(best_detail.total());
  if (stage_out != nullptr) *stage_out = best_stage;
  if (detail != nullptr) *detail = best_detail;
  return best;
}

v1::Mapping MakeMapping(int64_t tp, int64_t cp, int64_t dp, int64_t pp, int64_t etp, int64_t ep,
                        int64_t edp) {
  v1::Mapping m;
  m.set_tensor_model_parallel_size(static_cast<int32_t>(tp));
  m.set_context_parallel_size(static_cast<int32_t>(cp));
  m.set_data_parallel_size(static_cast<int32_t>(dp));
  m.set_pipeline_model_parallel_size(static_cast<int32_t>(pp));
  m.set_expert_tensor_parallel_size(static_cast<int32_t>(etp));
  m.set_expert_model_parallel_size(static_cast<int32_t>(ep));
  m.set_expert_data_parallel_size(static_cast<int32_t>(edp));
  m.set_use_distributed_optimizer(tp * cp * dp * pp > 1);
  return m;
}

absl::StatusOr<v1::Mapping> MappingOfSpec(const v1::JobSpec& spec) {
  const v1::ParallelConfig& p = spec.parallel();
  auto size = [](int64_t v) { return v > 0 ? v : int64_t{1}; };
  const int64_t world = size(p.world_size()), tp = size(p.tensor_model_parallel_size());
  const int64_t cp = size(p.context_parallel_size()), pp = size(p.pipeline_model_parallel_size());
  const int64_t ep = size(p.expert_model_parallel_size());
  const int64_t etp =
      p.has_expert_tensor_parallel_size() ? size(p.expert_tensor_parallel_size()) : tp;
  if (world % (tp * cp * pp) != 0 || world % (etp * ep * pp) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.world_size (", world, ") must be divisible by TP*CP*PP (",
                     tp * cp * pp, ") and by ETP*EP*PP (", etp * ep * pp, ")"));
  }
  const int64_t dp = world / (tp * cp * pp);
  const int64_t mbs = size(spec.training().micro_batch_size());
  const int64_t gbs =
      spec.training().has_global_batch_size() ? spec.training().global_batch_size() : mbs * dp;
  if (gbs <= 0 || gbs % (mbs * dp) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("training.global_batch_size (", gbs,
                                                   ") must be divisible by micro_batch_size (", mbs,
                                                   ") x data-parallel size (", dp, ")"));
  }
  v1::Mapping m = MakeMapping(tp, cp, dp, pp, etp, ep, world / (etp * ep * pp));
  m.set_micro_batch_size(static_cast<int32_t>(mbs));
  m.set_num_micro_batches(static_cast<int32_t>(gbs / (mbs * dp)));
  return m;
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
  const int64_t stages = p.pipeline_model_parallel_size();
  const double world = z.tp * z.cp * z.dp * z.pp;
  assert(world == layout.world_size());
  const double h = model.hidden_size;
  const double gbs = z.mbs * z.m * z.dp;
  const double t = z.mbs * model.seq_length / z.cp;  // tokens per micro-batch on a rank
  // Interleaved 1F1B: each stage runs v model chunks (the spec's VPP; 1 = plain 1F1B).
  const double vpp =
      stages > 1 ? static_cast<double>(std::max<int64_t>(1, model.pipeline_virtual_stages)) : 1;
  auto bw = [&](ParallelGroup g) { return GroupBandwidth(cluster, layout, g); };

  // Each micro-batch crosses every stage boundary once per chunk forward (activations) and once
  // backward (their gradient).
  const double pp_comm =
      z.pp > 1 ? vpp * z.m * 2 * 2 * t * h / z.tp / bw(ParallelGroup::kPipeline) : 0;

  // Per stage, for the whole step (m micro-batches): its own layers' compute, plus the LM head on
  // the last, over the W/PP ranks of the stage, and its layers' TP/CP and EP traffic. 1F1B runs
  // at the pace of the slowest stage, whose terms are reported.
  struct StageTime {
    double compute = 0, tp = 0, ep = 0;
    double work(double pp) const { return compute + tp + ep + pp; }
  };
  StageTime slowest;
  for (int64_t s = 0; s < stages; ++s) {
    double layers = 0, moe_layers = 0;
    for (int64_t l : StageLayerIndices(model, stages, s)) {
      layers += 1;
      moe_layers += model.is_moe(l) ? 1 : 0;
    }
    StageTime st;
    // The routed experts' FLOPs, charged (1 + kExpertGemmHalfRows / rows) times (cost_model.h).
    double flops = StageTrainingFlopsPerToken(model, stages, s);
    if (moe_layers > 0 && model.num_experts > 0) {
      const double k = static_cast<double>(model.moe_topk);
      const double expert_flops = 3 * moe_layers * 2 * k * 3 * h * model.moe_ffn_hidden_size;
      const double rows = t / z.tp * k * z.ep * z.etp / model.num_experts;
      flops += expert_flops * kExpertGemmHalfRows / rows;
    }
    const double gemm_rate = cluster.peak_flops() * kComputeEfficiency;
    st.compute = flops * gbs * model.seq_length / (world / z.pp * gemm_rate);
    // Selective recompute, per rank and micro-batch: bytes of the elementwise re-runs (at the
    // HBM rate) and the dense fc1 GEMM again ("mlp").
    double bytes = 0, recompute_flops = 0;
    const double tr = t / z.tp, dense_layers = layers - moe_layers;
    if (model.recompute_moe_act) {
      bytes +=
          moe_layers * 3 * 2 * tr *
          (static_cast<double>(model.moe_topk) * model.moe_ffn_hidden_size + model.shared_ffn_size);
    }
    if (model.recompute_layernorm) bytes += layers * 2 * 2 * 2 * tr * h;
    if (model.recompute_mlp) {
      bytes += dense_layers * 3 * 2 * t * model.ffn_hidden_size / z.tp;
      recompute_flops += dense_layers * 4 * t * h * model.ffn_hidden_size / z.tp;
    }
    st.compute +=
        z.m * (bytes * kFlopsPerHbmByte / cluster.peak_flops() + recompute_flops / gemm_rate);
    if (z.tp > 1) {
      st.tp += z.m * (4 * layers + 4 * (layers - moe_layers)) * Ring(z.tp) * 2 * t * h /
               bw(ParallelGroup::kTensor);
    }
    if (z.cp > 1) {
      st.tp += z.m * layers * 3 * (z.cp - 1) * 2 * 2 * t * model.num_kv_heads * model.head_dim /
               z.tp / bw(ParallelGroup::kContext);
    }
    if (moe_layers > 0 && (z.ep > 1 || z.etp > 1)) {
      const double routed_bytes = 2 * model.moe_topk * (t / z.tp) * h;
      double per_byte = 0;
      if (z.ep > 1) per_byte += Ring(z.ep) / bw(ParallelGroup::kExpert);
      if (z.etp > 1) per_byte += (z.etp - 1) / bw(ParallelGroup::kExpertTensor);
      st.ep = z.m * moe_layers * 4 * routed_bytes * per_byte;
    }
    if (s == 0 || st.work(pp_comm) > slowest.work(pp_comm)) slowest = st;
  }

  v1::TimeEstimate e;
  e.set_compute(slowest.compute);
  e.set_tp_communication(slowest.tp);
  e.set_ep_communication(slowest.ep);
  e.set_pp_communication(pp_comm);

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

  // The m micro-batches at the slowest stage's pace, plus the fill and drain: PP − 1 slots of one
  // chunk's time (work / (v·m)) (Narayanan et al. 2021, interleaved 1F1B).
  const double work =
      e.compute() + e.tp_communication() + e.ep_communication() + e.pp_communication();
  e.set_pipeline_bubble(work * (z.pp - 1) / (vpp * z.m));
  e.set_total(work + e.dp_communication() + e.pipeline_bubble());
  return e;
}

}  // namespace switchyard::planner
