// File: common/model/engine_support.cc
#include "common/model/engine_support.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace switchyard {

std::string UnsupportedByEngine(absl::string_view prefix, int64_t tensor_model_parallel_size,
                                int64_t context_parallel_size, int64_t pipeline_model_parallel_size,
                                int64_t expert_tensor_parallel_size,
                                int64_t virtual_pipeline_model_parallel_size) {
  // TP (with sequence parallelism, worker/model/gpt_model.h), CP (worker/model/gpt_model.h,
  // "Context parallelism"), ETP (worker/model/README.md, "Expert tensor parallelism"), PP
  // (worker/train/trainer.h, 1F1B) and VPP (the interleaved 1F1B schedule) run at any size the
  // layout rules accept (common/config validates them), all folded together.
  (void)prefix;
  (void)tensor_model_parallel_size;
  (void)context_parallel_size;
  (void)pipeline_model_parallel_size;
  (void)expert_tensor_parallel_size;
  (void)virtual_pipeline_model_parallel_size;
  return "";
}

std::string UnsupportedJobSpec(absl::string_view prefix, const v1::JobSpec& spec) {
  const v1::ParallelConfig& p = spec.parallel();
  auto size = [](bool has, int64_t v) { return has && v > 0 ? v : int64_t{1}; };
  const int64_t pp = size(p.has_pipeline_model_parallel_size(), p.pipeline_model_parallel_size());
  std::string why = UnsupportedByEngine(
      absl::StrCat(prefix, "parallel."),
      size(p.has_tensor_model_parallel_size(), p.tensor_model_parallel_size()),
      size(p.has_context_parallel_size(), p.context_parallel_size()), pp,
      size(p.has_expert_tensor_parallel_size(), p.expert_tensor_parallel_size()),
      size(p.has_virtual_pipeline_model_parallel_size(), p.virtual_pipeline_model_parallel_size()));
  // Every model and training feature runs at PP > 1 too (evaluation through the forward-only
  // pipeline schedule, worker/train/evaluate.cc): the parallel sizes are the whole rule.
  return why;
}

}  // namespace switchyard
