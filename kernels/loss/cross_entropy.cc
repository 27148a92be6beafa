// Validation, chunking and the CPU reference of the fused LM-head cross-entropy. The CUDA path
// (also here) sequences Gemm and the row kernels of cross_entropy.cu per chunk.
#include "kernels/loss/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/gemm/gemm.h"

namespace switchyard::kernels {
namespace {

bool IsFloat(DType d) { return d == DType::kF32 || d == DType::kF64 || d == DType::kBF16; }

// A [rows, cols] view of `t` starting at row `row0`.
Tensor Rows(const Tensor& t, int64_t row0, int64_t rows) {
  const int64_t cols = t.rank() == 2 ? t.dim(1) : 1;
  std::vector<int64_t> shape =
      t.rank() == 2 ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{rows};
  return Tensor(t.dtype, std::move(shape), t.device,
                static_cast<char*>(t.data) + row0 * cols * DTypeSize(t.dtype));
}

inline double ToD(float x) { return x; }
inline double ToD(double x) { return x; }
inline double ToD(BF16 x) { return x.ToFloat(); }

// z[r, v] = h[t0 + r] · w[v] in fp64 for one chunk.
template <typename T>
void ChunkLogits(const Tensor& h, const Tensor& w, int64_t t0, int64_t rows, double* z) {
  const int64_t h_n = h.dim(1), v_n = w.dim(0);
  const T* hp = h.as<T>();
  const T* wp = w.as<T>();
  std::vector<double> hrow(h_n);
  // Four vocabulary rows at a time: four independent accumulation chains (each logit still sums
  // k in ascending order, so the result is the plain dot product's, only faster).
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < h_n; ++k) hrow[k] = ToD(hp[(t0 + r) * h_n + k]);
    int64_t v = 0;
    for (; v + 4 <= v_n; v += 4) {
      const T* w0 = wp + v * h_n;
      const T* w1 = w0 + h_n;
      const T* w2 = w1 + h_n;
      const T* w3 = w2 + h_n;
      double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      for (int64_t k = 0; k < h_n; ++k) {
        const double x = hrow[k];
        a0 += x * ToD(w0[k]);
        a1 += x * ToD(w1[k]);
        a2 += x * ToD(w2[k]);
        a3 += x * ToD(w3[k]);
      }
      z[r * v_n + v] = a0;
      z[r * v_n + v + 1] = a1;
      z[r * v_n + v + 2] = a2;
      z[r * v_n + v + 3] = a3;
    }
    for (; v < v_n; ++v) {
      const T* wv = wp + v * h_n;
      double acc = 0;
      for (int64_t k = 0; k < h_n; ++k) acc += hrow[k] * ToD(wv[k]);
      z[r * v_n + v] = acc;
    }
  }
}

void Logits(const Tensor& h, const Tensor& w, int64_t t0, int64_t rows, double* z) {
  switch (h.dtype) {
    case DType::kF32:
      return ChunkLogits<float>(h, w, t0, rows, z);
    case DType::kF64:
      return ChunkLogits<double>(h, w, t0, rows, z);
    default:
      return ChunkLogits<BF16>(h, w, t0, rows, z);
  }
}

