// File: worker/checkpoint/hf_convert.h
//
// Import and export of HuggingFace `transformers` checkpoints of MixtralForCausalLM and
// Qwen3MoeForCausalLM (config.json + model.safetensors, or sharded with
// model.safetensors.index.json), so a small HF model can be loaded into GptModel, trained and
// written back in the layout `transformers` reads.
//
// Tensor mapping (HF name -> our name, worker/model/gpt_model.h; l = layer, j = expert; "moe" is
// `block_sparse_moe` for Mixtral as transformers 4.x writes it, or `mlp` for Qwen3 and for the
// Mixtral of transformers 5):
//   model.embed_tokens.weight [V,H]                    -> embedding.weight [V,H]
//   model.layers.l.input_layernorm.weight [H]          -> layers.l.input_norm.weight
//   model.layers.l.self_attn.{q,k,v,o}_proj.weight     -> layers.l.attention.{q,k,v,o}.weight (as
//   is) model.layers.l.self_attn.{q,k}_norm.weight [D]     -> layers.l.attention.{q,k}_norm.weight
//   (Qwen3) model.layers.l.post_attention_layernorm.weight [H] ->
//   layers.l.post_attention_norm.weight model.layers.l.<moe>.gate.weight [E,H]             ->
//   layers.l.moe.router.weight [E,H] per-expert (the classic layout; export always writes this
//   one):
//     Mixtral: <moe>.experts.j.w1.weight [F,H] (gate), .w3.weight [F,H] (up), .w2.weight [H,F]
//     Qwen3:   mlp.experts.j.gate_proj.weight [F,H], .up_proj.weight [F,H], .down_proj.weight [H,F]
//     -> layers.l.moe.experts.fc1[j] = [gateᵀ | upᵀ] [H,2F];  layers.l.moe.experts.fc2[j] = downᵀ
//   fused 3-D (import only; transformers 5 style), detected by name and shape:
//     <moe>.experts.gate_up_proj [E,2F,H] (gate rows, then up rows: x·Wᵀ, chunk(2)) or
//                                [E,H,2F] (gate columns, then up columns; NOT interleaved)
//     <moe>.experts.down_proj    [E,H,F] (x·Wᵀ) or [E,F,H] (x·W)
//     When 2F == H (or F == H for down_proj) the shape is ambiguous and the first form is taken.
//   Qwen3 dense layers (mlp_only_layers / decoder_sparse_step):
//     mlp.gate_proj [F,H], mlp.up_proj [F,H] -> layers.l.mlp.fc1.weight = cat rows [2F,H]
//     mlp.down_proj [H,F]                    -> layers.l.mlp.fc2.weight [H,F]
//   model.norm.weight [H]                   -> final_norm.weight
//   lm_head.weight [V,H]                    -> output.weight (untied); with tied embeddings an
//                                              lm_head.weight, if present, must equal the embedding
//   `*.rotary_emb.inv_freq` (old checkpoints) is ignored; any other unknown tensor is an error.
//
// Config mapping (config.json -> v1::ModelConfig): hidden_size, num_hidden_layers -> num_layers,
// num_attention_heads, num_key_value_heads -> num_query_groups, head_dim -> kv_channels (default
// hidden/heads), intermediate_size -> ffn_hidden_size (Qwen3 dense layers; for Mixtral also the
// expert size), moe_intermediate_size (Qwen3) / intermediate_size (Mixtral) ->
// moe_ffn_hidden_size, num_local_experts / num_experts -> num_experts, num_experts_per_tok ->
// moe_router_topk, rms_norm_eps -> norm_epsilon, rope_theta -> rotary_base, vocab_size,
// max_position_embeddings, tie_word_embeddings -> !untie_embeddings_and_output_weights,
// norm_topk_prob (Qwen3; Mixtral always renormalises) -> moe_router_pre_softmax = !norm_topk_prob
// (Megatron §1: top-k of the logits then softmax == softmax, top-k, renormalise), Qwen3 ->
// qk_layernorm, decoder_sparse_step + mlp_only_layers -> moe_layer_pattern, router_aux_loss_coef
// -> moe_router_load_balancing_type ["aux_loss"] with moe_aux_loss_coeff [coef] (HF adds it only
// with output_router_logits; we always train with it), router_jitter_noise (Mixtral) ->
// moe_input_jitter_eps. seq_length is left unset (set it for training). Rejected (error names
// the key): other architectures, hidden_act != "silu", attention_bias / mlp_bias true, a
// sliding window in use (Mixtral sliding_window < max_position_embeddings; Qwen3
// use_sliding_window), rope_scaling set, a Qwen3 shared expert (shared_expert_intermediate_size
// > 0), num_experts 0.
//
// Dtypes: F32, BF16, F16 and F64 inputs are widened exactly to f32. Export writes f32, bf16
// (round to nearest even), f16 (round to nearest even) or f64.
//
// Memory: import holds the whole model in f32 host memory; export builds every output tensor in
// host memory before writing (fine for the small models this is meant for).
// Thread-safety: free functions, no shared state.
#ifndef SWITCHYARD_WORKER_CHECKPOINT_HF_CONVERT_H_
#define SWITCHYARD_WORKER_CHECKPOINT_HF_CONVERT_H_

