#include "bench/bench_model.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace switchyard::bench {

absl::StatusOr<BenchModel> BenchModelByName(absl::string_view name) {
  if (name == "benchmark") return BenchModel{12, 1536, 12, 128, 4, 32768, 64, 8, 384, 4096, 2, 16};
  if (name == "small") return BenchModel{4, 768, 6, 128, 2, 32768, 32, 4, 192, 1024, 2, 8};
  return absl::InvalidArgumentError(
      absl::StrCat("--model: '", name, "' is not one of benchmark, small"));
}

v1::JobSpec MakeBenchSpec(absl::string_view name, const BenchModel& b, int64_t iters) {
  v1::JobSpec spec;
  spec.set_display_name(absl::StrCat("train_benchmark_", name));
  v1::ModelConfig* m = spec.mutable_model();
  m->set_num_layers(b.layers);
  m->set_hidden_size(b.hidden);
  m->set_num_attention_heads(b.heads);
  m->set_kv_channels(b.head_dim);
  m->set_num_query_groups(b.groups);
  m->set_ffn_hidden_size(4 * b.hidden);  // unused: every layer is MoE
  m->set_seq_length(b.seq);
  m->set_max_position_embeddings(b.seq);
  m->set_vocab_size(b.vocab);
  m->set_normalization("RMSNorm");
  m->set_norm_epsilon(1e-6);
  m->set_rotary_base(1e6);
  m->set_qk_layernorm(true);
  m->set_untie_embeddings_and_output_weights(true);
  m->set_init_method_std(0.02);
  m->set_num_experts(b.experts);
  m->set_moe_router_topk(b.topk);
  m->set_moe_ffn_hidden_size(b.moe_ffn);
  m->set_moe_router_score_function("softmax");
  m->add_moe_router_load_balancing_type("aux_loss");
  m->add_moe_aux_loss_coeff(1e-3);
  m->set_moe_layer_freq(1);
  m->set_moe_grouped_gemm(true);
  // The multi-GPU numbers in bench/README.md are of the alltoall dispatcher (the spec's default
  // is allgather, as Megatron's); pinned so --world N --ep E measures what the README describes.
  m->set_moe_token_dispatcher_type("alltoall");
  v1::TrainingConfig* t = spec.mutable_training();
  t->set_micro_batch_size(b.micro);
  t->set_global_batch_size(b.global);
  t->set_train_iters(iters);
  t->set_lr(1e-4);
  t->set_lr_warmup_iters(0);
  t->set_lr_decay_style("constant");
  t->set_weight_decay(0.01);
  t->set_clip_grad(1.0);
  t->set_seed(1234);
  t->set_bf16(true);
  t->set_log_interval(1);
  spec.mutable_data()->set_mock_data(true);
  return spec;
}

}  // namespace switchyard::bench
