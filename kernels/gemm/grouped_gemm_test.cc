// CPU reference of GroupedGemm against naive fp64 loops written group by group (zero-row groups,
// a single group, uneven groups, rows past the total left alone, count clamping), and argument
// validation by status code.
#include "kernels/gemm/grouped_gemm.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

constexpr double kPoison = 123.0;

struct Problem {
  std::vector<int32_t> counts;
  int64_t rows;  // capacity R >= the total of counts
  int64_t k, n;
};

// Naive fp64 reference. Returns {y, dx, dw (fresh), dw (accumulated onto dw0)}; rows past the
// total hold kPoison in y and dx.
struct Reference {
  std::vector<double> y, dx, dw, dw_acc;
};

Reference Naive(const Problem& p, const std::vector<double>& x, const std::vector<double>& w,
                const std::vector<double>& dy, const std::vector<double>& dw0) {
  const int64_t g_count = static_cast<int64_t>(p.counts.size()), k = p.k, n = p.n;
  Reference r;
  r.y.assign(p.rows * n, kPoison);
  r.dx.assign(p.rows * k, kPoison);
  r.dw.assign(g_count * k * n, 0.0);
  int64_t off = 0;
  for (int64_t g = 0; g < g_count; ++g) {
    const int64_t m = p.counts[g];
    for (int64_t i = off; i < off + m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t q = 0; q < k; ++q) s += x[i * k + q] * w[(g * k + q) * n + j];
        r.y[i * n + j] = s;
      }
      for (int64_t q = 0; q < k; ++q) {
        double s = 0;
        for (int64_t j = 0; j < n; ++j) s += dy[i * n + j] * w[(g * k + q) * n + j];
        r.dx[i * k + q] = s;
      }
    }
    for (int64_t q = 0; q < k; ++q) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t i = off; i < off + m; ++i) s += x[i * k + q] * dy[i * n + j];
        r.dw[(g * k + q) * n + j] = s;
      }
    }
    off += m;
  }
  r.dw_acc = r.dw;
  for (size_t e = 0; e < r.dw_acc.size(); ++e) r.dw_acc[e] += dw0[e];
  return r;
}

std::vector<double> Random(int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> v(n);
  for (double& e : v) e = dist(rng);
  return v;
}

double MaxAbsDiff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = a.size() == b.size() ? 0.0 : 1e300;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

void CheckProblem(const Problem& p, const char* name) {
  std::mt19937_64 rng(42);
  const int64_t g = static_cast<int64_t>(p.counts.size()), r = p.rows, k = p.k, n = p.n;
  std::vector<double> x = Random(r * k, rng), w = Random(g * k * n, rng), dy = Random(r * n, rng),
                      dw0 = Random(g * k * n, rng);
  std::vector<double> y(r * n, kPoison), dx(r * k, kPoison), dw(g * k * n, kPoison), dw_acc = dw0;
  std::vector<int32_t> counts = p.counts;
  const Device cpu = Device::Cpu();
  Tensor tx(DType::kF64, {r, k}, cpu, x.data()), tw(DType::kF64, {g, k, n}, cpu, w.data());
  Tensor tdy(DType::kF64, {r, n}, cpu, dy.data()), ty(DType::kF64, {r, n}, cpu, y.data());
  Tensor tdx(DType::kF64, {r, k}, cpu, dx.data()), tdw(DType::kF64, {g, k, n}, cpu, dw.data());
  Tensor tdw_acc(DType::kF64, {g, k, n}, cpu, dw_acc.data());
  Tensor tc(DType::kI32, {g}, cpu, counts.data());

  auto gg = GroupedGemm::Create(cpu, static_cast<int>(g));
  ASSERT_TRUE(gg.ok()) << gg.status();
  EXPECT_EQ((*gg)->path(), GroupedGemmPath::kCpuReference);
  const Stream s = Stream::Cpu();
  ASSERT_TRUE((*gg)->Fprop(s, tx, tw, tc, ty).ok());
  ASSERT_TRUE((*gg)->Dgrad(s, tdy, tw, tc, tdx).ok());
  ASSERT_TRUE((*gg)->Wgrad(s, tx, tdy, tc, tdw, /*accumulate=*/false).ok());
  ASSERT_TRUE((*gg)->Wgrad(s, tx, tdy, tc, tdw_acc, /*accumulate=*/true).ok());

  const Reference ref = Naive(p, x, w, dy, dw0);
  const double e_y = MaxAbsDiff(y, ref.y), e_dx = MaxAbsDiff(dx, ref.dx);
  const double e_dw = MaxAbsDiff(dw, ref.dw), e_acc = MaxAbsDiff(dw_acc, ref.dw_acc);
  std::printf(
      "grouped gemm cpu %s: G=%ld R=%ld K=%ld N=%ld max abs err fprop %.3g dgrad %.3g "
      "wgrad %.3g wgrad+acc %.3g (tol 1e-9)\n",
      name, g, r, k, n, e_y, e_dx, e_dw, e_acc);
  EXPECT_LT(e_y, 1e-9);
  EXPECT_LT(e_dx, 1e-9);
  EXPECT_LT(e_dw, 1e-9);
  EXPECT_LT(e_acc, 1e-9);
}

