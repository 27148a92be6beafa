// File: common/model/model_math.cc
#include "common/model/model_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/model/parallel_state.h"
#include "common/model/pipeline_layout.h"
#include "common/model/pipeline_schedule.h"

namespace switchyard {
namespace {

absl::Status Positive(const char* field, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " (", value, ") must be positive"));
}

// model.recompute_granularity / recompute_modules into the shape's recompute flags. Validation
// (common/config/validate_knobs.cc) rejects the same specs with fuller messages; this keeps a spec
// that skipped it from running with a module silently ignored.
absl::Status ParseRecompute(const v1::ModelConfig& m, ModelShape* s) {
  const std::string& granularity = m.recompute_granularity();
  if (!granularity.empty() && granularity != "selective") {
    return absl::InvalidArgumentError(
        absl::StrCat("model.recompute_granularity (\"", granularity,
                     "\") is not supported: only \"selective\" (or unset: no recompute)"));
  }
  if (granularity.empty() && m.recompute_modules_size() > 0) {
    return absl::InvalidArgumentError(
        "model.recompute_modules requires model.recompute_granularity \"selective\"");
  }
  for (const std::string& module : m.recompute_modules()) {
    if (module == "moe_act") {
      s->recompute_moe_act = true;
    } else if (module == "layernorm") {
      s->recompute_layernorm = true;
    } else if (module == "mlp") {
      s->recompute_mlp = true;
    } else if (module != "core_attn") {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.recompute_modules: \"", module,
          "\" is not supported (the engine recomputes \"moe_act\", \"layernorm\", \"mlp\"; "
          "\"core_attn\" is a no-op)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelShape> ModelShape::FromProto(const v1::ModelConfig& m) {
  if (!m.has_hidden_size()) return absl::InvalidArgumentError("model.hidden_size is required");
  if (!m.has_num_attention_heads()) {
    return absl::InvalidArgumentError("model.num_attention_heads is required");
  }
  if (!m.has_vocab_size()) {
    return absl::InvalidArgumentError(
        "model.vocab_size is required (the embedding and LM head sizes depend on it)");
  }
  ModelShape s;
  s.num_layers = m.has_num_layers() ? m.num_layers() : 2;
  s.hidden_size = m.hidden_size();
  s.num_heads = m.num_attention_heads();
  s.num_kv_heads = m.has_num_query_groups() ? m.num_query_groups() : s.num_heads;
  s.head_dim =
      m.has_kv_channels() ? m.kv_channels() : (s.num_heads > 0 ? s.hidden_size / s.num_heads : 0);
  s.ffn_hidden_size = m.has_ffn_hidden_size() ? m.ffn_hidden_size() : 4 * s.hidden_size;
  s.vocab_size = m.vocab_size();
  s.seq_length = m.has_seq_length() ? m.seq_length() : 1024;
  s.qk_layernorm = m.qk_layernorm();
  s.untie_embeddings = m.untie_embeddings_and_output_weights();
  for (auto [field, value] : {std::pair<const char*, int64_t>{"model.num_layers", s.num_layers},
                              {"model.hidden_size", s.hidden_size},
                              {"model.num_attention_heads", s.num_heads},
                              {"model.num_query_groups", s.num_kv_heads},
                              {"model.kv_channels", s.head_dim},
                              {"model.ffn_hidden_size", s.ffn_hidden_size},
                              {"model.vocab_size", s.vocab_size},
                              {"model.seq_length", s.seq_length}}) {
    if (absl::Status st = Positive(field, value); !st.ok()) return st;
  }
  s.moe_layers.assign(static_cast<size_t>(s.num_layers), false);
  if (absl::Status st = ParseRecompute(m, &s); !st.ok()) return st;
  if (!m.has_num_experts()) return s;

  s.num_experts = m.num_experts();
  s.moe_topk = m.has_moe_router_topk() ? m.moe_router_topk() : 2;
  s.moe_ffn_hidden_size = m.has_moe_ffn_hidden_size() ? m.moe_ffn_hidden_size() : s.ffn_hidden_size;
  s.shared_ffn_size = m.moe_shared_expert_intermediate_size();
  s.shared_expert_gate = m.moe_shared_expert_gate() && s.shared_ffn_size > 0;
  for (const std::string& type : m.moe_router_load_balancing_type()) {
    if (type == "aux_loss" || type == "seq_aux_loss" || type == "global_aux_loss") {
      ++s.moe_aux_terms;
    }
    if (type == "seq_aux_loss") s.moe_seq_aux = true;
  }
  s.moe_input_jitter = m.moe_input_jitter_eps() > 0;
  s.moe_capacity_factor = m.has_moe_expert_capacity_factor() ? m.moe_expert_capacity_factor() : 0;
  s.moe_pad_to_capacity = m.moe_pad_expert_input_to_capacity();
  s.moe_permute_fusion = m.moe_permute_fusion();
  // The config default (common/config/config_defaults.cc) is allgather.
  s.moe_allgather =
      m.moe_token_dispatcher_type().empty() || m.moe_token_dispatcher_type() == "allgather";
  for (auto [field, value] : {std::pair<const char*, int64_t>{"model.num_experts", s.num_experts},
                              {"model.moe_router_topk", s.moe_topk},
                              {"model.moe_ffn_hidden_size", s.moe_ffn_hidden_size}}) {
    if (absl::Status st = Positive(field, value); !st.ok()) return st;
  }
  if (s.shared_ffn_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.moe_shared_expert_intermediate_size (",
                                                   s.shared_ffn_size, ") must be positive"));
  }
  if (m.moe_layer_pattern_size() > 0) {
    if (m.moe_layer_pattern_size() != s.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.moe_layer_pattern has ", m.moe_layer_pattern_size(),
          " entries, must have one per layer (model.num_layers = ", s.num_layers, ")"));
    }
    for (int i = 0; i < m.moe_layer_pattern_size(); ++i) s.moe_layers[i] = m.moe_layer_pattern(i);
  } else {
    const int64_t freq = m.has_moe_layer_freq() ? m.moe_layer_freq() : 1;
    if (absl::Status st = Positive("model.moe_layer_freq", freq); !st.ok()) return st;
    for (int64_t l = 0; l < s.num_layers; ++l) s.moe_layers[l] = (l % freq == 0);
  }
  return s;
}

