// CPU reference of RoPE: a hand-computed rotate_half case, a naive fp64 formula, the backward as
// the adjoint of the forward in fp64, pair norms, round trips, in-place use, positions t % S and
// argument errors; context-parallel positions (chunks r and 2·CP−1−r of the whole sequence).
#include "kernels/attention/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

Tensor T64(std::vector<double>& v, int64_t t_n, int64_t heads, int64_t d) {
  return Tensor(DType::kF64, {t_n, heads, d}, Device::Cpu(), v.data());
}

std::vector<double> Random(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

TEST(RopeCpuTest, RotateHalfConventionByHand) {
  // D = 4, base 10000: inv_freq = {1, 0.01}; row 1 of S = 2 has position 1, row 2 position 0.
  std::vector<double> x = {0, 0, 0, 0, 1, 2, 3, 4, 1, 2, 3, 4}, y(12);
  ASSERT_TRUE(RopeForward(Stream::Cpu(), T64(x, 3, 1, 4), 2, 10000.0f, T64(y, 3, 1, 4)).ok());
  const double c0 = std::cos(1.0), s0 = std::sin(1.0), c1 = std::cos(double{0.01f}),
               s1 = std::sin(double{0.01f});
  EXPECT_NEAR(y[4], 1 * c0 - 3 * s0, 1e-12);
  EXPECT_NEAR(y[5], 2 * c1 - 4 * s1, 1e-12);
  EXPECT_NEAR(y[6], 3 * c0 + 1 * s0, 1e-12);
  EXPECT_NEAR(y[7], 4 * c1 + 2 * s1, 1e-12);
  for (int i = 8; i < 12; ++i) EXPECT_EQ(y[i], x[i]);  // position 0: identity
}

TEST(RopeCpuTest, ForwardMatchesNaiveFormula) {
  std::mt19937_64 rng(1);
  const int64_t t_n = 12, heads = 3, d = 16, s_len = 5;
  const float base = 1e6f;  // Qwen3's rotary_base
  std::vector<float> x(t_n * heads * d), y(x.size());
  Tensor tx(DType::kF32, {t_n, heads, d}, Device::Cpu(), x.data());
  testing::FillRandom(tx, rng);
  ASSERT_TRUE(RopeForward(Stream::Cpu(), tx, s_len, base,
                          Tensor(DType::kF32, {t_n, heads, d}, Device::Cpu(), y.data()))
                  .ok());
  double num = 0, den = 0;
  for (int64_t t = 0; t < t_n; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < d / 2; ++i) {
        const double theta = double(t % s_len) * std::pow(double(base), -2.0 * i / d);
        const int64_t o = (t * heads + h) * d;
        const double a = x[o + i], b = x[o + d / 2 + i];
        const double ra = a * std::cos(theta) - b * std::sin(theta);
        const double rb = b * std::cos(theta) + a * std::sin(theta);
        num +=
            (y[o + i] - ra) * (y[o + i] - ra) + (y[o + d / 2 + i] - rb) * (y[o + d / 2 + i] - rb);
        den += ra * ra + rb * rb;
      }
    }
  }
  const double err = std::sqrt(num / den);
  std::printf("RoPE forward f32 [%lld, %lld, %lld] S=%lld vs naive fp64: rel err %.3g (tol 1e-6)\n",
              (long long)t_n, (long long)heads, (long long)d, (long long)s_len, err);
  EXPECT_LT(err, 1e-6);
}

