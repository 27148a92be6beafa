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
