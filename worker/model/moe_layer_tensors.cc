#include "worker/model/moe_layer_tensors.h"

#include "common/status.h"
#include "kernels/elementwise/elementwise.h"

namespace switchyard::model {
namespace {

Tensor* Slot(MoELayerParams& p, const std::string& name) {
  if (name == "router.weight") return &p.router_weight;
  if (name == "experts.fc1") return &p.fc1;
  if (name == "experts.fc2") return &p.fc2;
  if (name == "shared_expert.fc1") return &p.shared_fc1;
  if (name == "shared_expert.fc2") return &p.shared_fc2;
  if (name == "shared_expert.gate") return &p.shared_gate;
  return nullptr;
}

void FillNormal(const Tensor& t, std::mt19937_64& rng, float std) {
  std::normal_distribution<float> dist(0.0f, std);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = dist(rng);
    if (t.dtype == DType::kF32) t.as<float>()[i] = v;
    if (t.dtype == DType::kF64) t.as<double>()[i] = v;
    if (t.dtype == DType::kBF16) t.as<BF16>()[i] = BF16::FromFloat(v);
  }
}

}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> MoELayerTensors::ParamShapes(
    const MoELayerConfig& c) {
  // f: this rank's ETP slice of the experts' intermediate size.
  const int64_t e = c.router.num_experts, h = c.hidden_size, f = c.local_ffn_size();
  // s: this TP rank's shared-expert units (the whole S without sequence parallelism).
  const int64_t s = c.local_shared_ffn_size(), l = c.num_local_experts();
  std::vector<std::pair<std::string, std::vector<int64_t>>> out = {
      {"router.weight", {e, h}}, {"experts.fc1", {l, h, 2 * f}}, {"experts.fc2", {l, f, h}}};
  if (s > 0) {
    out.push_back({"shared_expert.fc1", {h, 2 * s}});
    out.push_back({"shared_expert.fc2", {s, h}});
    if (c.shared_expert_gate) out.push_back({"shared_expert.gate", {h, 1}});
  }
  return out;
}

absl::StatusOr<MoELayerTensors> MoELayerTensors::Create(const MoELayerConfig& config, Device device,
                                                        DType param_dtype, DType grad_dtype) {
  MoELayerTensors t;
  for (auto& [name, shape] : ParamShapes(config)) {
    SY_ASSIGN_OR_RETURN(kernels::Buffer p, kernels::Buffer::ForTensor(param_dtype, shape, device));
    SY_ASSIGN_OR_RETURN(kernels::Buffer g, kernels::Buffer::ForTensor(grad_dtype, shape, device));
    SY_RETURN_IF_ERROR(kernels::FillBytes(p.View(), 0));
    SY_RETURN_IF_ERROR(kernels::FillBytes(g.View(), 0));
    *Slot(t.params_, name) = p.View();
    *Slot(t.grads_, name) = g.View();
    t.names_.push_back(name);
    t.params_list_.push_back(p.View());
    t.grads_list_.push_back(g.View());
    t.buffers_.push_back(std::move(p));
    t.buffers_.push_back(std::move(g));
  }
  const int64_t e = config.router.num_experts;
  for (Tensor* state : {&t.state_.expert_bias, &t.state_.local_tokens_per_expert}) {
    SY_ASSIGN_OR_RETURN(kernels::Buffer b, kernels::Buffer::ForTensor(DType::kF32, {e}, device));
    SY_RETURN_IF_ERROR(kernels::FillBytes(b.View(), 0));
    *state = b.View();
    t.buffers_.push_back(std::move(b));
  }
  return t;
}

Tensor MoELayerTensors::Param(const std::string& name) const {
  if (name == "router.expert_bias") return state_.expert_bias;
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return params_list_[i];
  }
  return Tensor();
}

Tensor MoELayerTensors::Grad(const std::string& name) const {
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return grads_list_[i];
  }
  return Tensor();
}

absl::Status MoELayerTensors::RandomizeOnCpu(std::mt19937_64& rng, float std, float bias_std) {
  for (const Tensor& p : params_list_) {
    if (p.device.is_cuda()) return absl::FailedPreconditionError("RandomizeOnCpu: CUDA tensors");
    FillNormal(p, rng, std);
  }
  if (bias_std > 0) FillNormal(state_.expert_bias, rng, bias_std);
  return absl::OkStatus();
}

absl::Status MoELayerTensors::CopyParamsFrom(const MoELayerTensors& src) {
  for (size_t i = 0; i < names_.size(); ++i) {
    const Tensor s = src.Param(names_[i]);
    const Tensor& d = params_list_[i];
    if (s.dtype == d.dtype || s.device == d.device) {
      if (s.dtype == d.dtype) {
        SY_RETURN_IF_ERROR(kernels::CopyTensor(s, d));
      } else {
        SY_RETURN_IF_ERROR(kernels::Cast(Stream{d.device, nullptr}, s, d));
      }
      continue;
    }
    // Different dtype and device: convert on the source's (CPU) side first.
    if (s.device.is_cuda()) return absl::UnimplementedError("CopyParamsFrom: CUDA -> other dtype");
    SY_ASSIGN_OR_RETURN(kernels::Buffer tmp,
                        kernels::Buffer::ForTensor(d.dtype, s.shape, Device::Cpu()));
    SY_RETURN_IF_ERROR(kernels::Cast(Stream::Cpu(), s, tmp.View()));
    SY_RETURN_IF_ERROR(kernels::CopyTensor(tmp.View(), d));
  }
  return kernels::CopyTensor(src.state_.expert_bias, state_.expert_bias);
}

absl::Status MoELayerTensors::ZeroGrads() {
  for (const Tensor& g : grads_list_) SY_RETURN_IF_ERROR(kernels::FillBytes(g, 0));
  return absl::OkStatus();
}

}  // namespace switchyard::model