TEST(GroupedGemmCpuTest, UnevenGroupsWithZeroRowGroups) {
  CheckProblem({{3, 0, 5, 2, 0}, 13, 7, 5}, "uneven+zero");
}

TEST(GroupedGemmCpuTest, SingleGroup) { CheckProblem({{9}, 9, 4, 6}, "single"); }

TEST(GroupedGemmCpuTest, LeadingAndTrailingEmptyGroups) {
  CheckProblem({{0, 0, 7, 0}, 10, 3, 8}, "empty ends");
}

TEST(GroupedGemmCpuTest, AllGroupsEmpty) { CheckProblem({{0, 0, 0}, 4, 5, 3}, "all empty"); }

TEST(GroupedGemmCpuTest, F32StorageMatchesNaive) {
  std::mt19937_64 rng(3);
  const int64_t g = 3, r = 10, k = 6, n = 4;
  std::vector<int32_t> counts = {4, 0, 5};
  std::vector<float> x(r * k), w(g * k * n), y(r * n, 7.0f);
  Tensor tx(DType::kF32, {r, k}, Device::Cpu(), x.data());
  Tensor tw(DType::kF32, {g, k, n}, Device::Cpu(), w.data());
  testing::FillRandom(tx, rng);
  testing::FillRandom(tw, rng);
  Tensor tc(DType::kI32, {g}, Device::Cpu(), counts.data());
  Tensor ty(DType::kF32, {r, n}, Device::Cpu(), y.data());
  auto gg = GroupedGemm::Create(Device::Cpu(), 4);
  ASSERT_TRUE(gg.ok());
  ASSERT_TRUE((*gg)->Fprop(Stream::Cpu(), tx, tw, tc, ty).ok());
  std::vector<float> ref(r * n, 7.0f);
  int64_t off = 0;
  for (int64_t gi = 0; gi < g; ++gi) {
    for (int64_t i = off; i < off + counts[gi]; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t q = 0; q < k; ++q) s += double(x[i * k + q]) * w[(gi * k + q) * n + j];
        ref[i * n + j] = static_cast<float>(s);
      }
    }
    off += counts[gi];
  }
  const double err = testing::RelativeError(y, ref);
  std::printf("grouped gemm cpu f32 fprop: rel err %.3g (tol 1e-6)\n", err);
  EXPECT_LT(err, 1e-6);
}

