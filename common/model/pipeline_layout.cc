// File: common/model/pipeline_layout.cc
//
// Megatron-Core's layer offsets per pipeline stage and model chunk (see the header).
#include "common/model/pipeline_layout.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace switchyard {
namespace {

constexpr char kFirst[] = "decoder_first_pipeline_num_layers";
constexpr char kLast[] = "decoder_last_pipeline_num_layers";

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

}  // namespace

absl::Status ValidatePipelineSplit(const PipelineSplit& s) {
  if (s.num_layers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_layers (", s.num_layers, ") must be at least 1"));
  }
  if (s.pp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline_model_parallel_size (", s.pp, ") must be at least 1"));
  }
  if (s.vpp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("virtual_pipeline_model_parallel_size (", s.vpp, ") must be at least 1"));
  }
  if (s.vpp > 1 && s.pp == 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("virtual_pipeline_model_parallel_size (", s.vpp,
                     ") requires pipeline_model_parallel_size > 1 (got 1)"));
  }
  const bool has_first = s.first_stage_layers >= 0, has_last = s.last_stage_layers >= 0;
  if ((has_first || has_last) && s.pp == 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        has_first ? kFirst : kLast, " requires pipeline_model_parallel_size > 1 (got 1)"));
  }
  const int64_t given =
      (has_first ? s.first_stage_layers : 0) + (has_last ? s.last_stage_layers : 0);
  if (given > s.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        kFirst, " + ", kLast, " (", given, ") must be at most num_layers (", s.num_layers, ")"));
  }
  const StageCounts c = Counts(s);
  const int64_t rest = s.num_layers - given;
  if (c.middle_stages == 0 && rest != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kFirst, " + ", kLast, " (", given, ") must equal num_layers (", s.num_layers,
        ") when they are the only pipeline stages (pipeline_model_parallel_size ", s.pp, ")"));
  }
  if (c.middle_stages > 0 && rest % c.middle_stages != 0 && !has_first && !has_last) {
    return absl::InvalidArgumentError(absl::StrCat("num_layers (", s.num_layers,
                                                   ") must be divisible by ",
                                                   "pipeline_model_parallel_size (", s.pp, ")"));
  }
  if (c.middle_stages > 0 && rest % c.middle_stages != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_layers", has_first ? absl::StrCat(" - ", kFirst) : "",
        has_last ? absl::StrCat(" - ", kLast) : "", " (", rest,
        ") must be divisible by the number of other pipeline stages (", c.middle_stages, ")"));
  }
  if (s.vpp > 1) {
    // Every model chunk of a stage holds the same number of layers (Megatron divides each
    // stage's count by VPP).
    auto check = [&](const std::string& name, int64_t count) -> absl::Status {
      if (count % s.vpp == 0) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat(
          name, " (", count, ") must be divisible by virtual_pipeline_model_parallel_size (", s.vpp,
          "): every model chunk of a stage holds the same number of layers"));
    };
    if (has_first) SY_RETURN_IF_ERROR(check(kFirst, c.first));
    if (has_last) SY_RETURN_IF_ERROR(check(kLast, c.last));
    if (c.middle_stages > 0) {
      SY_RETURN_IF_ERROR(check(has_first || has_last ? "layers per other pipeline stage"
                                                     : "num_layers / pipeline_model_parallel_size",
                               c.middle));
    }
  }
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
