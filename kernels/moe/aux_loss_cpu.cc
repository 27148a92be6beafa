// CPU reference of the aux and z losses (aux_loss.h): fp64 math, token sums in the chunks of
// router_math::kAuxChunk tokens that the CUDA kernels use, chunk sums in lane order. Templated on
// Real, the dtype of logits, losses, grad_weights and dlogits (f32, or f64 for gradient checks).
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/moe/router_internal.h"

namespace switchyard::kernels::internal {
namespace {

// P row (§2.2) plus the softmax normaliser of one token; `p` [E].
template <typename Real>
void AuxRow(const AuxPlan& plan, const Real* z, double* p, double* mx, double* sum,
            double* sig_sum) {
  const int64_t e_count = plan.num_experts;
  SoftmaxNorm(z, e_count, mx, sum);
  const double m = *mx;
  if (plan.sigmoid) {
    *sig_sum = LaneOrderSum(e_count, [&](int64_t e) { return Sigmoid(z[e]); });
    for (int64_t e = 0; e < e_count; ++e) p[e] = Sigmoid(z[e]) / *sig_sum;
  } else {
    for (int64_t e = 0; e < e_count; ++e) p[e] = Exp(static_cast<double>(z[e]) - m) / *sum;
  }
}

// `selected`: null, or the router's selection [T, k] (aux_loss.h), ids already checked.
template <typename Real>
void Stats(const AuxPlan& plan, const Real* logits, const int32_t* selected, double* psum,
           float* counts, double* zsum) {
  const int64_t e_count = plan.num_experts, seq = plan.tokens_per_sequence;
  const int64_t chunks = plan.chunks_per_sequence;
  std::vector<double> p(e_count), chunk_sums(chunks * e_count);
  std::vector<double> z_chunks(plan.num_sequences * chunks);
  std::vector<char> taken(e_count);
  for (int64_t i = 0; i < plan.num_sequences * e_count; ++i) psum[i] = 0.0, counts[i] = 0.0f;
  for (int64_t b = 0; b < plan.num_sequences; ++b) {
    for (int64_t c = 0; c < chunks; ++c) {
      double* chunk = chunk_sums.data() + c * e_count;
      std::fill(chunk, chunk + e_count, 0.0);
      double z_chunk = 0.0;
      const int64_t begin = c * router_math::kAuxChunk;
      const int64_t end = std::min<int64_t>(seq, begin + router_math::kAuxChunk);
      for (int64_t s = begin; s < end; ++s) {
        const Real* z = logits + (b * seq + s) * e_count;
        double mx, sum, sig_sum;
        AuxRow(plan, z, p.data(), &mx, &sum, &sig_sum);
        for (int64_t e = 0; e < e_count; ++e) chunk[e] += p[e];
        const double lse = mx + std::log(sum);
        z_chunk += lse * lse;
        if (selected != nullptr) {
          const int32_t* sel = selected + (b * seq + s) * plan.topk;
          for (int64_t r = 0; r < plan.topk; ++r) counts[b * e_count + sel[r]] += 1.0f;
          continue;
        }
        std::fill(taken.begin(), taken.end(), 0);
        for (int64_t r = 0; r < plan.topk; ++r) {  // plain top-k of z (= of P)
          int best = -1;
          double bv = 0.0;
          for (int e = 0; e < e_count; ++e) {
            if (!taken[e] && Better(z[e], e, bv, best)) bv = z[e], best = e;
          }
          taken[best] = 1;
          counts[b * e_count + best] += 1.0f;
        }
      }
      z_chunks[b * chunks + c] = z_chunk;
    }
    // Chunks in lane order (the CUDA finalize: one warp per column).
    for (int64_t e = 0; e < e_count; ++e) {
      psum[b * e_count + e] =
          LaneOrderSum(chunks, [&](int64_t c) { return chunk_sums[c * e_count + e]; });
    }
  }
  *zsum = LaneOrderSum(plan.num_sequences * chunks, [&](int64_t i) { return z_chunks[i]; });
}

template <typename Real>
void LossForward(const RouterConfig& config, const AuxPlan& plan, const double* psum,
                 const float* counts, const float* global_counts, const AuxLossNorms& norms,
                 double zsum, Real* losses, Real* grad_weights) {
  const int64_t e_count = plan.num_experts, b_count = plan.num_sequences;
  std::vector<double> p_total(e_count, 0.0), c_total(e_count, 0.0), w(b_count * e_count, 0.0);
  for (int64_t b = 0; b < b_count; ++b) {
    for (int64_t e = 0; e < e_count; ++e) {
      p_total[e] += psum[b * e_count + e];
      c_total[e] += counts[b * e_count + e];
    }
  }
  const double k = static_cast<double>(plan.topk), e_d = static_cast<double>(e_count);
  for (size_t i = 0; i < config.aux_losses.size(); ++i) {
    const AuxLossTerm& term = config.aux_losses[i];
    double value = 0.0;
    if (term.type == AuxLossType::kAuxLoss) {
      const double n = norms.aux_num_tokens > 0 ? norms.aux_num_tokens : plan.num_tokens;
      const double coef = e_d * term.coeff / (k * n * n);
      double dot = 0.0;
      for (int64_t e = 0; e < e_count; ++e) dot += p_total[e] * c_total[e];
      value = dot * coef;
      for (int64_t i2 = 0; i2 < b_count * e_count; ++i2) w[i2] += coef * c_total[i2 % e_count];
    } else if (term.type == AuxLossType::kSeqAuxLoss) {
      const double n = norms.seq_num_tokens > 0 ? norms.seq_num_tokens : plan.tokens_per_sequence;
      const double coef = e_d * term.coeff / (k * n * n);
      double total = 0.0;
      for (int64_t b = 0; b < b_count; ++b) {
        double dot = 0.0;
        for (int64_t e = 0; e < e_count; ++e) {
          dot += psum[b * e_count + e] * counts[b * e_count + e];
        }
        total += dot * coef;
      }
      value = total / b_count;
      for (int64_t i2 = 0; i2 < b_count * e_count; ++i2) w[i2] += coef / b_count * counts[i2];
    } else {  // kGlobalAuxLoss
      const double n = norms.global_num_tokens;
      const double coef = e_d * term.coeff / (k * n * n);
      double dot = 0.0;
      for (int64_t e = 0; e < e_count; ++e) dot += p_total[e] * global_counts[e];
      value = dot * coef;
      for (int64_t i2 = 0; i2 < b_count * e_count; ++i2) {
        w[i2] += norms.dp_size * coef * global_counts[i2 % e_count];
      }
    }
    losses[i] = static_cast<Real>(value);
  }
  losses[config.aux_losses.size()] =
      static_cast<Real>(config.z_loss_coeff * zsum / static_cast<double>(plan.num_tokens));
  for (int64_t i = 0; i < b_count * e_count; ++i) grad_weights[i] = static_cast<Real>(w[i]);
}

template <typename Real>
void LossBackward(const RouterConfig& config, const AuxPlan& plan, const Real* logits,
                  const Real* grad_weights, double scale, Real* dlogits) {
  const int64_t e_count = plan.num_experts;
  std::vector<double> p(e_count);
  const double z_coef = 2.0 * config.z_loss_coeff / static_cast<double>(plan.num_tokens);
  for (int64_t t = 0; t < plan.num_tokens; ++t) {
    const Real* z = logits + t * e_count;
    const Real* w = grad_weights + (t / plan.tokens_per_sequence) * e_count;
    double mx, sum, sig_sum = 0.0;
    AuxRow(plan, z, p.data(), &mx, &sum, &sig_sum);
    const double dot = LaneOrderSum(e_count, [&](int64_t e) { return p[e] * w[e]; });
    const double zc = z_coef * (mx + std::log(sum));
    for (int64_t e = 0; e < e_count; ++e) {
      double d;
      if (plan.sigmoid) {
        const double s = Sigmoid(z[e]);
        d = (w[e] - dot) / sig_sum * (s * (1.0 - s));
      } else {
        d = p[e] * (w[e] - dot);
      }
      d += zc * (Exp(static_cast<double>(z[e]) - mx) / sum);
      Real& out = dlogits[t * e_count + e];
      out = static_cast<Real>(static_cast<double>(out) + scale * d);
    }
  }
}

}  // namespace

absl::Status AuxLossStatsCpu(const AuxPlan& plan, const Tensor& logits, const Tensor& selected,
                             const AuxLossStats& stats) {
  const int32_t* sel = selected.data != nullptr ? selected.as<int32_t>() : nullptr;
  if (sel != nullptr) {
    for (int64_t i = 0; i < plan.num_tokens * plan.topk; ++i) {
      if (sel[i] < 0 || sel[i] >= plan.num_experts) {
        return absl::InvalidArgumentError(absl::StrCat("aux_loss.selected_idx[", i / plan.topk,
                                                       ", ", i % plan.topk, "] (", sel[i],
                                                       ") must be in [0, ", plan.num_experts, ")"));
      }
    }
  }
  double* psum = stats.prob_sums.as<double>();
  float* counts = stats.counts.as<float>();
  double* zsum = stats.lse_sq_sum.as<double>();
  if (logits.dtype == DType::kF64) {
    Stats(plan, logits.as<double>(), sel, psum, counts, zsum);
  } else {
    Stats(plan, logits.as<float>(), sel, psum, counts, zsum);
  }
  return absl::OkStatus();
}

absl::Status AuxLossForwardCpu(const RouterConfig& config, const AuxPlan& plan,
                               const AuxLossStats& stats, const AuxLossNorms& norms,
                               const Tensor& losses, const Tensor& grad_weights) {
  const float* global = norms.global_counts.data ? norms.global_counts.as<float>() : nullptr;
  const double zsum = *stats.lse_sq_sum.as<double>();
  if (losses.dtype == DType::kF64) {
    LossForward(config, plan, stats.prob_sums.as<double>(), stats.counts.as<float>(), global, norms,
                zsum, losses.as<double>(), grad_weights.as<double>());
  } else {
    LossForward(config, plan, stats.prob_sums.as<double>(), stats.counts.as<float>(), global, norms,
                zsum, losses.as<float>(), grad_weights.as<float>());
  }
  return absl::OkStatus();
}

absl::Status AuxLossBackwardCpu(const RouterConfig& config, const AuxPlan& plan,
                                const Tensor& logits, const Tensor& grad_weights,
                                double aux_grad_scale, const Tensor& dlogits) {
  if (logits.dtype == DType::kF64) {
    LossBackward(config, plan, logits.as<double>(), grad_weights.as<double>(), aux_grad_scale,
                 dlogits.as<double>());
  } else {
    LossBackward(config, plan, logits.as<float>(), grad_weights.as<float>(), aux_grad_scale,
                 dlogits.as<float>());
  }
  return absl::OkStatus();
}

}  // namespace switchyard::kernels::internal
