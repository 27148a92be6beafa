// File: common/model/engine_support.h
//
// What the worker's engine executes today: data, tensor (with sequence parallelism,
// worker/model/gpt_model.h), context, expert and expert-tensor parallelism, TP and CP folded
// together, with PP = 1 (any sizes the parallel layout accepts, with model.seq_length %
// (2·CP·TP) == 0 and moe_ffn_hidden_size % ETP == 0 as common/config/validate*.cc checks).
// One rule, used by every place that must refuse the rest: the coordinator's validation path
// (coordinator/jobs/resolve_spec.h, before the planner), the worker's check of an assignment
// (worker/agent/generation.cc) and a run without a coordinator (worker/train/trainer.cc). When
// the engine learns a dimension, this is the one place to change.
#ifndef SWITCHYARD_COMMON_MODEL_ENGINE_SUPPORT_H_
#define SWITCHYARD_COMMON_MODEL_ENGINE_SUPPORT_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace switchyard {

// "" when the engine runs these sizes; otherwise the first unsupported one, as
// "<prefix>pipeline_model_parallel_size (N) must be 1: workers run data, tensor, context and
// expert parallelism only" (expert parallelism here includes its tensor split, ETP), with
// `prefix` the field path of the caller's message ("parallel." for a job spec,
// "assignment.mapping." for an assignment).
std::string UnsupportedByEngine(absl::string_view prefix, int64_t tensor_model_parallel_size,
                                int64_t context_parallel_size, int64_t pipeline_model_parallel_size,
                                int64_t expert_tensor_parallel_size);

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_MODEL_ENGINE_SUPPORT_H_
