// File: common/config/validate_knobs.cc
//
// Knobs that Switchyard honours only in part: the values it does not implement are rejected here,
// naming the field and the rule, instead of being accepted and ignored (DESIGN.md, "Plan").
// Rules that only the worker can check (they depend on what this build of the engine runs, not on
// Megatron's semantics) are in Trainer::Init (worker/train/trainer.cc).
// worker/train/config_knobs_test.cc lists every config field with its consumer or the rule that
// rejects it.
#include <string>

#include "common/config/validate_internal.h"

namespace switchyard {
namespace validate_internal {

namespace {

// Megatron's recompute_modules names (TransformerConfig.__post_init__'s allowed set).
constexpr std::initializer_list<absl::string_view> kRecomputeModules = {
    "core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"};

// Selective activation recompute (config.proto "activation recompute"): the granularity, the
// module names, and the modules the engine does not honour (rejected, never ignored).
void CheckRecompute(const v1::ModelConfig& m, Violations* v) {
  const std::string& granularity = m.recompute_granularity();
  if (granularity == "full") {
    v->Add(
        "model.recompute_granularity (\"full\") is not supported: whole-layer recompute is not "
        "implemented; use \"selective\" with model.recompute_modules, or leave it unset (no "
        "recompute)");
  } else {
    CheckOneOf(v, "model.recompute_granularity", granularity, {"selective", "full"});
  }
  if (m.recompute_modules_size() == 0) return;
  if (granularity != "selective") {
    // Megatron reads the modules only under selective granularity; here they would be ignored.
    v->Add("model.recompute_modules requires model.recompute_granularity \"selective\" (got ",
           granularity.empty() ? std::string("unset")
                               : absl::StrCat("\"", config_internal::DisplayKey(granularity), "\""),
           ")");
    return;
  }
  // Dense layers, as common/model's ModelShape places them (num_layers defaults to 2).
  const int64_t layers = m.has_num_layers() ? m.num_layers() : 2;
  int64_t dense_layers = 0;
  if (!m.has_num_experts()) {
    dense_layers = layers;
  } else if (m.moe_layer_pattern_size() > 0) {
    for (int32_t x : m.moe_layer_pattern()) dense_layers += x == 0 ? 1 : 0;
  } else {
    const int64_t freq = m.has_moe_layer_freq() ? m.moe_layer_freq() : 1;
    if (freq > 0) dense_layers = layers - (layers + freq - 1) / freq;
  }
  for (int i = 0; i < m.recompute_modules_size(); ++i) {
    const std::string path = absl::StrCat("model.recompute_modules[", i, "]");
    const std::string& module = m.recompute_modules(i);
    if (!IsOneOf(module, kRecomputeModules)) {
      v->Add(path, " (\"", config_internal::DisplayKey(module), "\") must be one of ",
             QuoteList(kRecomputeModules));
    } else if (module == "moe") {
      v->Add(path,
             " (\"moe\") is not supported: recomputing the whole MoE layer (router and token "
             "dispatch included) is not implemented; \"moe_act\" and \"layernorm\" drop its "
             "largest recomputable activations");
    } else if (module == "shared_experts") {
      v->Add(path,
             " (\"shared_experts\") is not supported: recomputing the whole shared expert is not "
             "implemented; \"moe_act\" drops its SwiGLU output");
    } else if (module == "mla_up_proj") {
      v->Add(path,
             " (\"mla_up_proj\") requires multi-latent attention, which this model does not have "
             "(Megatron: \"mla_up_proj in recompute_modules is only supported with "
             "multi_latent_attention\")");
    } else if (module == "moe_act" && !m.has_num_experts()) {
      // (Megatron's other moe_act rule, "only with moe_grouped_gemm", always holds: false is
      // rejected above.)
      v->Add(path,
             " (\"moe_act\") requires MoE layers (model.num_experts): a dense model has no "
             "expert activation to recompute");
    } else if (module == "mlp" && dense_layers == 0) {
      v->Add(path,
             " (\"mlp\") recomputes the dense MLP layers and this model has none (every layer is "
             "MoE; \"moe_act\" is the MoE layers' module)");
    }
  }
}

}  // namespace

void CheckKnobs(const v1::JobSpec& spec, Violations* v) {
  const v1::ModelConfig& m = spec.model();
  // Megatron's "flex" dispatcher needs DeepEP / HybridEP kernels that Switchyard does not have;
  // CheckLayersAndExperts (validate_moe.cc) rejects it with the list of allowed values.
  if (m.moe_router_dtype() == "fp64") {
    v->Add(
        "model.moe_router_dtype (\"fp64\") is not supported: the router computes its logits and "
        "probabilities in fp32 (\"fp32\", the default); fp64 routing exists only in the CPU "
        "gradient-check builds of the layer, not for jobs");
  }
  CheckOneOf(v, "model.attention_backend", m.attention_backend(), {"auto", "cudnn", "native"});
  if (m.has_moe_grouped_gemm() && !m.moe_grouped_gemm()) {
    v->Add(
        "model.moe_grouped_gemm (false) is not supported: the experts always run as one grouped "
        "GEMM (kernels/gemm/grouped_gemm.h); leave it unset or true");
  }
  CheckRecompute(m, v);
  // Megatron's validate_args: the position range must cover a sequence. With RoPE nothing is
  // sized by it here; it is exported to Hugging Face configs (worker/checkpoint/hf_convert.cc).
  if (m.has_max_position_embeddings() && m.has_seq_length() && m.seq_length() > 0 &&
      m.max_position_embeddings() > 0 && m.max_position_embeddings() < m.seq_length()) {
    v->Add("model.max_position_embeddings (", m.max_position_embeddings(),
           ") must be at least model.seq_length (", m.seq_length(), ")");
  }

  const v1::ParallelConfig& pc = spec.parallel();
  // (With num_distributed_optimizer_instances > 1 the Megatron rule in validate_parallel.cc
  // already names the root cause.)
  if (pc.has_use_distributed_optimizer() && !pc.use_distributed_optimizer() &&
      pc.world_size() > 1 && pc.num_distributed_optimizer_instances() <= 1) {
    v->Add("parallel.use_distributed_optimizer (false) with parallel.world_size (", pc.world_size(),
           ") > 1 is not supported: a multi-rank worker shards its optimizer (ZeRO-1, the same "
           "update as a replicated one); leave the field unset or set it to true");
  }

  const v1::DataConfig& d = spec.data();
  CheckOneOf(v, "data.tokenizer_type", d.tokenizer_type(),
             {"ByteLevelBPE", "HuggingFaceTokenizer"});
  if (!d.tokenizer_type().empty() && d.tokenizer_model().empty()) {
    v->Add("data.tokenizer_type (\"", config_internal::DisplayKey(d.tokenizer_type()),
           "\") requires data.tokenizer_model (the path of its tokenizer.json)");
  }
}

}  // namespace validate_internal
}  // namespace switchyard