// dh[t0 + r] = g[r] · w and dw += gᵀ · h_chunk for one chunk of g [rows, V] (fp64). dw is rounded
// to its dtype once per chunk, as the CUDA path's beta = 1 Gemm does.
template <typename T>
void GradChunkT(const Tensor& h, const Tensor& w, const double* g, int64_t t0, int64_t rows,
                const Tensor& dh, const Tensor& dw) {
  const int64_t h_n = h.dim(1), v_n = w.dim(0);
  const T* hp = h.as<T>() + t0 * h_n;
  const T* wp = w.as<T>();
  std::vector<double> acc(h_n), hc(rows * h_n);
  for (int64_t i = 0; i < rows * h_n; ++i) hc[i] = ToD(hp[i]);
  for (int64_t r = 0; r < rows; ++r) {
    std::fill(acc.begin(), acc.end(), 0.0);
    const double* gr = g + r * v_n;
    for (int64_t v = 0; v < v_n; ++v) {
      if (gr[v] == 0.0) continue;
      const T* wv = wp + v * h_n;
      for (int64_t k = 0; k < h_n; ++k) acc[k] += gr[v] * ToD(wv[k]);
    }
    for (int64_t k = 0; k < h_n; ++k) StoreFromDouble(dh, (t0 + r) * h_n + k, acc[k]);
  }
  for (int64_t v = 0; v < v_n; ++v) {
    std::fill(acc.begin(), acc.end(), 0.0);
    bool any = false;
    for (int64_t r = 0; r < rows; ++r) {
      const double gv = g[r * v_n + v];
      if (gv == 0.0) continue;
      any = true;
      const double* hr = hc.data() + r * h_n;
      for (int64_t k = 0; k < h_n; ++k) acc[k] += gv * hr[k];
    }
    if (!any) continue;
    for (int64_t k = 0; k < h_n; ++k) {
      StoreFromDouble(dw, v * h_n + k, LoadAsDouble(dw, v * h_n + k) + acc[k]);
    }
  }
}

// The CPU reference's gradient of a chunk's logits: z [rows, V] (tokens t0.., of the vocabulary
// slice starting at `start`) becomes g = dloss * (softmax - onehot(target - start)) from the
// tokens' lse; rows of ignored tokens become zeros.
void SoftmaxGradRows(double* z, int64_t rows, int64_t v_n, const int32_t* targets,
                     const Tensor& lse, int64_t t0, int64_t start, float dloss) {
  for (int64_t r = 0; r < rows; ++r) {
    double* zr = z + r * v_n;
    const int32_t target = targets[t0 + r];
    const int64_t local = static_cast<int64_t>(target) - start;
    const double row_lse = LoadAsDouble(lse, t0 + r);
    for (int64_t v = 0; v < v_n; ++v) {
      zr[v] = target == kIgnoreTarget
                  ? 0.0
                  : dloss * (std::exp(zr[v] - row_lse) - (v == local ? 1.0 : 0.0));
    }
  }
}

void GradChunk(const Tensor& h, const Tensor& w, const double* g, int64_t t0, int64_t rows,
               const Tensor& dh, const Tensor& dw) {
  switch (h.dtype) {
    case DType::kF32:
      return GradChunkT<float>(h, w, g, t0, rows, dh, dw);
    case DType::kF64:
      return GradChunkT<double>(h, w, g, t0, rows, dh, dw);
    default:
      return GradChunkT<BF16>(h, w, g, t0, rows, dh, dw);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<FusedLinearCrossEntropy>> FusedLinearCrossEntropy::Create(
    Device device, int64_t max_tokens, int64_t hidden, int64_t vocab, int64_t chunk_tokens) {
  if (max_tokens <= 0 || hidden <= 0 || vocab <= 0 || chunk_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FusedLinearCrossEntropy::Create: max_tokens, hidden, vocab and chunk_tokens must be > 0, "
        "got ",
        max_tokens, ", ", hidden, ", ", vocab, ", ", chunk_tokens));
  }
  if (vocab > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("FusedLinearCrossEntropy::Create: vocab ", vocab, " exceeds int32 targets"));
  }
  const int64_t chunk = std::min(chunk_tokens, max_tokens);
  std::unique_ptr<FusedLinearCrossEntropy> plan(
      new FusedLinearCrossEntropy(device, max_tokens, hidden, vocab, chunk));
  if (device.is_cuda()) {
    SY_ASSIGN_OR_RETURN(plan->logits_, Buffer::ForTensor(DType::kF32, {chunk, vocab}, device));
    SY_ASSIGN_OR_RETURN(plan->grad_bf16_, Buffer::ForTensor(DType::kBF16, {chunk, vocab}, device));
    SY_ASSIGN_OR_RETURN(plan->row_loss_, Buffer::ForTensor(DType::kF32, {max_tokens}, device));
    SY_ASSIGN_OR_RETURN(plan->vp_stats_, Buffer::ForTensor(DType::kF32, {3 * chunk}, device));
    plan->fused_rows_ = internal::CrossEntropyGradRowsFits(device.index, vocab);
  } else {
    SY_ASSIGN_OR_RETURN(plan->logits_, Buffer::ForTensor(DType::kF64, {chunk, vocab}, device));
    SY_ASSIGN_OR_RETURN(plan->vp_stats_, Buffer::ForTensor(DType::kF64, {3 * chunk}, device));
  }
  return plan;
}