int64_t ModelShape::num_moe_layers() const {
  int64_t n = 0;
  for (bool moe : moe_layers) n += moe ? 1 : 0;
  return n;
}

int64_t AttentionMatrixParams(const ModelShape& m) {
  const int64_t h = m.hidden_size, d = m.head_dim;
  return h * m.num_heads * d + 2 * h * m.num_kv_heads * d + m.num_heads * d * h;
}

int64_t LayerNormParams(const ModelShape& m) {
  return 2 * m.hidden_size + (m.qk_layernorm ? 2 * m.head_dim : 0);
}

int64_t DenseMlpParams(const ModelShape& m) { return 3 * m.ffn_hidden_size * m.hidden_size; }

int64_t RouterParams(const ModelShape& m) { return m.num_experts * m.hidden_size; }

int64_t RoutedExpertParams(const ModelShape& m) {
  return 3 * m.num_experts * m.hidden_size * m.moe_ffn_hidden_size;
}

int64_t SharedExpertParams(const ModelShape& m) {
  if (m.shared_ffn_size <= 0) return 0;
  return 3 * m.hidden_size * m.shared_ffn_size + (m.shared_expert_gate ? m.hidden_size : 0);
}

int64_t EmbeddingParams(const ModelShape& m) { return m.vocab_size * m.hidden_size; }

int64_t TotalParams(const ModelShape& m) {
  int64_t n = EmbeddingParams(m) * (m.untie_embeddings ? 2 : 1) + m.hidden_size;  // + final norm
  for (int64_t l = 0; l < m.num_layers; ++l) {
    n += AttentionMatrixParams(m) + LayerNormParams(m);
    n += m.is_moe(l) ? RouterParams(m) + RoutedExpertParams(m) + SharedExpertParams(m)
                     : DenseMlpParams(m);
  }
  return n;
}

int64_t ActiveParams(const ModelShape& m) {
  const int64_t routed_all = RoutedExpertParams(m);
  const int64_t routed_active = m.num_experts > 0 ? routed_all / m.num_experts * m.moe_topk : 0;
  return TotalParams(m) - m.num_moe_layers() * (routed_all - routed_active);
}

