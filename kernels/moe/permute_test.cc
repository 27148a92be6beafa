// CPU permutation ops against a naive fp64 transcription of Megatron's permute/unpermute
// (megatron_moe.md §3.1), plus the invariants of §6: identity-expert round trips, dropped slots,
// empty experts, pad-to-capacity equivalence, and adjointness of the backward ops.
#include "kernels/moe/permute.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace switchyard::kernels {
namespace {

enum class Load { kUniform, kSkewed, kOneExpert };

struct Routing {
  int64_t t, k, e;
  std::vector<int32_t> idx;
  std::vector<double> probs;
};

// Distinct experts per token; kSkewed leaves the upper half of the experts empty; kOneExpert puts
// slot 0 of every token on expert e-1. Slots are then dropped with `drop`, and with capacity > 0
// each expert keeps its first `capacity` tokens (the router's "position" policy).
Routing MakeRouting(std::mt19937_64& rng, int64_t t, int64_t k, int64_t e, Load load, double drop,
                    int64_t capacity = 0) {
  Routing r{t, k, e, std::vector<int32_t>(t * k), std::vector<double>(t * k)};
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int32_t> perm(e);
  const int64_t pool = load == Load::kSkewed ? std::max<int64_t>(k, e / 2) : e;
  for (int64_t i = 0; i < t; ++i) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.begin() + pool, rng);
    if (load == Load::kOneExpert) std::swap(perm[0], *std::find(perm.begin(), perm.end(), e - 1));
    for (int64_t s = 0; s < k; ++s) {
      r.idx[i * k + s] = u(rng) < drop ? -1 : perm[s];
      r.probs[i * k + s] = 0.05 + u(rng);
    }
  }
  if (capacity > 0) {
    std::vector<int64_t> seen(e, 0);
    for (int64_t i = 0; i < t * k; ++i) {
      if (r.idx[i] >= 0 && seen[r.idx[i]]++ >= capacity) r.idx[i] = -1;
    }
  }
  return r;
}

// Naive Megatron order: for each expert, tokens ascending. Returns row_map (-1 = dropped).
std::vector<int32_t> NaiveRowMap(const Routing& r, int64_t capacity) {
  std::vector<int32_t> map(r.t * r.k, -1);
  int64_t next = 0;
  for (int64_t e = 0; e < r.e; ++e) {
    int64_t row = capacity > 0 ? e * capacity : next;
    for (int64_t i = 0; i < r.t; ++i)
      for (int64_t s = 0; s < r.k; ++s)
        if (r.idx[i * r.k + s] == e) map[i * r.k + s] = static_cast<int32_t>(row++);
    next = row;
  }
  return map;
}

Tensor T64(std::vector<double>& v, std::vector<int64_t> shape) {
  return Tensor(DType::kF64, std::move(shape), Device::Cpu(), v.data());
}
Tensor T32(std::vector<int32_t>& v, std::vector<int64_t> shape) {
  return Tensor(DType::kI32, std::move(shape), Device::Cpu(), v.data());
}
std::vector<double> Random(std::mt19937_64& rng, int64_t n) {
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}
double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  return std::inner_product(a.begin(), a.end(), b.begin(), 0.0);
}

// Everything Permute produces, in f64.
struct Permuted {
  std::vector<double> x, probs;
  std::vector<int32_t> row_map, tpe;
};

Permuted RunPermute(const Routing& r, std::vector<double>& x, int64_t h, int64_t capacity,
                    int64_t max_rows) {
  Permuted p{std::vector<double>(max_rows * h, NAN), std::vector<double>(max_rows, NAN),
             std::vector<int32_t>(r.t * r.k, 7), std::vector<int32_t>(r.e, 7)};
  Routing rc = r;
  absl::Status st =
      Permute(Stream::Cpu(), T64(x, {r.t, h}), T32(rc.idx, {r.t, r.k}), T64(rc.probs, {r.t, r.k}),
              r.e, capacity, T64(p.x, {max_rows, h}), T64(p.probs, {max_rows}),
              T32(p.row_map, {r.t, r.k}), T32(p.tpe, {r.e}), Tensor());
  EXPECT_TRUE(st.ok()) << st;
  return p;
}