TEST(RopeCpuTest, BackwardIsAdjointAndRotationsPreserveNorms) {
  std::mt19937_64 rng(2);
  const int64_t t_n = 10, heads = 2, d = 64, s_len = 7, n = t_n * heads * d;
  std::vector<double> x = Random(n, rng), dy = Random(n, rng), rx(n), rtdy(n), back(n);
  ASSERT_TRUE(
      RopeForward(Stream::Cpu(), T64(x, t_n, heads, d), s_len, 10000.0f, T64(rx, t_n, heads, d))
          .ok());
  ASSERT_TRUE(
      RopeBackward(Stream::Cpu(), T64(dy, t_n, heads, d), s_len, 10000.0f, T64(rtdy, t_n, heads, d))
          .ok());
  ASSERT_TRUE(
      RopeBackward(Stream::Cpu(), T64(rx, t_n, heads, d), s_len, 10000.0f, T64(back, t_n, heads, d))
          .ok());
  double lhs = 0, rhs = 0, scale = 0, norm_err = 0, round_trip = 0;
  for (int64_t k = 0; k < n; ++k) {
    lhs += dy[k] * rx[k];
    rhs += rtdy[k] * x[k];
    scale += std::abs(dy[k] * rx[k]);
    round_trip = std::max(round_trip, std::abs(back[k] - x[k]));
  }
  for (int64_t r = 0; r < t_n * heads; ++r) {
    for (int64_t i = 0; i < d / 2; ++i) {
      const int64_t a = r * d + i, b = a + d / 2;
      const double n0 = x[a] * x[a] + x[b] * x[b], n1 = rx[a] * rx[a] + rx[b] * rx[b];
      norm_err = std::max(norm_err, std::abs(n1 - n0) / n0);
    }
  }
  const double adj = std::abs(lhs - rhs) / scale;
  std::printf(
      "RoPE fp64: |<dy,Rx> - <R^T dy,x>| / sum|dy*Rx| = %.3g (tol 1e-14); max pair-norm rel "
      "change %.3g (tol 1e-14); max |R^T R x - x| %.3g (tol 1e-14)\n",
      adj, norm_err, round_trip);
  EXPECT_LT(adj, 1e-14);
  EXPECT_LT(norm_err, 1e-14);
  EXPECT_LT(round_trip, 1e-14);
}

TEST(RopeCpuTest, InPlaceAndPositionsWrapEverySequence) {
  std::mt19937_64 rng(3);
  const int64_t s_len = 4, heads = 2, d = 8, per_seq = s_len * heads * d;
  std::vector<double> one = Random(per_seq, rng), x(2 * per_seq), y(2 * per_seq);
  std::copy(one.begin(), one.end(), x.begin());
  std::copy(one.begin(), one.end(), x.begin() + per_seq);  // two identical sequences
  ASSERT_TRUE(RopeForward(Stream::Cpu(), T64(x, 2 * s_len, heads, d), s_len, 500000.0f,
                          T64(y, 2 * s_len, heads, d))
                  .ok());
  for (int64_t k = 0; k < per_seq; ++k) EXPECT_EQ(y[k], y[per_seq + k]);
  ASSERT_TRUE(RopeForward(Stream::Cpu(), T64(x, 2 * s_len, heads, d), s_len, 500000.0f,
                          T64(x, 2 * s_len, heads, d))
                  .ok());
  EXPECT_EQ(x, y);
}