absl::Status FusedLinearCrossEntropy::Check(const Stream& stream, const Tensor& h, const Tensor& w,
                                            const Tensor& targets, const Tensor& lse,
                                            absl::string_view op, int64_t target_vocab) const {
  if (target_vocab < 0) target_vocab = vocab_;
  if (stream.device != device_) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": plan was created for ",
                                                   device_.ToString(), ", stream is on ",
                                                   stream.device.ToString()));
  }
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&h, &w, &targets, &lse}));
  if (!IsFloat(h.dtype) || (stream.is_cuda() && h.dtype == DType::kF64) || w.dtype != h.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": h and w must share one dtype (bf16, f32; f64 on the CPU), got h ",
                     h.DebugString(), ", w ", w.DebugString()));
  }
  if (h.rank() != 2 || h.dim(1) != hidden_ || h.dim(0) > max_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": h must be [T <= ", max_tokens_, ", ",
                                                   hidden_, "], got ", h.DebugString()));
  }
  SY_RETURN_IF_ERROR(CheckTensor(w, absl::StrCat(op, ".w"), w.dtype, {vocab_, hidden_}));
  const int64_t t_n = h.dim(0);
  SY_RETURN_IF_ERROR(CheckTensor(targets, absl::StrCat(op, ".targets"), DType::kI32, {t_n}));
  if (lse.dtype != DType::kF32 && (stream.is_cuda() || lse.dtype != DType::kF64)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": lse must be f32 (or f64 on the CPU), got ", lse.DebugString()));
  }
  SY_RETURN_IF_ERROR(CheckTensor(lse, absl::StrCat(op, ".lse"), lse.dtype, {t_n}));
  if (!stream.is_cuda()) {
    const int32_t* tg = targets.as<int32_t>();
    for (int64_t t = 0; t < t_n; ++t) {
      if (tg[t] != kIgnoreTarget && (tg[t] < 0 || tg[t] >= target_vocab)) {
        return absl::InvalidArgumentError(absl::StrCat(
            op, ": targets[", t, "] = ", tg[t], " is outside [0, ", target_vocab, ") and not -1"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status FusedLinearCrossEntropy::CheckLossOutputs(const Stream& stream, const Tensor& loss_sum,
                                                       const Tensor& num_valid, const Tensor& lse,
                                                       absl::string_view op) const {
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&loss_sum, &num_valid}));
  SY_RETURN_IF_ERROR(CheckTensor(loss_sum, absl::StrCat(op, ".loss_sum"), lse.dtype, {1}));
  return CheckTensor(num_valid, absl::StrCat(op, ".num_valid"), DType::kI32, {1});
}

absl::Status FusedLinearCrossEntropy::CheckGradOutputs(const Stream& stream, const Tensor& h,
                                                       const Tensor& w, const Tensor& dh,
                                                       const Tensor& dw,
                                                       absl::string_view op) const {
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&dh, &dw}));
  SY_RETURN_IF_ERROR(CheckTensor(dh, absl::StrCat(op, ".dh"), h.dtype, {h.dim(0), hidden_}));
  if (dw.dtype != DType::kF32 && dw.dtype != w.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": dw must be f32 or the dtype of w, got ", dw.DebugString()));
  }
  return CheckTensor(dw, absl::StrCat(op, ".dw"), dw.dtype, {vocab_, hidden_});
}

