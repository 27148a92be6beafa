// CPU reference of the router ops (router.h): fp64 math from f32 or f64 logits, with the same
// expressions and summation orders as the CUDA kernels (router_math.h), so that selections agree
// bit for bit. Templated on Real, the dtype of logits / probabilities / gradients.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/moe/rng.h"
#include "kernels/moe/router_internal.h"

namespace switchyard::kernels::internal {
namespace {

// Sinkhorn scaling of exp(z) (router.h): d0 [T], d1 [E], in the CUDA kernel's summation order.
template <typename Real>
void Sinkhorn(const Real* z, int64_t t_count, int64_t e_count, std::vector<double>* d0_out,
              std::vector<double>* d1_out) {
  using router_math::kSinkhornChunk;
  std::vector<double>& d0 = *d0_out;
  std::vector<double>& d1 = *d1_out;
  d0.assign(t_count, 0.0);
  d1.assign(e_count, 1.0);
  const int64_t chunks = (t_count + kSinkhornChunk - 1) / kSinkhornChunk;
  std::vector<double> partial(chunks * e_count), d1_next(e_count);
  for (int it = 0; it < router_math::kSinkhornMaxIters; ++it) {
    for (int64_t t = 0; t < t_count; ++t) {
      const Real* row = z + t * e_count;
      const double s = LaneOrderSum(e_count, [&](int64_t e) { return Exp(row[e]) * d1[e]; });
      d0[t] = (1.0 / t_count) / (s + router_math::kSinkhornEps);
    }
    for (int64_t c = 0; c < chunks; ++c) {
      for (int64_t e = 0; e < e_count; ++e) {
        double acc = 0.0;
        for (int64_t t = c * kSinkhornChunk; t < std::min(t_count, (c + 1) * kSinkhornChunk); ++t) {
          acc += Exp(z[t * e_count + e]) * d0[t];
        }
        partial[c * e_count + e] = acc;
      }
    }
    double err = 0.0;
    for (int64_t e = 0; e < e_count; ++e) {
      double col = 0.0;
      for (int64_t c = 0; c < chunks; ++c) col += partial[c * e_count + e];
      d1_next[e] = (1.0 / e_count) / (col + router_math::kSinkhornEps);
      err += std::fabs(d1_next[e] - d1[e]);
    }
    d1 = d1_next;
    if (!(err / e_count > router_math::kSinkhornTol)) break;
  }
}

// Marks the experts outside the group_topk best groups unavailable (§1.4).
void GroupMask(const RoutingPlan& p, const double* key, std::vector<char>* avail) {
  const int g_count = p.num_groups;
  const int64_t gs = p.num_experts / g_count;
  const int per = static_cast<int>(p.topk / p.group_topk);
  std::vector<double> score(g_count);
  std::vector<char> taken(gs);
  for (int j = 0; j < g_count; ++j) {
    std::fill(taken.begin(), taken.end(), 0);
    double s = 0.0;
    for (int r = 0; r < per; ++r) {
      int best = -1;
      double bv = 0.0;
      for (int64_t i = 0; i < gs; ++i) {
        const int e = static_cast<int>(j * gs + i);
        if (!taken[i] && Better(key[e], e, bv, best)) bv = key[e], best = e;
      }
      taken[best - j * gs] = 1;
      s += bv;
    }
    score[j] = s;
  }
  std::vector<char> chosen(g_count, 0);
  for (int r = 0; r < p.group_topk; ++r) {
    int best = -1;
    double bv = 0.0;
    for (int j = 0; j < g_count; ++j) {
      if (!chosen[j] && Better(score[j], j, bv, best)) bv = score[j], best = j;
    }
    chosen[best] = 1;
  }
  for (int64_t e = 0; e < p.num_experts; ++e) (*avail)[e] = chosen[e / gs];
}

template <typename Real>
void Forward(const RoutingPlan& p, const Real* logits, const float* bias, float* local_tpe,
             int32_t* topk_idx, Real* probs, int32_t* selected, int32_t* tpe) {
  const int64_t t_count = p.num_tokens, e_count = p.num_experts, k = p.topk;
  std::vector<double> d0, d1;
  if (p.key == KeyKind::kSinkhorn) Sinkhorn(logits, t_count, e_count, &d0, &d1);
  std::vector<double> key(e_count), zs(k), ps(k);
  std::vector<char> avail(e_count);
  std::vector<int64_t> pre_counts(e_count, 0);
  for (int64_t t = 0; t < t_count; ++t) {
    const Real* z = logits + t * e_count;
    double mx = 0.0, sum = 1.0;
    if (p.key == KeyKind::kSoftmax || p.prob == ProbKind::kFullSoftmax) {
      SoftmaxNorm(z, e_count, &mx, &sum);
    }
    for (int64_t e = 0; e < e_count; ++e) {
      const double ze = z[e];
      switch (p.key) {
        case KeyKind::kLogit:
          key[e] = ze;
          break;
        case KeyKind::kSoftmax:
          key[e] = Exp(ze - mx) / sum;
          break;
        case KeyKind::kSigmoid:
          key[e] = Sigmoid(ze) + (p.use_bias ? bias[e] : 0.0f);
          break;
        case KeyKind::kSinkhorn:
          key[e] = d1[e] * Exp(ze) * d0[t];
          break;
      }
    }
    std::fill(avail.begin(), avail.end(), 1);
    if (p.num_groups > 0) GroupMask(p, key.data(), &avail);
    for (int64_t r = 0; r < k; ++r) {
      int best = -1;
      double bv = 0.0;
      for (int e = 0; e < e_count; ++e) {
        if (avail[e] && Better(key[e], e, bv, best)) bv = key[e], best = e;
      }
      avail[best] = 0;
      selected[t * k + r] = topk_idx[t * k + r] = best;
      zs[r] = z[best];
      ++pre_counts[best];
    }
    if (p.prob == ProbKind::kFullSoftmax) {
      for (int64_t r = 0; r < k; ++r) ps[r] = Exp(zs[r] - mx) / sum * p.scale;
    } else {
      SlotProbs(p.prob, static_cast<int>(k), zs.data(), p.scale, ps.data());
    }
    for (int64_t r = 0; r < k; ++r) probs[t * k + r] = static_cast<Real>(ps[r]);
  }
  for (int64_t e = 0; e < e_count; ++e) tpe[e] = static_cast<int32_t>(pre_counts[e]);
  if (p.capacity >= 0) {
    // Per expert, order the slots that chose it (by prob desc then row, or by position) and keep
    // the first `capacity`.
    std::vector<std::vector<int64_t>> slots(e_count);
    for (int64_t a = 0; a < t_count * k; ++a) slots[selected[a]].push_back(a);
    for (int64_t e = 0; e < e_count; ++e) {
      std::vector<int64_t>& v = slots[e];
      if (static_cast<int64_t>(v.size()) <= p.capacity) continue;
      if (p.position_policy) {
        std::sort(v.begin(), v.end(), [&](int64_t a, int64_t b) {
          return router_math::PositionKey(a / k, p.seq_length, p.num_sequences) <
                 router_math::PositionKey(b / k, p.seq_length, p.num_sequences);
        });
      } else {
        std::sort(v.begin(), v.end(), [&](int64_t a, int64_t b) {
          return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
        });
      }
      for (size_t i = p.capacity; i < v.size(); ++i) {
        topk_idx[v[i]] = -1;
        probs[v[i]] = 0;
      }
      tpe[e] = static_cast<int32_t>(p.capacity);
    }
  }
  if (p.count_for_bias) {
    for (int64_t e = 0; e < e_count; ++e) local_tpe[e] += static_cast<float>(tpe[e]);
  }
}

template <typename Real>
void Backward(const RoutingPlan& p, const Real* logits, const int32_t* selected,
              const int32_t* topk_idx, const Real* dprobs, Real* dlogits) {
  const int64_t e_count = p.num_experts, k = p.topk;
  std::vector<double> zs(k), g(k), dzs(k), dz(e_count);
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const Real* z = logits + t * e_count;
    std::fill(dz.begin(), dz.end(), 0.0);
    for (int64_t r = 0; r < k; ++r) {
      zs[r] = z[selected[t * k + r]];
      g[r] = topk_idx[t * k + r] < 0 ? 0.0 : static_cast<double>(dprobs[t * k + r]);
    }
    if (p.prob == ProbKind::kFullSoftmax) {
      double mx, sum;
      SoftmaxNorm(z, e_count, &mx, &sum);
      double dot = 0.0;
      for (int64_t r = 0; r < k; ++r) dot += Exp(zs[r] - mx) / sum * (g[r] * p.scale);
      std::vector<double> upstream(e_count, 0.0);
      for (int64_t r = 0; r < k; ++r) upstream[selected[t * k + r]] = g[r] * p.scale;
      for (int64_t e = 0; e < e_count; ++e) {
        dz[e] = Exp(static_cast<double>(z[e]) - mx) / sum * (upstream[e] - dot);
      }
    } else {
      SlotGrads(p.prob, static_cast<int>(k), zs.data(), g.data(), p.scale, dzs.data());
      for (int64_t r = 0; r < k; ++r) dz[selected[t * k + r]] = dzs[r];
    }
    for (int64_t e = 0; e < e_count; ++e) dlogits[t * e_count + e] = static_cast<Real>(dz[e]);
  }
}

}  // namespace