TEST(RopeCpuTest, RejectsBadArguments) {
  std::vector<float> x(2 * 3 * 6), odd(2 * 3 * 5);
  const Device cpu = Device::Cpu();
  Tensor tx(DType::kF32, {2, 3, 6}, cpu, x.data());
  EXPECT_EQ(RopeForward(Stream::Cpu(), Tensor(DType::kF32, {2, 3, 5}, cpu, odd.data()), 2, 1e4f,
                        Tensor(DType::kF32, {2, 3, 5}, cpu, odd.data()))
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RopeForward(Stream::Cpu(), tx, 0, 1e4f, tx).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RopeForward(Stream::Cpu(), tx, 2, -1.0f, tx).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RopeBackward(Stream::Cpu(), tx, 2, 1e4f, Tensor(DType::kBF16, {2, 3, 6}, cpu, x.data()))
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RopeForward(Stream::Cpu(), Tensor(DType::kF32, {6, 6}, cpu, x.data()), 2, 1e4f,
                        Tensor(DType::kF32, {6, 6}, cpu, x.data()))
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// The load-balanced chunk order of megatron_parallel.md §2.1: S = 16, CP = 2 -> 4 chunks of 4;
// rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2. CP = 4 -> 8 chunks of 2.
TEST(RopeCpuTest, CpGlobalPositionByHand) {
  std::vector<int64_t> r0, r1;
  for (int64_t i = 0; i < 8; ++i) {
    r0.push_back(CpGlobalPosition(i, 8, 2, 0));
    r1.push_back(CpGlobalPosition(i, 8, 2, 1));
  }
  EXPECT_EQ(r0, (std::vector<int64_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(r1, (std::vector<int64_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  std::vector<int64_t> r2;
  for (int64_t i = 0; i < 4; ++i) r2.push_back(CpGlobalPosition(i, 4, 4, 2));
  EXPECT_EQ(r2, (std::vector<int64_t>{4, 5, 10, 11}));
  // Every position of the whole sequence is held by exactly one (rank, local index).
  std::vector<int> seen(16, 0);
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t i = 0; i < 4; ++i) ++seen[CpGlobalPosition(i, 4, 4, r)];
  }
  for (int n : seen) EXPECT_EQ(n, 1);
  EXPECT_EQ(CpGlobalPosition(5, 8, 1, 0), 5);  // CP = 1: the identity
}

// A CP rank's rotation of its two chunks equals the whole sequence's rotation of those rows
// (exactly: same fp32 angle), for every rank, CP in {2, 4}, two sequences.
TEST(RopeCpuTest, ContextParallelChunksMatchTheWholeSequence) {
  std::mt19937_64 rng(5);
  const int64_t b_n = 2, s_len = 16, heads = 2, d = 8;
  std::vector<double> x = Random(b_n * s_len * heads * d, rng), y(x.size());
  ASSERT_TRUE(RopeForward(Stream::Cpu(), T64(x, b_n * s_len, heads, d), s_len, 1e4f,
                          T64(y, b_n * s_len, heads, d))
                  .ok());
  for (int64_t cp : {2, 4}) {
    const int64_t local = s_len / cp, row = heads * d;
    for (int64_t r = 0; r < cp; ++r) {
      std::vector<double> lx(b_n * local * row), ly(lx.size()), back(lx.size());
      for (int64_t b = 0; b < b_n; ++b) {
        for (int64_t i = 0; i < local; ++i) {
          const int64_t g = CpGlobalPosition(i, local, cp, r);
          for (int64_t e = 0; e < row; ++e) {
            lx[(b * local + i) * row + e] = x[(b * s_len + g) * row + e];
          }
        }
      }
      ASSERT_TRUE(RopeForward(Stream::Cpu(), T64(lx, b_n * local, heads, d), local, 1e4f,
                              T64(ly, b_n * local, heads, d), RopeCp{cp, r})
                      .ok());
      ASSERT_TRUE(RopeBackward(Stream::Cpu(), T64(ly, b_n * local, heads, d), local, 1e4f,
                               T64(back, b_n * local, heads, d), RopeCp{cp, r})
                      .ok());
      for (int64_t b = 0; b < b_n; ++b) {
        for (int64_t i = 0; i < local; ++i) {
          const int64_t g = CpGlobalPosition(i, local, cp, r);
          for (int64_t e = 0; e < row; ++e) {
            ASSERT_EQ(ly[(b * local + i) * row + e], y[(b * s_len + g) * row + e])
                << "CP " << cp << " rank " << r << " b " << b << " i " << i;
            ASSERT_NEAR(back[(b * local + i) * row + e], lx[(b * local + i) * row + e], 1e-12);
          }
        }
      }
    }
  }
  std::vector<double> odd(3 * 2 * 8);
  const absl::Status st =
      RopeForward(Stream::Cpu(), T64(odd, 3, 2, 8), 3, 1e4f, T64(odd, 3, 2, 8), RopeCp{2, 0});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("must be even"), std::string::npos) << st;
  EXPECT_EQ(RopeForward(Stream::Cpu(), T64(odd, 3, 2, 8), 3, 1e4f, T64(odd, 3, 2, 8), RopeCp{2, 2})
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace switchyard::kernels
