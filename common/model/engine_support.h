// File: common/model/engine_support.h
//
// What the worker's engine executes today: data, tensor (with sequence parallelism,
// worker/model/gpt_model.h), context, expert, expert-tensor and pipeline parallelism, all folded
// together (any sizes the parallel layout accepts, with model.seq_length % (2·CP·TP) == 0,
// moe_ffn_hidden_size % ETP == 0 and the pipeline layout rules as common/config/validate*.cc
// checks). Pipeline parallelism runs Megatron's 1F1B and, with virtual pipeline stages, its
// interleaved 1F1B (worker/train/trainer.h), with tied embeddings, global_aux_loss and evaluation
// (a forward-only pipeline): nothing the validated layouts allow is refused today.
// One rule, used by every place that must refuse the rest: the coordinator's validation path
// (coordinator/jobs/resolve_spec.h, before the planner), the planner's candidates
// (coordinator/planner/planner.cc), the worker's check of an assignment
// (worker/agent/generation.cc) and a run without a coordinator (worker/train/trainer.cc). When
// the engine learns a dimension or feature, this is the one place to change.
#ifndef SWITCHYARD_COMMON_MODEL_ENGINE_SUPPORT_H_
#define SWITCHYARD_COMMON_MODEL_ENGINE_SUPPORT_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "switchyard/v1/config.pb.h"

namespace switchyard {

// "" when the engine runs these sizes (today: every size the layout rules accept, VPP
// included); otherwise the first unsupported one, as "<prefix><field> (N) ...: ..." with
// `prefix` the field path of the caller's message ("parallel." for a job spec,
// "assignment.spec.parallel." for an assignment). The arguments stay so that every caller keeps
// one call shape while dimensions are lifted.
std::string UnsupportedByEngine(absl::string_view prefix, int64_t tensor_model_parallel_size,
                                int64_t context_parallel_size, int64_t pipeline_model_parallel_size,
                                int64_t expert_tensor_parallel_size,
                                int64_t virtual_pipeline_model_parallel_size);

// The rule for a whole job spec (defaults applied or not: unset sizes count as 1):
// UnsupportedByEngine on spec.parallel, field paths "<prefix>parallel.". `prefix`: "" for a job
// spec, "assignment.spec." for an assignment's. (Every model feature runs at PP > 1: tied
// embeddings through the embedding group, global_aux_loss with one running count per layer,
// evaluation through the forward-only pipeline schedule.)
std::string UnsupportedJobSpec(absl::string_view prefix, const v1::JobSpec& spec);

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_MODEL_ENGINE_SUPPORT_H_