struct Case {
  int64_t t, k, e, h;
  Load load;
  double drop;
  int64_t capacity;
};

class PermuteCpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(PermuteCpuTest, MatchesNaiveMegatronOrder) {
  const Case c = GetParam();
  std::mt19937_64 rng(c.t * 131 + c.e);
  const Routing r = MakeRouting(rng, c.t, c.k, c.e, c.load, c.drop, c.capacity);
  const int64_t max_rows = c.capacity > 0 ? c.e * c.capacity : c.t * c.k;
  std::vector<double> x = Random(rng, c.t * c.h);
  const Permuted p = RunPermute(r, x, c.h, c.capacity, max_rows);
  const std::vector<int32_t> ref_map = NaiveRowMap(r, c.capacity);
  EXPECT_EQ(p.row_map, ref_map);
  std::vector<int32_t> ref_tpe(c.e, 0), counts(c.e, 0);
  for (int32_t v : r.idx)
    if (v >= 0) ++counts[v];
  for (int64_t e = 0; e < c.e; ++e) ref_tpe[e] = c.capacity > 0 ? c.capacity : counts[e];
  EXPECT_EQ(p.tpe, ref_tpe);
  std::vector<int32_t> tpe(c.e, -5);
  ASSERT_TRUE(TokensPerExpert(Stream::Cpu(),
                              T32(const_cast<std::vector<int32_t>&>(r.idx), {c.t, c.k}), c.e,
                              T32(tpe, {c.e}))
                  .ok());
  EXPECT_EQ(tpe, counts);
  // Every mapped row is an exact copy; in pad mode every other row is zero with probability 0.
  std::vector<bool> mapped(max_rows, false);
  for (int64_t i = 0; i < c.t * c.k; ++i) {
    if (ref_map[i] < 0) continue;
    mapped[ref_map[i]] = true;
    EXPECT_EQ(p.probs[ref_map[i]], r.probs[i]);
    for (int64_t j = 0; j < c.h; ++j) ASSERT_EQ(p.x[ref_map[i] * c.h + j], x[(i / c.k) * c.h + j]);
  }
  int64_t padding = 0;
  for (int64_t row = 0; c.capacity > 0 && row < max_rows; ++row) {
    if (mapped[row]) continue;
    ++padding;
    EXPECT_EQ(p.probs[row], 0.0) << row;
    for (int64_t j = 0; j < c.h; ++j) ASSERT_EQ(p.x[row * c.h + j], 0.0) << row;
  }
  const int64_t kept =
      std::count_if(ref_map.begin(), ref_map.end(), [](int32_t v) { return v >= 0; });
  std::printf("permute cpu T=%ld k=%ld E=%ld H=%ld C=%ld: %ld rows kept, %ld padding rows, exact\n",
              c.t, c.k, c.e, c.h, c.capacity, kept, padding);
}