TEST(GroupedGemmCpuTest, CountsAreClampedToCapacity) {
  // Counts {4, -2, 5} with capacity 6: group 1 counts as 0, group 2 keeps 2 rows.
  const int64_t r = 6, k = 2, n = 3;
  std::vector<int32_t> counts = {4, -2, 5};
  std::vector<double> x(r * k, 1.0), w(3 * k * n, 1.0), y(r * n, kPoison), dw(3 * k * n, kPoison);
  const Device cpu = Device::Cpu();
  Tensor tx(DType::kF64, {r, k}, cpu, x.data()), tw(DType::kF64, {3, k, n}, cpu, w.data());
  Tensor tc(DType::kI32, {3}, cpu, counts.data()), ty(DType::kF64, {r, n}, cpu, y.data());
  Tensor tdw(DType::kF64, {3, k, n}, cpu, dw.data());
  auto gg = GroupedGemm::Create(cpu, 3);
  ASSERT_TRUE(gg.ok());
  ASSERT_TRUE((*gg)->Fprop(Stream::Cpu(), tx, tw, tc, ty).ok());
  for (double v : y) EXPECT_EQ(v, 2.0);  // every row belongs to a group: K ones times ones
  ASSERT_TRUE((*gg)->Wgrad(Stream::Cpu(), tx, ty, tc, tdw, false).ok());
  EXPECT_EQ(dw[0], 4 * 2.0);          // group 0: 4 rows
  EXPECT_EQ(dw[k * n], 0.0);          // group 1: empty
  EXPECT_EQ(dw[2 * k * n], 2 * 2.0);  // group 2: clamped to 2 rows
}

class GroupedGemmValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto gg = GroupedGemm::Create(Device::Cpu(), 2);
    ASSERT_TRUE(gg.ok());
    gg_ = std::move(*gg);
  }
  std::unique_ptr<GroupedGemm> gg_;
  std::vector<double> data_ = std::vector<double>(1000, 1.0);
  std::vector<int32_t> counts_ = {2, 3, 1};
  Tensor T(DType dt, std::vector<int64_t> shape) {
    return Tensor(dt, std::move(shape), Device::Cpu(),
                  dt == DType::kI32 ? static_cast<void*>(counts_.data()) : data_.data());
  }
};

TEST_F(GroupedGemmValidationTest, RejectsBadShapesAndDtypes) {
  const Stream s = Stream::Cpu();
  const Tensor c2 = T(DType::kI32, {2});
  // w's K does not match x's.
  absl::Status st =
      gg_->Fprop(s, T(DType::kF64, {5, 4}), T(DType::kF64, {2, 3, 6}), c2, T(DType::kF64, {5, 6}));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("w must be [G, K, N] = [2, 4, 6]"), absl::string_view::npos) << st;
  // y has the wrong row count.
  st = gg_->Fprop(s, T(DType::kF64, {5, 4}), T(DType::kF64, {2, 4, 6}), c2, T(DType::kF64, {4, 6}));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("y must be [R, N]"), absl::string_view::npos) << st;
  // Counts must be int32.
  st = gg_->Dgrad(s, T(DType::kF64, {5, 6}), T(DType::kF64, {2, 4, 6}), T(DType::kF64, {2}),
                  T(DType::kF64, {5, 4}));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("tokens_per_group must be int32"), absl::string_view::npos) << st;
  // More groups than max_groups.
  st = gg_->Wgrad(s, T(DType::kF64, {5, 4}), T(DType::kF64, {5, 6}), T(DType::kI32, {3}),
                  T(DType::kF64, {3, 4, 6}), false);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("exceeds max_groups"), absl::string_view::npos) << st;
  // Mixed input dtypes.
  st = gg_->Wgrad(s, T(DType::kF64, {5, 4}), T(DType::kF32, {5, 6}), c2, T(DType::kF64, {2, 4, 6}),
                  false);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  // A stream on another device.
  st = gg_->Fprop(Stream{Device::Cuda(0), nullptr}, T(DType::kF64, {5, 4}),
                  T(DType::kF64, {2, 4, 6}), c2, T(DType::kF64, {5, 6}));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  // Sane call for contrast.
  EXPECT_TRUE(
      gg_->Fprop(s, T(DType::kF64, {5, 4}), T(DType::kF64, {2, 4, 6}), c2, T(DType::kF64, {5, 6}))
          .ok());
}

