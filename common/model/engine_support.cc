// File: common/model/engine_support.cc
#include "common/model/engine_support.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace switchyard {

std::string UnsupportedByEngine(absl::string_view prefix, int64_t tensor_model_parallel_size,
                                int64_t context_parallel_size, int64_t pipeline_model_parallel_size,
                                int64_t expert_tensor_parallel_size) {
  // TP (with sequence parallelism, worker/model/gpt_model.h), CP (worker/model/gpt_model.h,
  // "Context parallelism") and ETP (worker/model/README.md, "Expert tensor parallelism") run at
  // any size the layout rules accept; only PP is refused, and TP together with CP (below). The
  // arguments stay so that every caller keeps one call shape while dimensions are lifted.
  (void)expert_tensor_parallel_size;
  const std::pair<const char*, int64_t> sizes[] = {
      {"pipeline_model_parallel_size", pipeline_model_parallel_size},
  };
  for (const auto& [name, value] : sizes) {
    if (value > 1) {
      return absl::StrCat(
          prefix, name, " (", value,
          ") must be 1: workers run data, tensor, context and expert parallelism only");
    }
  }
  if (tensor_model_parallel_size > 1 && context_parallel_size > 1) {
    // WHY: each runs alone, but their fold (CP picks the positions a rank holds, SP then shards
    // them over TP, the MoE statistics over TP×CP) is not built yet; refusing here keeps every
    // entry point from starting a run whose routing would silently differ from one process.
    return absl::StrCat(prefix, "tensor_model_parallel_size (", tensor_model_parallel_size,
                        ") and ", prefix, "context_parallel_size (", context_parallel_size,
                        ") cannot both exceed 1: tensor and context parallelism do not fold yet");
  }
  return "";
}

}  // namespace switchyard