// Identity experts (y = permuted_x * permuted_probs) give x * sum of kept probs; with probs 1/k
// and no drops the round trip returns x. Backward ops are the adjoints of the forward ops.
TEST_P(PermuteCpuTest, RoundTripAndAdjoints) {
  const Case c = GetParam();
  std::mt19937_64 rng(c.t * 7 + c.h);
  Routing r = MakeRouting(rng, c.t, c.k, c.e, c.load, c.drop, c.capacity);
  const int64_t max_rows = c.capacity > 0 ? c.e * c.capacity : c.t * c.k;
  std::vector<double> x = Random(rng, c.t * c.h);
  Permuted p = RunPermute(r, x, c.h, c.capacity, max_rows);
  const int64_t total =
      c.capacity > 0 ? max_rows : std::accumulate(p.tpe.begin(), p.tpe.end(), int64_t{0});
  std::vector<double> y(max_rows * c.h, NAN);  // rows past the total must never be read
  for (int64_t row = 0; row < total; ++row)
    for (int64_t j = 0; j < c.h; ++j) y[row * c.h + j] = p.x[row * c.h + j] * p.probs[row];
  std::vector<double> out(c.t * c.h, NAN);
  ASSERT_TRUE(Unpermute(Stream::Cpu(), T64(y, {max_rows, c.h}), T32(p.row_map, {c.t, c.k}),
                        T64(out, {c.t, c.h}))
                  .ok());
  double max_err = 0;
  for (int64_t i = 0; i < c.t; ++i) {
    double psum = 0;
    for (int64_t s = 0; s < c.k; ++s) psum += r.idx[i * c.k + s] >= 0 ? r.probs[i * c.k + s] : 0;
    for (int64_t j = 0; j < c.h; ++j)
      max_err = std::max(max_err, std::abs(out[i * c.h + j] - x[i * c.h + j] * psum));
  }
  EXPECT_LT(max_err, 1e-12);

  // <dP, P(x)> == <P^T(dP), x> and <dp, gather(probs)> == <gather^T(dp), probs>, over valid rows.
  std::vector<double> dpx = Random(rng, max_rows * c.h), dpp = Random(rng, max_rows);
  for (int64_t row = total; row < max_rows; ++row) {
    dpp[row] = 0;
    for (int64_t j = 0; j < c.h; ++j) dpx[row * c.h + j] = 0;
  }
  std::vector<double> px = p.x, pp = p.probs;
  for (int64_t i = total * c.h; i < max_rows * c.h; ++i) px[i] = 0;
  for (int64_t i = total; i < max_rows; ++i) pp[i] = 0;
  std::vector<double> dx(c.t * c.h, NAN), dprobs(c.t * c.k, NAN);
  ASSERT_TRUE(PermuteBackward(Stream::Cpu(), T64(dpx, {max_rows, c.h}), T64(dpp, {max_rows}),
                              T32(p.row_map, {c.t, c.k}), T64(dx, {c.t, c.h}),
                              T64(dprobs, {c.t, c.k}))
                  .ok());
  std::vector<double> kept_probs = r.probs;  // Permute only reads the probs of kept slots
  for (int64_t i = 0; i < c.t * c.k; ++i)
    if (r.idx[i] < 0) kept_probs[i] = 0;
  const double a1 = Dot(dpx, px), b1 = Dot(dx, x);
  const double a2 = Dot(dpp, pp), b2 = Dot(dprobs, kept_probs);
  EXPECT_NEAR(a1, b1, 1e-10 * (1 + std::abs(a1)));
  EXPECT_NEAR(a2, b2, 1e-10 * (1 + std::abs(a2)));
  for (int64_t i = 0; i < c.t * c.k; ++i)
    if (r.idx[i] < 0) {
      EXPECT_EQ(dprobs[i], 0.0);
    }

  // <dout, U(y)> == <U^T(dout), y>; y random on every row, unmapped rows of U^T zeroed.
  std::vector<double> yr = Random(rng, max_rows * c.h), dout = Random(rng, c.t * c.h);
  std::vector<double> uy(c.t * c.h), dy(max_rows * c.h, NAN);
  ASSERT_TRUE(Unpermute(Stream::Cpu(), T64(yr, {max_rows, c.h}), T32(p.row_map, {c.t, c.k}),
                        T64(uy, {c.t, c.h}))
                  .ok());
  ASSERT_TRUE(UnpermuteBackward(Stream::Cpu(), T64(dout, {c.t, c.h}), T32(p.row_map, {c.t, c.k}),
                                T64(dy, {max_rows, c.h}), /*zero_unmapped_rows=*/true)
                  .ok());
  const double a3 = Dot(dout, uy), b3 = Dot(dy, yr);
  EXPECT_NEAR(a3, b3, 1e-10 * (1 + std::abs(a3)));
  std::printf(
      "round trip T=%ld k=%ld E=%ld H=%ld C=%ld: max err %.3g (tol 1e-12); adjoint gaps "
      "%.3g %.3g %.3g (tol 1e-10 rel)\n",
      c.t, c.k, c.e, c.h, c.capacity, max_err, std::abs(a1 - b1), std::abs(a2 - b2),
      std::abs(a3 - b3));
}