absl::Status FusedLinearCrossEntropy::Forward(const Stream& stream, const Tensor& h,
                                              const Tensor& w, const Tensor& targets,
                                              const Tensor& loss_sum, const Tensor& num_valid,
                                              const Tensor& lse) const {
  constexpr absl::string_view kOp = "FusedLinearCrossEntropy::Forward";
  SY_RETURN_IF_ERROR(Check(stream, h, w, targets, lse, kOp));
  SY_RETURN_IF_ERROR(CheckLossOutputs(stream, loss_sum, num_valid, lse, kOp));
  if (stream.is_cuda()) {
    return RunCuda(stream, h, w, targets, lse, true, false, 0.0f, loss_sum, num_valid, Tensor(),
                   Tensor());
  }
  return ForwardCpu(h, w, targets, loss_sum, num_valid, lse);
}

absl::Status FusedLinearCrossEntropy::Backward(const Stream& stream, const Tensor& h,
                                               const Tensor& w, const Tensor& targets,
                                               const Tensor& lse, float dloss, const Tensor& dh,
                                               const Tensor& dw) const {
  constexpr absl::string_view kOp = "FusedLinearCrossEntropy::Backward";
  SY_RETURN_IF_ERROR(Check(stream, h, w, targets, lse, kOp));
  SY_RETURN_IF_ERROR(CheckGradOutputs(stream, h, w, dh, dw, kOp));
  if (stream.is_cuda()) {
    return RunCuda(stream, h, w, targets, lse, false, true, dloss, Tensor(), Tensor(), dh, dw);
  }
  return BackwardCpu(h, w, targets, lse, dloss, dh, dw);
}

absl::Status FusedLinearCrossEntropy::ForwardBackward(const Stream& stream, const Tensor& h,
                                                      const Tensor& w, const Tensor& targets,
                                                      float dloss, const Tensor& loss_sum,
                                                      const Tensor& num_valid, const Tensor& lse,
                                                      const Tensor& dh, const Tensor& dw) const {
  constexpr absl::string_view kOp = "FusedLinearCrossEntropy::ForwardBackward";
  SY_RETURN_IF_ERROR(Check(stream, h, w, targets, lse, kOp));
  SY_RETURN_IF_ERROR(CheckLossOutputs(stream, loss_sum, num_valid, lse, kOp));
  SY_RETURN_IF_ERROR(CheckGradOutputs(stream, h, w, dh, dw, kOp));
  if (stream.is_cuda()) {
    return RunCuda(stream, h, w, targets, lse, true, true, dloss, loss_sum, num_valid, dh, dw);
  }
  // The CPU reference: literally Forward then Backward.
  SY_RETURN_IF_ERROR(ForwardCpu(h, w, targets, loss_sum, num_valid, lse));
  return BackwardCpu(h, w, targets, lse, dloss, dh, dw);
}

absl::Status FusedLinearCrossEntropy::CheckShard(const VocabShard& shard,
                                                 absl::string_view op) const {
  if (shard.start < 0 || shard.vocab_size < vocab_ || shard.start > shard.vocab_size - vocab_ ||
      shard.vocab_size > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": the vocabulary slice [", shard.start, ", ", shard.start + vocab_,
                     ") must lie inside the whole vocabulary [0, ", shard.vocab_size, ")"));
  }
  if (!shard.all_reduce) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": VocabShard.all_reduce must be set (the TP all-reduce)"));
  }
  return absl::OkStatus();
}

