// File: common/model/pipeline_layout.h
//
// Which decoder layers a pipeline stage (and, with virtual stages, which model chunk of it)
// holds, as Megatron-Core's get_transformer_layer_offset / get_num_layers_to_build
// (megatron_parallel.md, PP layouts). Layer indices are GLOBAL (0 .. num_layers − 1) so that
// initialisation, RNG streams and checkpoint names of a stage's layers match one process.
//
// Even split: every stage holds num_layers / PP layers; with VPP chunks, chunk v of stage p holds
// layers [v·N/VPP + p·N/(PP·VPP), + N/(PP·VPP)), i.e. the model is cut into PP·VPP pieces dealt
// round-robin to the stages (chunk-major order).
// Uneven split (Megatron's decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers,
// < 0 = unset): the first / last stage holds the given count, the other stages share the rest
// evenly, e.g. 14 layers, PP 4, first 3, last 3: 3 | 4 | 4 | 3 (the embedding rides on the first
// stage and the LM head on the last, which is why they are made lighter).
//
// Pure arithmetic. The trainer assigns each stage's chunks with StageLayers (one chunk without
// VPP, GptConfig::chunk_begin/chunk_end with it) and the planner sizes the stages with it
// (common/model/model_math.h StageLayerIndices: every chunk of the stage, for memory and step
// time).
// The rules are stated once, in common/config/parallel_rules.h PipelineLayoutViolations, which
// validates the JobSpec fields parallel.decoder_first/last_pipeline_num_layers too.
#ifndef SWITCHYARD_COMMON_MODEL_PIPELINE_LAYOUT_H_
#define SWITCHYARD_COMMON_MODEL_PIPELINE_LAYOUT_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace switchyard {

struct PipelineSplit {
  int64_t num_layers = 0;
  int64_t pp = 1;
  int64_t vpp = 1;
  int64_t first_stage_layers = -1;  // decoder_first_pipeline_num_layers; < 0: unset
  int64_t last_stage_layers = -1;   // decoder_last_pipeline_num_layers; < 0: unset
};

struct LayerRange {
  int64_t begin = 0;  // global index of the first layer
  int64_t count = 0;
};

// INVALID_ARGUMENT naming the field (the JobSpec's paths: model.num_layers, parallel.*) and the
// rule when the split cannot be made: num_layers < 1, pp < 1, vpp < 1, vpp > 1 at pp = 1, then
// the first violation of PipelineLayoutViolations (a first/last count at pp = 1 or <= 0, counts
// that leave the other stages a remainder they cannot share evenly with at least one layer each,
// or none to stages that must be empty, and with vpp > 1 a per-stage count not divisible by vpp).
absl::Status ValidatePipelineSplit(const PipelineSplit& split);

// The layers of model chunk `chunk` (in [0, vpp)) of stage `stage` (in [0, pp)).
absl::StatusOr<LayerRange> StageLayers(const PipelineSplit& split, int64_t stage, int64_t chunk);

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_MODEL_PIPELINE_LAYOUT_H_