// PermuteIndex: Permute's row_map, permuted_probs and counts, and source_rows naming the token
// whose row Permute copied to each permuted row (dropless shapes; with drops the kept rows).
TEST_P(PermuteCpuTest, PermuteIndexNamesTheRowsPermuteCopies) {
  const Case c = GetParam();
  if (c.capacity > 0) GTEST_SKIP() << "PermuteIndex is dropless only";
  std::mt19937_64 rng(c.t * 31 + c.e);
  Routing r = MakeRouting(rng, c.t, c.k, c.e, c.load, c.drop);
  const int64_t max_rows = c.t * c.k;
  std::vector<double> x = Random(rng, c.t * c.h);
  const Permuted p = RunPermute(r, x, c.h, 0, max_rows);
  std::vector<double> probs(max_rows, NAN);
  std::vector<int32_t> map(c.t * c.k, 7), tpe(c.e, 7), sources(max_rows, -7);
  const absl::Status st = PermuteIndex(
      Stream::Cpu(), T32(r.idx, {c.t, c.k}), T64(r.probs, {c.t, c.k}), c.e, T64(probs, {max_rows}),
      T32(map, {c.t, c.k}), T32(sources, {max_rows}), T32(tpe, {c.e}), Tensor());
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(map, p.row_map);
  EXPECT_EQ(tpe, p.tpe);
  const int64_t valid = std::accumulate(tpe.begin(), tpe.end(), int64_t{0});
  EXPECT_EQ(std::vector<double>(probs.begin(), probs.begin() + valid),
            std::vector<double>(p.probs.begin(), p.probs.begin() + valid));
  for (int64_t row = 0; row < valid; ++row) {
    ASSERT_GE(sources[row], 0) << row;
    ASSERT_LT(sources[row], c.t) << row;
    for (int64_t j = 0; j < c.h; ++j) {
      ASSERT_EQ(p.x[row * c.h + j], x[sources[row] * c.h + j]) << "row " << row << " col " << j;
    }
  }
  for (int64_t row = valid; row < max_rows; ++row) EXPECT_EQ(sources[row], -7) << "past the total";
}

TEST(PermuteCpuTest, PermuteIndexRejectsBadInput) {
  const int64_t t = 4, k = 2, e = 4;
  std::vector<double> probs(t * k, 0.5), pp(t * k);
  std::vector<int32_t> idx = {0, 1, 2, 3, 0, 1, 2, 3}, map(t * k), tpe(e), sources(t * k);
  absl::Status s =
      PermuteIndex(Stream::Cpu(), T32(idx, {t, k}), T64(probs, {t, k}), e, T64(pp, {t * k - 1}),
                   T32(map, {t, k}), T32(sources, {t * k - 1}), T32(tpe, {e}), Tensor());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("source_rows has 7 rows; needs >= 8"), absl::string_view::npos) << s;
  s = PermuteIndex(Stream::Cpu(), T32(idx, {t, k}), T64(probs, {t, k}), e, T64(pp, {t * k}),
                   T32(map, {t, k}), T32(sources, {t * k}), T32(tpe, {e}), Tensor(),
                   /*max_routed_rows=*/-1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_routed_rows (-1)"), absl::string_view::npos) << s;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PermuteCpuTest,
    ::testing::Values(Case{33, 2, 8, 16, Load::kUniform, 0.0, 0},
                      Case{64, 4, 16, 5, Load::kSkewed, 0.2, 0},    // empty experts, drops
                      Case{40, 3, 6, 8, Load::kOneExpert, 0.1, 0},  // one hot expert
                      Case{1, 8, 16, 7, Load::kUniform, 0.0, 0},    // T = 1
                      Case{50, 2, 8, 9, Load::kSkewed, 0.1, 7},     // pad to capacity 7
                      Case{30, 1, 4, 3, Load::kOneExpert, 0.0, 12}));

