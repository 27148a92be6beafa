// File: common/model/pipeline_layout.cc
//
// Megatron-Core's layer offsets per pipeline stage and model chunk (see the header).
#include "common/model/pipeline_layout.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/config/parallel_rules.h"

namespace switchyard {
namespace {

// Layers of the first / last / each middle stage.
struct StageCounts {
  int64_t first = 0, last = 0, middle = 0;
  int64_t middle_stages = 0;
};

StageCounts Counts(const PipelineSplit& s) {
  StageCounts c;
  const bool has_first = s.first_stage_layers >= 0, has_last = s.last_stage_layers >= 0;
  c.middle_stages = s.pp - (has_first ? 1 : 0) - (has_last ? 1 : 0);
  const int64_t rest =
      s.num_layers - (has_first ? s.first_stage_layers : 0) - (has_last ? s.last_stage_layers : 0);
  c.middle = c.middle_stages > 0 ? rest / c.middle_stages : 0;
  c.first = has_first ? s.first_stage_layers : c.middle;
  c.last = has_last ? s.last_stage_layers : c.middle;
  return c;
}

std::optional<int64_t> Given(int64_t layers) {
  return layers >= 0 ? std::optional<int64_t>(layers) : std::nullopt;
}

}  // namespace

absl::Status ValidatePipelineSplit(const PipelineSplit& s) {
  // The preconditions of PipelineLayoutViolations, then its rules (the JobSpec's, one source).
  if (s.num_layers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.num_layers (", s.num_layers, ") must be at least 1"));
  }
  if (s.pp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.pipeline_model_parallel_size (", s.pp, ") must be at least 1"));
  }
  if (s.vpp < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.virtual_pipeline_model_parallel_size (", s.vpp, ") must be at least 1"));
  }
  if (s.vpp > 1 && s.pp == 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.virtual_pipeline_model_parallel_size (", s.vpp,
                     ") requires parallel.pipeline_model_parallel_size > 1 (got 1)"));
  }
  const std::vector<std::string> violations = PipelineLayoutViolations(
      s.num_layers, s.pp, s.vpp, Given(s.first_stage_layers), Given(s.last_stage_layers));
  if (!violations.empty()) return absl::InvalidArgumentError(violations.front());
  return absl::OkStatus();
}

absl::StatusOr<LayerRange> StageLayers(const PipelineSplit& s, int64_t stage, int64_t chunk) {
  if (absl::Status st = ValidatePipelineSplit(s); !st.ok()) return st;
  if (stage < 0 || stage >= s.pp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage (", stage, ") must be in [0, pipeline_model_parallel_size ", s.pp, ")"));
  }
  if (chunk < 0 || chunk >= s.vpp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk (", chunk, ") must be in [0, virtual_pipeline_model_parallel_size ", s.vpp, ")"));
  }
  const StageCounts c = Counts(s);
  // Per chunk: the model is dealt chunk-major, so chunk v starts after v full rounds of every
  // stage's per-chunk share (Megatron's total_virtual_chunks), then the earlier stages' shares.
  const int64_t first = c.first / s.vpp, last = c.last / s.vpp, middle = c.middle / s.vpp;
  const int64_t round = first + last + middle * (s.pp - 2 >= 0 ? s.pp - 2 : 0);
  LayerRange r;
  if (s.pp == 1) {
    r.count = s.num_layers;  // vpp is 1 (validated)
    return r;
  }
  r.begin = chunk * round + (stage == 0 ? 0 : first + (stage - 1) * middle);
  r.count = stage == 0 ? first : stage == s.pp - 1 ? last : middle;
  return r;
}

}  // namespace switchyard
