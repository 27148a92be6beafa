// GroupedGemm: creation (path selection), argument validation and dispatch to the CPU reference,
// the CUTLASS SM90 path or the portable fallback.
#include "kernels/gemm/grouped_gemm.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::kernels {
namespace {

using internal::GroupedGemmCall;
using internal::GroupedGemmOp;

constexpr int kMaxGroupsLimit = 65535;

bool IsFloat(DType d) { return d == DType::kF32 || d == DType::kF64 || d == DType::kBF16; }

absl::Status CheckRank(const char* what, const char* name, const Tensor& t, int rank,
                       const char* dims) {
  if (t.rank() == rank) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": ", name, " must be ", rank, "-D ", dims, ", got ", t.DebugString()));
}

absl::Status CheckShape(const char* what, const char* name, const Tensor& t,
                        const std::vector<int64_t>& want, const char* dims) {
  if (t.shape == want) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", name, " must be ", dims, " = [",
                                                 absl::StrJoin(want, ", "), "], got ",
                                                 t.DebugString()));
}

absl::Status CheckTokens(const char* what, const Tensor& tokens) {
  SY_RETURN_IF_ERROR(CheckRank(what, "tokens_per_group", tokens, 1, "[G]"));
  if (tokens.dtype != DType::kI32) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": tokens_per_group must be int32, got ", tokens.DebugString()));
  }
  return absl::OkStatus();
}

// The call Fprop, Dgrad and Wgrad build once validated: `a` and `b` into `out`, R rows of
// capacity, K, N and G groups (capped to int; Run then refuses more groups than the GroupedGemm
// was created for).
GroupedGemmCall MakeCall(GroupedGemmOp op, const Tensor& a, const Tensor& b, const Tensor& out,
                         const Tensor& tokens_per_group, int64_t r, int64_t k, int64_t n,
                         int64_t g) {
  GroupedGemmCall call;
  call.op = op;
  call.a = a.data;
  call.b = b.data;
  call.out = out.data;
  call.tokens_per_group = tokens_per_group.as<int32_t>();
  call.in_dtype = a.dtype;
  call.out_dtype = out.dtype;
  call.rows = r;
  call.k = k;
  call.n = n;
  call.groups = static_cast<int>(std::min<int64_t>(g, std::numeric_limits<int>::max()));
  return call;
}

}  // namespace

const char* GroupedGemmPathName(GroupedGemmPath path) {
  switch (path) {
    case GroupedGemmPath::kAuto:
      return "auto";
    case GroupedGemmPath::kCpuReference:
      return "cpu_reference";
    case GroupedGemmPath::kCutlassSm90:
      return "cutlass_sm90";
    case GroupedGemmPath::kFallback:
      return "fallback";
  }
  return "?";
}

const char* GroupedGemmTileName(GroupedGemmTile tile) {
  switch (tile) {
    case GroupedGemmTile::kAuto:
      return "auto";
    case GroupedGemmTile::kPingpong128x128:
      return "pingpong_128x128x64";
    case GroupedGemmTile::kCooperative256x128:
      return "cooperative_256x128x64";
    case GroupedGemmTile::kCooperative128x128:
      return "cooperative_128x128x64";
    case GroupedGemmTile::kPingpong64x128:
      return "pingpong_64x128x64";
    case GroupedGemmTile::kCooperative128x256:
      return "cooperative_128x256x64";
  }
  return "?";
}

absl::StatusOr<GroupedGemmTile> ParseGroupedGemmTile(absl::string_view name) {
  std::vector<std::string> names = {GroupedGemmTileName(GroupedGemmTile::kAuto)};
  if (name == names[0]) return GroupedGemmTile::kAuto;
  for (GroupedGemmTile tile : kGroupedGemmTiles) {
    if (name == GroupedGemmTileName(tile)) return tile;
    names.push_back(GroupedGemmTileName(tile));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("grouped GEMM tile '", name, "' must be one of ", absl::StrJoin(names, ", ")));
}

