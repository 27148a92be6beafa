// Router invariants from megatron_moe.md §6 on the CPU reference: k distinct experts per token
// when dropless, group-limited routing touches <= group_topk groups, capacity count bounds, the
// expert-bias counting and sign-rule update, input jitter and the router GEMMs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <vector>

#include "kernels/moe/rng.h"
#include "kernels/moe/router.h"
#include "kernels/moe/router_test_util.h"

namespace switchyard::kernels {
namespace {

using testutil::RandomNormal;
using testutil::View;

RouterConfig Base(int e, int k) {
  RouterConfig c;
  c.num_experts = e;
  c.topk = k;
  return c;
}

TEST(RouterInvariantsTest, DroplessRoutesEveryTokenToKDistinctExperts) {
  std::mt19937_64 rng(std::random_device{}());
  for (int k : {1, 2, 8}) {
    RouterConfig c = Base(64, k);
    if (k == 1) c.score_function = RouterScoreFunction::kSigmoid;
    const int64_t t = 128;
    auto r = testutil::Route(c, RandomNormal(t * 64, rng));
    ASSERT_TRUE(r.status.ok()) << r.status;
    int64_t total = 0;
    for (int64_t i = 0; i < t; ++i) {
      std::set<int> experts(r.idx.begin() + i * k, r.idx.begin() + (i + 1) * k);
      EXPECT_EQ(experts.size(), static_cast<size_t>(k));
      EXPECT_GE(*experts.begin(), 0);
    }
    for (int v : r.tokens_per_expert) total += v;
    EXPECT_EQ(total, t * k);  // map.sum() == T·k
  }
}

TEST(RouterInvariantsTest, GroupLimitedTouchesAtMostGroupTopkGroups) {
  std::mt19937_64 rng(std::random_device{}());
  // Megatron's TestGroupLimitedRouter: E=16, k=4, (group_topk, num_groups) in {(3, 8), (2, 4)}.
  for (auto [g, groups] : {std::pair{3, 8}, std::pair{2, 4}}) {
    for (bool sigmoid : {false, true}) {
      RouterConfig c = Base(16, 4);
      c.num_groups = groups;
      c.group_topk = g;
      if (sigmoid) c.score_function = RouterScoreFunction::kSigmoid;
      auto r = testutil::Route(c, RandomNormal(256 * 16, rng));
      ASSERT_TRUE(r.status.ok()) << r.status;
      size_t most = 0;
      for (int64_t t = 0; t < 256; ++t) {
        std::set<int> touched;
        for (int q = 0; q < 4; ++q) touched.insert(r.idx[t * 4 + q] / (16 / groups));
        most = std::max(most, touched.size());
      }
      EXPECT_LE(most, static_cast<size_t>(g)) << "groups " << groups;
    }
  }
}

TEST(RouterInvariantsTest, CapacityBoundsAndCounts) {
  std::mt19937_64 rng(std::random_device{}());
  const int64_t t = 32, e = 8, k = 2;
  for (double cf : {0.5, 1.0, 2.0, 8.0}) {
    for (auto policy : {CapacityDropPolicy::kProbs, CapacityDropPolicy::kPosition}) {
      RouterConfig c = Base(e, k);
      c.capacity_factor = cf;
      c.drop_policy = policy;
      const int64_t cap = ExpertCapacity(c, t);
      const int64_t formula = static_cast<int64_t>(std::ceil(double(t * k) / e * cf));
      EXPECT_EQ(cap, formula < t ? formula : -1) << cf;
      auto r = testutil::Route(c, RandomNormal(t * e, rng));
      ASSERT_TRUE(r.status.ok()) << r.status;
      std::vector<int> hist(e, 0);
      int64_t kept = 0;
      for (size_t i = 0; i < r.idx.size(); ++i) {
        if (r.idx[i] >= 0) {
          ++hist[r.idx[i]], ++kept;
          EXPECT_EQ(r.idx[i], r.selected[i]);
        } else {
          EXPECT_EQ(r.probs[i], 0.0);
        }
      }
      EXPECT_EQ(std::vector<int>(r.tokens_per_expert.begin(), r.tokens_per_expert.end()), hist);
      // No padding: <= T·k·cf; padded (Permute pads each expert to C): exactly C·E = T·k·cf here.
      EXPECT_LE(kept, static_cast<int64_t>(std::ceil(t * k * cf)));
      if (cap >= 0) {
        for (int v : hist) EXPECT_LE(v, cap);
        EXPECT_EQ(cap * e, static_cast<int64_t>(t * k * cf));
      } else {
        EXPECT_EQ(kept, t * k);
      }
    }
  }
}

TEST(RouterInvariantsTest, PositionPolicyKeepsEarliestSequencePositions) {
  // All tokens pick experts 0 and 1 (ties to the lower index); capacity keeps the earliest
  // positions: Megatron's seq-major order s·B + b over our batch-major rows b·S + s.
  RouterConfig c = Base(4, 2);
  c.score_function = RouterScoreFunction::kSigmoid;
  c.capacity_factor = 1.0;  // C = ceil(8·2/4) = 4 of 8 tokens
  c.drop_policy = CapacityDropPolicy::kPosition;
  c.seq_length = 4;  // B = 2 sequences
  auto r = testutil::Route(c, std::vector<double>(8 * 4, 0.0));
  ASSERT_TRUE(r.status.ok());
  // Kept tokens: positions s = 0, 1 of both sequences: rows 0, 1, 4, 5.
  std::vector<int> kept_rows;
  for (int t = 0; t < 8; ++t) {
    if (r.idx[t * 2] >= 0) kept_rows.push_back(t);
  }
  EXPECT_EQ(kept_rows, (std::vector<int>{0, 1, 4, 5}));
  c.seq_length = 0;  // plain row order
  r = testutil::Route(c, std::vector<double>(8 * 4, 0.0));
  kept_rows.clear();
  for (int t = 0; t < 8; ++t) {
    if (r.idx[t * 2] >= 0) kept_rows.push_back(t);
  }
  EXPECT_EQ(kept_rows, (std::vector<int>{0, 1, 2, 3}));
}

TEST(RouterInvariantsTest, ExpertBiasCountsOnlyInTraining) {
  std::mt19937_64 rng(std::random_device{}());
  RouterConfig c = Base(8, 2);
  c.score_function = RouterScoreFunction::kSigmoid;
  c.use_expert_bias = true;
  c.capacity_factor = 0.5;
  const std::vector<float> bias(8, 0.0f);
  std::vector<float> local(8, 1.0f);
  auto r = testutil::Route(c, RandomNormal(16 * 8, rng), bias, &local);
  ASSERT_TRUE(r.status.ok()) << r.status;
  for (int e = 0; e < 8; ++e) EXPECT_EQ(local[e], 1.0f + r.tokens_per_expert[e]);  // after drops
  c.training = false;
  const std::vector<float> before = local;
  r = testutil::Route(c, RandomNormal(16 * 8, rng), bias, &local);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(local, before);
}

TEST(RouterInvariantsTest, ExpertBiasSignRuleAndSelectionOnly) {
  std::vector<float> counts = {10, 2, 6, 6, 0, 12, 6, 6};  // mean 6
  std::vector<float> bias = {0.5f, 0.5f, 0.5f, -1.0f, 0, 0, 0, 0};
  ASSERT_TRUE(UpdateExpertBias(Stream::Cpu(), View(counts, {8}), View(bias, {8}), 0.125f).ok());
  EXPECT_EQ(bias, (std::vector<float>{0.375f, 0.625f, 0.5f, -1.0f, 0.125f, -0.125f, 0, 0}));
  EXPECT_EQ(counts, std::vector<float>(8, 0.0f));
  // A bias changes the selection but never the probabilities of a selected expert.
  RouterConfig c = Base(4, 1);
  c.score_function = RouterScoreFunction::kSigmoid;
  c.use_expert_bias = true;
  const std::vector<double> z = {0.3, 0.1, -0.2, 0.0};
  auto r = testutil::Route(c, z, std::vector<float>{0, 0.5f, 0, 0});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.idx[0], 1);
  EXPECT_DOUBLE_EQ(r.probs[0], 1.0 / (1.0 + std::exp(-0.1)));
}

TEST(RouterInvariantsTest, InputJitterIsDeterministicBoundedAndInvertedByBackward) {
  std::mt19937_64 rng(std::random_device{}());
  const int64_t t = 16, h = 64, n = t * h;
  std::vector<double> xd = RandomNormal(n, rng);
  std::vector<float> x(xd.begin(), xd.end()), y(n), y2(n), dx(n);
  const float eps = 0.01f;
  ASSERT_TRUE(
      ApplyInputJitter(Stream::Cpu(), View(x, {t, h}), eps, 42, 1000, View(y, {t, h})).ok());
  ASSERT_TRUE(
      ApplyInputJitter(Stream::Cpu(), View(x, {t, h}), eps, 42, 1000, View(y2, {t, h})).ok());
  EXPECT_EQ(y, y2);
  double lo = 2, hi = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float u = JitterMultiplier(eps, 42, 1000 + i);
    lo = std::min<double>(lo, u), hi = std::max<double>(hi, u);
    EXPECT_EQ(y[i], x[i] * u);
  }
  EXPECT_GE(lo, 1.0 - eps);
  EXPECT_LT(hi, 1.0 + eps);
  EXPECT_GT(hi - lo, eps);  // actually spread over the interval
  ASSERT_TRUE(
      ApplyInputJitter(Stream::Cpu(), View(x, {t, h}), eps, 43, 1000, View(y2, {t, h})).ok());
  EXPECT_NE(y, y2);
  // Backward: dx = dy ⊙ u with the same u (here dy = x, so dx == y).
  ASSERT_TRUE(
      InputJitterBackward(Stream::Cpu(), View(x, {t, h}), eps, 42, 1000, View(dx, {t, h})).ok());
  EXPECT_EQ(dx, y);
  std::vector<BF16> xb(n), yb(n);
  for (int64_t i = 0; i < n; ++i) xb[i] = BF16::FromFloat(x[i]);
  Tensor xbt(DType::kBF16, {t, h}, Device::Cpu(), xb.data());
  Tensor ybt(DType::kBF16, {t, h}, Device::Cpu(), yb.data());
  ASSERT_TRUE(ApplyInputJitter(Stream::Cpu(), xbt, eps, 42, 1000, ybt).ok());
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(yb[i].bits,
              BF16::FromFloat(xb[i].ToFloat() * JitterMultiplier(eps, 42, 1000 + i)).bits);
  }
}

