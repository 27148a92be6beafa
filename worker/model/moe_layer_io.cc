// moe_layer_io: runs one MoE layer forward and backward on tensors read from a safetensors file,
// and writes every result to another, so Switchyard's layer can be compared with another
// framework's tensor by tensor. Tensor names and layouts: worker/model/README.md.
//
//   moe_layer_io --config job.yaml --in layer_in.safetensors --out layer_out.safetensors
//                [--device cpu|cuda] [--dtype f32|f64] [--aux_grad_scale 1]
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/command_line.h"
#include "common/config/config.h"
#include "common/config/config_defaults.h"
#include "common/config/validate.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/runtime/buffer.h"
#include "worker/model/moe_layer.h"
#include "worker/model/moe_layer_tensors.h"

ABSL_FLAG(std::string, config, "",
          "job spec (YAML or JSON); its model section configures the layer");
ABSL_FLAG(std::string, in, "", "input safetensors: input, grad_output and the layer's weights");
ABSL_FLAG(std::string, out, "", "output safetensors");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda (bf16 weights and activations on cuda)");
ABSL_FLAG(std::string, dtype, "f32", "CPU compute dtype: f32 or f64");
ABSL_FLAG(double, aux_grad_scale, 1.0, "seed of the aux/z-loss gradients (spec §2.4)");

