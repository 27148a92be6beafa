// Validation, CPU reference and CUDA dispatch of the chunk sort (sort_chunks.h).
#include "kernels/moe/sort_chunks.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace switchyard::kernels {
namespace {

absl::Status Invalid(absl::string_view op, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", msg));
}

bool Overlap(const Tensor& x, const Tensor& y) {
  const char* a = static_cast<const char*>(x.data);
  const char* b = static_cast<const char*>(y.data);
  return a < b + y.bytes() && b < a + x.bytes();
}

bool IsRowDType(DType d) { return d == DType::kBF16 || d == DType::kF32 || d == DType::kF64; }

absl::Status Validate(const Stream& stream, absl::string_view op, const Tensor& input,
                      const Tensor& split_sizes, absl::Span<const int32_t> sorted_order,
                      const Tensor& output, const Tensor& probs, const Tensor& probs_out) {
  SY_RETURN_IF_ERROR(Annotate(CheckDevice(stream, {&input}), absl::StrCat(op, " input")));
  SY_RETURN_IF_ERROR(Annotate(CheckDevice(stream, {&output}), absl::StrCat(op, " output")));
  SY_RETURN_IF_ERROR(
      Annotate(CheckDevice(stream, {&split_sizes}), absl::StrCat(op, " split_sizes")));
  if (!IsRowDType(input.dtype) || input.rank() != 2) {
    return Invalid(op,
                   absl::StrCat("input must be 2-D bf16, f32 or f64, got ", input.DebugString()));
  }
  const int64_t n = input.dim(0), h = input.dim(1);
  if (n > std::numeric_limits<int32_t>::max()) {
    return Invalid(op, absl::StrCat("input has ", n, " rows; must be < 2^31"));
  }
  SY_RETURN_IF_ERROR(Annotate(CheckTensor(output, "output", input.dtype, {n, h}), op));
  if (input.numel() > 0 && (input.data == nullptr || output.data == nullptr)) {
    return Invalid(op, "input and output must have non-null data");
  }
  if (input.numel() > 0 && Overlap(input, output)) {
    return Invalid(op, "output must not overlap input (the op is out of place)");
  }
  const int64_t c = static_cast<int64_t>(sorted_order.size());
  if (c < 1 || c > kMaxSortChunks) {
    return Invalid(
        op, absl::StrCat("sorted_order has ", c, " chunks; must be in [1, ", kMaxSortChunks, "]"));
  }
  SY_RETURN_IF_ERROR(Annotate(CheckTensor(split_sizes, "split_sizes", DType::kI32, {c}), op));
  if (split_sizes.data == nullptr) return Invalid(op, "split_sizes has null data");
  std::vector<bool> seen(c, false);
  for (int64_t i = 0; i < c; ++i) {
    const int32_t v = sorted_order[i];
    if (v < 0 || v >= c || seen[v]) {
      return Invalid(op, absl::StrCat("sorted_order must be a permutation of [0, ", c, "); entry ",
                                      i, " is ", v, v >= 0 && v < c ? " (repeated)" : "", " in [",
                                      absl::StrJoin(sorted_order, ","), "]"));
    }
    seen[v] = true;
  }
  const bool has_probs = probs.data != nullptr || !probs.shape.empty();
  const bool has_probs_out = probs_out.data != nullptr || !probs_out.shape.empty();
  if (has_probs != has_probs_out) {
    return Invalid(op, absl::StrCat("probs ", probs.DebugString(), " and probs_out ",
                                    probs_out.DebugString(), " must be both given or both empty"));
  }
  if (has_probs) {
    SY_RETURN_IF_ERROR(Annotate(CheckDevice(stream, {&probs}), absl::StrCat(op, " probs")));
    SY_RETURN_IF_ERROR(Annotate(CheckDevice(stream, {&probs_out}), absl::StrCat(op, " probs_out")));
    if (probs.dtype != DType::kF32 && (stream.is_cuda() || probs.dtype != DType::kF64)) {
      return Invalid(op,
                     absl::StrCat("probs must be f32 (f64 on the CPU), got ", probs.DebugString()));
    }
    SY_RETURN_IF_ERROR(Annotate(CheckTensor(probs, "probs", probs.dtype, {n}), op));
    SY_RETURN_IF_ERROR(Annotate(CheckTensor(probs_out, "probs_out", probs.dtype, {n}), op));
    if (n > 0 && (probs.data == nullptr || probs_out.data == nullptr)) {
      return Invalid(op, "probs and probs_out must have non-null data");
    }
    if (n > 0 && Overlap(probs, probs_out)) {
      return Invalid(op, "probs_out must not overlap probs (the op is out of place)");
    }
  }
  return absl::OkStatus();
}

absl::Status Run(const Stream& stream, absl::string_view op, bool inverse, const Tensor& input,
                 const Tensor& split_sizes, absl::Span<const int32_t> sorted_order,
                 const Tensor& output, const Tensor& probs, const Tensor& probs_out,
                 const Tensor& workspace) {
  SY_RETURN_IF_ERROR(
      Validate(stream, op, input, split_sizes, sorted_order, output, probs, probs_out));
  if (!stream.is_cuda()) {
    return Annotate(internal::SortChunksCpu(input, split_sizes, sorted_order, inverse, output,
                                            probs, probs_out),
                    op);
  }
  SY_RETURN_IF_ERROR(Annotate(CheckDevice(stream, {&workspace}), absl::StrCat(op, " workspace")));
  const int64_t need = SortChunksWorkspaceBytes(static_cast<int64_t>(sorted_order.size()));
  if (workspace.data == nullptr || static_cast<int64_t>(workspace.bytes()) < need ||
      reinterpret_cast<uintptr_t>(workspace.data) % 8 != 0) {
    return Invalid(
        op, absl::StrCat("workspace ", workspace.DebugString(), " has ", workspace.bytes(),
                         " bytes; needs SortChunksWorkspaceBytes = ", need, ", 8-byte aligned"));
  }
  return internal::SortChunksCuda(stream, input, split_sizes, sorted_order, inverse, output, probs,
                                  probs_out, workspace);
}

}  // namespace

