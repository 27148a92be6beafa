// GroupedGemm: creation (path selection), argument validation and dispatch to the CPU reference,
// the CUTLASS SM90 path or the portable fallback.
#include "kernels/gemm/grouped_gemm.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "kernels/gemm/grouped_gemm_gather_sm90.h"
#include "kernels/runtime/buffer.h"
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

// A gathered operand's rows: R and whether it is gathered. `rows` empty (rank 0): src is the
// operand, [R, C]; else rows is int32 [R] and src [S, C]. `r` is the expected R (-1: any).
absl::StatusOr<int64_t> GatheredRows(const char* what, const char* name, const Tensor& src,
                                     const Tensor& rows, int64_t r) {
  SY_RETURN_IF_ERROR(CheckRank(what, name, src, 2, rows.rank() == 0 ? "[R, C]" : "[S, C]"));
  if (rows.rank() == 0) {
    if (r >= 0 && src.dim(0) != r) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", name, " (not gathered) must have ",
                                                     r, " rows, got ", src.DebugString()));
    }
    return src.dim(0);
  }
  const std::string rows_name = absl::StrCat(name, "_rows");
  SY_RETURN_IF_ERROR(CheckRank(what, rows_name.c_str(), rows, 1, "[R]"));
  if (rows.dtype != DType::kI32 || (r >= 0 && rows.dim(0) != r)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", rows_name, " must be int32 [",
                                                   r >= 0 ? absl::StrCat(r) : "R", "], got ",
                                                   rows.DebugString()));
  }
  return rows.dim(0);
}

// The CPU reference's gathered copy: rows [0, total) of `src` through `rows` (zeros past it).
absl::StatusOr<Buffer> GatherCopyCpu(const char* what, const char* name, const Tensor& src,
                                     const Tensor& rows, int64_t r, int64_t total) {
  SY_ASSIGN_OR_RETURN(Buffer out, Buffer::ForTensor(src.dtype, {r, src.dim(1)}, Device::Cpu()));
  SY_RETURN_IF_ERROR(FillBytes(out.View(), 0));
  const int64_t row_bytes = src.dim(1) * static_cast<int64_t>(DTypeSize(src.dtype));
  const int32_t* index = rows.as<int32_t>();
  for (int64_t p = 0; p < total; ++p) {
    if (index[p] < 0 || index[p] >= src.dim(0)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", name, "_rows[", p,
                                                     "] = ", index[p], " is outside [0, ",
                                                     src.dim(0), ") (the rows of ", name, ")"));
    }
    std::memcpy(static_cast<char*>(out.data()) + p * row_bytes,
                static_cast<const char*>(src.data) + index[p] * row_bytes, row_bytes);
  }
  return out;
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

bool GroupedGemm::GatherSupported(int64_t k, int64_t n) const {
  if (!device_.is_cuda()) return true;
  return path_ == GroupedGemmPath::kCutlassSm90 && internal::GatherGemmSm90Compiled() && k > 0 &&
         n > 0 && k % 128 == 0 && n % 128 == 0;
}

absl::Status GroupedGemm::FpropGathered(const Stream& stream, const Tensor& x_src,
                                        const Tensor& x_rows, const Tensor& w,
                                        const Tensor& tokens_per_group, const Tensor& y) {
  return RunGathered(GroupedGemmOp::kFprop, stream, x_src, x_rows, w, Tensor(), tokens_per_group, y,
                     false);
}

absl::Status GroupedGemm::DgradGathered(const Stream& stream, const Tensor& dy_src,
                                        const Tensor& dy_rows, const Tensor& w,
                                        const Tensor& tokens_per_group, const Tensor& dx) {
  return RunGathered(GroupedGemmOp::kDgrad, stream, dy_src, dy_rows, w, Tensor(), tokens_per_group,
                     dx, false);
}

absl::Status GroupedGemm::WgradGathered(const Stream& stream, const Tensor& x_src,
                                        const Tensor& x_rows, const Tensor& dy_src,
                                        const Tensor& dy_rows, const Tensor& tokens_per_group,
                                        const Tensor& dw, bool accumulate) {
  return RunGathered(GroupedGemmOp::kWgrad, stream, x_src, x_rows, dy_src, dy_rows,
                     tokens_per_group, dw, accumulate);
}

