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
  // any size the layout rules accept, TP and CP together too (CP picks a rank's positions, SP
  // shards them over TP); only PP is refused. The trainer runs PP itself (1F1B on the CPU over
  // Gloo, worker/train/trainer.h) and passes 1 here; the worker agent and the coordinator still
  // refuse it until the pipeline has run on GPUs. The arguments stay so that every caller keeps
  // one call shape while dimensions are lifted.
  (void)tensor_model_parallel_size;
  (void)context_parallel_size;
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
  return "";
}

}  // namespace switchyard
