// File: common/model_math.cc
#include "common/model_math.h"

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace switchyard {
namespace {

absl::Status Positive(const char* field, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " (", value, ") must be positive"));
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
  if (!m.has_num_experts()) return s;

  s.num_experts = m.num_experts();
  s.moe_topk = m.has_moe_router_topk() ? m.moe_router_topk() : 2;
  s.moe_ffn_hidden_size = m.has_moe_ffn_hidden_size() ? m.moe_ffn_hidden_size() : s.ffn_hidden_size;
  s.shared_ffn_size = m.moe_shared_expert_intermediate_size();
  s.shared_expert_gate = m.moe_shared_expert_gate() && s.shared_ffn_size > 0;
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

double TrainingFlopsPerToken(const ModelShape& m) {
  const double h = m.hidden_size, d = m.head_dim, hq = m.num_heads, hkv = m.num_kv_heads;
  const double attn = 2 * h * (hq * d + 2 * hkv * d) + 2 * hq * d * h;  // q, k, v, o
  const double attn_core = 2.0 * 2.0 * hq * d * (m.seq_length / 2.0);   // q·kᵀ and p·v, causal
  double total = 0;
  for (int64_t l = 0; l < m.num_layers; ++l) {
    total += attn + attn_core;
    if (m.is_moe(l)) {
      total += 2 * h * m.num_experts;                                     // router
      total += 2.0 * m.moe_topk * 3 * h * m.moe_ffn_hidden_size;          // routed experts
      total += 2.0 * 3 * h * m.shared_ffn_size;                           // shared expert
      if (m.shared_ffn_size > 0 && m.shared_expert_gate) total += 2 * h;  // its gate
    } else {
      total += 2.0 * 3 * h * m.ffn_hidden_size;
    }
  }
  total += 2 * h * m.vocab_size;  // LM head
  return 3 * total;
}

}  // namespace switchyard
