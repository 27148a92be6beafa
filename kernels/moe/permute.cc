// Validation and CPU/CUDA dispatch of the permutation ops (permute.h).
#include "kernels/moe/permute.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace switchyard::kernels {
namespace {

absl::Status Invalid(absl::string_view op, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", msg));
}

// 2-D activations: bf16 or f32, plus f64 on the CPU.
absl::Status CheckRows(const Stream& stream, absl::string_view op, absl::string_view what,
                       const Tensor& t) {
  const bool ok_dtype = t.dtype == DType::kBF16 || t.dtype == DType::kF32 ||
                        (!stream.is_cuda() && t.dtype == DType::kF64);
  if (!ok_dtype || t.rank() != 2) {
    return Invalid(
        op, absl::StrCat(what, " must be 2-D bf16 or f32 (f64 on the CPU), got ", t.DebugString()));
  }
  if (t.numel() > 0 && t.data == nullptr) return Invalid(op, absl::StrCat(what, " has null data"));
  return absl::OkStatus();
}

// Probabilities: f32, plus f64 on the CPU; `shape` as in CheckTensor.
absl::Status CheckProbs(const Stream& stream, absl::string_view op, absl::string_view what,
                        const Tensor& t, std::initializer_list<int64_t> shape) {
  if (t.dtype == DType::kF64 && stream.is_cuda()) {
    return Invalid(op, absl::StrCat(what, " must be f32 on CUDA, got ", t.DebugString()));
  }
  return Annotate(CheckTensor(t, what, t.dtype == DType::kF64 ? DType::kF64 : DType::kF32, shape),
                  op);
}

absl::Status CheckRowMap(absl::string_view op, const Tensor& row_map, int64_t num_tokens,
                         int64_t max_rows) {
  SY_RETURN_IF_ERROR(Annotate(CheckTensor(row_map, "row_map", DType::kI32, {num_tokens, -1}), op));
  if (max_rows > std::numeric_limits<int32_t>::max()) {
    return Invalid(op, absl::StrCat("max_rows (", max_rows, ") must fit in int32 (row_map)"));
  }
  return absl::OkStatus();
}

// The outputs Permute and PermuteIndex share: permuted_probs [max_rows] (the probs' dtype),
// row_map [T, k] i32 (its values checked on the CPU), tokens_per_expert [E] i32.
absl::Status CheckPermuteOutputs(absl::string_view op, const Tensor& permuted_probs,
                                 DType probs_dtype, const Tensor& row_map,
                                 const Tensor& tokens_per_expert, int64_t t, int64_t k,
                                 int64_t max_rows, int64_t num_experts) {
  SY_RETURN_IF_ERROR(
      Annotate(CheckTensor(permuted_probs, "permuted_probs", probs_dtype, {max_rows}), op));
  SY_RETURN_IF_ERROR(Annotate(CheckTensor(row_map, "row_map", DType::kI32, {t, k}), op));
  SY_RETURN_IF_ERROR(CheckRowMap(op, row_map, t, max_rows));
  return Annotate(CheckTensor(tokens_per_expert, "tokens_per_expert", DType::kI32, {num_experts}),
                  op);
}

// Permute's and PermuteIndex's CUDA workspace: on the stream's device, PermuteWorkspaceBytes.
absl::Status CheckWorkspace(const Stream& stream, absl::string_view op, const Tensor& workspace,
                            int64_t num_tokens, int64_t num_experts) {
  SY_RETURN_IF_ERROR(Annotate(CheckDevice(stream, {&workspace}), absl::StrCat(op, " workspace")));
  const int64_t ws_bytes = PermuteWorkspaceBytes(num_tokens, num_experts);
  if (static_cast<int64_t>(workspace.bytes()) < ws_bytes || workspace.data == nullptr) {
    return Invalid(op,
                   absl::StrCat("workspace ", workspace.DebugString(), " has ", workspace.bytes(),
                                " bytes; needs PermuteWorkspaceBytes = ", ws_bytes));
  }
  return absl::OkStatus();
}

absl::Status CheckExperts(const Stream& stream, absl::string_view op, int64_t num_experts) {
  if (num_experts <= 0)
    return Invalid(op, absl::StrCat("num_experts (", num_experts, ") must be > 0"));
  if (stream.is_cuda() && num_experts > kMaxExpertsCuda) {
    return Invalid(op, absl::StrCat("num_experts (", num_experts, ") must be <= ", kMaxExpertsCuda,
                                    " on CUDA"));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t PermuteWorkspaceBytes(int64_t num_tokens, int64_t num_experts) {
  const int64_t chunks =
      (num_tokens + internal::kPermuteChunkTokens - 1) / internal::kPermuteChunkTokens;
  return (chunks + 1) * num_experts * static_cast<int64_t>(sizeof(int32_t));
}

absl::Status TokensPerExpert(const Stream& stream, const Tensor& topk_idx, int64_t num_experts,
                             const Tensor& counts) {
  constexpr absl::string_view kOp = "TokensPerExpert";
  SY_RETURN_IF_ERROR(Annotate(CheckDevice(stream, {&topk_idx, &counts}), kOp));
  SY_RETURN_IF_ERROR(CheckExperts(stream, kOp, num_experts));
  SY_RETURN_IF_ERROR(Annotate(CheckTensor(topk_idx, "topk_idx", DType::kI32, {-1, -1}), kOp));
  SY_RETURN_IF_ERROR(Annotate(CheckTensor(counts, "counts", DType::kI32, {num_experts}), kOp));
  if (stream.is_cuda()) return internal::TokensPerExpertCuda(stream, topk_idx, num_experts, counts);
  return internal::TokensPerExpertCpu(topk_idx, num_experts, counts);
}

absl::Status Permute(const Stream& stream, const Tensor& x, const Tensor& topk_idx,
                     const Tensor& topk_probs, int64_t num_experts, int64_t pad_to_capacity,
                     const Tensor& permuted_x, const Tensor& permuted_probs, const Tensor& row_map,
                     const Tensor& tokens_per_expert, const Tensor& workspace,
                     int64_t max_routed_rows) {
  constexpr absl::string_view kOp = "Permute";
  SY_RETURN_IF_ERROR(Annotate(CheckDevice(stream, {&x, &topk_idx, &topk_probs, &permuted_x,
                                                   &permuted_probs, &row_map, &tokens_per_expert}),
                              kOp));
  SY_RETURN_IF_ERROR(CheckExperts(stream, kOp, num_experts));
  SY_RETURN_IF_ERROR(CheckRows(stream, kOp, "x", x));
  const int64_t t = x.dim(0), h = x.dim(1);
  SY_RETURN_IF_ERROR(Annotate(CheckTensor(topk_idx, "topk_idx", DType::kI32, {t, -1}), kOp));
  const int64_t k = topk_idx.dim(1);
  if (k <= 0) return Invalid(kOp, absl::StrCat("topk_idx must have k > 0 slots, got ", k));
  SY_RETURN_IF_ERROR(CheckProbs(stream, kOp, "topk_probs", topk_probs, {t, k}));
  SY_RETURN_IF_ERROR(CheckRows(stream, kOp, "permuted_x", permuted_x));
  const int64_t max_rows = permuted_x.dim(0);
  if (permuted_x.dtype != x.dtype || permuted_x.dim(1) != h) {
    return Invalid(kOp,
                   absl::StrCat("permuted_x ", permuted_x.DebugString(),
                                " must have x's dtype and hidden size (x ", x.DebugString(), ")"));
  }
  SY_RETURN_IF_ERROR(CheckPermuteOutputs(kOp, permuted_probs, topk_probs.dtype, row_map,
                                         tokens_per_expert, t, k, max_rows, num_experts));
  if (pad_to_capacity < 0) {
    return Invalid(kOp, absl::StrCat("pad_to_capacity (", pad_to_capacity, ") must be >= 0"));
  }
  if (max_routed_rows < 0 || (max_routed_rows > 0 && pad_to_capacity > 0)) {
    return Invalid(kOp, absl::StrCat("max_routed_rows (", max_routed_rows,
                                     ") must be >= 0, and 0 with pad_to_capacity"));
  }
  const int64_t needed_rows = pad_to_capacity > 0   ? num_experts * pad_to_capacity
                              : max_routed_rows > 0 ? max_routed_rows
                                                    : t * k;
  if (max_rows < needed_rows) {
    return Invalid(kOp, absl::StrCat("permuted_x has ", max_rows, " rows; needs >= ", needed_rows,
                                     pad_to_capacity > 0   ? " (num_experts * pad_to_capacity)"
                                     : max_routed_rows > 0 ? " (max_routed_rows)"
                                                           : " (T * k)"));
  }
  if (!stream.is_cuda()) {
    return internal::PermuteCpu(x, topk_idx, topk_probs, num_experts, pad_to_capacity, max_rows,
                                permuted_x, permuted_probs, row_map, Tensor(), tokens_per_expert);
  }
  SY_RETURN_IF_ERROR(CheckWorkspace(stream, kOp, workspace, t, num_experts));
  return internal::PermuteCuda(stream, x, topk_idx, topk_probs, num_experts, pad_to_capacity,
                               max_rows, permuted_x, permuted_probs, row_map, Tensor(),
                               tokens_per_expert, workspace);
}

absl::Status PermuteIndex(const Stream& stream, const Tensor& topk_idx, const Tensor& topk_probs,
                          int64_t num_experts, const Tensor& permuted_probs, const Tensor& row_map,
                          const Tensor& source_rows, const Tensor& tokens_per_expert,
                          const Tensor& workspace, int64_t max_routed_rows) {
  constexpr absl::string_view kOp = "PermuteIndex";
  SY_RETURN_IF_ERROR(Annotate(CheckDevice(stream, {&topk_idx, &topk_probs, &permuted_probs,
                                                   &row_map, &source_rows, &tokens_per_expert}),
                              kOp));
  SY_RETURN_IF_ERROR(CheckExperts(stream, kOp, num_experts));
  SY_RETURN_IF_ERROR(Annotate(CheckTensor(topk_idx, "topk_idx", DType::kI32, {-1, -1}), kOp));
  const int64_t t = topk_idx.dim(0), k = topk_idx.dim(1);
  if (k <= 0) return Invalid(kOp, absl::StrCat("topk_idx must have k > 0 slots, got ", k));
  SY_RETURN_IF_ERROR(CheckProbs(stream, kOp, "topk_probs", topk_probs, {t, k}));
  SY_RETURN_IF_ERROR(Annotate(CheckTensor(source_rows, "source_rows", DType::kI32, {-1}), kOp));
  const int64_t max_rows = source_rows.dim(0);
  SY_RETURN_IF_ERROR(CheckPermuteOutputs(kOp, permuted_probs, topk_probs.dtype, row_map,
                                         tokens_per_expert, t, k, max_rows, num_experts));
  if (max_routed_rows < 0) {
    return Invalid(kOp, absl::StrCat("max_routed_rows (", max_routed_rows, ") must be >= 0"));
  }
  const int64_t needed_rows = max_routed_rows > 0 ? max_routed_rows : t * k;
  if (max_rows < needed_rows) {
    return Invalid(kOp, absl::StrCat("source_rows has ", max_rows, " rows; needs >= ", needed_rows,
                                     max_routed_rows > 0 ? " (max_routed_rows)" : " (T * k)"));
  }
  const Tensor no_rows(DType::kBF16, {max_rows, 0}, topk_idx.device, nullptr);
  if (!stream.is_cuda()) {
    return internal::PermuteCpu(no_rows, topk_idx, topk_probs, num_experts, 0, max_rows, no_rows,
                                permuted_probs, row_map, source_rows, tokens_per_expert);
  }
  SY_RETURN_IF_ERROR(CheckWorkspace(stream, kOp, workspace, t, num_experts));
  return internal::PermuteCuda(stream, no_rows, topk_idx, topk_probs, num_experts, 0, max_rows,
                               no_rows, permuted_probs, row_map, source_rows, tokens_per_expert,
                               workspace);
}

absl::Status Unpermute(const Stream& stream, const Tensor& y, const Tensor& row_map,
                       const Tensor& out) {
  constexpr absl::string_view kOp = "Unpermute";
  SY_RETURN_IF_ERROR(Annotate(CheckDevice(stream, {&y, &row_map, &out}), kOp));
  SY_RETURN_IF_ERROR(CheckRows(stream, kOp, "y", y));
  SY_RETURN_IF_ERROR(CheckRows(stream, kOp, "out", out));
  if (out.dtype != y.dtype || out.dim(1) != y.dim(1)) {
    return Invalid(kOp, absl::StrCat("out ", out.DebugString(), " must have y's dtype and hidden ",
                                     "size (y ", y.DebugString(), ")"));
  }
  SY_RETURN_IF_ERROR(CheckRowMap(kOp, row_map, out.dim(0), y.dim(0)));
  if (stream.is_cuda()) return internal::GatherSumCuda(stream, y, Tensor(), row_map, out, Tensor());
  return internal::GatherSumCpu(y, Tensor(), row_map, out, Tensor());
}

absl::Status PermuteBackward(const Stream& stream, const Tensor& d_permuted_x,
                             const Tensor& d_permuted_probs, const Tensor& row_map,
                             const Tensor& dx, const Tensor& d_topk_probs) {
  constexpr absl::string_view kOp = "PermuteBackward";
  SY_RETURN_IF_ERROR(Annotate(
      CheckDevice(stream, {&d_permuted_x, &d_permuted_probs, &row_map, &dx, &d_topk_probs}), kOp));
  SY_RETURN_IF_ERROR(CheckRows(stream, kOp, "d_permuted_x", d_permuted_x));
  SY_RETURN_IF_ERROR(CheckRows(stream, kOp, "dx", dx));
  if (dx.dtype != d_permuted_x.dtype || dx.dim(1) != d_permuted_x.dim(1)) {
    return Invalid(kOp, absl::StrCat("dx ", dx.DebugString(), " must have d_permuted_x's dtype ",
                                     "and hidden size (", d_permuted_x.DebugString(), ")"));
  }
  const int64_t max_rows = d_permuted_x.dim(0);
  SY_RETURN_IF_ERROR(CheckRowMap(kOp, row_map, dx.dim(0), max_rows));
  SY_RETURN_IF_ERROR(CheckProbs(stream, kOp, "d_permuted_probs", d_permuted_probs, {max_rows}));
  SY_RETURN_IF_ERROR(Annotate(CheckTensor(d_topk_probs, "d_topk_probs", d_permuted_probs.dtype,
                                          {dx.dim(0), row_map.dim(1)}),
                              kOp));
  if (stream.is_cuda()) {
    return internal::GatherSumCuda(stream, d_permuted_x, d_permuted_probs, row_map, dx,
                                   d_topk_probs);
  }
  return internal::GatherSumCpu(d_permuted_x, d_permuted_probs, row_map, dx, d_topk_probs);
}

absl::Status UnpermuteBackward(const Stream& stream, const Tensor& dout, const Tensor& row_map,
                               const Tensor& dy, bool zero_unmapped_rows) {
  constexpr absl::string_view kOp = "UnpermuteBackward";
  SY_RETURN_IF_ERROR(Annotate(CheckDevice(stream, {&dout, &row_map, &dy}), kOp));
  SY_RETURN_IF_ERROR(CheckRows(stream, kOp, "dout", dout));
  SY_RETURN_IF_ERROR(CheckRows(stream, kOp, "dy", dy));
  if (dy.dtype != dout.dtype || dy.dim(1) != dout.dim(1)) {
    return Invalid(kOp, absl::StrCat("dy ", dy.DebugString(), " must have dout's dtype and hidden ",
                                     "size (dout ", dout.DebugString(), ")"));
  }
  SY_RETURN_IF_ERROR(CheckRowMap(kOp, row_map, dout.dim(0), dy.dim(0)));
  if (stream.is_cuda())
    return internal::ScatterRowsCuda(stream, dout, row_map, dy, zero_unmapped_rows);
  return internal::ScatterRowsCpu(dout, row_map, dy, zero_unmapped_rows);
}

}  // namespace switchyard::kernels