namespace internal {

const char* GroupedGemmOpName(GroupedGemmOp op) {
  switch (op) {
    case GroupedGemmOp::kFprop:
      return "Fprop";
    case GroupedGemmOp::kDgrad:
      return "Dgrad";
    case GroupedGemmOp::kWgrad:
      return "Wgrad";
  }
  return "?";
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<GroupedGemm>> GroupedGemm::Create(
    Device device, int max_groups, const GroupedGemmOptions& options) {
  if (max_groups < 1 || max_groups > kMaxGroupsLimit) {
    return absl::InvalidArgumentError(absl::StrCat("GroupedGemm::Create: max_groups (", max_groups,
                                                   ") must be in [1, ", kMaxGroupsLimit, "]"));
  }
  GroupedGemmPath path = options.path;
  if (!device.is_cuda()) {
    if (path != GroupedGemmPath::kAuto && path != GroupedGemmPath::kCpuReference) {
      return absl::FailedPreconditionError(
          absl::StrCat("GroupedGemm::Create: path ", GroupedGemmPathName(path),
                       " needs a CUDA device, got ", device.ToString()));
    }
    return std::unique_ptr<GroupedGemm>(
        new GroupedGemm(device, max_groups, GroupedGemmPath::kCpuReference, options.tile, nullptr));
  }
  if (path == GroupedGemmPath::kCpuReference) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GroupedGemm::Create: path cpu_reference needs a CPU device, got ", device.ToString()));
  }
  int major = 0, minor = 0;
  SY_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index));
  SY_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device.index));
  // The CUTLASS kernels are built for sm_90a only: arch-specific features run on 9.0 exactly.
  const bool sm90_ok = major == 9 && minor == 0 && internal::Sm90GroupedGemmCompiled();
  if (path == GroupedGemmPath::kAuto) {
    path = sm90_ok ? GroupedGemmPath::kCutlassSm90 : GroupedGemmPath::kFallback;
  }
  std::unique_ptr<internal::GroupedGemmCudaPath> cuda_path;
  if (path == GroupedGemmPath::kCutlassSm90) {
    if (!sm90_ok) {
      return absl::FailedPreconditionError(absl::StrCat(
          "GroupedGemm::Create: path cutlass_sm90 needs a compute capability 9.0 device and a "
          "build with the CUTLASS SM90 kernels; ",
          device.ToString(), " is ", major, ".", minor,
          internal::Sm90GroupedGemmCompiled() ? "" : " and the kernels are not compiled in"));
    }
    SY_ASSIGN_OR_RETURN(cuda_path, internal::CreateGroupedGemmSm90(device.index, max_groups));
  } else {
    SY_ASSIGN_OR_RETURN(cuda_path, internal::CreateGroupedGemmFallback(device.index, max_groups));
  }
  return std::unique_ptr<GroupedGemm>(
      new GroupedGemm(device, max_groups, path, options.tile, std::move(cuda_path)));
}

GroupedGemm::GroupedGemm(Device device, int max_groups, GroupedGemmPath path, GroupedGemmTile tile,
                         std::unique_ptr<internal::GroupedGemmCudaPath> cuda_path)
    : device_(device),
      max_groups_(max_groups),
      path_(path),
      tile_(tile),
      cuda_path_(std::move(cuda_path)) {}

GroupedGemm::~GroupedGemm() = default;

absl::Status GroupedGemm::Fprop(const Stream& stream, const Tensor& x, const Tensor& w,
                                const Tensor& tokens_per_group, const Tensor& y) {
  return RunOnWeights(GroupedGemmOp::kFprop, stream, x, w, tokens_per_group, y);
}

absl::Status GroupedGemm::Dgrad(const Stream& stream, const Tensor& dy, const Tensor& w,
                                const Tensor& tokens_per_group, const Tensor& dx) {
  return RunOnWeights(GroupedGemmOp::kDgrad, stream, dy, w, tokens_per_group, dx);
}

