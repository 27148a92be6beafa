// File: common/model/engine_support.cc
#include "common/model/engine_support.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace switchyard {

std::string UnsupportedByEngine(absl::string_view prefix, int64_t tensor_model_parallel_size,
                                int64_t context_parallel_size, int64_t pipeline_model_parallel_size,
                                int64_t expert_tensor_parallel_size) {
  // CP runs (worker/model/gpt_model.h, "Context parallelism") and ETP runs (worker/model/README.md,
  // "Expert tensor parallelism"): any size the layout rules accept. The arguments stay so that
  // every caller keeps one call shape while the other dimensions are lifted one by one.
  (void)context_parallel_size;
  (void)expert_tensor_parallel_size;
  const std::pair<const char*, int64_t> sizes[] = {
      {"tensor_model_parallel_size", tensor_model_parallel_size},
      {"pipeline_model_parallel_size", pipeline_model_parallel_size},
  };
  for (const auto& [name, value] : sizes) {
    if (value > 1) {
      return absl::StrCat(prefix, name, " (", value,
                          ") must be 1: workers run data, context and expert parallelism only");
    }
  }
  return "";
}

}  // namespace switchyard
