// File: common/config/config_defaults.cc
#include "common/config/config_defaults.h"

#include <cstdint>
#include <limits>

namespace switchyard {
namespace {

// Sets an optional scalar field `name` of `msg` to `value` unless it is present.
#define SY_DEFAULT(msg, name, value)                    \
  do {                                                  \
    if (!(msg)->has_##name()) (msg)->set_##name(value); \
  } while (0)

// Sets a string field to `value` when empty (proto3 strings have no presence).
#define SY_DEFAULT_STRING(msg, name, value)              \
  do {                                                   \
    if ((msg)->name().empty()) (msg)->set_##name(value); \
  } while (0)

bool FitsInt32(int64_t v) {
  return v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max();
}

void ApplyModelDefaults(v1::ModelConfig* m) {
  SY_DEFAULT(m, num_layers, 2);
  if (m->has_num_attention_heads()) SY_DEFAULT(m, num_query_groups, m->num_attention_heads());
  if (m->has_hidden_size() && m->hidden_size() > 0 && FitsInt32(int64_t{4} * m->hidden_size())) {
    SY_DEFAULT(m, ffn_hidden_size, 4 * m->hidden_size());
  }
  if (m->hidden_size() > 0 && m->num_attention_heads() > 0 &&
      m->hidden_size() % m->num_attention_heads() == 0) {
    SY_DEFAULT(m, kv_channels, m->hidden_size() / m->num_attention_heads());
  }
  SY_DEFAULT(m, seq_length, 1024);
  SY_DEFAULT(m, max_position_embeddings, m->seq_length());
  SY_DEFAULT_STRING(m, normalization, "RMSNorm");
  SY_DEFAULT(m, norm_epsilon, 1e-5);
  SY_DEFAULT(m, rotary_base, 10000.0);
  SY_DEFAULT(m, init_method_std, 0.02);
  SY_DEFAULT_STRING(m, attention_backend, "auto");
  // Megatron's recompute_modules default, ["core_attn"], where Megatron reads the list (selective
  // granularity only; without it a list would be ignored, which validation rejects).
  if (m->recompute_granularity() == "selective" && m->recompute_modules_size() == 0) {
    m->add_recompute_modules("core_attn");
  }

  if (!m->has_num_experts()) return;  // dense model: no MoE defaults
  if (m->has_ffn_hidden_size()) SY_DEFAULT(m, moe_ffn_hidden_size, m->ffn_hidden_size());
  SY_DEFAULT(m, moe_router_topk, 2);
  SY_DEFAULT_STRING(m, moe_router_score_function, "softmax");
  SY_DEFAULT(m, moe_router_bias_update_rate, 1e-3);
  if (m->moe_router_load_balancing_type_size() == 0)
    m->add_moe_router_load_balancing_type("aux_loss");
  if (m->moe_aux_loss_coeff_size() == 0) {
    for (int i = 0; i < m->moe_router_load_balancing_type_size(); ++i)
      m->add_moe_aux_loss_coeff(0.0);
  }
  SY_DEFAULT_STRING(m, moe_token_drop_policy, "probs");
  SY_DEFAULT_STRING(m, moe_token_dispatcher_type, "allgather");
  SY_DEFAULT(m, moe_layer_freq, 1);
  SY_DEFAULT_STRING(m, moe_router_dtype, "fp32");
  SY_DEFAULT(m, moe_grouped_gemm, true);
}

void ApplyParallelDefaults(v1::ParallelConfig* p) {
  SY_DEFAULT(p, tensor_model_parallel_size, 1);
  SY_DEFAULT(p, pipeline_model_parallel_size, 1);
  SY_DEFAULT(p, context_parallel_size, 1);
  SY_DEFAULT(p, expert_model_parallel_size, 1);
  SY_DEFAULT(p, expert_tensor_parallel_size, p->tensor_model_parallel_size());
  SY_DEFAULT(p, num_distributed_optimizer_instances, 1);
}

// Data-parallel size W / (TP * CP * PP), or 0 when the world size is unset or not divisible.
int64_t DataParallelSize(const v1::ParallelConfig& p) {
  const int64_t tp = p.tensor_model_parallel_size(), cp = p.context_parallel_size(),
                pp = p.pipeline_model_parallel_size(), world = p.world_size();
  // Sizes are int32, so a product of positive ones that divides the world size fits in int64.
  if (world <= 0 || tp <= 0 || cp <= 0 || pp <= 0 || world % tp != 0 || world / tp % cp != 0 ||
      world / tp / cp % pp != 0) {
    return 0;
  }
  return world / tp / cp / pp;
}

void ApplyTrainingDefaults(v1::TrainingConfig* t, const v1::ParallelConfig& p) {
  SY_DEFAULT(t, micro_batch_size, 1);
  int64_t dp = DataParallelSize(p);
  // One micro-batch per data-parallel rank, times PP: the pipeline schedule needs at least PP
  // micro-batches in flight (validate_parallel.cc, CheckTraining), so the default is the smallest
  // batch that keeps every stage busy (PP is 1 unless the spec says otherwise).
  const int64_t pp = p.pipeline_model_parallel_size() > 0 ? p.pipeline_model_parallel_size() : 1;
  if (dp > 0 && t->micro_batch_size() > 0 && FitsInt32(dp * t->micro_batch_size() * pp)) {
    SY_DEFAULT(t, global_batch_size, static_cast<int32_t>(dp * t->micro_batch_size() * pp));
  }
  SY_DEFAULT(t, lr, 1e-4);
  SY_DEFAULT(t, min_lr, 0.0);
  SY_DEFAULT(t, lr_warmup_iters, 0);
  if (t->has_train_iters()) SY_DEFAULT(t, lr_decay_iters, t->train_iters());
  SY_DEFAULT_STRING(t, lr_decay_style, "cosine");
  SY_DEFAULT(t, weight_decay, 0.01);
  SY_DEFAULT(t, adam_beta1, 0.9);
  SY_DEFAULT(t, adam_beta2, 0.999);
  SY_DEFAULT(t, adam_eps, 1e-8);
  SY_DEFAULT(t, clip_grad, 1.0);
  SY_DEFAULT(t, seed, 1234);
  SY_DEFAULT(t, log_interval, 1);
  if (t->has_eval_interval()) SY_DEFAULT(t, eval_iters, kDefaultEvalIters);
}

#undef SY_DEFAULT
#undef SY_DEFAULT_STRING

}  // namespace

void ApplyDefaults(v1::JobSpec* spec) {
  ApplyModelDefaults(spec->mutable_model());
  ApplyParallelDefaults(spec->mutable_parallel());
  ApplyTrainingDefaults(spec->mutable_training(), spec->parallel());
  if (spec->parallel().has_world_size()) {
    if (!spec->has_min_workers()) spec->set_min_workers(spec->parallel().world_size());
    if (!spec->has_max_workers()) spec->set_max_workers(spec->parallel().world_size());
  }
  if (!spec->has_max_restarts()) spec->set_max_restarts(3);
  // A job that evaluates needs a held-out share: Megatron's split, only for such jobs (see the
  // header: an empty split keeps its "all training data" meaning for every other job).
  v1::DataConfig* data = spec->mutable_data();  // present, so printed specs show every section
  if (spec->training().has_eval_interval() && data->split().empty() && !data->mock_data()) {
    data->set_split(kDefaultEvalSplit);
  }
}

}  // namespace switchyard
