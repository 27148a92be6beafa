// File: common/model_math.h
//
// Parameter counts and training FLOPs of the decoder-only MoE transformer that the worker builds
// (worker/model/gpt_model.h), computed from a job spec's ModelConfig alone, so the coordinator's
// planner and the worker agree on the model's size without the coordinator depending on worker/.
//
// The counts follow MakeGptParamLayout tensor by tensor (without its 64-element alignment
// padding); TrainingFlopsPerToken is the same formula as GptTrainingFlopsPerToken. Per layer:
//   attention matrices   q [Hq·D, H], k and v [Hkv·D, H], o [H, Hq·D]
//   attention norms      input_norm [H], post_attention_norm [H] (+ q_norm, k_norm [D] each)
//   dense MLP            fc1 [2F, H], fc2 [H, F]                      = 3·F·H
//   MoE                  router [E, H]; routed experts fc1 [E, H, 2Fe], fc2 [E, Fe, H]
//                        (= 3·E·H·Fe); shared expert [H, 2S] + [S, H] (= 3·H·S) + gate [H, 1]
// plus the embedding [V, H], the final norm [H] and, when untied, the output layer [V, H].
#ifndef SWITCHYARD_COMMON_MODEL_MATH_H_
#define SWITCHYARD_COMMON_MODEL_MATH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "switchyard/v1/config.pb.h"

namespace switchyard {

// The sizes that determine parameters, FLOPs and activations.
struct ModelShape {
  int64_t num_layers = 0;       // L
  int64_t hidden_size = 0;      // H
  int64_t num_heads = 0;        // Hq
  int64_t num_kv_heads = 0;     // Hkv (num_query_groups)
  int64_t head_dim = 0;         // D (kv_channels)
  int64_t ffn_hidden_size = 0;  // F, dense layers
  int64_t vocab_size = 0;       // V
  int64_t seq_length = 0;       // S
  bool qk_layernorm = false;
  bool untie_embeddings = false;
  std::vector<bool> moe_layers;  // one per layer: true = MoE layer, false = dense SwiGLU MLP
  // MoE (meaningful when some layer is MoE).
  int64_t num_experts = 0;          // E
  int64_t moe_topk = 0;             // k
  int64_t moe_ffn_hidden_size = 0;  // Fe
  int64_t shared_ffn_size = 0;      // S_sh (moe_shared_expert_intermediate_size; 0 = none)
  bool shared_expert_gate = false;

  // From a ModelConfig, defaults applied as in common/config_defaults.cc and
  // worker/model/gpt_model.cc (num_layers 2, num_query_groups = heads, kv_channels = H / heads,
  // ffn 4·H, seq 1024, moe_ffn = ffn, top-k 2, moe_layer_freq 1). INVALID_ARGUMENT naming the
  // field when hidden_size, num_attention_heads or vocab_size is missing or not positive, a
  // size is negative, or moe_layer_pattern has the wrong length.
  static absl::StatusOr<ModelShape> FromProto(const v1::ModelConfig& model);

  bool is_moe(int64_t layer) const { return moe_layers[static_cast<size_t>(layer)]; }
  int64_t num_moe_layers() const;
};

// Per-layer parameter counts, unsharded.
int64_t AttentionMatrixParams(const ModelShape& m);  // q, k, v, o
int64_t LayerNormParams(const ModelShape& m);        // input/post-attention norms (+ q/k norms)
int64_t DenseMlpParams(const ModelShape& m);         // 3·F·H
int64_t RouterParams(const ModelShape& m);           // E·H
int64_t RoutedExpertParams(const ModelShape& m);     // 3·E·H·Fe (all experts of one layer)
int64_t SharedExpertParams(const ModelShape& m);     // 3·H·S_sh (+ H for the gate)
int64_t EmbeddingParams(const ModelShape& m);        // V·H (one of embedding / output layer)

// Every parameter of the model (= GptTotalParams without alignment padding).
int64_t TotalParams(const ModelShape& m);

// Training FLOPs per token (forward + backward = 3 × forward), as GptTrainingFlopsPerToken:
// 2 FLOPs per multiply-add of every GEMM with active parameters (q, k, v, o; router; top-k
// routed experts; shared expert and its gate; dense MLP; LM head) plus the causal attention
// products q·kᵀ and p·v (2·2·Hq·D·S/2 per token). Embedding lookups, norms and elementwise ops
// are not counted.
double TrainingFlopsPerToken(const ModelShape& m);

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_MODEL_MATH_H_
