// CPU reference of the aux and z losses (aux_loss.h) against the naive fp64 formulas
// (router_naive.h), finite-difference gradients, and the §6 invariants: uniform probabilities give
// exactly the coefficient, seq_aux_loss with one sequence equals aux_loss, per-sequence
// decomposition, global == aux at DP = 1 and the DP gradient fix, several losses at once.
#include "kernels/moe/aux_loss.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/moe/router.h"
#include "kernels/moe/router_naive.h"
#include "kernels/moe/router_test_util.h"

namespace switchyard::kernels {
namespace {

using testutil::RandomNormal;

RouterConfig AllLosses(RouterScoreFunction f, int64_t seq_length) {
  RouterConfig c;
  c.num_experts = 8;
  c.topk = 2;
  c.score_function = f;
  c.seq_length = seq_length;
  c.aux_losses = {{AuxLossType::kAuxLoss, 0.1},
                  {AuxLossType::kSeqAuxLoss, 0.7},
                  {AuxLossType::kGlobalAuxLoss, 0.3}};
  c.z_loss_coeff = 1e-2;
  return c;
}

std::vector<float> SomeGlobalCounts(std::mt19937_64& rng) {
  std::vector<float> g(8);
  for (float& v : g) v = static_cast<float>(rng() % 40);
  return g;
}

class AuxLossScoreTest : public ::testing::TestWithParam<RouterScoreFunction> {};

TEST_P(AuxLossScoreTest, MatchesNaiveFp64AndFp32) {
  std::mt19937_64 rng(std::random_device{}());
  const RouterConfig c = AllLosses(GetParam(), 6);
  const int64_t t = 24;
  const std::vector<double> z = RandomNormal(t * 8, rng, 2.0);
  const std::vector<float> gc = SomeGlobalCounts(rng);
  AuxLossNorms norms;
  norms.global_num_tokens = 3 * t;
  const std::vector<double> want =
      naive::AuxLosses(c, z, t, std::vector<double>(gc.begin(), gc.end()), 3.0 * t);
  auto got = testutil::Aux(c, z, norms, gc);
  ASSERT_TRUE(got.status.ok()) << got.status;
  std::vector<float> z32(z.begin(), z.end());
  const std::vector<double> want32 =
      naive::AuxLosses(c, std::vector<double>(z32.begin(), z32.end()), t,
                       std::vector<double>(gc.begin(), gc.end()), 3.0 * t);
  auto got32 = testutil::Aux(c, z32, norms, gc);
  ASSERT_TRUE(got32.status.ok()) << got32.status;
  ASSERT_EQ(got.losses.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const double rel64 = std::fabs(got.losses[i] - want[i]) / std::fabs(want[i]);
    const double rel32 = std::fabs(got32.losses[i] - want32[i]) / std::fabs(want32[i]);
    std::printf(
        "loss[%zu] = %.9g (naive %.9g): rel err f64 %.2g (tol 1e-12), f32 %.2g (tol 1e-6)\n", i,
        got.losses[i], want[i], rel64, rel32);
    EXPECT_LT(rel64, 1e-12);
    EXPECT_LT(rel32, 1e-6);
  }
}

TEST_P(AuxLossScoreTest, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(std::random_device{}());
  const RouterConfig c = AllLosses(GetParam(), 6);
  const int64_t t = 12;
  std::vector<double> z = RandomNormal(t * 8, rng, 2.0);
  const std::vector<float> gc = SomeGlobalCounts(rng);
  AuxLossNorms norms;
  norms.global_num_tokens = 2 * t;
  auto base = testutil::Aux(c, z, norms, gc);
  ASSERT_TRUE(base.status.ok()) << base.status;
  const std::vector<double> dz = testutil::AuxBackward(c, z, base, 1.0, std::vector<double>(t * 8));
  ASSERT_EQ(dz.size(), z.size());
  auto total = [&](const std::vector<double>& zz) {
    auto r = testutil::Aux(c, zz, norms, gc);
    EXPECT_EQ(r.counts, base.counts);  // counts are constants (the aux top-k does not move)
    double l = 0;
    for (double v : r.losses) l += v;
    return l;
  };
  const double h = 1e-5;
  double max_err = 0, max_grad = 0;
  for (size_t i = 0; i < z.size(); ++i) {
    const double z0 = z[i];
    z[i] = z0 + h;
    const double lp = total(z);
    z[i] = z0 - h;
    const double lm = total(z);
    z[i] = z0;
    max_err = std::max(max_err, std::fabs((lp - lm) / (2 * h) - dz[i]));
    max_grad = std::max(max_grad, std::fabs(dz[i]));
  }
  std::printf(
      "aux+seq+global+z dlogits vs central differences: max abs err %.2g (max |grad| "
      "%.2g, tol 1e-9)\n",
      max_err, max_grad);
  EXPECT_LT(max_err, 1e-9);
  EXPECT_GT(max_grad, 1e-4);
}

TEST_P(AuxLossScoreTest, UniformProbabilitiesGiveExactlyTheCoefficient) {
  // Zero router weights -> equal logits -> P = 1/E (Megatron's test_force_balanced_aux_loss).
  std::mt19937_64 rng(std::random_device{}());
  const int64_t t = 64, h = 16;
  const std::vector<double> x = RandomNormal(t * h, rng);
  const std::vector<double> w(8 * h, 0.0);
  std::vector<double> z(t * 8, -1.0);
  ASSERT_TRUE(RouterGatingForward(Stream::Cpu(), testutil::View(x, {t, h}),
                                  testutil::View(w, {8, h}), testutil::View(z, {t, 8}))
                  .ok());
  for (double coeff : {1.0, 0.1}) {
    RouterConfig c = AllLosses(GetParam(), 16);
    for (AuxLossTerm& term : c.aux_losses) term.coeff = coeff;
    RouterConfig aux_only = c;  // global counts: this batch's, N_g = T
    aux_only.aux_losses = {c.aux_losses[0]};
    auto r = testutil::Aux(aux_only, z);
    ASSERT_TRUE(r.status.ok()) << r.status;
    AuxLossNorms norms;
    norms.global_num_tokens = t;
    r = testutil::Aux(c, z, norms, r.counts);
    ASSERT_TRUE(r.status.ok()) << r.status;
    for (int i = 0; i < 3; ++i) EXPECT_EQ(r.losses[i], coeff) << "term " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(ScoreFunctions, AuxLossScoreTest,
                         ::testing::Values(RouterScoreFunction::kSoftmax,
                                           RouterScoreFunction::kSigmoid));

RouterConfig Only(AuxLossType type, int64_t seq_length) {
  RouterConfig c;
  c.num_experts = 8;
  c.topk = 2;
  c.seq_length = seq_length;
  c.aux_losses = {{type, 0.1}};
  return c;
}

TEST(AuxLossTest, SeqAuxWithOneSequenceEqualsAuxExactly) {
  std::mt19937_64 rng(std::random_device{}());
  const int64_t t = 40;
  const std::vector<double> z = RandomNormal(t * 8, rng);
  auto aux = testutil::Aux(Only(AuxLossType::kAuxLoss, 0), z);
  auto seq = testutil::Aux(Only(AuxLossType::kSeqAuxLoss, t), z);
  ASSERT_TRUE(aux.status.ok() && seq.status.ok());
  EXPECT_EQ(aux.losses, seq.losses);
  EXPECT_EQ(aux.grad_weights, seq.grad_weights);
  std::vector<double> zero(t * 8, 0.0);
  EXPECT_EQ(testutil::AuxBackward(Only(AuxLossType::kAuxLoss, 0), z, aux, 1.0, zero),
            testutil::AuxBackward(Only(AuxLossType::kSeqAuxLoss, t), z, seq, 1.0, zero));
}

TEST(AuxLossTest, SeqAuxIsTheMeanOverSequences) {
  // Megatron's test_seq_aux_loss with B = 2: loss = mean of per-sequence aux losses and
  // 2·grad(seq) = [grad(aux, seq 0); grad(aux, seq 1)].
  std::mt19937_64 rng(std::random_device{}());
  const int64_t s = 20;
  const std::vector<double> z = RandomNormal(2 * s * 8, rng);
  const RouterConfig seq_c = Only(AuxLossType::kSeqAuxLoss, s);
  auto seq = testutil::Aux(seq_c, z);
  ASSERT_TRUE(seq.status.ok()) << seq.status;
  const std::vector<double> dseq =
      testutil::AuxBackward(seq_c, z, seq, 1.0, std::vector<double>(2 * s * 8));
  double mean = 0;
  for (int b = 0; b < 2; ++b) {
    const std::vector<double> zb(z.begin() + b * s * 8, z.begin() + (b + 1) * s * 8);
    auto aux = testutil::Aux(Only(AuxLossType::kAuxLoss, 0), zb);
    mean += aux.losses[0] / 2;
    const std::vector<double> daux = testutil::AuxBackward(Only(AuxLossType::kAuxLoss, 0), zb, aux,
                                                           1.0, std::vector<double>(s * 8));
    for (int64_t i = 0; i < s * 8; ++i) EXPECT_NEAR(2 * dseq[b * s * 8 + i], daux[i], 1e-15);
  }
  EXPECT_NEAR(seq.losses[0], mean, 1e-15);
}

TEST(AuxLossTest, GlobalEqualsAuxAtDp1AndScalesItsGradientByDp) {
  std::mt19937_64 rng(std::random_device{}());
  const int64_t t = 32;
  const std::vector<double> z = RandomNormal(t * 8, rng);
  auto aux = testutil::Aux(Only(AuxLossType::kAuxLoss, 0), z);
  ASSERT_TRUE(aux.status.ok());
  const RouterConfig gc = Only(AuxLossType::kGlobalAuxLoss, 0);
  AuxLossNorms norms;
  norms.global_num_tokens = t;
  auto global = testutil::Aux(gc, z, norms, aux.counts);
  ASSERT_TRUE(global.status.ok()) << global.status;
  EXPECT_EQ(global.losses, aux.losses);
  EXPECT_EQ(global.grad_weights, aux.grad_weights);
  norms.dp_size = 2;  // value stays Megatron's; the gradient is dp_size × (issue #3672 fix)
  auto global2 = testutil::Aux(gc, z, norms, aux.counts);
  EXPECT_EQ(global2.losses, aux.losses);
  for (size_t i = 0; i < aux.grad_weights.size(); ++i) {
    EXPECT_EQ(global2.grad_weights[i], 2 * aux.grad_weights[i]);
  }
}

TEST(AuxLossTest, SeveralLossesAtOnceAddUp) {
  std::mt19937_64 rng(std::random_device{}());
  const int64_t t = 24;
  const std::vector<double> z = RandomNormal(t * 8, rng);
  RouterConfig all = AllLosses(RouterScoreFunction::kSoftmax, 8);
  all.aux_losses[0].coeff = 0.5, all.aux_losses[1].coeff = 1.0, all.aux_losses[2].coeff = 2.0;
  const std::vector<float> gc(8, 6.0f);
  AuxLossNorms norms;
  norms.global_num_tokens = t;
  auto both = testutil::Aux(all, z, norms, gc);
  ASSERT_TRUE(both.status.ok()) << both.status;
  std::vector<double> base = RandomNormal(t * 8, rng);  // backward ADDS to dlogits
  std::vector<double> sum = base;
  for (size_t i = 0; i < all.aux_losses.size(); ++i) {
    RouterConfig one = all;
    one.aux_losses = {all.aux_losses[i]};
    one.z_loss_coeff = i == 0 ? all.z_loss_coeff : 0.0;
    auto r = testutil::Aux(one, z, norms, gc);
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_NEAR(r.losses[0], both.losses[i], 1e-15);
    sum = testutil::AuxBackward(one, z, r, 0.25, sum);
  }
  const std::vector<double> got = testutil::AuxBackward(all, z, both, 0.25, base);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], sum[i], 1e-15);
}

// The router's selection replaces the losses' own top-k only where they are the same
// (AuxTopkIsRouterTopk); then every statistic and loss is bitwise the same, including logits with
// many exact ties (quantised), f64 logits and a capacity limit that drops slots (selected_idx is
// the selection before dropping). Elsewhere a given selection is ignored.
template <typename Real>
void ExpectSameWithRouterSelection(RouterConfig c, std::mt19937_64& rng, bool ties) {
  const int64_t t = 48, e = c.num_experts;
  std::vector<Real> z(t * e);
  for (size_t i = 0; i < z.size(); ++i) {
    const double v = std::normal_distribution<double>(0.0, 2.0)(rng);
    z[i] = static_cast<Real>(ties ? std::round(v) * 0.5 : v);  // ties: 9 or so distinct values
  }
  const testutil::Routed<Real> routed = testutil::Route(c, z);
  ASSERT_TRUE(routed.status.ok()) << routed.status;
  const std::vector<float> gc(e, 3.0f);
  AuxLossNorms norms;
  norms.global_num_tokens = t;
  const auto own = testutil::Aux(c, z, norms, gc);
  ASSERT_TRUE(own.status.ok()) << own.status;
  const auto from_router = testutil::Aux(c, z, norms, gc, &routed.selected);
  ASSERT_TRUE(from_router.status.ok()) << from_router.status;
  EXPECT_EQ(from_router.counts, own.counts);
  EXPECT_EQ(from_router.prob_sums, own.prob_sums);
  EXPECT_EQ(from_router.lse_sq_sum, own.lse_sq_sum);
  EXPECT_EQ(from_router.losses, own.losses);
  EXPECT_EQ(from_router.grad_weights, own.grad_weights);
}

TEST(AuxLossTest, RouterSelectionGivesTheSameCountsWhereItIsTheLossesTopk) {
  std::mt19937_64 rng(std::random_device{}());
  for (const int e : {8, 64, 160}) {
    for (const int k : {2, 8}) {
      for (const bool ties : {false, true}) {
        for (const double capacity : {0.0, 0.5}) {
          RouterConfig c = AllLosses(RouterScoreFunction::kSoftmax, 12);
          c.num_experts = e;
          c.topk = k;
          c.capacity_factor = capacity;
          ASSERT_TRUE(c.Validate().ok()) << c.Validate();
          ASSERT_TRUE(AuxTopkIsRouterTopk(c));
          SCOPED_TRACE(testing::Message()
                       << "E " << e << " k " << k << " ties " << ties << " capacity " << capacity);
          ExpectSameWithRouterSelection<float>(c, rng, ties);
          ExpectSameWithRouterSelection<double>(c, rng, ties);
        }
      }
    }
  }
}

TEST(AuxLossTest, RouterSelectionIsIgnoredWhereTheRouterSelectsOtherwise) {
  std::mt19937_64 rng(std::random_device{}());
  RouterConfig pre = AllLosses(RouterScoreFunction::kSoftmax, 0);
  pre.aux_losses = {{AuxLossType::kAuxLoss, 0.1}};
  pre.pre_softmax = true;
  RouterConfig sigmoid = pre;
  sigmoid.pre_softmax = false;
  sigmoid.score_function = RouterScoreFunction::kSigmoid;
  RouterConfig groups = pre;
  groups.pre_softmax = false;
  groups.num_groups = 4;
  groups.group_topk = 2;
  for (const RouterConfig& c : {pre, sigmoid, groups}) {
    ASSERT_TRUE(c.Validate().ok()) << c.Validate();
    EXPECT_FALSE(AuxTopkIsRouterTopk(c));
    const std::vector<double> z = RandomNormal(24 * 8, rng);
    const std::vector<int32_t> wrong(24 * 2, 0);  // would count expert 0 twice per token
    const auto own = testutil::Aux(c, z);
    const auto given = testutil::Aux(c, z, {}, {}, &wrong);
    ASSERT_TRUE(given.status.ok()) << given.status;
    EXPECT_EQ(given.counts, own.counts);
    EXPECT_EQ(given.losses, own.losses);
  }
}

TEST(AuxLossTest, RejectsABadRouterSelection) {
  std::mt19937_64 rng(std::random_device{}());
  const RouterConfig c = Only(AuxLossType::kAuxLoss, 0);
  const std::vector<double> z = RandomNormal(10 * 8, rng);
  std::vector<int32_t> sel(10 * 2, 1);
  sel[7] = 8;  // token 3, slot 1: not an expert
  auto r = testutil::Aux(c, z, {}, {}, &sel);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status.message()),
              ::testing::HasSubstr("aux_loss.selected_idx[3, 1] (8) must be in [0, 8)"));
  EXPECT_THAT(r.counts, ::testing::Each(-7.0f));  // nothing written
  sel.resize(9 * 2, 1);                           // 9 tokens' selection for 10 tokens
  r = testutil::Aux(c, z, {}, {}, &sel);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status.message()), ::testing::HasSubstr("aux_loss.selected_idx"));
}

TEST(AuxLossTest, RejectsBadInputs) {
  std::vector<double> z(10 * 8, 0.0);
  auto r = testutil::Aux(Only(AuxLossType::kSeqAuxLoss, 4), z);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status.message()),
              ::testing::HasSubstr("multiple of router.seq_length"));
  r = testutil::Aux(Only(AuxLossType::kGlobalAuxLoss, 0), z);
  EXPECT_THAT(std::string(r.status.message()), ::testing::HasSubstr("global_counts"));
  AuxLossNorms norms;  // counts given but no N_g
  r = testutil::Aux(Only(AuxLossType::kGlobalAuxLoss, 0), z, norms, std::vector<float>(8, 1.0f));
  EXPECT_THAT(std::string(r.status.message()), ::testing::HasSubstr("global_num_tokens"));
}

}  // namespace
}  // namespace switchyard::kernels