absl::Status FusedLinearCrossEntropy::VocabParallelForward(const Stream& stream, const Tensor& h,
                                                           const Tensor& w, const Tensor& targets,
                                                           const VocabShard& shard,
                                                           const Tensor& loss_sum,
                                                           const Tensor& num_valid,
                                                           const Tensor& lse) const {
  constexpr absl::string_view kOp = "FusedLinearCrossEntropy::VocabParallelForward";
  // Targets index the whole vocabulary: Check validates them against it.
  SY_RETURN_IF_ERROR(CheckShard(shard, kOp));
  SY_RETURN_IF_ERROR(Check(stream, h, w, targets, lse, kOp, shard.vocab_size));
  SY_RETURN_IF_ERROR(CheckLossOutputs(stream, loss_sum, num_valid, lse, kOp));
  return RunVocabParallel(stream, h, w, targets, shard, false, 0.0f, loss_sum, num_valid, lse,
                          Tensor(), Tensor());
}

absl::Status FusedLinearCrossEntropy::VocabParallelForwardBackward(
    const Stream& stream, const Tensor& h, const Tensor& w, const Tensor& targets,
    const VocabShard& shard, float dloss, const Tensor& loss_sum, const Tensor& num_valid,
    const Tensor& lse, const Tensor& dh, const Tensor& dw) const {
  constexpr absl::string_view kOp = "FusedLinearCrossEntropy::VocabParallelForwardBackward";
  SY_RETURN_IF_ERROR(CheckShard(shard, kOp));
  SY_RETURN_IF_ERROR(Check(stream, h, w, targets, lse, kOp, shard.vocab_size));
  SY_RETURN_IF_ERROR(CheckLossOutputs(stream, loss_sum, num_valid, lse, kOp));
  SY_RETURN_IF_ERROR(CheckGradOutputs(stream, h, w, dh, dw, kOp));
  return RunVocabParallel(stream, h, w, targets, shard, true, dloss, loss_sum, num_valid, lse, dh,
                          dw);
}