absl::Status RouterForwardCpu(const RoutingPlan& plan, const Tensor& logits,
                              const Tensor& expert_bias, const Tensor& local_tokens_per_expert,
                              const RouterOutputs& out) {
  const float* bias = plan.use_bias ? expert_bias.as<float>() : nullptr;
  float* local = plan.count_for_bias ? local_tokens_per_expert.as<float>() : nullptr;
  if (logits.dtype == DType::kF64) {
    Forward(plan, logits.as<double>(), bias, local, out.topk_idx.as<int32_t>(),
            out.topk_probs.as<double>(), out.selected_idx.as<int32_t>(),
            out.tokens_per_expert.as<int32_t>());
  } else {
    Forward(plan, logits.as<float>(), bias, local, out.topk_idx.as<int32_t>(),
            out.topk_probs.as<float>(), out.selected_idx.as<int32_t>(),
            out.tokens_per_expert.as<int32_t>());
  }
  return absl::OkStatus();
}

absl::Status RouterBackwardCpu(const RoutingPlan& plan, const Tensor& logits,
                               const Tensor& selected_idx, const Tensor& topk_idx,
                               const Tensor& dtopk_probs, const Tensor& dlogits) {
  const int32_t* sel = selected_idx.as<int32_t>();
  for (int64_t i = 0; i < selected_idx.numel(); ++i) {
    if (sel[i] < 0 || sel[i] >= plan.num_experts) {
      return absl::InvalidArgumentError("router.selected_idx: expert id out of range");
    }
  }
  if (logits.dtype == DType::kF64) {
    Backward(plan, logits.as<double>(), sel, topk_idx.as<int32_t>(), dtopk_probs.as<double>(),
             dlogits.as<double>());
  } else {
    Backward(plan, logits.as<float>(), sel, topk_idx.as<int32_t>(), dtopk_probs.as<float>(),
             dlogits.as<float>());
  }
  return absl::OkStatus();
}

