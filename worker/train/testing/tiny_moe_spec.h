// File: worker/train/testing/tiny_moe_spec.h
//
// The tiny MoE job the distributed tests share (distributed_trainer_test, distributed_gpu_test,
// killed_peer_test, the agent tests): three layers (MoE, dense, MoE), hidden 32, 4 query heads in
// 2 groups, 8 experts top-2 with a shared expert, sigmoid routing with expert bias, aux and z
// losses, vocabulary 64, 16-token sequences, 8 micro-batches of one sequence per step (so DP and
// EP up to 4 divide it), mock data.
//
// init_method_std is 0.2, not Megatron's 0.02: at 0.02 the router logits of this freshly
// initialised model are ~1e-3 apart, so the top-k margins of some tokens are below the 1e-7
// float differences that another reduction order (gradients summed over ranks instead of over
// micro-batches) legitimately makes; one flipped token then changes the expert-bias signs and
// the curves part by chaos, not by a semantic difference (measured: identical to 1e-8 for 8
// steps, then apart). With decisive routing the equivalence tests check the semantics.
#ifndef SWITCHYARD_WORKER_TRAIN_TESTING_TINY_MOE_SPEC_H_
#define SWITCHYARD_WORKER_TRAIN_TESTING_TINY_MOE_SPEC_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace switchyard::test_specs {

// The job spec as YAML. train_iters <= 0 leaves it out (the caller sets it); kv_channels 0 keeps
// the default head dim (32 / 4 = 8: CPU only; the CUDA attention needs 64 or 128); jitter adds
// moe_input_jitter_eps 0.01 (exercises the per-micro-batch jitter counter).
inline std::string TinyMoeSpecYaml(int64_t train_iters, bool jitter, int kv_channels = 0) {
  std::string s =
      "model:\n"
      "  num_layers: 3\n"
      "  hidden_size: 32\n"
      "  num_attention_heads: 4\n"
      "  num_query_groups: 2\n"
      "  ffn_hidden_size: 48\n"
      "  seq_length: 16\n"
      "  vocab_size: 64\n"
      "  qk_layernorm: true\n"
      "  num_experts: 8\n"
      "  moe_router_topk: 2\n"
      "  moe_ffn_hidden_size: 24\n"
      "  moe_shared_expert_intermediate_size: 16\n"
      "  moe_router_score_function: sigmoid\n"
      "  moe_router_enable_expert_bias: true\n"
      "  moe_router_bias_update_rate: 0.01\n"
      "  moe_router_load_balancing_type: aux_loss\n"
      "  moe_aux_loss_coeff: 0.01\n"
      "  moe_z_loss_coeff: 0.001\n"
      "  moe_layer_pattern: [1, 0, 1]\n"
      "  init_method_std: 0.2\n";
  if (kv_channels > 0) absl::StrAppend(&s, "  kv_channels: ", kv_channels, "\n");
  if (jitter) s += "  moe_input_jitter_eps: 0.01\n";
  s += "training:\n"
       "  micro_batch_size: 1\n"
       "  global_batch_size: 8\n";
  if (train_iters > 0) absl::StrAppend(&s, "  train_iters: ", train_iters, "\n");
  s += "  lr: 0.003\n"
       "  lr_warmup_iters: 2\n"
       "  seed: 11\n"
       "data:\n"
       "  mock_data: true\n";
  return s;
}

}  // namespace switchyard::test_specs

#endif  // SWITCHYARD_WORKER_TRAIN_TESTING_TINY_MOE_SPEC_H_
