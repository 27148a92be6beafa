// File: kernels/moe/ep_routing_test.cc
//
// RouteToRanks / LocalizeRouting on the CPU: a hand-checked case (which ranks each token goes to,
// the packed routing row, the localized ids), the round trip RouteToRanks -> LocalizeRouting on
// every rank giving back exactly the slots of that rank's experts, and the argument rules.
#include "kernels/moe/ep_routing.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "absl/strings/match.h"

namespace switchyard::kernels {
namespace {

template <typename T>
Tensor View(DType dtype, std::vector<T>& v, std::vector<int64_t> shape) {
  return Tensor(dtype, std::move(shape), Device::Cpu(), v.data());
}

TEST(EpRoutingTest, HandCheckedCase) {
  // 3 tokens, k = 3, 8 experts over 4 EP ranks (2 local experts each).
  std::vector<int32_t> idx = {0,  1,  6,    // ranks 0 (twice) and 3
                              -1, 5,  4,    // rank 2 (twice), one dropped slot
                              -1, -1, -1};  // nothing
  std::vector<float> probs = {0.5f, 0.25f, 0.125f, 0.7f, 0.2f, 0.1f, 1.f, 2.f, 3.f};
  std::vector<int32_t> ranks(3 * 4, 99);
  std::vector<float> meta(3 * 6, -99.f);
  ASSERT_TRUE(RouteToRanks(Stream::Cpu(), View(DType::kI32, idx, {3, 3}),
                           View(DType::kF32, probs, {3, 3}), 8, 4, View(DType::kI32, ranks, {3, 4}),
                           View(DType::kF32, meta, {3, 6}))
                  .ok());
  EXPECT_EQ(ranks, (std::vector<int32_t>{0, -1, -1, 3, -1, -1, 2, -1, -1, -1, -1, -1}));
  EXPECT_EQ(meta, (std::vector<float>{0, 1, 6, 0.5f, 0.25f, 0.125f, -1, 5, 4, 0.7f, 0.2f, 0.1f, -1,
                                      -1, -1, 1.f, 2.f, 3.f}));
  // Rank 2 (experts 4, 5) localizes the rows it would receive.
  std::vector<int32_t> local(3 * 3, 99);
  std::vector<float> lp(3 * 3, -99.f);
  ASSERT_TRUE(LocalizeRouting(Stream::Cpu(), View(DType::kF32, meta, {3, 6}), 4, 2,
                              View(DType::kI32, local, {3, 3}), View(DType::kF32, lp, {3, 3}))
                  .ok());
  EXPECT_EQ(local, (std::vector<int32_t>{-1, -1, -1, -1, 1, 0, -1, -1, -1}));
  EXPECT_EQ(lp, probs);
}

TEST(EpRoutingTest, RoundTripGivesEachRankItsSlots) {
  std::mt19937 rng(std::random_device{}());
  const int64_t t = 37, k = 4, e = 16, ep = 4, local = e / ep;
  std::vector<int32_t> idx;
  std::vector<double> probs;
  std::uniform_real_distribution<double> p(0.0, 1.0);
  for (int64_t i = 0; i < t; ++i) {
    std::vector<int32_t> perm(e);
    for (int32_t j = 0; j < e; ++j) perm[j] = j;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t s = 0; s < k; ++s) {
      idx.push_back(p(rng) < 0.1 ? -1 : perm[s]);
      probs.push_back(p(rng));
    }
  }
  std::vector<int32_t> ranks(t * ep);
  std::vector<double> meta(t * 2 * k);
  ASSERT_TRUE(RouteToRanks(Stream::Cpu(), View(DType::kI32, idx, {t, k}),
                           View(DType::kF64, probs, {t, k}), e, ep,
                           View(DType::kI32, ranks, {t, ep}), View(DType::kF64, meta, {t, 2 * k}))
                  .ok());
  for (int64_t j = 0; j < ep; ++j) {
    std::vector<int32_t> li(t * k);
    std::vector<double> lp(t * k);
    ASSERT_TRUE(LocalizeRouting(Stream::Cpu(), View(DType::kF64, meta, {t, 2 * k}), j * local,
                                local, View(DType::kI32, li, {t, k}), View(DType::kF64, lp, {t, k}))
                    .ok());
    for (int64_t i = 0; i < t; ++i) {
      bool any = false;
      for (int64_t s = 0; s < k; ++s) {
        const int32_t g = idx[i * k + s];
        const bool mine = g >= 0 && g / local == j;
        any = any || mine;
        EXPECT_EQ(li[i * k + s], mine ? g - j * local : -1) << "token " << i << " slot " << s;
        EXPECT_EQ(lp[i * k + s], probs[i * k + s]);  // bit for bit
      }
      EXPECT_EQ(ranks[i * ep + j], any ? j : -1) << "token " << i << " rank " << j;
    }
  }
}

TEST(EpRoutingTest, RejectsBadArguments) {
  std::vector<int32_t> idx = {0, 9}, ranks(2), li(2);
  std::vector<float> probs = {1, 1}, meta(4), lp(2);
  const absl::Status out_of_range =
      RouteToRanks(Stream::Cpu(), View(DType::kI32, idx, {1, 2}), View(DType::kF32, probs, {1, 2}),
                   8, 2, View(DType::kI32, ranks, {1, 2}), View(DType::kF32, meta, {1, 4}));
  EXPECT_EQ(out_of_range.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(out_of_range.message(), "outside [-1, num_experts = 8)"))
      << out_of_range;
  const absl::Status indivisible =
      RouteToRanks(Stream::Cpu(), View(DType::kI32, idx, {1, 2}), View(DType::kF32, probs, {1, 2}),
                   9, 2, View(DType::kI32, ranks, {1, 2}), View(DType::kF32, meta, {1, 4}));
  EXPECT_TRUE(absl::StrContains(indivisible.message(), "multiple of ep_size (2)")) << indivisible;
  const absl::Status odd =
      LocalizeRouting(Stream::Cpu(), View(DType::kF32, meta, {1, 3}), 0, 4,
                      View(DType::kI32, li, {1, 1}), View(DType::kF32, lp, {1, 1}));
  EXPECT_EQ(odd.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(odd.message(), "must be [R, 2k]")) << odd;
}

}  // namespace
}  // namespace switchyard::kernels