#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "kernels/runtime/buffer.h"
#include "switchyard/v1/config.pb.h"
#include "worker/model/gpt_model.h"

namespace switchyard::model {

inline constexpr char kHfMixtral[] = "MixtralForCausalLM";
inline constexpr char kHfQwen3Moe[] = "Qwen3MoeForCausalLM";

// An imported checkpoint: the model config and every parameter under OUR name and layout, as an
// f32 CPU buffer.
struct HfCheckpoint {
  std::string architecture;  // kHfMixtral or kHfQwen3Moe
  v1::ModelConfig config;
  std::map<std::string, kernels::Buffer> tensors;
  // A view of tensor `name`; NotFound if absent.
  absl::StatusOr<Tensor> Get(const std::string& name) const;
};

// Maps an HF config.json text onto a ModelConfig (see the file comment); `architecture` receives
// the architecture name. InvalidArgument naming the key for anything we cannot represent.
absl::StatusOr<v1::ModelConfig> HfConfigToModelConfig(const std::string& config_json,
                                                      std::string* architecture);
// The HF config.json text of `config` for `architecture` (errors if it cannot be expressed, e.g.
// a dense layer or QK-norm in Mixtral, a shared expert, sigmoid scores, expert bias).
absl::StatusOr<std::string> ModelConfigToHfConfig(const v1::ModelConfig& config,
                                                  const std::string& architecture);

// Reads `dir`/config.json and `dir`/model.safetensors (or the shards listed by
// `dir`/model.safetensors.index.json). Missing, unexpected or mis-shaped tensors give
// InvalidArgument naming the HF tensor.
absl::StatusOr<HfCheckpoint> ImportHfModel(const std::string& dir);

// Copies every tensor of `ckpt` into `model`'s parameters (any device, converting f32 to the
// parameter dtype, bf16 by round to nearest even). Errors (nothing partially meaningful is
// promised after an error) if a parameter has no tensor, a tensor has no parameter, or shapes
// differ. Synchronous.
absl::Status LoadIntoModel(const HfCheckpoint& ckpt, GptModel* model);

// Gives the f32 CPU tensor of one of OUR names (layout of gpt_model.h); the view must stay valid
// until ExportHfModel returns.
using HfTensorSource = std::function<absl::StatusOr<Tensor>(const std::string& name)>;

// Writes `dir`/config.json and `dir`/model.safetensors (HF names and shapes, per-expert layout,
// dtype `out_dtype`: f32, bf16, f16 or f64). Atomic: everything is written into a sibling
// temporary directory which then replaces `dir` (an existing `dir` is moved aside and removed
// after the rename). `config` must be expressible in `architecture` (ModelConfigToHfConfig).
absl::Status ExportHfModel(const v1::ModelConfig& config, const std::string& architecture,
                           const HfTensorSource& source, const std::string& dir, DType out_dtype);
// The same from a model's parameters (read to the host once; `config` is the ModelConfig the
// model was built from, for the keys GptConfig does not keep).
absl::Status ExportHfModel(const v1::ModelConfig& config, const std::string& architecture,
                           const GptModel& model, const std::string& dir, DType out_dtype);

}  // namespace switchyard::model

#endif  // SWITCHYARD_WORKER_CHECKPOINT_HF_CONVERT_H_