namespace {

// Forward FLOPs per token of decoder layer `l` and of the LM head: the terms of
// TrainingFlopsPerToken (model_math.h). Every term is an integer below 2^53, so sums are exact in
// any order (a stage's sum and the whole model's agree to the last bit).
double LayerForwardFlops(const ModelShape& m, int64_t l) {
  const double h = m.hidden_size, d = m.head_dim, hq = m.num_heads, hkv = m.num_kv_heads;
  const double attn = 2 * h * (hq * d + 2 * hkv * d) + 2 * hq * d * h;  // q, k, v, o
  const double attn_core = 2.0 * 2.0 * hq * d * (m.seq_length / 2.0);   // q·kᵀ and p·v, causal
  double total = attn + attn_core;
  if (m.is_moe(l)) {
    total += 2 * h * m.num_experts;                                     // router
    total += 2.0 * m.moe_topk * 3 * h * m.moe_ffn_hidden_size;          // routed experts
    total += 2.0 * 3 * h * m.shared_ffn_size;                           // shared expert
    if (m.shared_ffn_size > 0 && m.shared_expert_gate) total += 2 * h;  // its gate
  } else {
    total += 2.0 * 3 * h * m.ffn_hidden_size;
  }
  return total;
}

double LmHeadForwardFlops(const ModelShape& m) { return 2.0 * m.hidden_size * m.vocab_size; }

}  // namespace

double TrainingFlopsPerToken(const ModelShape& m) {
  double total = 0;
  for (int64_t l = 0; l < m.num_layers; ++l) total += LayerForwardFlops(m, l);
  total += LmHeadForwardFlops(m);
  return 3 * total;
}

double StageTrainingFlopsPerToken(const ModelShape& m, int64_t pp, int64_t stage) {
  double total = 0;
  for (int64_t l : StageLayerIndices(m, pp, stage)) total += LayerForwardFlops(m, l);
  if (stage == pp - 1) total += LmHeadForwardFlops(m);  // the embedding (a lookup) counts 0
  return 3 * total;
}