TEST(PermuteCpuTest, UniformProbsRoundTripReturnsX) {
  std::mt19937_64 rng(3);
  const int64_t t = 37, k = 4, e = 8, h = 11;
  Routing r = MakeRouting(rng, t, k, e, Load::kUniform, 0.0);
  std::fill(r.probs.begin(), r.probs.end(), 1.0 / k);
  std::vector<double> x = Random(rng, t * h);
  Permuted p = RunPermute(r, x, h, 0, t * k);
  std::vector<double> y(t * k * h), out(t * h);
  for (int64_t row = 0; row < t * k; ++row)
    for (int64_t j = 0; j < h; ++j) y[row * h + j] = p.x[row * h + j] * p.probs[row];
  ASSERT_TRUE(
      Unpermute(Stream::Cpu(), T64(y, {t * k, h}), T32(p.row_map, {t, k}), T64(out, {t, h})).ok());
  double err = 0;
  for (int64_t i = 0; i < t * h; ++i) err = std::max(err, std::abs(out[i] - x[i]));
  std::printf("probs 1/k round trip: max |out - x| = %.3g (tol 1e-12)\n", err);
  EXPECT_LT(err, 1e-12);
}

TEST(PermuteCpuTest, PaddingRowsDoNotChangeTheResult) {
  std::mt19937_64 rng(5);
  const int64_t t = 48, k = 2, e = 6, h = 6, cap = 10;
  const Routing r = MakeRouting(rng, t, k, e, Load::kSkewed, 0.0, cap);
  std::vector<double> x = Random(rng, t * h);
  Permuted padded = RunPermute(r, x, h, cap, e * cap), plain = RunPermute(r, x, h, 0, t * k);
  auto combine = [&](Permuted& p, int64_t rows) {
    std::vector<double> y(rows * h, 0), out(t * h);
    const int64_t valid = std::accumulate(p.tpe.begin(), p.tpe.end(), int64_t{0});
    for (int64_t row = 0; row < valid; ++row)
      for (int64_t j = 0; j < h; ++j) y[row * h + j] = p.x[row * h + j] * p.probs[row];
    EXPECT_TRUE(
        Unpermute(Stream::Cpu(), T64(y, {rows, h}), T32(p.row_map, {t, k}), T64(out, {t, h})).ok());
    return out;
  };
  EXPECT_EQ(combine(padded, e * cap), combine(plain, t * k));
  EXPECT_EQ(padded.tpe, std::vector<int32_t>(e, cap));
}

TEST(PermuteCpuTest, AllDroppedTokenGetsZerosAndUnmappedRowsAreKept) {
  std::vector<double> y = {1, 2, 3, 4, 5, 6}, out(4, NAN), dout = {7, 8, 9, 10}, dy(6, -1);
  std::vector<int32_t> map = {-1, -1, 2, 0};  // token 0: all dropped; token 1: rows 2 and 0
  ASSERT_TRUE(Unpermute(Stream::Cpu(), T64(y, {3, 2}), T32(map, {2, 2}), T64(out, {2, 2})).ok());
  EXPECT_EQ(out, (std::vector<double>{0, 0, 6, 8}));
  ASSERT_TRUE(
      UnpermuteBackward(Stream::Cpu(), T64(dout, {2, 2}), T32(map, {2, 2}), T64(dy, {3, 2}), false)
          .ok());
  EXPECT_EQ(dy, (std::vector<double>{9, 10, -1, -1, 9, 10}));
  ASSERT_TRUE(
      UnpermuteBackward(Stream::Cpu(), T64(dout, {2, 2}), T32(map, {2, 2}), T64(dy, {3, 2}), true)
          .ok());
  EXPECT_EQ(dy, (std::vector<double>{9, 10, 0, 0, 9, 10}));
}

