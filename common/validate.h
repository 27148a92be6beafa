// File: common/validate.h
//
// Semantic checks of a job spec: Megatron-LM's parallel-state constraints (reference
// megatron_moe.md §5.2), its MoE config validations (§5.3) and sanity bounds. Call after
// ApplyDefaults (common/config_defaults.h); unset optional fields are then treated as Megatron
// would (sizes 1, no world size known, no capacity factor, ...), so calling it on a spec without
// defaults is safe but checks less.
//
// Every violation is one line naming the field paths and the rule, e.g.
//
//   model.num_experts (6) must be divisible by parallel.expert_model_parallel_size (4)
//   model.hidden_size (0) must be positive
//   model.moe_router_score_function ("softmx") must be one of "softmax", "sigmoid"
//
// Rules are checked in a fixed order (required fields and ranges first, then model, MoE, parallel,
// training, elastic range, data), and a rule whose inputs are themselves invalid is skipped, so the
// first violation is the root cause. Rules that need the world size (divisibility of
// parallel.world_size, global batch vs. data-parallel size, distributed-optimizer instances) run
// only when parallel.world_size is set; the planner re-checks them with the actual world size.
//
// Deliberate differences from the anchor, all stricter:
// - lr_warmup_iters must be < lr_decay_iters (Megatron's scheduler asserts this; it divides by the
//   difference).
// - Non-finite doubles, negative coefficients and rates, a capacity factor of 0 and malformed
//   data.data_path / data.split strings are rejected.
// Not checked, as in the anchor: moe_router_topk % moe_router_group_topk (the router uses the
// integer division topk / group_topk).
#ifndef SWITCHYARD_COMMON_VALIDATE_H_
#define SWITCHYARD_COMMON_VALIDATE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "switchyard/v1/config.pb.h"

namespace switchyard {

// OK, or INVALID_ARGUMENT with the first violation as its message.
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// Every violation, in rule order (empty when the spec is valid).
std::vector<std::string> AllViolations(const v1::JobSpec& spec);

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_VALIDATE_H_