absl::Status GroupedGemm::RunOnWeights(GroupedGemmOp op, const Stream& stream, const Tensor& a,
                                       const Tensor& w, const Tensor& tokens_per_group,
                                       const Tensor& out) {
  // Fprop: a = x [R, K] -> out = y [R, N]; Dgrad: a = dy [R, N] -> out = dx [R, K].
  const bool fprop = op == GroupedGemmOp::kFprop;
  const char* what = fprop ? "GroupedGemm::Fprop" : "GroupedGemm::Dgrad";
  const char* a_name = fprop ? "x" : "dy";
  const char* a_dims = fprop ? "[R, K]" : "[R, N]";
  SY_RETURN_IF_ERROR(CheckTokens(what, tokens_per_group));
  SY_RETURN_IF_ERROR(CheckRank(what, a_name, a, 2, a_dims));
  SY_RETURN_IF_ERROR(CheckRank(what, "w", w, 3, "[G, K, N]"));
  // The inner size comes from `a`, the outer one from w.
  const int64_t g = tokens_per_group.dim(0), r = a.dim(0);
  const int64_t k = fprop ? a.dim(1) : w.dim(1), n = fprop ? w.dim(2) : a.dim(1);
  SY_RETURN_IF_ERROR(CheckShape(what, "w", w, {g, k, n}, "[G, K, N]"));
  SY_RETURN_IF_ERROR(fprop ? CheckShape(what, "y", out, {r, n}, "[R, N]")
                           : CheckShape(what, "dx", out, {r, k}, "[R, K]"));
  if (a.dtype != w.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", a_name, " and w dtypes differ: ", a.DebugString(), " vs ", w.DebugString()));
  }
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&a, &w, &tokens_per_group, &out}));
  return Run(what, stream, MakeCall(op, a, w, out, tokens_per_group, r, k, n, g));
}

absl::Status GroupedGemm::Wgrad(const Stream& stream, const Tensor& x, const Tensor& dy,
                                const Tensor& tokens_per_group, const Tensor& dw, bool accumulate) {
  const char* what = "GroupedGemm::Wgrad";
  SY_RETURN_IF_ERROR(CheckTokens(what, tokens_per_group));
  SY_RETURN_IF_ERROR(CheckRank(what, "x", x, 2, "[R, K]"));
  SY_RETURN_IF_ERROR(CheckRank(what, "dy", dy, 2, "[R, N]"));
  const int64_t g = tokens_per_group.dim(0), r = x.dim(0), k = x.dim(1), n = dy.dim(1);
  SY_RETURN_IF_ERROR(CheckShape(what, "dy", dy, {r, n}, "[R, N]"));
  SY_RETURN_IF_ERROR(CheckShape(what, "dw", dw, {g, k, n}, "[G, K, N]"));
  if (x.dtype != dy.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": x and dy dtypes differ: ", x.DebugString(), " vs ", dy.DebugString()));
  }
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&x, &dy, &tokens_per_group, &dw}));
  GroupedGemmCall call = MakeCall(GroupedGemmOp::kWgrad, x, dy, dw, tokens_per_group, r, k, n, g);
  call.accumulate = accumulate;
  return Run(what, stream, call);
}

absl::Status GroupedGemm::Run(const char* what, const Stream& stream, GroupedGemmCall call) {
  if (stream.device != device_) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the stream is on ",
                                                   stream.device.ToString(),
                                                   " but the GroupedGemm "
                                                   "was created for ",
                                                   device_.ToString()));
  }
  if (call.groups > max_groups_) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": G (", call.groups, ") exceeds max_groups (", max_groups_, ")"));
  }
  if (call.k < 1 || call.n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": K (", call.k, ") and N (", call.n, ") must be positive"));
  }
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  if (call.rows > kIntMax || call.k > kIntMax || call.n > kIntMax) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": R (", call.rows, "), K (", call.k,
                                                   ") and N (", call.n, ") must be < 2^31"));
  }
  if (!device_.is_cuda()) {
    if (!IsFloat(call.in_dtype) || !IsFloat(call.out_dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the CPU reference takes f32, f64 or bf16 tensors, got inputs ",
                       DTypeName(call.in_dtype), " and output ", DTypeName(call.out_dtype)));
    }
  } else {
    const bool out_ok = call.out_dtype == DType::kBF16 ||
                        (call.op == GroupedGemmOp::kWgrad && call.out_dtype == DType::kF32);
    if (call.in_dtype != DType::kBF16 || !out_ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": on CUDA the inputs must be bf16 and the output bf16",
                       call.op == GroupedGemmOp::kWgrad ? " or f32" : "", "; got inputs ",
                       DTypeName(call.in_dtype), " and output ", DTypeName(call.out_dtype)));
    }
  }
  if (call.groups == 0) return absl::OkStatus();
  call.cuda_stream = stream.cuda_stream;
  call.tile = tile_;
  if (!device_.is_cuda()) return internal::GroupedGemmCpu(call);
  absl::Status status = cuda_path_->Run(call);
  if (!status.ok())
    return Annotate(status, absl::StrCat(what, " (", GroupedGemmPathName(path_), ")"));
  return absl::OkStatus();
}

}  // namespace switchyard::kernels