// max_routed_rows: a sparse routing (most slots dropped, as ep_routing.h's) fits a permuted_x of
// the bound's rows, in the same order as with T*k rows; a routing keeping more slots than the
// rows is refused, naming the rule.
TEST(PermuteCpuTest, SparseRoutingWithARoutedRowBound) {
  const int64_t t = 4, k = 3, e = 2, h = 2;
  std::vector<double> x = {1, 2, 3, 4, 5, 6, 7, 8}, probs(t * k, 0.5);
  std::vector<int32_t> idx = {1, -1, -1, -1, 0, -1, -1, -1, -1, 0, 1, -1};  // 4 kept slots
  std::vector<double> px(4 * h, NAN), pp(4, NAN), full(t * k * h, NAN), fp(t * k, NAN);
  std::vector<int32_t> map(t * k), full_map(t * k), tpe(e), full_tpe(e);
  ASSERT_TRUE(Permute(Stream::Cpu(), T64(x, {t, h}), T32(idx, {t, k}), T64(probs, {t, k}), e, 0,
                      T64(px, {4, h}), T64(pp, {4}), T32(map, {t, k}), T32(tpe, {e}), Tensor(),
                      /*max_routed_rows=*/4)
                  .ok());
  ASSERT_TRUE(Permute(Stream::Cpu(), T64(x, {t, h}), T32(idx, {t, k}), T64(probs, {t, k}), e, 0,
                      T64(full, {t * k, h}), T64(fp, {t * k}), T32(full_map, {t, k}),
                      T32(full_tpe, {e}), Tensor())
                  .ok());
  EXPECT_EQ(map, full_map);
  EXPECT_EQ(tpe, (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(px, (std::vector<double>(full.begin(), full.begin() + 4 * h)));
  EXPECT_EQ(px, (std::vector<double>{3, 4, 7, 8, 1, 2, 7, 8}));
  const absl::Status s =
      Permute(Stream::Cpu(), T64(x, {t, h}), T32(idx, {t, k}), T64(probs, {t, k}), e, 0,
              T64(px, {3, h}), T64(pp, {3}), T32(map, {t, k}), T32(tpe, {e}), Tensor(), 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("keeps 4 slots, more than permuted_x's 3 rows"),
            absl::string_view::npos)
      << s;
}

TEST(PermuteCpuTest, RejectsBadInput) {
  const int64_t t = 4, k = 2, e = 4, h = 3;
  std::vector<double> x(t * h, 1), probs(t * k, 0.5), px(t * k * h), pp(t * k);
  std::vector<int32_t> idx = {0, 1, 2, 3, 0, 1, 2, 3}, map(t * k), tpe(e);
  auto run = [&](int64_t experts, int64_t cap, int64_t rows) {
    return Permute(Stream::Cpu(), T64(x, {t, h}), T32(idx, {t, k}), T64(probs, {t, k}), experts,
                   cap, T64(px, {rows, h}), T64(pp, {rows}), T32(map, {t, k}), T32(tpe, {experts}),
                   Tensor());
  };
  EXPECT_TRUE(run(e, 0, t * k).ok());
  absl::Status s = run(e, 0, t * k - 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("needs >= 8"), absl::string_view::npos) << s;
  s = run(e, 1, e);  // expert 0 gets 2 tokens, capacity 1
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("more than pad_to_capacity"), absl::string_view::npos) << s;
  idx[3] = 4;
  s = run(e, 0, t * k);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("topk_idx[1, 1] = 4"), absl::string_view::npos) << s;
  s = TokensPerExpert(Stream::Cpu(), T32(idx, {t, k}), e, T32(tpe, {e}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> bad_map = {0, 9};
  std::vector<double> out(h);
  s = Unpermute(Stream::Cpu(), T64(px, {t * k, h}), T32(bad_map, {1, 2}), T64(out, {1, h}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("row_map[0, 1] = 9"), absl::string_view::npos) << s;
  s = Unpermute(Stream::Cpu(), T64(px, {t * k, h}), T32(bad_map, {1, 2}), T64(out, {1, 1}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace switchyard::kernels