TEST(RouterInvariantsTest, GatingForwardAndBackwardMatchNaive) {
  std::mt19937_64 rng(std::random_device{}());
  const int64_t t = 6, h = 5, e = 4;
  const std::vector<double> xd = RandomNormal(t * h, rng), wd = RandomNormal(e * h, rng);
  const std::vector<double> gd = RandomNormal(t * e, rng);
  std::vector<float> x(xd.begin(), xd.end()), w(wd.begin(), wd.end()), g(gd.begin(), gd.end());
  std::vector<float> logits(t * e), dx(t * h), dw(e * h, 1.0f);
  ASSERT_TRUE(
      RouterGatingForward(Stream::Cpu(), View(x, {t, h}), View(w, {e, h}), View(logits, {t, e}))
          .ok());
  ASSERT_TRUE(RouterGatingBackward(Stream::Cpu(), View(g, {t, e}), View(x, {t, h}), View(w, {e, h}),
                                   Tensor(), View(dx, {t, h}), View(dw, {e, h}), 1.0f)
                  .ok());
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < e; ++j) {
      double want = 0;
      for (int64_t q = 0; q < h; ++q) want += double(x[i * h + q]) * w[j * h + q];
      EXPECT_NEAR(logits[i * e + j], want, 1e-5);
    }
    for (int64_t q = 0; q < h; ++q) {
      double want = 0;
      for (int64_t j = 0; j < e; ++j) want += double(g[i * e + j]) * w[j * h + q];
      EXPECT_NEAR(dx[i * h + q], want, 1e-5);
    }
  }
  for (int64_t j = 0; j < e; ++j) {
    for (int64_t q = 0; q < h; ++q) {
      double want = 1.0;  // dw_beta = 1 accumulates
      for (int64_t i = 0; i < t; ++i) want += double(g[i * e + j]) * x[i * h + q];
      EXPECT_NEAR(dw[j * h + q], want, 1e-5);
    }
  }
  // bf16 inputs need the bf16 copy of dlogits.
  std::vector<BF16> xb(t * h), wb(e * h);
  Tensor xbt(DType::kBF16, {t, h}, Device::Cpu(), xb.data());
  Tensor wbt(DType::kBF16, {e, h}, Device::Cpu(), wb.data());
  const absl::Status s = RouterGatingBackward(Stream::Cpu(), View(g, {t, e}), xbt, wbt, Tensor(),
                                              View(dx, {t, h}), View(dw, {e, h}), 0.0f);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("dlogits_lowp"));
}

}  // namespace
}  // namespace switchyard::kernels
