// File: common/config/parallel_rules.h
//
// The size-only divisibility rules of a parallel mapping (megatron_moe.md §5.2). They live with
// the other validation rules so that common/config depends on nothing above it; the rank
// arithmetic that also enforces them (common/model/parallel_state.h) calls this function.
#ifndef SWITCHYARD_COMMON_CONFIG_PARALLEL_RULES_H_
#define SWITCHYARD_COMMON_CONFIG_PARALLEL_RULES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace switchyard {

// The divisibility rules of §5.2 that depend on sizes alone (parallel_state.py:823, :881-884,
// :922-926, :1447-1449), one message per violated rule, each naming its fields with `prefix`
// prepended ("parallel." for a job spec, "" for ParallelLayout::Create). Preconditions: every
// size > 0 (etp resolved, not 0) and world_size > 0. Used by common/config/validate_parallel.cc
// (job specs) and common/model/parallel_state.cc (ParallelLayout::Create).
std::vector<std::string> ParallelDivisibilityViolations(absl::string_view prefix, int64_t world,
                                                        int64_t tp, int64_t cp, int64_t pp,
                                                        int64_t ep, int64_t etp, int64_t instances);

// Pipeline layouts (megatron_parallel.md §3.8, mechanism 2: Megatron's
// --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers). `first` and `last`
// (nullopt: unset) fix the decoder layers of the first and the last stage; the other stages share
// the rest equally; with neither set every stage gets num_layers / pp. One message per violated
// rule (transformer_config.py:2294-2368), fields named with `prefix` ("parallel." / "model." for a
// job spec): first / last need PP > 1 and are > 0; the remaining layers must divide over the middle
// stages, every middle stage getting at least one (no empty stage), or be 0 when there are none;
// with VPP (vpp > 1) every stage's count must be divisible by it. Preconditions: num_layers > 0,
// pp > 0, vpp > 0. The one statement of these rules: the JobSpec's (common/config/
// validate_parallel.cc) and the trainer's stage assignment (common/model/pipeline_layout.h
// ValidatePipelineSplit, which StageLayers calls) both report them from here, with the JobSpec's
// field paths ("model.num_layers", "parallel.decoder_first_pipeline_num_layers", ...).
std::vector<std::string> PipelineLayoutViolations(int64_t num_layers, int64_t pp, int64_t vpp,
                                                  std::optional<int64_t> first,
                                                  std::optional<int64_t> last);

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_CONFIG_PARALLEL_RULES_H_
