// Validation, CPU reference and CUDA dispatch of the EP routing metadata ops (ep_routing.h).
#include "kernels/moe/ep_routing.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace switchyard::kernels {
namespace {

absl::Status Invalid(absl::string_view op, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", msg));
}

// f32 probabilities (f64 allowed on the CPU).
absl::Status CheckFloat(const Stream& stream, absl::string_view op, absl::string_view what,
                        const Tensor& t, std::initializer_list<int64_t> shape) {
  const DType want = t.dtype == DType::kF64 && !stream.is_cuda() ? DType::kF64 : DType::kF32;
  return Annotate(CheckTensor(t, what, want, shape), op);
}

template <typename P>
void RouteToRanksCpu(const int32_t* idx, const P* probs, int64_t t, int64_t k, int64_t local,
                     int64_t ep, int32_t* rank_idx, P* meta) {
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < ep; ++j) rank_idx[i * ep + j] = -1;
    for (int64_t s = 0; s < k; ++s) {
      const int32_t e = idx[i * k + s];
      if (e >= 0) rank_idx[i * ep + e / local] = static_cast<int32_t>(e / local);
      meta[i * 2 * k + s] = static_cast<P>(e);
      meta[i * 2 * k + k + s] = probs[i * k + s];
    }
  }
}

template <typename P>
void LocalizeRoutingCpu(const P* meta, int64_t r, int64_t k, int64_t first, int64_t local,
                        int32_t* local_idx, P* local_probs) {
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t s = 0; s < k; ++s) {
      const int64_t e = static_cast<int64_t>(meta[i * 2 * k + s]);
      local_idx[i * k + s] = e >= first && e < first + local ? static_cast<int32_t>(e - first) : -1;
      local_probs[i * k + s] = meta[i * 2 * k + k + s];
    }
  }
}

}  // namespace

absl::Status RouteToRanks(const Stream& stream, const Tensor& topk_idx, const Tensor& topk_probs,
                          int64_t num_experts, int64_t ep_size, const Tensor& rank_idx,
                          const Tensor& meta) {
  constexpr absl::string_view kOp = "RouteToRanks";
  SY_RETURN_IF_ERROR(
      Annotate(CheckDevice(stream, {&topk_idx, &topk_probs, &rank_idx, &meta}), kOp));
  if (ep_size <= 0 || num_experts <= 0 || num_experts % ep_size != 0) {
    return Invalid(kOp, absl::StrCat("num_experts (", num_experts,
                                     ") must be a positive multiple of ep_size (", ep_size, ")"));
  }
  SY_RETURN_IF_ERROR(Annotate(CheckTensor(topk_idx, "topk_idx", DType::kI32, {-1, -1}), kOp));
  const int64_t t = topk_idx.dim(0), k = topk_idx.dim(1);
  SY_RETURN_IF_ERROR(CheckFloat(stream, kOp, "topk_probs", topk_probs, {t, k}));
  SY_RETURN_IF_ERROR(Annotate(CheckTensor(rank_idx, "rank_idx", DType::kI32, {t, ep_size}), kOp));
  SY_RETURN_IF_ERROR(Annotate(CheckTensor(meta, "meta", topk_probs.dtype, {t, 2 * k}), kOp));
  if (t == 0) return absl::OkStatus();
  if (stream.is_cuda()) {
    return internal::RouteToRanksCuda(stream, topk_idx, topk_probs, num_experts, ep_size, rank_idx,
                                      meta);
  }
  const int32_t* idx = topk_idx.as<int32_t>();
  for (int64_t i = 0; i < t * k; ++i) {
    if (idx[i] < -1 || idx[i] >= num_experts) {
      return Invalid(kOp, absl::StrCat("topk_idx[", i / k, ", ", i % k, "] = ", idx[i],
                                       " is outside [-1, num_experts = ", num_experts, ")"));
    }
  }
  const int64_t local = num_experts / ep_size;
  if (topk_probs.dtype == DType::kF64) {
    RouteToRanksCpu(idx, topk_probs.as<double>(), t, k, local, ep_size, rank_idx.as<int32_t>(),
                    meta.as<double>());
  } else {
    RouteToRanksCpu(idx, topk_probs.as<float>(), t, k, local, ep_size, rank_idx.as<int32_t>(),
                    meta.as<float>());
  }
  return absl::OkStatus();
}

absl::Status LocalizeRouting(const Stream& stream, const Tensor& meta, int64_t first_expert,
                             int64_t num_local, const Tensor& local_idx,
                             const Tensor& local_probs) {
  constexpr absl::string_view kOp = "LocalizeRouting";
  SY_RETURN_IF_ERROR(Annotate(CheckDevice(stream, {&meta, &local_idx, &local_probs}), kOp));
  if (first_expert < 0 || num_local <= 0) {
    return Invalid(kOp, absl::StrCat("first_expert (", first_expert, ") must be >= 0 and ",
                                     "num_local (", num_local, ") > 0"));
  }
  SY_RETURN_IF_ERROR(CheckFloat(stream, kOp, "meta", meta, {-1, -1}));
  const int64_t r = meta.dim(0), k = meta.dim(1) / 2;
  if (meta.dim(1) % 2 != 0 || k == 0) {
    return Invalid(kOp, absl::StrCat("meta ", meta.DebugString(), " must be [R, 2k], k > 0"));
  }
  SY_RETURN_IF_ERROR(Annotate(CheckTensor(local_idx, "local_idx", DType::kI32, {r, k}), kOp));
  SY_RETURN_IF_ERROR(Annotate(CheckTensor(local_probs, "local_probs", meta.dtype, {r, k}), kOp));
  if (r == 0) return absl::OkStatus();
  if (stream.is_cuda()) {
    return internal::LocalizeRoutingCuda(stream, meta, first_expert, num_local, local_idx,
                                         local_probs);
  }
  if (meta.dtype == DType::kF64) {
    LocalizeRoutingCpu(meta.as<double>(), r, k, first_expert, num_local, local_idx.as<int32_t>(),
                       local_probs.as<double>());
  } else {
    LocalizeRoutingCpu(meta.as<float>(), r, k, first_expert, num_local, local_idx.as<int32_t>(),
                       local_probs.as<float>());
  }
  return absl::OkStatus();
}

}  // namespace switchyard::kernels
