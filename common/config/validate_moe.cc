// File: common/config/validate_moe.cc
//
// MoE rules (megatron_moe.md §1 and §5.3), for specs with model.num_experts set.
#include <string>

#include "common/config/validate_internal.h"

namespace switchyard {
namespace validate_internal {
namespace {

constexpr std::initializer_list<absl::string_view> kLoadBalancingTypes = {
    "aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"};
// Load-balancing types that may be combined with a capacity factor (transformer_config.py:1836).
constexpr std::initializer_list<absl::string_view> kCapacityTypes = {"aux_loss", "seq_aux_loss",
                                                                     "global_aux_loss", "none"};

bool HasType(const v1::ModelConfig& m, absl::string_view type) {
  for (const std::string& t : m.moe_router_load_balancing_type()) {
    if (t == type) return true;
  }
  return false;
}

void CheckRouter(const v1::ModelConfig& m, Violations* v) {
  const int64_t experts = m.num_experts();
  const int64_t topk = m.has_moe_router_topk() ? m.moe_router_topk() : 2;
  if (m.has_moe_router_topk() && (topk < 1 || topk > experts)) {
    v->Add("model.moe_router_topk (", topk, ") must be between 1 and model.num_experts (", experts,
           ")");
  }
  const std::string& score = m.moe_router_score_function();
  const bool softmax = score.empty() || score == "softmax";
  CheckOneOf(v, "model.moe_router_score_function", score, {"softmax", "sigmoid"});
  // transformer_config.py:2661-2669.
  if (topk == 1 && softmax && !m.moe_router_pre_softmax() && !HasType(m, "sinkhorn")) {
    v->Add(
        "model.moe_router_topk (1) with model.moe_router_score_function \"softmax\" requires "
        "model.moe_router_pre_softmax or load balancing type \"sinkhorn\": softmax over a "
        "[num_tokens, 1] tensor would yield a zero gradient");
  }
  // Group-limited routing (transformer_config.py:2671-2696). Like the anchor, topk need not be a
  // multiple of group_topk: the router takes the top topk / group_topk scores of each group.
  if (m.has_moe_router_group_topk()) {
    if (!m.has_moe_router_num_groups()) {
      v->Add("model.moe_router_group_topk (", m.moe_router_group_topk(),
             ") requires model.moe_router_num_groups");
    } else {
      CheckDivisible(v, "model.num_experts", experts, "model.moe_router_num_groups",
                     m.moe_router_num_groups());
      if (m.moe_router_group_topk() > m.moe_router_num_groups()) {
        v->Add("model.moe_router_group_topk (", m.moe_router_group_topk(),
               ") must be at most model.moe_router_num_groups (", m.moe_router_num_groups(), ")");
      }
    }
  }
  if (m.moe_router_enable_expert_bias() && score != "sigmoid") {
    v->Add(
        "model.moe_router_enable_expert_bias requires model.moe_router_score_function "
        "\"sigmoid\" (got \"",
        score.empty() ? "softmax" : config_internal::DisplayKey(score), "\")");
  }
  if (m.has_moe_router_bias_update_rate() && m.moe_router_bias_update_rate() < 0) {
    v->Add("model.moe_router_bias_update_rate (", Num(m.moe_router_bias_update_rate()),
           ") must be non-negative");
  }
  if (m.has_moe_router_topk_scaling_factor() && !(m.moe_router_topk_scaling_factor() > 0)) {
    v->Add("model.moe_router_topk_scaling_factor (", Num(m.moe_router_topk_scaling_factor()),
           ") must be positive");
  }
  CheckOneOf(v, "model.moe_router_dtype", m.moe_router_dtype(), {"fp32", "fp64"});
  if (m.has_moe_input_jitter_eps() &&
      !(m.moe_input_jitter_eps() >= 0 && m.moe_input_jitter_eps() < 1)) {
    v->Add("model.moe_input_jitter_eps (", Num(m.moe_input_jitter_eps()), ") must be in [0, 1)");
  }
}

void CheckLoadBalancing(const v1::ModelConfig& m, Violations* v) {
  for (int i = 0; i < m.moe_router_load_balancing_type_size(); ++i) {
    CheckOneOf(v, absl::StrCat("model.moe_router_load_balancing_type[", i, "]"),
               m.moe_router_load_balancing_type(i), kLoadBalancingTypes);
  }
  const int types = m.moe_router_load_balancing_type_size();
  const int coeffs = m.moe_aux_loss_coeff_size();
  if (types != coeffs && (types > 0 || coeffs > 1)) {
    v->Add("model.moe_aux_loss_coeff has ", coeffs,
           " entries but model.moe_router_load_balancing_type has ", types,
           ": there must be one coefficient per load balancing type");
  }
  for (int i = 0; i < coeffs; ++i) {
    if (m.moe_aux_loss_coeff(i) < 0) {
      v->Add("model.moe_aux_loss_coeff[", i, "] (", Num(m.moe_aux_loss_coeff(i)),
             ") must be non-negative");
    }
    if (i < types && m.moe_router_load_balancing_type(i) == "sinkhorn" &&
        m.moe_aux_loss_coeff(i) != 0) {
      v->Add("model.moe_aux_loss_coeff[", i, "] (", Num(m.moe_aux_loss_coeff(i)),
             ") must be 0 for load balancing type \"sinkhorn\"");
    }
  }
  if (m.has_moe_z_loss_coeff() && m.moe_z_loss_coeff() < 0) {
    v->Add("model.moe_z_loss_coeff (", Num(m.moe_z_loss_coeff()), ") must be non-negative");
  }
}

void CheckCapacity(const v1::ModelConfig& m, Violations* v) {
  // A negative capacity factor means dropless, as unset (transformer_config.py:1836).
  const bool capacity = m.has_moe_expert_capacity_factor() && m.moe_expert_capacity_factor() >= 0;
  if (capacity) {
    const double factor = m.moe_expert_capacity_factor();
    if (factor == 0) {
      v->Add("model.moe_expert_capacity_factor (0) must be positive (or negative for dropless)");
    }
    for (const std::string& type : m.moe_router_load_balancing_type()) {
      if (IsOneOf(type, kCapacityTypes) || !IsOneOf(type, kLoadBalancingTypes)) continue;
      v->Add("model.moe_expert_capacity_factor (", Num(factor),
             ") cannot be combined with load balancing type \"", type,
             "\" (a capacity factor is allowed only with ", QuoteList(kCapacityTypes), ")");
    }
  }
  if (m.moe_pad_expert_input_to_capacity() && !capacity) {
    v->Add(
        "model.moe_pad_expert_input_to_capacity requires a non-negative "
        "model.moe_expert_capacity_factor");
  }
  CheckOneOf(v, "model.moe_token_drop_policy", m.moe_token_drop_policy(), {"probs", "position"});
}

void CheckLayersAndExperts(const v1::JobSpec& spec, Violations* v) {
  const v1::ModelConfig& m = spec.model();
  const ParallelSizes p = ParallelSizes::From(spec.parallel());
  CheckOneOf(v, "model.moe_token_dispatcher_type", m.moe_token_dispatcher_type(),
             {"allgather", "alltoall"});
  if (m.delay_wgrad_compute() && m.moe_token_dispatcher_type() != "alltoall") {
    v->Add(
        "model.delay_wgrad_compute requires model.moe_token_dispatcher_type \"alltoall\" (got "
        "\"",
        m.moe_token_dispatcher_type().empty()
            ? "allgather"
            : config_internal::DisplayKey(m.moe_token_dispatcher_type()),
        "\")");
  }
  if (m.moe_shared_expert_overlap() && m.moe_token_dispatcher_type() != "alltoall") {
    v->Add(
        "model.moe_shared_expert_overlap requires model.moe_token_dispatcher_type "
        "\"alltoall\" (got \"",
        m.moe_token_dispatcher_type().empty()
            ? "allgather"
            : config_internal::DisplayKey(m.moe_token_dispatcher_type()),
        "\")");
  }
  if (!p.valid) return;
  CheckDivisible(v, "model.num_experts", m.num_experts(), "parallel.expert_model_parallel_size",
                 p.ep);
  // Expert tensor parallelism splits every expert's intermediate size over ETP (fc1 columns, fc2
  // rows: worker/model/moe_layer.h), so each ETP rank needs an equal, whole slice.
  const int64_t moe_ffn =
      m.has_moe_ffn_hidden_size() ? m.moe_ffn_hidden_size() : m.ffn_hidden_size();
  CheckDivisible(v, "model.moe_ffn_hidden_size", moe_ffn, "parallel.expert_tensor_parallel_size",
                 p.etp);
  // moe_layer.py:636-640: MoE with tensor parallelism runs the experts on sequence-parallel input.
  if (p.tp > 1 && !spec.parallel().sequence_parallel()) {
    v->Add(
        "parallel.sequence_parallel must be true for an MoE model (model.num_experts set) with "
        "parallel.tensor_model_parallel_size (",
        p.tp, ") > 1");
  }
  // transformer_config.py:2612-2615.
  if (m.add_bias_linear() && p.etp != 1) {
    v->Add(
        "model.add_bias_linear with an MoE model requires "
        "parallel.expert_tensor_parallel_size == 1 (got ",
        p.etp, ")");
  }
  if (m.moe_layer_pattern_size() > 0) {
    if (m.has_num_layers() && m.moe_layer_pattern_size() != m.num_layers()) {
      v->Add("model.moe_layer_pattern has ", m.moe_layer_pattern_size(),
             " entries but model.num_layers is ", m.num_layers(),
             ": there must be one entry per layer");
    }
    for (int i = 0; i < m.moe_layer_pattern_size(); ++i) {
      if (m.moe_layer_pattern(i) != 0 && m.moe_layer_pattern(i) != 1) {
        v->Add("model.moe_layer_pattern[", i, "] (", m.moe_layer_pattern(i),
               ") must be 0 (dense) or 1 (MoE)");
      }
    }
  }
}

}  // namespace

void CheckMoe(const v1::JobSpec& spec, Violations* v) {
  const v1::ModelConfig& m = spec.model();
  if (!m.has_num_experts() || m.num_experts() <= 0) return;
  CheckRouter(m, v);
  CheckLoadBalancing(m, v);
  CheckCapacity(m, v);
  CheckLayersAndExperts(spec, v);
}

}  // namespace validate_internal
}  // namespace switchyard
