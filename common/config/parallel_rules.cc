// File: common/config/parallel_rules.cc
//
// The divisibility rules of megatron_moe.md §5.2 (parallel_state.py:823, :881-884, :922-926,
// :1447-1449).
#include "common/config/parallel_rules.h"

#include <optional>
#include <string>
#include <utility>
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

std::vector<std::string> PipelineLayoutViolations(int64_t num_layers, int64_t pp, int64_t vpp,
                                                  std::optional<int64_t> first,
                                                  std::optional<int64_t> last) {
  std::vector<std::string> out;
  const char* kFirst = "parallel.decoder_first_pipeline_num_layers";
  const char* kLast = "parallel.decoder_last_pipeline_num_layers";
  if (!first.has_value() && !last.has_value()) {
    if (num_layers % pp != 0) {
      out.push_back(absl::StrCat("model.num_layers (", num_layers,
                                 ") must be divisible by parallel.pipeline_model_parallel_size (",
                                 pp, ")"));
    } else if (vpp > 1 && num_layers % (pp * vpp) != 0) {
      out.push_back(absl::StrCat("model.num_layers (", num_layers,
                                 ") must be divisible by parallel.pipeline_model_parallel_size * "
                                 "parallel.virtual_pipeline_model_parallel_size (",
                                 pp, " * ", vpp, " = ", pp * vpp, ")"));
    }
    return out;
  }
  if (pp <= 1) {
    out.push_back(
        absl::StrCat(first.has_value() ? kFirst : kLast, " (", first.has_value() ? *first : *last,
                     ") requires parallel.pipeline_model_parallel_size > 1 (got ", pp, ")"));
    return out;
  }
  for (auto [name, v] :
       {std::pair<const char*, std::optional<int64_t>>{kFirst, first}, {kLast, last}}) {
    if (!v.has_value()) continue;
    // transformer_config.py: the first / last stage counts are > 0 when given.
    if (*v <= 0) out.push_back(absl::StrCat(name, " (", *v, ") must be > 0 when set"));
    if (*v > 0 && vpp > 1 && *v % vpp != 0) {
      out.push_back(absl::StrCat(name, " (", *v,
                                 ") must be divisible by "
                                 "parallel.virtual_pipeline_model_parallel_size (",
                                 vpp, ")"));
    }
  }
  if (!out.empty()) return out;
  const int64_t f = first.value_or(0), l = last.value_or(0);
  const int64_t set = (first.has_value() ? 1 : 0) + (last.has_value() ? 1 : 0);
  const int64_t middle_stages = pp - set, rest = num_layers - f - l;
  const std::string what = absl::StrCat("model.num_layers (", num_layers, ") - ", kFirst, " (", f,
                                        ") - ", kLast, " (", l, ") = ", rest, " layers");
  if (middle_stages == 0) {
    if (rest != 0) {
      out.push_back(absl::StrCat(what, " must be 0: parallel.pipeline_model_parallel_size (", pp,
                                 ") leaves no other stage"));
    }
  } else if (rest < middle_stages || rest % middle_stages != 0) {
    out.push_back(absl::StrCat(what, " must divide into the ", middle_stages,
                               " other stages of parallel.pipeline_model_parallel_size (", pp,
                               "), at least one layer each"));
  } else if (vpp > 1 && (rest / middle_stages) % vpp != 0) {
    out.push_back(absl::StrCat(what, " over ", middle_stages, " stages gives ",
                               rest / middle_stages,
                               " per stage, which must be divisible by "
                               "parallel.virtual_pipeline_model_parallel_size (",
                               vpp, ")"));
  }
  return out;
}

}  // namespace switchyard