absl::Status FusedLinearCrossEntropy::RunVocabParallel(const Stream& stream, const Tensor& h,
                                                       const Tensor& w, const Tensor& targets,
                                                       const VocabShard& shard, bool with_grad,
                                                       float dloss, const Tensor& loss_sum,
                                                       const Tensor& num_valid, const Tensor& lse,
                                                       const Tensor& dh, const Tensor& dw) const {
  const int64_t t_n = h.dim(0), v_n = vocab_, start = shard.start;
  const int32_t* tg = targets.as<int32_t>();
  const DType sdt = vp_stats_.View().dtype;
  char* st = static_cast<char*>(vp_stats_.data());
  double loss = 0;
  int32_t valid = 0;
  for (int64_t t0 = 0; t0 < t_n; t0 += chunk_) {
    const int64_t rows = std::min(chunk_, t_n - t0);
    // [rows] maxima, then [rows, 2] (sum-exp, target logit) right after them.
    const Tensor row_max(sdt, {rows}, device_, st);
    const Tensor stats(sdt, {2 * rows}, device_, st + rows * DTypeSize(sdt));
    if (stream.is_cuda()) {
      const Tensor z(DType::kF32, {rows, v_n}, device_, logits_.data());
      const Tensor hc = Rows(h, t0, rows);
      SY_RETURN_IF_ERROR(Gemm(stream, hc, false, w, true, z));
      SY_RETURN_IF_ERROR(
          internal::VpRowMaxCuda(stream, z.as<float>(), rows, v_n, row_max.as<float>()));
      SY_RETURN_IF_ERROR(shard.all_reduce(row_max, /*max=*/true));
      SY_RETURN_IF_ERROR(internal::VpRowSumCuda(stream, z.as<float>(), rows, v_n, tg + t0, start,
                                                row_max.as<float>(), stats.as<float>()));
      SY_RETURN_IF_ERROR(shard.all_reduce(stats, /*max=*/false));
      SY_RETURN_IF_ERROR(internal::VpFinishCuda(
          stream, rows, tg + t0, shard.vocab_size, row_max.as<float>(), stats.as<float>(),
          lse.as<float>() + t0, row_loss_.View().as<float>() + t0));
      if (!with_grad) continue;
      void* g_data = w.dtype == DType::kBF16 ? grad_bf16_.data() : logits_.data();
      SY_RETURN_IF_ERROR(internal::SoftmaxGradRowsCuda(stream, z.as<float>(), rows, v_n, tg + t0,
                                                       lse.as<float>() + t0, dloss, g_data, w.dtype,
                                                       start));
      const Tensor g(w.dtype, {rows, v_n}, device_, g_data);
      SY_RETURN_IF_ERROR(Gemm(stream, g, false, w, false, Rows(dh, t0, rows)));
      SY_RETURN_IF_ERROR(Gemm(stream, g, true, hc, false, dw, 1.0f, 1.0f));
      continue;
    }
    // The CPU reference: the same steps in fp64.
    double* z = static_cast<double*>(logits_.data());
    double* m = row_max.as<double>();
    double* sp = stats.as<double>();
    Logits(h, w, t0, rows, z);
    for (int64_t r = 0; r < rows; ++r) m[r] = *std::max_element(z + r * v_n, z + (r + 1) * v_n);
    SY_RETURN_IF_ERROR(shard.all_reduce(row_max, /*max=*/true));
    for (int64_t r = 0; r < rows; ++r) {
      const double* zr = z + r * v_n;
      double s = 0;
      for (int64_t v = 0; v < v_n; ++v) s += std::exp(zr[v] - m[r]);
      const int64_t local = static_cast<int64_t>(tg[t0 + r]) - start;
      sp[2 * r] = s;
      sp[2 * r + 1] = tg[t0 + r] != kIgnoreTarget && local >= 0 && local < v_n ? zr[local] : 0.0;
    }
    SY_RETURN_IF_ERROR(shard.all_reduce(stats, /*max=*/false));
    for (int64_t r = 0; r < rows; ++r) {
      const double row_lse = m[r] + std::log(sp[2 * r]);
      StoreFromDouble(lse, t0 + r, row_lse);
      if (tg[t0 + r] != kIgnoreTarget) {
        loss += row_lse - sp[2 * r + 1];
        ++valid;
      }
    }
    if (!with_grad) continue;
    SoftmaxGradRows(z, rows, v_n, tg, lse, t0, start, dloss);
    GradChunk(h, w, z, t0, rows, dh, dw);
  }
  if (stream.is_cuda()) {
    return internal::ReduceLossCuda(stream, row_loss_.View().as<float>(), tg, t_n,
                                    loss_sum.as<float>(), num_valid.as<int32_t>());
  }
  StoreFromDouble(loss_sum, 0, loss);
  num_valid.as<int32_t>()[0] = valid;
  return absl::OkStatus();
}

absl::Status FusedLinearCrossEntropy::ForwardCpu(const Tensor& h, const Tensor& w,
                                                 const Tensor& targets, const Tensor& loss_sum,
                                                 const Tensor& num_valid, const Tensor& lse) const {
  const int64_t t_n = h.dim(0), v_n = vocab_;
  const int32_t* tg = targets.as<int32_t>();
  double* z = static_cast<double*>(logits_.data());
  double loss = 0;
  int32_t valid = 0;
  for (int64_t t0 = 0; t0 < t_n; t0 += chunk_) {
    const int64_t rows = std::min(chunk_, t_n - t0);
    Logits(h, w, t0, rows, z);
    for (int64_t r = 0; r < rows; ++r) {
      const double* zr = z + r * v_n;
      const double m = *std::max_element(zr, zr + v_n);
      double s = 0;
      for (int64_t v = 0; v < v_n; ++v) s += std::exp(zr[v] - m);
      const double row_lse = m + std::log(s);
      StoreFromDouble(lse, t0 + r, row_lse);
      if (tg[t0 + r] != kIgnoreTarget) {
        loss += row_lse - zr[tg[t0 + r]];
        ++valid;
      }
    }
  }
  StoreFromDouble(loss_sum, 0, loss);
  num_valid.as<int32_t>()[0] = valid;
  return absl::OkStatus();
}