absl::Status UpdateExpertBiasCpu(const Tensor& counts, const Tensor& bias, float rate) {
  const int64_t e_count = bias.numel();
  float* c = counts.as<float>();
  float* b = bias.as<float>();
  double total = 0.0;
  for (int64_t e = 0; e < e_count; ++e) total += c[e];
  const double mean = total / e_count;
  for (int64_t e = 0; e < e_count; ++e) {
    const double d = mean - c[e];
    b[e] = b[e] + (d > 0 ? rate : d < 0 ? -rate : 0.0f);
    c[e] = 0.0f;
  }
  return absl::OkStatus();
}

absl::Status JitterScaleCpu(const Tensor& in, float eps, uint64_t seed, uint64_t offset,
                            const Tensor& out) {
  const int64_t n = in.numel();
  if (in.dtype == DType::kF32) {
    for (int64_t i = 0; i < n; ++i) {
      out.as<float>()[i] = in.as<float>()[i] * JitterMultiplier(eps, seed, offset + i);
    }
  } else if (in.dtype == DType::kF64) {
    for (int64_t i = 0; i < n; ++i) {
      out.as<double>()[i] = in.as<double>()[i] * JitterMultiplier(eps, seed, offset + i);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float v = in.as<BF16>()[i].ToFloat() * JitterMultiplier(eps, seed, offset + i);
      out.as<BF16>()[i] = BF16::FromFloat(v);
    }
  }
  return absl::OkStatus();
}

}  // namespace switchyard::kernels::internal