namespace {

int64_t Align64(int64_t n) { return (n + 63) / 64 * 64; }
int64_t RoundUpTo(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
double Round256(double bytes) { return std::ceil(bytes / 256) * 256; }

struct Dims {
  int64_t tp, cp, dp, pp, etp, ep, edp, mbs, m;
};

Dims DimsOf(const v1::Mapping& p) {
  auto pos = [](int64_t v) { return std::max<int64_t>(1, v); };
  return Dims{pos(p.tensor_model_parallel_size()),
              pos(p.context_parallel_size()),
              pos(p.data_parallel_size()),
              pos(p.pipeline_model_parallel_size()),
              pos(p.expert_tensor_parallel_size()),
              pos(p.expert_model_parallel_size()),
              pos(p.expert_data_parallel_size()),
              pos(p.micro_batch_size()),
              pos(p.num_micro_batches())};
}

}  // namespace

std::pair<int64_t, int64_t> StageLayerRange(const ModelShape& m, int64_t pp, int64_t stage) {
  PipelineSplit split;
  split.num_layers = m.num_layers;
  split.pp = pp;
  split.first_stage_layers = m.pipeline_first_layers;
  split.last_stage_layers = m.pipeline_last_layers;
  absl::StatusOr<LayerRange> r = StageLayers(split, stage, /*chunk=*/0);
  if (r.ok()) return {r->begin, r->begin + r->count};
  const int64_t per_stage = m.num_layers / std::max<int64_t>(pp, 1);
  return {stage * per_stage, (stage + 1) * per_stage};
}

std::vector<int64_t> StageLayerIndices(const ModelShape& m, int64_t pp, int64_t stage) {
  PipelineSplit split;
  split.num_layers = m.num_layers;
  split.pp = pp;
  split.vpp = pp > 1 ? std::max<int64_t>(1, m.pipeline_virtual_stages) : 1;
  split.first_stage_layers = m.pipeline_first_layers;
  split.last_stage_layers = m.pipeline_last_layers;
  std::vector<int64_t> layers;
  if (ValidatePipelineSplit(split).ok()) {
    for (int64_t chunk = 0; chunk < split.vpp; ++chunk) {
      absl::StatusOr<LayerRange> r = StageLayers(split, stage, chunk);
      if (!r.ok()) break;
      for (int64_t l = r->begin; l < r->begin + r->count; ++l) layers.push_back(l);
    }
    if (!layers.empty()) return layers;
  }
  const auto [begin, end] = StageLayerRange(m, pp, stage);
  for (int64_t l = begin; l < end; ++l) layers.push_back(l);
  return layers;
}

StageParamElements StageLayoutElements(const ModelShape& m, const v1::Mapping& mapping,
                                       int64_t stage) {
  const Dims z = DimsOf(mapping);
  const int64_t h = m.hidden_size, d = m.head_dim, tp = z.tp;
  StageParamElements s;
  // With TP the TP-sharded dense tensors (q/k/v/o, the MLPs, the vocabulary-parallel embedding and
  // output layer) form a region of their own, padded on its own (MakeGptParamLayout): it has its
  // own optimizer instance.
  int64_t sharded = 0;
  auto dense = [&](int64_t elements, bool tp_sharded) {
    s.dense += elements;
    if (tp_sharded && tp > 1) sharded += elements;
  };
  for (int64_t l : StageLayerIndices(m, z.pp, stage)) {
    dense(2 * Align64(h), false);                           // input and post-attention norms
    if (m.qk_layernorm) dense(2 * Align64(d), false);       // q_norm, k_norm
    dense(2 * Align64(m.num_heads * d / tp * h), true);     // q, o
    dense(2 * Align64(m.num_kv_heads * d / tp * h), true);  // k, v
    if (m.is_moe(l)) {
      const int64_t local = m.num_experts / z.ep, fe = m.moe_ffn_hidden_size / z.etp;
      dense(Align64(m.num_experts * h), false);  // router
      s.expert += Align64(local * h * 2 * fe) + Align64(local * fe * h);
      if (m.shared_ffn_size > 0) {
        // Split over TP like the dense MLP (fc1 [H, 2S/TP], fc2 [S/TP, H]); the gate is whole.
        const int64_t ssh = m.shared_ffn_size / tp;
        dense(Align64(h * 2 * ssh) + Align64(ssh * h), true);
        if (m.shared_expert_gate) dense(Align64(h), false);
      }
    } else {
      dense(Align64(2 * m.ffn_hidden_size / tp * h) + Align64(h * m.ffn_hidden_size / tp), true);
    }
  }
  // The embedding and the output layer are vocabulary-parallel: V/TP rows on every TP rank.
  const int64_t vocab = Align64(m.vocab_size / tp * h);
  if (z.pp == 1) {
    dense(vocab * (m.untie_embeddings ? 2 : 1), true);
    dense(Align64(h), false);  // final norm
  } else if (stage == 0) {
    dense(vocab, true);
  } else if (stage == z.pp - 1) {
    dense(vocab, true);
    dense(Align64(h), false);
  }
  s.dense_tp_sharded = sharded;
  s.expert_padded = RoundUpTo(s.expert, 64 * z.edp);
  const int64_t multiple = 64 * z.dp * z.cp;
  s.dense_padded = RoundUpTo(sharded, multiple) + RoundUpTo(s.dense - sharded, multiple);
  return s;
}

EngineCommunicatorSet EngineCommunicators(const ModelShape& m, const v1::Mapping& mapping) {
  const Dims z = DimsOf(mapping);
  const int64_t world = z.tp * z.cp * z.dp * z.pp;
  EngineCommunicatorSet out;
  if (world <= 1) return out;  // one process: no process groups
  ParallelDims dims;
  dims.world_size = world;
  dims.tensor_model_parallel_size = z.tp;
  dims.context_parallel_size = z.cp;
  dims.pipeline_model_parallel_size = z.pp;
  dims.expert_model_parallel_size = z.ep;
  dims.expert_tensor_parallel_size = z.etp;
  absl::StatusOr<ParallelLayout> layout = ParallelLayout::Create(dims);
  out.communicators = 2;  // the world and grad_world, whatever the layout
  if (!layout.ok()) return out;
  // FillRoles of worker/train/process_groups.cc on rank 0: the world, then one communicator per
  // role whose members no earlier one has (the roles of its kRoles table; order does not change
  // which lists are distinct).
  std::vector<std::vector<int>> made;
  std::vector<int> everyone(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) everyone[static_cast<size_t>(r)] = r;
  made.push_back(everyone);
  for (ParallelGroup role :
       {ParallelGroup::kTensor, ParallelGroup::kDataContext, ParallelGroup::kContext,
        ParallelGroup::kTensorDataContext, ParallelGroup::kExpert, ParallelGroup::kExpertTensor,
        ParallelGroup::kExpertTensorExpert, ParallelGroup::kExpertData,
        ParallelGroup::kExpertTensorExpertPipeline, ParallelGroup::kPipeline}) {
    std::vector<int> members = layout->Group(role, 0);
    if (std::find(made.begin(), made.end(), members) == made.end()) {
      if (members.size() > 1) ++out.communicators;
      made.push_back(std::move(members));
    }
  }
  // grad_dp_cp and grad_edp: splits of grad_world, one communicator each even when their
  // members equal another's.
  if (z.dp * z.cp > 1) ++out.communicators;
  if (z.edp > 1) ++out.communicators;
  if (m.num_moe_layers() > 0 && !m.moe_allgather && z.ep > 1) {
    out.p2p_peers += std::min<int64_t>(z.ep - 1, kNcclMaxCountedPeers);
  }
  if (z.pp > 1) out.p2p_peers += std::min<int64_t>(z.pp - 1, 2);
  return out;
}

double RuntimeBytes(const ModelShape& m, const v1::Mapping& mapping) {
  const EngineCommunicatorSet c = EngineCommunicators(m, mapping);
  if (c.communicators == 0) return kCudaRuntimeBytes;
  return kCudaRuntimeBytes + kNcclProcessBytes +
         kNcclCommunicatorBytes * static_cast<double>(c.communicators) +
         kNcclPeerBytes * static_cast<double>(c.p2p_peers);
}

EngineMemory EstimateEngineMemory(const ModelShape& m, const v1::Mapping& mapping, int64_t stage,
                                  const EngineMemoryOptions& o) {
  const Dims z = DimsOf(mapping);
  const double a = static_cast<double>(o.param_bytes);
  const double g = o.param_bytes == 8 ? 8 : 4;  // gradients and master weights
  const double r = o.param_bytes == 8 ? 8 : 4;  // router logits/probs
  const double st = o.cuda ? 4 : 8;             // rstd, lse, loss statistics
  const double h = m.hidden_size, hq = m.num_heads, hkv = m.num_kv_heads, d = m.head_dim;
  const double f = m.ffn_hidden_size, v = m.vocab_size, e = m.num_experts, k = m.moe_topk;
  const double ssh = m.shared_ffn_size, tp = z.tp;
  const double t = static_cast<double>(z.mbs * m.seq_length / z.cp);  // tokens per micro-batch
  const double tr = t / tp;  // tokens per rank of the TP group (sequence parallelism)
  const std::vector<int64_t> stage_layers = StageLayerIndices(m, z.pp, stage);
  const bool last = stage == z.pp - 1;
  // Model chunks per stage (interleaved 1F1B), as StageLayerIndices deals them.
  const int64_t vpp = z.pp > 1 ? std::max<int64_t>(1, m.pipeline_virtual_stages) : 1;

  EngineMemory out;
  const StageParamElements p = StageLayoutElements(m, mapping, stage);
  const double n = static_cast<double>(p.total());
  out.weights = a * n;
  out.gradients = g * n;
  const double norm_scratch = 8.0 * 1024 + 3 * 4;  // kGradNormWorkspace f64 + sum_sq, norm, coef
  const int64_t world = z.tp * z.cp * z.dp * z.pp;
  if (world == 1 || !mapping.use_distributed_optimizer()) {
    out.optimizer_states = 3 * g * n + norm_scratch;
  } else {
    out.optimizer_states =
        20.0 * (static_cast<double>(p.dense_padded) / (z.dp * z.cp) +
                static_cast<double>(p.expert_padded) / z.edp) +
        // the trainer's, the dense, the TP-sharded and the expert instance's
        norm_scratch * (2 + (p.dense_tp_sharded > 0 ? 1 : 0) + (p.expert_padded > 0 ? 1 : 0));
    // Trainer::Create initialises the shards directly (the initial values go through the fp32
    // gradient buffer): no full-size transient.
    out.create_transient = 0;
  }

  // Layers: attention, norms, dense MLP (per token, then times t / TP).
  int64_t layers = 0, moe_layers = 0, dense_layers = 0;
  for (int64_t l : stage_layers) {
    ++layers;
    (m.is_moe(l) ? moe_layers : dense_layers) += 1;
  }
  // n1, mid, n2 (with "layernorm" recompute only mid: n1 and n2 are the shared norm scratch).
  double per_layer =
      (m.recompute_layernorm ? 1 : 3) * a * h + 2 * st + 2 * a * hq * d + 2 * a * hkv * d + st * hq;
  if (m.qk_layernorm) per_layer += a * (hq + hkv) * d + st * (hq + hkv);
  // Dense layers' h, a (with "mlp" recompute: the shared MLP scratch).
  const double dense_tokens = m.recompute_mlp ? 0 : 3 * a * f * dense_layers;
  // The residual stream: each chunk's x_0 .. x_n (GptModel: layers + chunks tensors per slot).
  const double layer_tokens =
      a * h * static_cast<double>(layers + vpp) + per_layer * layers + dense_tokens;
  out.layer_activations = tr * layer_tokens;
  // Selective recompute's shared scratch (GptModel::Build), once per stage, whatever the layers
  // and in-flight slots: the norm output [t/TP, H], the dense MLP's h and a [t, 3F/TP].
  double recompute_scratch = 0;
  if (m.recompute_layernorm) recompute_scratch += tr * a * h;
  if (m.recompute_mlp && dense_layers > 0) recompute_scratch += tr * 3 * a * f;
  double moe_act_scratch = 0;  // "moe_act": the SwiGLU scratch of the MoE layers, once
  // The MoE layers' backward-only buffers (MoEGradScratch, worker/model/moe_layer.h), once per
  // stage whatever the layers and slots: the experts' da and dh, the dispatcher's gradients.
  double moe_grad_scratch = 0;

  // MoE layers.
  if (moe_layers > 0) {
    const double local = e / z.ep, fe = static_cast<double>(m.moe_ffn_hidden_size) / z.etp;
    double per_token = 2 * r * e + (a == 2 ? 2 * e : 0) + 8 * k + 2 * r * k;
    if (m.moe_input_jitter) per_token += 2 * a * h;  // the jittered input and the router's dx
    if (ssh > 0) {
      // The shared expert: its output and dx on the rank's sequence shard (2H); fc1/SwiGLU and
      // their gradients over the TP-gathered t = TP·tr tokens with S/TP units, i.e. 6S per
      // shard token at any TP; at TP > 1 the gathered x and the partial sums, [t, H] each.
      // ("moe_act" recompute: 5Ssh, the SwiGLU output is the shared scratch below.)
      per_token += a * ((m.recompute_moe_act ? 5 : 6) * ssh + 2 * h);
      if (z.tp > 1) per_token += 2 * a * h * tp;
      if (m.shared_expert_gate) per_token += 2 * r + a * (2 * h + 1);
    }
    double bytes = tr * per_token;
    double rows = 0;
    if (z.ep == 1 && z.etp == 1) {
      rows = tr * k;
      if (m.moe_pad_to_capacity && m.moe_capacity_factor > 0) {
        const double c = std::ceil(tr * k / e * m.moe_capacity_factor);
        rows = e * (c >= tr ? tr : c);
      }
      // Expert in/out and probs per layer; their gradients 2a·R·H + r·R are the shared scratch.
      // The row map 4t·k and the dispatcher's tokens per expert 4E. With the permutation fused
      // into the experts (MoELayer::permute_fused), no expert input and no output gradient: the
      // row index 4R instead, and a·R·H of shared scratch.
      const bool fused = m.moe_permute_fusion && !m.moe_pad_to_capacity &&
                         static_cast<int64_t>(h) % 128 == 0 && m.moe_ffn_hidden_size % 128 == 0;
      const double io = fused ? a * rows * h + 4 * rows : 2 * a * rows * h;
      bytes += io + r * rows + 4 * tr * k + 4 * e;
      moe_grad_scratch = (fused ? 1 : 2) * a * rows * h + r * rows;
      if (o.cuda) bytes += (std::ceil(tr / 128) + 1) * e * 4;  // permute workspace
    } else if (m.moe_allgather) {
      // AllGatherDispatcher (worker/model/allgather_dispatcher.cc, Create): the ETP×EP group's
      // G = EP·ETP micro-batches gathered, g = G·t tokens, expert rows R = g·k (every gathered
      // slot). Gathered x, y and the padded y 3a·g·H; indices, local indices and row map
      // 12·g·k; probs, padded probs and their gradient 3r·g·k; the reduced y and probs
      // a·t·H + r·t·k; the expert side 2a·R·H + r·R + 4L (its gradients 2a·R·H + r·R are the
      // shared scratch); counts 4(G + 1).
      const double groups = static_cast<double>(z.ep * z.etp), g = groups * tr;
      rows = g * k;
      bytes += 3 * a * g * h + 12 * g * k + 3 * r * g * k + a * tr * h + r * tr * k;
      bytes += 2 * a * rows * h + r * rows + 4 * local + 4 * (groups + 1);
      moe_grad_scratch = 2 * a * rows * h + r * rows;
      if (o.cuda) bytes += (std::ceil(g / 128) + 1) * local * 4;  // permute workspace
    } else {
      // AllToAllDispatcher (worker/model/alltoall_dispatcher.cc, Create): token-deduplicating,
      // each token sent once per destination rank with its routing row (2k probs-dtype values).
      // Send side, S = t·min(EP, k) token rows: rows a·S·H, routing rows 2r·S·k, probs r·S; the
      // rank routing (index, row map 8t·EP, two probs operands 2r·t·EP) and the routing rows
      // 2r·t·k; counts 4(E + EP)(1 + EP (+ ETP·EP)) and tokens per expert 4L.
      const double p = z.ep, q = z.etp, sent = tr * std::min(p, k);
      bytes += a * sent * h + 2 * r * sent * k + r * sent;
      bytes += 8 * tr * p + 2 * r * tr * p + 2 * r * tr * k;
      bytes += 4 * (e + p) * (1 + p + (q > 1 ? q * p : 0)) + 4 * local;
      // Received side, sized by the counts ("Receive buffers"), estimated at its initial size
      // Rc = min(EP·t, S + ⌊S/4⌋) token rows per ETP peer: rows a·Rc·H and routing rows 2r·Rc·k;
      // with ETP > 1 the gathered and padded copies 2a·ETP·Rc·H, 2r·ETP·Rc·k + r·ETP·Rc·k;
      // the local routing (index, row map, probs) (8 + r)·ETP·Rc·k.
      const double rc = std::min(p * tr, sent + std::floor(sent / 4));
      bytes += a * rc * h + 2 * r * rc * k + (8 + r) * q * rc * k;
      if (q > 1) bytes += 2 * a * q * rc * h + 3 * r * q * rc * k;
      // Expert side, X = min(XB, ETP·(t·k + ⌊t·k/4⌋)) rows (XB = ETP·EP·t·min(k, L), the
      // bound): input and one buffer for the output and both gradients (shared, dispatcher.h)
      // 2a·X·H, probs r·X (their gradient r·X is the shared scratch). Routing more uneven than
      // 1.25x the mean grows X (and the expert terms below) on the ranks that receive more, up to
      // XB.
      rows = q * std::min(p * tr * std::min(k, local), tr * k + std::floor(tr * k / 4));
      bytes += 2 * a * rows * h + r * rows;
      moe_grad_scratch = r * rows;
      if (o.cuda) {
        bytes += std::max((std::ceil(tr / 128) + 1) * p * 4,
                          (std::ceil(q * p * tr / 128) + 1) * local * 4);  // permute workspace
      }
    }
    // fc1 output and SwiGLU output per layer; their gradients da, dh 3a·R·Fe/ETP are the shared
    // backward scratch; with "moe_act" recompute the SwiGLU output is one scratch for all MoE
    // layers and slots too (routed rows R, and the shared expert's t/TP tokens · Ssh when
    // present). Both sized at the initial R (they grow with an alltoall's R).
    moe_grad_scratch += 3 * a * rows * fe;
    if (m.recompute_moe_act) {
      bytes += 2 * a * rows * fe;
      moe_act_scratch = a * rows * fe + a * tr * ssh;
    } else {
      bytes += 3 * a * rows * fe;
    }
    const double b = m.moe_seq_aux ? std::max(1.0, std::floor(tr / m.seq_length)) : 1;
    // Aux statistics (8 + 4 + r)·b·E; the layer's tokens per expert and global_aux_loss counts
    // and means 3·4E, and the step's counts summed over TP×DP×CP 4E when the process has groups
    // (W > 1: MoELayer's global_step_counts); the losses and the lse.
    bytes += (8 + 4 + r) * b * e + 4 * (world > 1 ? 4 : 3) * e + r * (m.moe_aux_terms + 1) + 8;
    if (o.cuda) {
      const double chunks = b * std::ceil(tr / b / 16);
      bytes += Round256(8 * chunks * e) + Round256(8 * chunks);  // aux-loss workspace
      bytes += 3 * Round256(4 * e);                              // router workspace
      if (m.moe_capacity_factor > 0) bytes += 2 * Round256(4 * tr * k);
    }
    out.moe_buffers = moe_layers * bytes;
  }
  // One set of the per-layer buffers per micro-batch alive at once on this stage, the count the
  // trainer sizes its slots by (pipeline_schedule.h PipelineAliveMicroBatches: 1F1B min(PP −
  // stage, m); interleaved more, on the last stage too). A micro-batch count the schedule refuses
  // (m < PP, or not a multiple of PP with VPP > 1; validation reports it first): 1F1B's count.
  if (z.pp > 1) {
    const absl::StatusOr<int64_t> alive = PipelineAliveMicroBatches(z.pp, stage, vpp, z.m);
    out.in_flight = alive.ok() ? *alive : std::min(z.pp - stage, z.m);
  }
  out.layer_activations *= static_cast<double>(out.in_flight);
  out.moe_buffers *= static_cast<double>(out.in_flight);
  out.layer_activations += recompute_scratch;
  out.moe_buffers += moe_act_scratch + moe_grad_scratch;

  // Head: final norm, backward scratch, the fused LM-head loss, statistics, the batch.
  double head = tr * (3 * a * h + 2 * a * (hq + hkv) * d + st * (hq + 2)) + 4;
  if (dense_layers > 0 || m.num_moe_layers() < m.num_layers) head += tr * 3 * a * f;
  // Vocabulary-parallel embedding and LM head: V/TP rows per TP rank, over the whole micro-batch
  // (t tokens; tr == t without TP).
  const double vl = v / tp;
  if (last) {
    // The fused LM-head loss: GptModel::Build creates it on the stage holding the LM head only
    // (the last; with virtual stages the one holding the last chunk). Its logits chunk (+ bf16
    // gradient on CUDA), per-token loss terms (CUDA) and the vocabulary-parallel statistics
    // 3·chunk.
    const double budget = o.cuda ? 512.0 * 1024 * 1024 : 64.0 * 1024 * 1024;
    const double chunk = std::max(1.0, std::min(t, std::floor(budget / (vl * 8))));
    head += o.cuda ? chunk * vl * 6 + 4 * t + 3 * 4 * chunk : chunk * vl * 8 + 3 * 8 * chunk;
  }
  head += st * (t - tr);  // the lse of all t tokens (every stage; tr of them counted above)
  if (o.cuda) {
    auto rms_ws = [](double rows, double width) { return std::min(rows, 256.0) * width * 4; };
    // One workspace for the hidden-size norms' backward and, with QK-norm, the QK-norm + RoPE
    // backward (QkNormRopeBackwardWorkspaceBytes: the fused kernels' 2 · min(t, 1024) rows of D
    // partial sums, or the composed path's per-head norm; kernels/attention/qk_norm_rope.h).
    const double qk_ws = m.qk_layernorm ? std::max(2 * std::min(t, 1024.0) * d * 4,
                                                   rms_ws(tr * std::max(hq, hkv), d))
                                        : 0.0;
    head += std::max(rms_ws(tr, h), qk_ws);
    head += 4 * ((vl + 1) + vl + 2 * t);  // embedding backward
  }
  if (z.tp > 1) {
    // Sequence parallelism's scratch (GptModel::Build): the all-gathered input and the partial
    // sums before the reduce-scatter, [t, H] each, a third [t, H] for the permuted rows when a
    // micro-batch holds more than one sequence, and the micro-batch's ids mapped to this rank's
    // vocabulary rows (i32 [t]).
    head += a * t * h * (z.mbs > 1 ? 3 : 2) + 4 * t;
  }
  if (z.cp > 1) {
    // Context parallelism's K/V gather (GptModel::Build): the gathered rows, the whole K and V
    // and their gradients, B·S rows of Hkv/TP heads each, and two partial gradients of S rows.
    const double kv_row = a * (hkv / tp) * d;
    head += kv_row * (5 * t * z.cp + 2 * static_cast<double>(m.seq_length));
  }
  const double n_moe = static_cast<double>(m.num_moe_layers());
  head += st * z.m + r * z.m * n_moe * (m.moe_aux_terms + 1) + 4 * z.m * n_moe * e;
  head += 8 * n_moe * e;  // expert bias and local token counts
  // ids and targets: on CUDA this rank's t tokens on the device; on the CPU the host staging of
  // the micro-batch's whole samples (Trainer::LoadMicroBatch slices them to the CP rank in place).
  head += 8 * (o.cuda ? t : t * z.cp);
  if (z.pp > 1) {
    // The trainer's pipeline receive buffers (a stage's input and its output's gradient,
    // [t/TP, H]), plus its message-buffer pool (pipeline_schedule.h PipelinePoolBuffers, the
    // trainer allocates exactly those: the interleaved step's and evaluation's receives) and,
    // with a tied embedding, the other end's embedding gradient [V/TP, H] on the first and the
    // last stage (Trainer::SumSharedEmbeddingGrad).
    const absl::StatusOr<int64_t> messages = PipelinePoolBuffers(z.pp, stage, vpp, z.m);
    head += (2 + static_cast<double>(messages.ok() ? *messages : 0)) * a * tr * h;
    if (!m.untie_embeddings && (stage == 0 || last)) head += g * vl * h;
  }
  out.head_buffers = head;

  out.runtime = o.runtime_bytes >= 0 ? o.runtime_bytes : (o.cuda ? RuntimeBytes(m, mapping) : 0.0);
  return out;
}

}  // namespace switchyard
