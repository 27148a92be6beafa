// File: common/config/config_defaults.h
//
// Megatron-LM's defaults for the unset fields of a job spec, as documented field by field in
// proto/switchyard/v1/config.proto. Call after parsing and before ValidateJobSpec:
//
//   SY_ASSIGN_OR_RETURN(v1::JobSpec spec, LoadJobSpecFile(path));
//   ApplyDefaults(&spec);
//   SY_RETURN_IF_ERROR(ValidateJobSpec(spec));
//
// Contract:
// - A field that is set (optional fields: present; strings: non-empty; repeated: non-empty) is
//   never changed, 0 and negative values included, so the validator sees what the user wrote.
// - Idempotent: ApplyDefaults twice equals once.
// - Derived defaults are filled only when their inputs are usable (set and positive) and the
//   result is exact and fits; otherwise the field stays unset and the validator reports the
//   input. So kv_channels = hidden_size / num_attention_heads only when that divides (the
//   validator then reports "hidden_size must be divisible by num_attention_heads");
//   global_batch_size = micro_batch_size * DP * PP (PP micro-batches per step: the pipeline
//   schedule's minimum) and min/max_workers = world size only when
//   parallel.world_size is set (otherwise the planner decides them).
// - MoE defaults (moe_ffn_hidden_size, top-k, score function, load balancing, dispatcher, drop
//   policy, router dtype, bias update rate, layer frequency, grouped GEMM) are filled only for MoE
//   models, i.e. when model.num_experts is set; a dense spec stays free of MoE knobs.
// - moe_aux_loss_coeff: when empty it gets one 0 per load-balancing type. A non-empty list of
//   the wrong length is left alone for the validator to reject (Megatron requires equal lengths).
// - model.recompute_modules: Megatron's ["core_attn"] only when model.recompute_granularity is
//   "selective" and the list is empty (an empty list cannot be told from an unset one).
// - training.bf16 stays unset ("true on GPU" is decided by the worker that knows its device);
//   model.vocab_size stays unset (it comes from the tokenizer).
// - Evaluation (issue 18): training.eval_iters defaults to Megatron's 100 only when
//   training.eval_interval is set. data.split defaults to Megatron's kDefaultEvalSplit
//   ("969,30,1") only when training.eval_interval is set, data.split is empty and the job reads a
//   dataset (not mock_data). WHY only then: an empty split means "every document is training
//   data", and a job that does not evaluate keeps exactly the training data (and loss curve) it
//   had before evaluation existed; a job that asks for evaluation needs a held-out share, and
//   gets Megatron's.
#ifndef SWITCHYARD_COMMON_CONFIG_CONFIG_DEFAULTS_H_
#define SWITCHYARD_COMMON_CONFIG_CONFIG_DEFAULTS_H_

#include <cstdint>

#include "switchyard/v1/config.pb.h"

namespace switchyard {

// Megatron's default --split: the data.split of a job that evaluates and names none.
inline constexpr char kDefaultEvalSplit[] = "969,30,1";
// Megatron's default --eval-iters.
inline constexpr int64_t kDefaultEvalIters = 100;

void ApplyDefaults(v1::JobSpec* spec);

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_CONFIG_CONFIG_DEFAULTS_H_