namespace switchyard::model {
namespace {

using kernels::Buffer;

// Converts a CPU tensor of any float dtype to `dtype` on `device`.
absl::StatusOr<Buffer> Load(const Tensor& src, DType dtype, Device device) {
  SY_ASSIGN_OR_RETURN(Buffer cpu, Buffer::ForTensor(dtype, src.shape, Device::Cpu()));
  SY_RETURN_IF_ERROR(ConvertTensor(src, cpu.View()));
  if (!device.is_cuda()) return cpu;
  SY_ASSIGN_OR_RETURN(Buffer dev, Buffer::ForTensor(dtype, src.shape, device));
  SY_RETURN_IF_ERROR(kernels::CopyTensor(cpu.View(), dev.View()));
  return dev;
}

// A CPU copy of any tensor (for writing).
absl::StatusOr<Buffer> ToCpu(const Tensor& t) {
  SY_ASSIGN_OR_RETURN(Buffer b, Buffer::ForTensor(t.dtype, t.shape, Device::Cpu()));
  SY_RETURN_IF_ERROR(kernels::CopyTensor(t, b.View()));
  return b;
}

absl::Status Run() {
  const bool cuda = absl::GetFlag(FLAGS_device) == "cuda";
  if (!cuda && absl::GetFlag(FLAGS_device) != "cpu") {
    return absl::InvalidArgumentError("--device must be cpu or cuda");
  }
  const DType dtype =
      cuda ? DType::kBF16 : (absl::GetFlag(FLAGS_dtype) == "f64" ? DType::kF64 : DType::kF32);
  const Device device = cuda ? Device::Cuda(0) : Device::Cpu();
  const Stream stream{device, nullptr};

  SY_ASSIGN_OR_RETURN(v1::JobSpec spec, LoadJobSpecFile(absl::GetFlag(FLAGS_config)));
  ApplyDefaults(&spec);
  SY_RETURN_IF_ERROR(ValidateJobSpec(spec));
  SY_ASSIGN_OR_RETURN(MoELayerConfig config, MoELayerConfig::FromProto(spec.model(), dtype));

  SY_ASSIGN_OR_RETURN(SafetensorsFile in, SafetensorsFile::Open(absl::GetFlag(FLAGS_in)));
  SY_ASSIGN_OR_RETURN(Tensor x_in, in.Get("input"));
  SY_ASSIGN_OR_RETURN(Tensor dy_in, in.Get("grad_output"));
  if (x_in.rank() != 2 || x_in.dim(1) != config.hidden_size || dy_in.shape != x_in.shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("input and grad_output must be [T, hidden_size=", config.hidden_size,
                     "], got ", x_in.DebugString(), " and ", dy_in.DebugString()));
  }
  const int64_t t = x_in.dim(0);
  if (config.router.seq_length <= 0 || t % config.router.seq_length != 0) {
    config.router.seq_length = t;  // one sequence unless the spec's seq_length divides T
  }
  const DType grad_dtype = cuda ? DType::kF32 : dtype;
  SY_ASSIGN_OR_RETURN(MoELayerTensors w,
                      MoELayerTensors::Create(config, device, dtype, grad_dtype));
  for (auto& [name, shape] : MoELayerTensors::ParamShapes(config)) {
    SY_ASSIGN_OR_RETURN(Tensor src, in.Get(name));
    if (src.shape != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": shape ", src.DebugString(), " does not match the config"));
    }
    SY_ASSIGN_OR_RETURN(Buffer b, Load(src, dtype, device));
    SY_RETURN_IF_ERROR(kernels::CopyTensor(b.View(), w.Param(name)));
  }
  if (in.Has("router.expert_bias")) {
    SY_ASSIGN_OR_RETURN(Tensor src, in.Get("router.expert_bias"));
    SY_ASSIGN_OR_RETURN(Buffer b, Load(src, DType::kF32, device));
    SY_RETURN_IF_ERROR(kernels::CopyTensor(b.View(), w.Param("router.expert_bias")));
  }
  SY_ASSIGN_OR_RETURN(Buffer x, Load(x_in, dtype, device));
  SY_ASSIGN_OR_RETURN(Buffer dy, Load(dy_in, dtype, device));
  SY_ASSIGN_OR_RETURN(Buffer y, Buffer::ForTensor(dtype, {t, config.hidden_size}, device));
  SY_ASSIGN_OR_RETURN(Buffer dx, Buffer::ForTensor(dtype, {t, config.hidden_size}, device));

  SY_ASSIGN_OR_RETURN(auto layer, MoELayer::Create(config, device, t));
  SY_RETURN_IF_ERROR(layer->Forward(stream, w.params(), w.router_state(), x.View(), y.View()));
  SY_RETURN_IF_ERROR(layer->Backward(stream, w.params(), w.grads(), dy.View(), dx.View(),
                                     absl::GetFlag(FLAGS_aux_grad_scale)));
  if (cuda && cudaDeviceSynchronize() != cudaSuccess) return absl::InternalError("CUDA sync");

  SafetensorsWriter out;
  std::vector<Buffer> keep;
  auto add = [&](const std::string& name, const Tensor& tensor) -> absl::Status {
    SY_ASSIGN_OR_RETURN(Buffer b, ToCpu(tensor));
    out.Add(name, b.View());
    keep.push_back(std::move(b));
    return absl::OkStatus();
  };
  SY_RETURN_IF_ERROR(add("output", y.View()));
  SY_RETURN_IF_ERROR(add("grad_input", dx.View()));
  SY_RETURN_IF_ERROR(add("router.topk_idx", layer->topk_idx()));
  SY_RETURN_IF_ERROR(add("router.topk_probs", layer->topk_probs()));
  SY_RETURN_IF_ERROR(add("grad.router.topk_probs", layer->dtopk_probs()));
  SY_RETURN_IF_ERROR(add("router.tokens_per_expert", layer->tokens_per_expert()));
  SY_RETURN_IF_ERROR(add("router.losses", layer->losses()));
  for (auto& [name, shape] : MoELayerTensors::ParamShapes(config)) {
    SY_RETURN_IF_ERROR(add("grad." + name, w.Grad(name)));
  }
  out.SetMetadata("device", cuda ? "cuda" : "cpu");
  out.SetMetadata("dtype", DTypeName(dtype));
  return out.Write(absl::GetFlag(FLAGS_out));
}

}  // namespace
}  // namespace switchyard::model

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "runs one MoE layer forward and backward on tensors from a safetensors file.\n"
      "usage: moe_layer_io --config job.yaml --in layer_in.safetensors --out "
      "layer_out.safetensors [--device cpu|cuda] [--dtype f32|f64] [--aux_grad_scale 1]");
  switchyard::ParseCommandLine(argc, argv);
  absl::Status s = switchyard::model::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "moe_layer_io: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
