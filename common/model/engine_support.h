// File: common/model/engine_support.h
//
// What the worker's engine executes today: data, expert, tensor (with sequence parallelism,
// worker/model/gpt_model.h) and expert-tensor parallelism, with PP = 1 (and CP as
// UnsupportedByEngine below says).
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
// "<prefix><field> (N) must be 1: workers run data and expert parallelism only" (the wording
// predates TP and ETP; tests match it), with `prefix` the field path of the caller's message
// ("parallel." for a job spec, "assignment.mapping." for an assignment). Any
// tensor_model_parallel_size and expert_tensor_parallel_size is accepted (the shape rules they
// need live in common/config/validate*.cc).
std::string UnsupportedByEngine(absl::string_view prefix, int64_t tensor_model_parallel_size,
                                int64_t context_parallel_size, int64_t pipeline_model_parallel_size,
                                int64_t expert_tensor_parallel_size);

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_MODEL_ENGINE_SUPPORT_H_