absl::Status FusedLinearCrossEntropy::BackwardCpu(const Tensor& h, const Tensor& w,
                                                  const Tensor& targets, const Tensor& lse,
                                                  float dloss, const Tensor& dh,
                                                  const Tensor& dw) const {
  const int64_t t_n = h.dim(0), v_n = vocab_;
  const int32_t* tg = targets.as<int32_t>();
  double* z = static_cast<double*>(logits_.data());
  for (int64_t t0 = 0; t0 < t_n; t0 += chunk_) {
    const int64_t rows = std::min(chunk_, t_n - t0);
    Logits(h, w, t0, rows, z);
    SoftmaxGradRows(z, rows, v_n, tg, lse, t0, /*start=*/0, dloss);
    GradChunk(h, w, z, t0, rows, dh, dw);
  }
  return absl::OkStatus();
}

absl::Status FusedLinearCrossEntropy::ChunkCuda(const Stream& stream, const Tensor& h,
                                                const Tensor& w, const Tensor& targets,
                                                const Tensor& lse, int64_t t0, int64_t rows,
                                                bool with_loss, bool with_grad, float dloss,
                                                const Tensor& dh, const Tensor& dw) const {
  const Tensor z(DType::kF32, {rows, vocab_}, device_, logits_.data());
  const Tensor hc = Rows(h, t0, rows);
  SY_RETURN_IF_ERROR(Gemm(stream, hc, false, w, true, z));
  // g must share w's dtype for the Gemms: in place over the f32 logits, or the bf16 buffer.
  void* g_data = w.dtype == DType::kBF16 ? grad_bf16_.data() : logits_.data();
  const bool fused = with_loss && with_grad && fused_rows_;
  if (fused) {
    // One read of the logits for the loss and the gradient (bitwise the two kernels' results).
    SY_RETURN_IF_ERROR(internal::CrossEntropyGradRowsCuda(
        stream, z.as<float>(), rows, vocab_, targets.as<int32_t>() + t0, dloss, g_data, w.dtype,
        lse.as<float>() + t0, row_loss_.View().as<float>() + t0));
  } else if (with_loss) {
    SY_RETURN_IF_ERROR(internal::CrossEntropyRowsCuda(
        stream, z.as<float>(), rows, vocab_, targets.as<int32_t>() + t0, lse.as<float>() + t0,
        row_loss_.View().as<float>() + t0));
  }
  if (!with_grad) return absl::OkStatus();
  if (!fused) {
    SY_RETURN_IF_ERROR(internal::SoftmaxGradRowsCuda(stream, z.as<float>(), rows, vocab_,
                                                     targets.as<int32_t>() + t0,
                                                     lse.as<float>() + t0, dloss, g_data, w.dtype));
  }
  const Tensor g(w.dtype, {rows, vocab_}, device_, g_data);
  SY_RETURN_IF_ERROR(Gemm(stream, g, false, w, false, Rows(dh, t0, rows)));
  return Gemm(stream, g, true, hc, false, dw, 1.0f, 1.0f);
}

absl::Status FusedLinearCrossEntropy::RunCuda(const Stream& stream, const Tensor& h,
                                              const Tensor& w, const Tensor& targets,
                                              const Tensor& lse, bool with_loss, bool with_grad,
                                              float dloss, const Tensor& loss_sum,
                                              const Tensor& num_valid, const Tensor& dh,
                                              const Tensor& dw) const {
  const int64_t t_n = h.dim(0);
  for (int64_t t0 = 0; t0 < t_n; t0 += chunk_) {
    SY_RETURN_IF_ERROR(ChunkCuda(stream, h, w, targets, lse, t0, std::min(chunk_, t_n - t0),
                                 with_loss, with_grad, dloss, dh, dw));
  }
  if (!with_loss) return absl::OkStatus();
  return internal::ReduceLossCuda(stream, row_loss_.View().as<float>(), targets.as<int32_t>(), t_n,
                                  loss_sum.as<float>(), num_valid.as<int32_t>());
}

}  // namespace switchyard::kernels
