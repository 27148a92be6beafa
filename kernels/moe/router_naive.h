// File: kernels/moe/router_naive.h
//
// Test-only: a naive fp64 router and aux-loss reference written directly from
// megatron_moe.md §1-§2 (std::exp, std::stable_sort, no shared code with router_cpu.cc), against
// which router_test.cc and aux_loss_test.cc check the CPU reference.
#ifndef SWITCHYARD_KERNELS_MOE_ROUTER_NAIVE_H_
#define SWITCHYARD_KERNELS_MOE_ROUTER_NAIVE_H_

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/moe/router.h"

namespace switchyard::kernels::naive {

// Indices of the k largest `score` among `allowed`, ties to the lower index.
inline std::vector<int> TopK(const std::vector<double>& score, int k,
                             const std::vector<bool>& allowed) {
  std::vector<int> order;
  for (int e = 0; e < static_cast<int>(score.size()); ++e) {
    if (allowed[e]) order.push_back(e);
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[a] > score[b]; });
  order.resize(k);
  return order;
}

inline std::vector<double> Softmax(const double* z, int e_count) {
  const double m = *std::max_element(z, z + e_count);
  std::vector<double> s(e_count);
  double sum = 0;
  for (int e = 0; e < e_count; ++e) sum += s[e] = std::exp(z[e] - m);
  for (double& v : s) v /= sum;
  return s;
}

inline double Sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// Megatron's sinkhorn(): returns d1 ⊙ exp(z) ⊙ d0 [T, E].
inline std::vector<double> Sinkhorn(const std::vector<double>& z, int64_t t_count, int e_count) {
  std::vector<double> d0(t_count, 1.0), d1(e_count, 1.0), d1_old = d1;
  for (int it = 0; it < 2000; ++it) {
    for (int64_t t = 0; t < t_count; ++t) {
      double s = 0;
      for (int e = 0; e < e_count; ++e) s += d1[e] * std::exp(z[t * e_count + e]);
      d0[t] = (1.0 / t_count) / (s + 1e-8);
    }
    double err = 0;
    for (int e = 0; e < e_count; ++e) {
      double s = 0;
      for (int64_t t = 0; t < t_count; ++t) s += d0[t] * std::exp(z[t * e_count + e]);
      d1[e] = (1.0 / e_count) / (s + 1e-8);
      err += std::fabs(d1_old[e] - d1[e]);
    }
    d1_old = d1;
    if (!(err / e_count > 1e-4)) break;
  }
  std::vector<double> out(z.size());
  for (int64_t t = 0; t < t_count; ++t) {
    for (int e = 0; e < e_count; ++e) {
      out[t * e_count + e] = d1[e] * std::exp(z[t * e_count + e]) * d0[t];
    }
  }
  return out;
}

struct Routing {
  std::vector<int> idx, selected, tokens_per_expert;
  std::vector<double> probs;
};

