// File: cli/megatron_args.h
//
// Megatron-LM command-line flags (pretrain_gpt.py style) to a switchyard.v1.JobSpec, for
// `syctl submit --megatron-args "..."` and `syctl plan --megatron-args "..."`.
//
// A flag `--moe-router-topk` names the JobSpec field `moe_router_topk` of ModelConfig,
// ParallelConfig, TrainingConfig or DataConfig (config.proto follows Megatron's argument names),
// so every field that exists there is accepted, typed by the proto:
//   - bool fields are store_true flags that take no value (`--qk-layernorm`, `--bf16`);
//   - repeated fields take one or more values up to the next `--flag` (`--data-path 0.7 a 0.3 b`,
//     `--moe-router-load-balancing-type aux_loss`, `--moe-aux-loss-coeff 0.01`);
//   - int32/int64/double/string fields take exactly one value (`--lr 3e-4` or `--lr=3e-4`).
// Special cases, as Megatron spells them:
//   - `--disable-bias-linear` sets add_bias_linear false; `--moe-layer-freq` takes an integer or a
//     list `[0,1,1,1]` (Megatron's python-list form, brackets and commas, no expressions), which
//     goes to moe_layer_pattern;
//   - accepted and ignored (they only restate what Switchyard always does): `--swiglu`,
//     `--group-query-attention`, `--use-mcore-models`, `--position-embedding-type rope`,
//     `--transformer-impl local|transformer_engine`;
//   - `--fp16` is rejected (Switchyard trains in bf16 or fp32).
// Fields that are not Megatron flags (model.swiglu_activation, model.moe_layer_pattern) and any
// other flag are rejected. Errors are INVALID_ARGUMENT naming the flag and the rule, e.g.
//   unknown Megatron flag '--moe-routr-topk'
//   --num-layers: expected an integer, got 'four'
//   --qk-layernorm takes no value
//
// Values are not range-checked here: the coordinator validates the resulting spec
// (common/config/validate.h) and names the field.
//
// Thread-safe: no shared state.
#ifndef SWITCHYARD_CLI_MEGATRON_ARGS_H_
#define SWITCHYARD_CLI_MEGATRON_ARGS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "switchyard/v1/config.pb.h"

namespace switchyard::cli {

// Splits a command line as a POSIX shell would for plain words: whitespace separates, single and
// double quotes group, backslash escapes the next character outside single quotes. An unclosed
// quote is INVALID_ARGUMENT.
absl::StatusOr<std::vector<std::string>> SplitCommandLine(absl::string_view text);

// Applies the flags in `args` to `spec` (fields already set are overwritten; repeated fields are
// replaced). On error `spec` may be partly updated.
absl::Status ApplyMegatronArgs(const std::vector<std::string>& args, v1::JobSpec* spec);

}  // namespace switchyard::cli

#endif  // SWITCHYARD_CLI_MEGATRON_ARGS_H_
