// File: common/config/parallel_rules.cc
//
// The divisibility rules of megatron_moe.md §5.2 (parallel_state.py:823, :881-884, :922-926,
// :1447-1449).
#include "common/config/parallel_rules.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace switchyard {

std::vector<std::string> ParallelDivisibilityViolations(absl::string_view prefix, int64_t world,
                                                        int64_t tp, int64_t cp, int64_t pp,
                                                        int64_t ep, int64_t etp,
                                                        int64_t instances) {
  std::vector<std::string> out;
  const std::string p(prefix);
  // parallel_state.py:823 and :881-884.
  const bool dense_ok = world % (tp * pp * cp) == 0;
  if (!dense_ok) {
    out.push_back(absl::StrCat(p, "world_size (", world, ") must be divisible by ", p,
                               "tensor_model_parallel_size * ", p,
                               "pipeline_model_parallel_size * ", p, "context_parallel_size (", tp,
                               " * ", pp, " * ", cp, " = ", tp * pp * cp, ")"));
  }
  const bool expert_ok = world % (etp * ep * pp) == 0;
  if (!expert_ok) {
    out.push_back(absl::StrCat(p, "world_size (", world, ") must be divisible by ", p,
                               "expert_tensor_parallel_size * ", p, "expert_model_parallel_size * ",
                               p, "pipeline_model_parallel_size (", etp, " * ", ep, " * ", pp,
                               " = ", etp * ep * pp, ")"));
  }
  // parallel_state.py:922-926 and :1447-1449.
  if (dense_ok) {
    const int64_t dp = world / (tp * cp * pp);
    if ((dp * cp) % instances != 0) {
      out.push_back(absl::StrCat("data-parallel size * ", p, "context_parallel_size (", dp, " * ",
                                 cp, " = ", dp * cp, ") must be divisible by ", p,
                                 "num_distributed_optimizer_instances (", instances, ")"));
    }
  }
  if (expert_ok) {
    const int64_t edp = world / (etp * ep * pp);
    if (edp % instances != 0) {
      out.push_back(absl::StrCat("expert data-parallel size (", edp, ") must be divisible by ", p,
                                 "num_distributed_optimizer_instances (", instances, ")"));
    }
  }
  return out;
}

}  // namespace switchyard
