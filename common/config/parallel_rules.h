// File: common/config/parallel_rules.h
//
// The size-only divisibility rules of a parallel mapping (megatron_moe.md §5.2). They live with
// the other validation rules so that common/config depends on nothing above it; the rank
// arithmetic that also enforces them (common/model/parallel_state.h) calls this function.
#ifndef SWITCHYARD_COMMON_CONFIG_PARALLEL_RULES_H_
#define SWITCHYARD_COMMON_CONFIG_PARALLEL_RULES_H_

#include <cstdint>
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

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_CONFIG_PARALLEL_RULES_H_