absl::StatusOr<ChunkOrder> LocalExpertChunkOrder(int64_t num_sources, int64_t num_local_experts) {
  if (num_sources < 1 || num_local_experts < 1 ||
      num_sources > std::numeric_limits<int32_t>::max() / num_local_experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LocalExpertChunkOrder: num_sources (", num_sources, ") and num_local_experts (",
        num_local_experts, ") must be >= 1 with a product that fits int32"));
  }
  const int32_t s = static_cast<int32_t>(num_sources), l = static_cast<int32_t>(num_local_experts);
  ChunkOrder o{std::vector<int32_t>(s * l), std::vector<int32_t>(s * l)};
  for (int32_t r = 0; r < s; ++r) {
    for (int32_t e = 0; e < l; ++e) {
      o.sort[e * s + r] = r * l + e;
      o.restore[r * l + e] = e * s + r;
    }
  }
  return o;
}

int64_t SortChunksWorkspaceBytes(int64_t num_chunks) {
  return (2 * num_chunks + 1) * static_cast<int64_t>(sizeof(int64_t));
}

absl::Status SortChunks(const Stream& stream, const Tensor& input, const Tensor& split_sizes,
                        absl::Span<const int32_t> sorted_order, const Tensor& output,
                        const Tensor& probs, const Tensor& probs_out, const Tensor& workspace) {
  return Run(stream, "SortChunks", /*inverse=*/false, input, split_sizes, sorted_order, output,
             probs, probs_out, workspace);
}

absl::Status UnsortChunks(const Stream& stream, const Tensor& input, const Tensor& split_sizes,
                          absl::Span<const int32_t> sorted_order, const Tensor& output,
                          const Tensor& probs, const Tensor& probs_out, const Tensor& workspace) {
  return Run(stream, "UnsortChunks", /*inverse=*/true, input, split_sizes, sorted_order, output,
             probs, probs_out, workspace);
}

namespace internal {

absl::Status SortChunksCpu(const Tensor& input, const Tensor& split_sizes,
                           absl::Span<const int32_t> sorted_order, bool inverse,
                           const Tensor& output, const Tensor& probs, const Tensor& probs_out) {
  const int64_t n = input.dim(0), c = static_cast<int64_t>(sorted_order.size());
  const int32_t* sizes = split_sizes.as<int32_t>();
  // orig_start[j]: first row of chunk j in the input (forward) order; sorted_start[j]: first row
  // of chunk j once sorted.
  std::vector<int64_t> orig_start(c), sorted_start(c);
  int64_t total = 0;
  for (int64_t j = 0; j < c; ++j) {
    if (sizes[j] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("split_sizes[", j, "] is ", sizes[j], "; must be >= 0"));
    }
    orig_start[j] = total;
    total += sizes[j];
  }
  if (total > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("split_sizes sum to ", total, "; must be <= the ", n, " input rows"));
  }
  int64_t pos = 0;
  for (int64_t i = 0; i < c; ++i) {
    sorted_start[sorted_order[i]] = pos;
    pos += sizes[sorted_order[i]];
  }
  const size_t row_bytes = static_cast<size_t>(input.dim(1)) * DTypeSize(input.dtype);
  const size_t prob_bytes = probs.data != nullptr ? DTypeSize(probs.dtype) : 0;
  const char* in = static_cast<const char*>(input.data);
  char* out = static_cast<char*>(output.data);
  for (int64_t j = 0; j < c; ++j) {
    const int64_t src = inverse ? sorted_start[j] : orig_start[j];
    const int64_t dst = inverse ? orig_start[j] : sorted_start[j];
    if (sizes[j] == 0) continue;
    if (row_bytes > 0)
      std::memcpy(out + dst * row_bytes, in + src * row_bytes, sizes[j] * row_bytes);
    if (prob_bytes > 0) {
      std::memcpy(static_cast<char*>(probs_out.data) + dst * prob_bytes,
                  static_cast<const char*>(probs.data) + src * prob_bytes, sizes[j] * prob_bytes);
    }
  }
  return absl::OkStatus();
}

}  // namespace internal

}  // namespace switchyard::kernels
