// File: common/model/engine_support.cc
#include "common/model/engine_support.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace switchyard {

std::string UnsupportedByEngine(absl::string_view prefix, int64_t tensor_model_parallel_size,
                                int64_t context_parallel_size, int64_t pipeline_model_parallel_size,
                                int64_t expert_tensor_parallel_size) {
  // Tensor parallelism (with sequence parallelism, worker/model/gpt_model.h) and expert tensor
  // parallelism (worker/model/README.md) run; the arguments stay so that every caller keeps one
  // call shape while the other dimensions are lifted one by one.
  (void)tensor_model_parallel_size;
  (void)expert_tensor_parallel_size;
  const std::pair<const char*, int64_t> sizes[] = {
      {"context_parallel_size", context_parallel_size},
      {"pipeline_model_parallel_size", pipeline_model_parallel_size},
  };
  for (const auto& [name, value] : sizes) {
    if (value > 1) {
      return absl::StrCat(prefix, name, " (", value,
                          ") must be 1: workers run data and expert parallelism only");
    }
  }
  return "";
}

}  // namespace switchyard