absl::Status GroupedGemm::RunGathered(GroupedGemmOp op, const Stream& stream, const Tensor& a_src,
                                      const Tensor& a_rows, const Tensor& b_src,
                                      const Tensor& b_rows, const Tensor& tokens_per_group,
                                      const Tensor& out, bool accumulate) {
  const char* what = op == GroupedGemmOp::kFprop   ? "GroupedGemm::FpropGathered"
                     : op == GroupedGemmOp::kDgrad ? "GroupedGemm::DgradGathered"
                                                   : "GroupedGemm::WgradGathered";
  SY_RETURN_IF_ERROR(CheckTokens(what, tokens_per_group));
  const int64_t g = tokens_per_group.dim(0);
  int64_t r = 0, k = 0, n = 0;
  const char* a_name = op == GroupedGemmOp::kDgrad ? "dy" : "x";
  if (op != GroupedGemmOp::kWgrad) {
    // Fprop: x [., K] -> y [R, N]; Dgrad: dy [., N] -> dx [R, K]; w [G, K, N] (b_src).
    const bool fprop = op == GroupedGemmOp::kFprop;
    SY_RETURN_IF_ERROR(CheckRank(what, "w", b_src, 3, "[G, K, N]"));
    SY_RETURN_IF_ERROR(CheckRank(what, fprop ? "y" : "dx", out, 2, fprop ? "[R, N]" : "[R, K]"));
    k = b_src.dim(1);
    n = b_src.dim(2);
    r = out.dim(0);
    SY_RETURN_IF_ERROR(CheckShape(what, "w", b_src, {g, k, n}, "[G, K, N]"));
    SY_RETURN_IF_ERROR(fprop ? CheckShape(what, "y", out, {r, n}, "[R, N]")
                             : CheckShape(what, "dx", out, {r, k}, "[R, K]"));
    SY_RETURN_IF_ERROR(GatheredRows(what, a_name, a_src, a_rows, r).status());
    if (a_src.dim(1) != (fprop ? k : n)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", a_name, " must have ",
                                                     fprop ? "K" : "N", " = ", fprop ? k : n,
                                                     " columns, got ", a_src.DebugString()));
    }
  } else {
    SY_RETURN_IF_ERROR(CheckRank(what, "dw", out, 3, "[G, K, N]"));
    k = out.dim(1);
    n = out.dim(2);
    SY_RETURN_IF_ERROR(CheckShape(what, "dw", out, {g, k, n}, "[G, K, N]"));
    SY_ASSIGN_OR_RETURN(r, GatheredRows(what, "x", a_src, a_rows, -1));
    SY_RETURN_IF_ERROR(GatheredRows(what, "dy", b_src, b_rows, r).status());
    if (a_src.dim(1) != k || b_src.dim(1) != n) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": x must have K = ", k, " and dy N = ", n, " columns, got ",
                       a_src.DebugString(), " and ", b_src.DebugString()));
    }
  }
  if (a_src.dtype != b_src.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": input dtypes differ: ", a_src.DebugString(), " vs ", b_src.DebugString()));
  }
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&a_src, &b_src, &tokens_per_group, &out}));
  for (const Tensor* rows : {&a_rows, &b_rows}) {
    if (rows->rank() != 0) SY_RETURN_IF_ERROR(CheckDevice(stream, {rows}));
  }
  // The checks every grouped GEMM call gets (stream, groups, sizes, dtypes).
  SY_RETURN_IF_ERROR(
      CheckCall(what, stream, MakeCall(op, a_src, b_src, out, tokens_per_group, r, k, n, g)));
  if (!device_.is_cuda()) {
    // The reference: the gathered copies, then the op on them.
    const int32_t* counts = tokens_per_group.as<int32_t>();
    int64_t total = 0;
    for (int64_t i = 0; i < g; ++i) total += std::max<int32_t>(counts[i], 0);
    total = std::min(total, r);
    Buffer a_copy, b_copy;
    Tensor a = a_src, b = b_src;
    if (a_rows.rank() != 0) {
      SY_ASSIGN_OR_RETURN(a_copy, GatherCopyCpu(what, a_name, a_src, a_rows, r, total));
      a = a_copy.View();
    }
    if (b_rows.rank() != 0) {
      SY_ASSIGN_OR_RETURN(b_copy, GatherCopyCpu(what, "dy", b_src, b_rows, r, total));
      b = b_copy.View();
    }
    const Stream cpu = Stream::Cpu();
    switch (op) {
      case GroupedGemmOp::kFprop:
        return Fprop(cpu, a, b, tokens_per_group, out);
      case GroupedGemmOp::kDgrad:
        return Dgrad(cpu, a, b, tokens_per_group, out);
      case GroupedGemmOp::kWgrad:
        return Wgrad(cpu, a, b, tokens_per_group, out, accumulate);
    }
    return absl::InternalError("unknown op");
  }
  if (!GatherSupported(k, n)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the gathered grouped GEMM needs the cutlass_sm90 path (this one is ",
        GroupedGemmPathName(path_), ") and K (", k, ") and N (", n, ") multiples of 128"));
  }
  if (op == GroupedGemmOp::kWgrad && out.dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the gathered Wgrad writes an f32 dw, got ", out.DebugString()));
  }
  if (g == 0) return absl::OkStatus();
  internal::GatherGemmCall call;
  call.op = op;
  call.a = a_src.data;
  call.a_index = a_rows.rank() != 0 ? a_rows.as<int32_t>() : nullptr;
  call.b = b_src.data;
  call.b_index = b_rows.rank() != 0 ? b_rows.as<int32_t>() : nullptr;
  call.out = out.data;
  call.out_dtype = out.dtype;
  call.tokens_per_group = tokens_per_group.as<int32_t>();
  call.rows = r;
  call.k = k;
  call.n = n;
  call.groups = static_cast<int>(g);
  call.accumulate = accumulate;
  call.cuda_stream = stream.cuda_stream;
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_.index));
  return Annotate(internal::RunGatherGemmSm90(call), what);
}

absl::Status GroupedGemm::Run(const char* what, const Stream& stream, GroupedGemmCall call) {
  SY_RETURN_IF_ERROR(CheckCall(what, stream, call));
  if (call.groups == 0) return absl::OkStatus();
  call.cuda_stream = stream.cuda_stream;
  call.tile = tile_;
  if (!device_.is_cuda()) return internal::GroupedGemmCpu(call);
  absl::Status status = cuda_path_->Run(call);
  if (!status.ok())
    return Annotate(status, absl::StrCat(what, " (", GroupedGemmPathName(path_), ")"));
  return absl::OkStatus();
}

absl::Status GroupedGemm::CheckCall(const char* what, const Stream& stream,
                                    const GroupedGemmCall& call) const {
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
  return absl::OkStatus();
}

}  // namespace switchyard::kernels
