// File: worker/model/moe_layer_tensors.h
//
// Owning storage for one MoE layer's parameters, gradients and router state, addressed by the
// tensor names used in layer I/O files (docs in worker/model/README.md):
//   router.weight [E, H], experts.fc1 [L, H, 2F'], experts.fc2 [L, F', H] (L = E / EP local
//   experts, F' = F / ETP: this rank's shard, moe_layer.h),
//   shared_expert.fc1 [H, 2S], shared_expert.fc2 [S, H], shared_expert.gate [H, 1],
//   router.expert_bias [E] (f32, state, not trained).
// Used by the layer I/O command, the benchmark and the tests; the trainer keeps parameters in
// its own contiguous buffers and hands MoELayer plain views.
#ifndef SWITCHYARD_WORKER_MODEL_MOE_LAYER_TENSORS_H_
#define SWITCHYARD_WORKER_MODEL_MOE_LAYER_TENSORS_H_

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/runtime/buffer.h"
#include "worker/model/moe_layer.h"

namespace switchyard::model {

class MoELayerTensors {
 public:
  // Allocates zeroed parameters (param_dtype), gradients (grad_dtype) and router state on device.
  static absl::StatusOr<MoELayerTensors> Create(const MoELayerConfig& config, Device device,
                                                DType param_dtype, DType grad_dtype);

  // (name, shape) of every trainable parameter of `config`, in a fixed order.
  static std::vector<std::pair<std::string, std::vector<int64_t>>> ParamShapes(
      const MoELayerConfig& config);

  const MoELayerParams& params() const { return params_; }
  const MoELayerParams& grads() const { return grads_; }
  const MoERouterState& router_state() const { return state_; }
  // The parameter (or gradient) called `name` (see the file comment); empty Tensor if absent.
  Tensor Param(const std::string& name) const;
  Tensor Grad(const std::string& name) const;

  // CPU tensors only: parameters ~ N(0, std^2), expert bias ~ N(0, bias_std^2).
  absl::Status RandomizeOnCpu(std::mt19937_64& rng, float std, float bias_std = 0.0f);
  // Copies (with dtype conversion) every parameter and the router state from `src`.
  absl::Status CopyParamsFrom(const MoELayerTensors& src);
  absl::Status ZeroGrads();

 private:
  std::vector<kernels::Buffer> buffers_;
  std::vector<std::string> names_;
  std::vector<Tensor> params_list_, grads_list_;
  MoELayerParams params_, grads_;
  MoERouterState state_;
};

}  // namespace switchyard::model

#endif  // SWITCHYARD_WORKER_MODEL_MOE_LAYER_TENSORS_H_