inline Routing Route(const RouterConfig& c, const std::vector<double>& z, int64_t t_count,
                     const std::vector<float>& bias = {}) {
  const int e_count = c.num_experts, k = c.topk;
  Routing r;
  r.idx.resize(t_count * k);
  r.probs.resize(t_count * k);
  std::vector<double> sink;
  if (c.sinkhorn && c.training) sink = Sinkhorn(z, t_count, e_count);
  for (int64_t t = 0; t < t_count; ++t) {
    const double* zt = &z[t * e_count];
    const std::vector<double> soft = Softmax(zt, e_count);
    std::vector<double> sig(e_count), sel_score(e_count), prob_src(e_count);
    for (int e = 0; e < e_count; ++e) sig[e] = Sigmoid(zt[e]);
    for (int e = 0; e < e_count; ++e) {
      if (c.sinkhorn) {
        prob_src[e] = k == 1 ? sig[e] : soft[e];
        sel_score[e] = c.training ? sink[t * e_count + e] : prob_src[e];
      } else if (c.score_function == RouterScoreFunction::kSigmoid) {
        prob_src[e] = sig[e];
        sel_score[e] = sig[e] + (c.use_expert_bias ? bias[e] : 0.0);
      } else if (c.pre_softmax) {
        sel_score[e] = prob_src[e] = soft[e];
      } else {
        sel_score[e] = prob_src[e] = zt[e];
      }
    }
    std::vector<bool> allowed(e_count, true);
    if (c.num_groups > 0) {  // §1.4
      const int gs = e_count / c.num_groups;
      std::vector<double> gscore(c.num_groups);
      for (int g = 0; g < c.num_groups; ++g) {
        std::vector<double> in(sel_score.begin() + g * gs, sel_score.begin() + (g + 1) * gs);
        std::vector<int> top = TopK(in, c.topk / c.group_topk, std::vector<bool>(gs, true));
        for (int i : top) gscore[g] += in[i];
      }
      std::vector<int> groups = TopK(gscore, c.group_topk, std::vector<bool>(c.num_groups, true));
      for (int e = 0; e < e_count; ++e) {
        allowed[e] = std::find(groups.begin(), groups.end(), e / gs) != groups.end();
      }
    }
    const std::vector<int> top = TopK(sel_score, k, allowed);
    double denom = 1.0;
    if (!c.sinkhorn && c.score_function == RouterScoreFunction::kSoftmax && !c.pre_softmax) {
      const double m = zt[top[0]];
      denom = 0;
      for (int e : top) denom += std::exp(zt[e] - m);
      for (int e : top) prob_src[e] = std::exp(zt[e] - m);
    } else if (!c.sinkhorn && c.score_function == RouterScoreFunction::kSigmoid && k > 1) {
      denom = 1e-20;
      for (int e : top) denom += sig[e];
    }
    for (int q = 0; q < k; ++q) {
      r.idx[t * k + q] = top[q];
      r.probs[t * k + q] = prob_src[top[q]] / denom * (c.sinkhorn ? 1.0 : c.topk_scaling_factor);
    }
  }
  r.selected = r.idx;
  r.tokens_per_expert.assign(e_count, 0);
  const int64_t cap = ExpertCapacity(c, t_count);
  for (int e = 0; e < e_count; ++e) {
    std::vector<int64_t> slots;  // (token, slot) ids routed to e
    for (int64_t a = 0; a < t_count * k; ++a) {
      if (r.idx[a] == e) slots.push_back(a);
    }
    if (cap >= 0 && static_cast<int64_t>(slots.size()) > cap) {
      const int64_t s_len = c.seq_length, b_count = s_len > 0 ? t_count / s_len : 1;
      auto pos = [&](int64_t a) {  // Megatron's seq-major row of our batch-major token
        const int64_t t = a / k;
        return s_len > 0 ? (t % s_len) * b_count + t / s_len : t;
      };
      std::stable_sort(slots.begin(), slots.end(), [&](int64_t a, int64_t b) {
        return c.drop_policy == CapacityDropPolicy::kPosition ? pos(a) < pos(b)
                                                              : r.probs[a] > r.probs[b];
      });
      for (size_t i = cap; i < slots.size(); ++i) {
        r.idx[slots[i]] = -1;
        r.probs[slots[i]] = 0;
      }
      slots.resize(cap);
    }
    r.tokens_per_expert[e] = static_cast<int>(slots.size());
  }
  return r;
}

// Loss values (config order, then z-loss) straight from §1.6 / §2 on one rank.
inline std::vector<double> AuxLosses(const RouterConfig& c, const std::vector<double>& z,
                                     int64_t t_count, const std::vector<double>& global_counts = {},
                                     double global_tokens = 0) {
  const int e_count = c.num_experts, k = c.topk;
  std::vector<std::vector<double>> p(t_count);
  std::vector<std::vector<int>> map(t_count);
  double z_loss = 0;
  for (int64_t t = 0; t < t_count; ++t) {
    const double* zt = &z[t * e_count];
    p[t] = Softmax(zt, e_count);
    if (c.score_function == RouterScoreFunction::kSigmoid) {
      double s = 0;
      for (int e = 0; e < e_count; ++e) s += p[t][e] = Sigmoid(zt[e]);
      for (double& v : p[t]) v /= s;
    }
    map[t] = TopK(p[t], k, std::vector<bool>(e_count, true));
    double lse = 0;
    for (int e = 0; e < e_count; ++e) lse += std::exp(zt[e]);
    z_loss += std::log(lse) * std::log(lse);
  }
  // aux(P over rows [t0, t1), counts c, N) = α·E/(k·N²)·Σ_e ΣP·c.
  auto aux = [&](double alpha, int64_t t0, int64_t t1, const std::vector<double>& c_e, double n) {
    double dot = 0;
    for (int e = 0; e < e_count; ++e) {
      double ps = 0;
      for (int64_t t = t0; t < t1; ++t) ps += p[t][e];
      dot += ps * c_e[e];
    }
    return alpha * e_count / (k * n * n) * dot;
  };
  auto counts = [&](int64_t t0, int64_t t1) {
    std::vector<double> ce(e_count, 0);
    for (int64_t t = t0; t < t1; ++t) {
      for (int e : map[t]) ce[e] += 1;
    }
    return ce;
  };
  std::vector<double> out;
  for (const AuxLossTerm& term : c.aux_losses) {
    if (term.type == AuxLossType::kAuxLoss) {
      out.push_back(aux(term.coeff, 0, t_count, counts(0, t_count), t_count));
    } else if (term.type == AuxLossType::kSeqAuxLoss) {
      const int64_t s = c.seq_length, b_count = t_count / s;
      double v = 0;
      for (int64_t b = 0; b < b_count; ++b) {
        v += aux(term.coeff, b * s, (b + 1) * s, counts(b * s, (b + 1) * s), s);
      }
      out.push_back(v / b_count);
    } else {
      out.push_back(aux(term.coeff, 0, t_count, global_counts, global_tokens));
    }
  }
  out.push_back(c.z_loss_coeff * z_loss / t_count);
  return out;
}

}  // namespace switchyard::kernels::naive

#endif  // SWITCHYARD_KERNELS_MOE_ROUTER_NAIVE_H_