// The gathered ops on the CPU equal the plain ops on the explicitly gathered copies, bit for bit
// (the reference gathers, then runs them); index entries past the total are never read, and a bad
// entry below it is refused naming it.
TEST(GroupedGemmCpuTest, GatheredOpsEqualTheOpsOnTheGatheredCopies) {
  const int64_t s_rows = 7, k = 3, n = 4, g = 3;
  const std::vector<int32_t> counts = {2, 0, 3};  // total 5 of R = 6
  const int64_t r = 6, total = 5;
  std::mt19937_64 rng(5);
  std::normal_distribution<double> d;
  auto random = [&](int64_t count) {
    std::vector<double> v(count);
    for (double& x : v) x = d(rng);
    return v;
  };
  std::vector<double> x_src = random(s_rows * k), dy_src = random(s_rows * n),
                      w = random(g * k * n);
  std::vector<int32_t> rows = {6, 0, 3, 3, 1, -99};  // the last entry is past the total
  std::vector<double> x(r * k, 0.0), dy(r * n, 0.0);
  for (int64_t p = 0; p < total; ++p) {
    for (int64_t j = 0; j < k; ++j) x[p * k + j] = x_src[rows[p] * k + j];
    for (int64_t j = 0; j < n; ++j) dy[p * n + j] = dy_src[rows[p] * n + j];
  }
  std::vector<int32_t> c = counts;
  const Device cpu = Device::Cpu();
  const Stream st = Stream::Cpu();
  auto t = [&](std::vector<double>& v, std::vector<int64_t> shape) {
    return Tensor(DType::kF64, std::move(shape), cpu, v.data());
  };
  const Tensor tc(DType::kI32, {g}, cpu, c.data()), trows(DType::kI32, {r}, cpu, rows.data());
  auto gg = GroupedGemm::Create(cpu, static_cast<int>(g)).value();
  EXPECT_TRUE(gg->GatherSupported(3, 4));
  std::vector<double> y_ref(r * n, kPoison), y(r * n, kPoison);
  ASSERT_TRUE(gg->Fprop(st, t(x, {r, k}), t(w, {g, k, n}), tc, t(y_ref, {r, n})).ok());
  absl::Status s =
      gg->FpropGathered(st, t(x_src, {s_rows, k}), trows, t(w, {g, k, n}), tc, t(y, {r, n}));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(y, y_ref);
  std::vector<double> dx_ref(r * k, kPoison), dx(r * k, kPoison);
  ASSERT_TRUE(gg->Dgrad(st, t(dy, {r, n}), t(w, {g, k, n}), tc, t(dx_ref, {r, k})).ok());
  s = gg->DgradGathered(st, t(dy_src, {s_rows, n}), trows, t(w, {g, k, n}), tc, t(dx, {r, k}));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(dx, dx_ref);
  std::vector<double> dw_ref(g * k * n, 1.5);
  ASSERT_TRUE(gg->Wgrad(st, t(x, {r, k}), t(dy, {r, n}), tc, t(dw_ref, {g, k, n}), true).ok());
  for (int mode = 1; mode < 4; ++mode) {  // x gathered, dy gathered, both
    std::vector<double> dw(g * k * n, 1.5);
    const bool gx = mode & 1, gdy = mode & 2;
    s = gg->WgradGathered(st, gx ? t(x_src, {s_rows, k}) : t(x, {r, k}), gx ? trows : Tensor(),
                          gdy ? t(dy_src, {s_rows, n}) : t(dy, {r, n}), gdy ? trows : Tensor(), tc,
                          t(dw, {g, k, n}), /*accumulate=*/true);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(dw, dw_ref) << "mode " << mode;
  }
  // An entry below the total outside the source's rows.
  rows[2] = 7;
  s = gg->FpropGathered(st, t(x_src, {s_rows, k}), trows, t(w, {g, k, n}), tc, t(y, {r, n}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("x_rows[2] = 7 is outside [0, 7)"), absl::string_view::npos) << s;
  rows[2] = 3;
  // The index must have R entries; the source must have K columns.
  const Tensor short_rows(DType::kI32, {r - 1}, cpu, rows.data());
  s = gg->FpropGathered(st, t(x_src, {s_rows, k}), short_rows, t(w, {g, k, n}), tc, t(y, {r, n}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("x_rows must be int32 [6]"), absl::string_view::npos) << s;
  s = gg->DgradGathered(st, t(dy_src, {s_rows * n / 2, 2}), trows, t(w, {g, k, n}), tc,
                        t(dx, {r, k}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("dy must have N = 4 columns"), absl::string_view::npos) << s;
  // Wgrad: the two operands' R must agree.
  s = gg->WgradGathered(st, t(x_src, {s_rows, k}), trows, t(dy, {r - 1, n}), Tensor(), tc,
                        t(dw_ref, {g, k, n}), false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("dy (not gathered) must have 6 rows"), absl::string_view::npos) << s;
}

TEST(GroupedGemmCreateTest, RejectsBadOptions) {
  EXPECT_EQ(GroupedGemm::Create(Device::Cpu(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GroupedGemm::Create(Device::Cpu(), 70000).status().code(),
            absl::StatusCode::kInvalidArgument);
  GroupedGemmOptions o;
  o.path = GroupedGemmPath::kCutlassSm90;
  EXPECT_EQ(GroupedGemm::Create(Device::Cpu(), 4, o).status().code(),
            absl::StatusCode::kFailedPrecondition);
  o.path = GroupedGemmPath::kFallback;
  EXPECT_EQ(GroupedGemm::Create(Device::Cpu(), 4, o).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// The measured rule (kGroupedGemmTileRules' comment: one H100, 2026-12-07): ping-pong 128x128 for
// the weight gradient when K <= 768 and for the data gradient when K <= 384 (fc2 of the
// fine-grained configs), cooperative 256x128 everywhere else.
TEST(GroupedGemmTileTest, AutoTileFollowsTheMeasuredRule) {
  using internal::ChooseGroupedGemmTile;
  using internal::GroupedGemmOp;
  constexpr GroupedGemmTile kCo = GroupedGemmTile::kCooperative256x128;
  constexpr GroupedGemmTile kPp = GroupedGemmTile::kPingpong128x128;
  // K and N of the BASELINES.md configs' fc1 (w1 [E, H, 2F]) and fc2 (w2 [E, F, H]), rows T * k,
  // and the tile each op of fc2 gets (fc1's K is H >= 1536: cooperative for every op).
  struct Config {
    int64_t rows;
    int groups;
    int64_t h, f;
    GroupedGemmTile fc2_dgrad, fc2_wgrad;
  };
  const Config configs[] = {
      {8192 * 2, 8, 4096, 14336, kCo, kCo},   // mixtral8x7b: 2048 rows per group, F 14336
      {8192 * 8, 128, 2048, 768, kCo, kPp},   // qwen3_30b_a3b: 512, F 768
      {4096 * 8, 256, 7168, 2048, kCo, kCo},  // dsv3_layer: 128, F 2048
      {8192 * 8, 64, 1536, 384, kPp, kPp}};   // the benchmark model: 1024, F 384
  for (const Config& c : configs) {
    for (GroupedGemmOp op : {GroupedGemmOp::kFprop, GroupedGemmOp::kDgrad, GroupedGemmOp::kWgrad}) {
      EXPECT_EQ(ChooseGroupedGemmTile(op, c.rows, c.groups, c.h, 2 * c.f), kCo) << c.f;
    }
    EXPECT_EQ(ChooseGroupedGemmTile(GroupedGemmOp::kFprop, c.rows, c.groups, c.f, c.h), kCo);
    EXPECT_EQ(ChooseGroupedGemmTile(GroupedGemmOp::kDgrad, c.rows, c.groups, c.f, c.h), c.fc2_dgrad)
        << c.f;
    EXPECT_EQ(ChooseGroupedGemmTile(GroupedGemmOp::kWgrad, c.rows, c.groups, c.f, c.h), c.fc2_wgrad)
        << c.f;
  }
  // The bounds are inclusive and stop where the measurements did.
  EXPECT_EQ(ChooseGroupedGemmTile(GroupedGemmOp::kWgrad, 65536, 64, 769, 1536), kCo);
  EXPECT_EQ(ChooseGroupedGemmTile(GroupedGemmOp::kDgrad, 65536, 64, 385, 1536), kCo);
}

TEST(GroupedGemmTileTest, EveryRuleNamesARealTileAndEveryOpHasACatchAll) {
  using internal::GroupedGemmOp;
  for (const internal::GroupedGemmTileRule& r : internal::kGroupedGemmTileRules) {
    EXPECT_NE(r.tile, GroupedGemmTile::kAuto) << internal::GroupedGemmOpName(r.op);
    EXPECT_GT(r.max_rows_per_group, 0) << internal::GroupedGemmOpName(r.op);
  }
  // Shapes no measured row is meant for still match a row of their op (the table's last row per
  // op has no bounds), not the function's own default.
  for (GroupedGemmOp op : {GroupedGemmOp::kFprop, GroupedGemmOp::kDgrad, GroupedGemmOp::kWgrad}) {
    bool catch_all = false;
    for (const internal::GroupedGemmTileRule& r : internal::kGroupedGemmTileRules) {
      catch_all |=
          r.op == op && r.max_rows_per_group == internal::kAnyRows && r.max_k == 0 && r.max_n == 0;
    }
    EXPECT_TRUE(catch_all) << internal::GroupedGemmOpName(op);
  }
}

TEST(GroupedGemmTileTest, RulesMatchInOrderOnRowsPerGroupKAndN) {
  using internal::ChooseGroupedGemmTileFrom;
  using internal::GroupedGemmOp;
  using internal::kAnyRows;
  const GroupedGemmOp kF = GroupedGemmOp::kFprop, kW = GroupedGemmOp::kWgrad;
  const internal::GroupedGemmTileRule rules[] = {
      {kF, 64, 0, 0, GroupedGemmTile::kPingpong64x128},
      {kF, 128, 0, 1024, GroupedGemmTile::kCooperative128x128},
      {kF, 128, 0, 0, GroupedGemmTile::kCooperative128x256},
      {kF, kAnyRows, 4096, 0, GroupedGemmTile::kPingpong128x128},
      {kW, kAnyRows, 0, 0, GroupedGemmTile::kCooperative128x256},
  };
  // Rows per group = rows / groups, bucketed by the first row whose bound it is within.
  EXPECT_EQ(ChooseGroupedGemmTileFrom(rules, kF, 64 * 10, 10, 8192, 8192),
            GroupedGemmTile::kPingpong64x128);
  EXPECT_EQ(ChooseGroupedGemmTileFrom(rules, kF, 65 * 10, 10, 8192, 512),
            GroupedGemmTile::kCooperative128x128);
  // N above the second row's bound: the third row.
  EXPECT_EQ(ChooseGroupedGemmTileFrom(rules, kF, 128 * 10, 10, 8192, 1025),
            GroupedGemmTile::kCooperative128x256);
  // Large groups: the K bound decides between the fourth row and the default.
  EXPECT_EQ(ChooseGroupedGemmTileFrom(rules, kF, 4096 * 8, 8, 4096, 14336),
            GroupedGemmTile::kPingpong128x128);
  EXPECT_EQ(ChooseGroupedGemmTileFrom(rules, kF, 4096 * 8, 8, 4097, 14336),
            GroupedGemmTile::kCooperative256x128);
  // Rows of another op never match; an op without rows gets the default.
  EXPECT_EQ(ChooseGroupedGemmTileFrom(rules, kW, 64, 10, 64, 64),
            GroupedGemmTile::kCooperative128x256);
  EXPECT_EQ(ChooseGroupedGemmTileFrom(rules, GroupedGemmOp::kDgrad, 64, 10, 64, 64),
            GroupedGemmTile::kCooperative256x128);
  // No groups: the rows count as one group.
  EXPECT_EQ(ChooseGroupedGemmTileFrom(rules, kF, 100, 0, 64, 64),
            GroupedGemmTile::kCooperative128x128);
}

TEST(GroupedGemmTileTest, NamesAreDistinctAndParseBack) {
  std::set<std::string> names = {GroupedGemmTileName(GroupedGemmTile::kAuto)};
  auto parsed = ParseGroupedGemmTile("auto");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, GroupedGemmTile::kAuto);
  for (GroupedGemmTile tile : kGroupedGemmTiles) {
    const std::string name = GroupedGemmTileName(tile);
    EXPECT_TRUE(names.insert(name).second) << name;
    parsed = ParseGroupedGemmTile(name);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, tile) << name;
  }
  EXPECT_EQ(names.size(), 6u);
  parsed = ParseGroupedGemmTile("pingpong_96x128x64");
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("cooperative_128x256x64"), absl::string_view::npos)
      << parsed.status();
}

}  // namespace
}  // namespace switchyard::kernels
