// File: common/config/validate.h
//
// Semantic checks of a job spec: Megatron-LM's parallel-state constraints (reference
// megatron_moe.md §5.2), its MoE config validations (§5.3) and sanity bounds. Call after
// ApplyDefaults (common/config/config_defaults.h); unset optional fields are then treated as
// Megatron would (sizes 1, no world size known, no capacity factor, ...), so calling it on a spec
// without defaults is safe but checks less.
//
// Every violation is one line naming the field paths and the rule, e.g.
//
//   model.num_experts (6) must be divisible by parallel.expert_model_parallel_size (4)
//   model.hidden_size (0) must be positive
//   model.moe_router_score_function ("softmx") must be one of "softmax", "sigmoid"
//
// Bounds come first and, when broken, alone (the other rules never see an unbounded value):
// - the serialized spec is at most kMaxSpecBytes;
// - display_name at most kMaxDisplayNameBytes; training.save, training.load, data.data_path[i]
//   and data.tokenizer_model at most kMaxPathBytes; every other string at most 64 bytes;
// - no string contains a control character (C0, DEL or C1: FirstControlCharacter), so names
//   and paths print safely and cannot forge log lines or terminal escapes;
// - data.data_path at most 1024 entries, model.moe_layer_pattern 16384, the load-balancing
//   types and their coefficients 8, any other repeated field 64.
// A new config.proto field is bounded by these defaults until it is given a row
// (validate_bounds.cc).
//
// Rules are checked in a fixed order (bounds, required fields and ranges, then model, MoE,
// parallel, training, elastic range, data), and a rule whose inputs are themselves invalid is
// skipped, so the first violation is the root cause. Rules that need the world size (divisibility
// of parallel.world_size, global batch vs. data-parallel size, distributed-optimizer instances) run
// only when parallel.world_size is set; the planner re-checks them with the actual world size.
//
// Deliberate differences from the anchor, all stricter:
// - lr_warmup_iters must be < lr_decay_iters (Megatron's scheduler asserts this; it divides by the
//   difference).
// - Non-finite doubles, negative coefficients and rates, a capacity factor of 0 and malformed
//   data.data_path / data.split strings are rejected.
// - training.eval_interval needs a positive valid weight in data.split (Megatron then builds no
//   valid dataset and silently skips evaluation) and a dataset (not data.mock_data).
// Not checked, as in the anchor: moe_router_topk % moe_router_group_topk (the router uses the
// integer division topk / group_topk).
#ifndef SWITCHYARD_COMMON_CONFIG_VALIDATE_H_
#define SWITCHYARD_COMMON_CONFIG_VALIDATE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "switchyard/v1/config.pb.h"

namespace switchyard {

// Bounds on a job spec (see above).
inline constexpr size_t kMaxSpecBytes = 64 * 1024;
inline constexpr size_t kMaxDisplayNameBytes = 256;
inline constexpr size_t kMaxPathBytes = 4096;

// The offset of the first control character in `text` (a byte below 0x20, 0x7F, or a UTF-8
// encoded U+0080..U+009F), or npos. Shared by every input check that refuses them.
size_t FirstControlCharacter(absl::string_view text);

// Whether data.data_path is Megatron's weighted form ["0.7", "prefix_a", "0.3", "prefix_b"]:
// more than one entry and the first parses as a number. The one detection the validator (which
// checks the weights) and the path rules (common/config/job_paths.h DataPathIndices, which
// resolve only the prefixes) share, so they never disagree on which entries are paths.
bool IsWeightedDataPath(const v1::DataConfig& data);

// OK, or INVALID_ARGUMENT with the first violation as its message.
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// Every violation, in rule order (empty when the spec is valid).
std::vector<std::string> AllViolations(const v1::JobSpec& spec);

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_CONFIG_VALIDATE_H_
