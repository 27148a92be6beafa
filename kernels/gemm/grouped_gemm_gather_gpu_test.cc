// The gathered grouped GEMM (grouped_gemm_gather_sm90.h) on the GPU against the CPU reference of
// GroupedGemm applied to the explicitly gathered (permuted) operands, on fresh random bf16 inputs
// and random row indices, with the outputs poisoned first (0xFF bytes: NaN). Index entries of
// rows past the total are out of range (INT32_MIN), so reading one would fault; rows of y and dx
// past the total must keep their poison. Each case runs with the whole GPU's persistent grid and
// with 1 and 3 CTAs (many tiles per CTA: the pipeline's stages wrap across tiles). Tolerance
// (DESIGN.md): relative L2 error < 1e-2 (bf16 outputs), the empty groups of dW exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm/grouped_gemm.h"
#include "kernels/gemm/grouped_gemm_gather_sm90.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

using internal::GatherGemmCall;
using internal::GroupedGemmOp;

constexpr double kTol = 1e-2;

struct Shape {
  const char* name;
  std::vector<int32_t> counts;
  int64_t capacity_delta;  // R = total + capacity_delta (negative: the last groups are clamped)
  int64_t sources;         // S, rows of the unpermuted sources
  int64_t k, n;
};

Buffer Host(DType dt, std::vector<int64_t> shape) {
  return Buffer::ForTensor(dt, std::move(shape), Device::Cpu()).value();
}

// Rows [0, valid) of dst [R, C] = src[index[p]]; rows past `valid` NaN.
void Gather(const Buffer& src, const std::vector<int32_t>& index, int64_t valid, Buffer& dst) {
  const int64_t cols = src.View().shape[1];
  const BF16* s = static_cast<const BF16*>(src.data());
  BF16* d = static_cast<BF16*>(dst.data());
  std::memset(d, 0xFF, dst.View().numel() * sizeof(BF16));
  for (int64_t p = 0; p < valid; ++p) {
    std::memcpy(d + p * cols, s + static_cast<int64_t>(index[p]) * cols, cols * sizeof(BF16));
  }
}

struct Case {
  Shape shape;
  int64_t g = 0, r = 0, valid = 0;  // groups, capacity, rows kept after clamping
  Buffer x_src, dy_src, w, counts, index_host, dw0;
  std::vector<int32_t> index;
  Buffer x_perm, dy_perm;  // host, gathered
  Buffer y_ref, dx_ref, dw_ref, dw_acc_ref;
};

Case MakeCase(const Shape& s) {
  Case c{s};
  c.g = static_cast<int64_t>(s.counts.size());
  const int64_t total = std::accumulate(s.counts.begin(), s.counts.end(), int64_t{0});
  c.r = total + s.capacity_delta;
  c.valid = std::min(total, c.r);
  std::mt19937_64 rng(std::random_device{}());
  c.x_src = Host(DType::kBF16, {s.sources, s.k});
  c.dy_src = Host(DType::kBF16, {s.sources, s.n});
  c.w = Host(DType::kBF16, {c.g, s.k, s.n});
  c.dw0 = Host(DType::kF32, {c.g, s.k, s.n});
  testing::FillRandom(c.x_src.View(), rng);
  testing::FillRandom(c.dy_src.View(), rng);
  testing::FillRandom(c.w.View(), rng);
  testing::FillRandom(c.dw0.View(), rng);
  c.counts = Host(DType::kI32, {c.g});
  std::memcpy(c.counts.data(), s.counts.data(), s.counts.size() * sizeof(int32_t));
  std::uniform_int_distribution<int32_t> src_row(0, static_cast<int32_t>(s.sources - 1));
  c.index.assign(c.r, INT32_MIN);
  for (int64_t p = 0; p < c.valid; ++p) c.index[p] = src_row(rng);
  c.index_host = Host(DType::kI32, {c.r});
  std::memcpy(c.index_host.data(), c.index.data(), c.r * sizeof(int32_t));

  c.x_perm = Host(DType::kBF16, {c.r, s.k});
  c.dy_perm = Host(DType::kBF16, {c.r, s.n});
  Gather(c.x_src, c.index, c.valid, c.x_perm);
  Gather(c.dy_src, c.index, c.valid, c.dy_perm);

  c.y_ref = Host(DType::kF32, {c.r, s.n});
  c.dx_ref = Host(DType::kF32, {c.r, s.k});
  c.dw_ref = Host(DType::kF32, {c.g, s.k, s.n});
  c.dw_acc_ref = Host(DType::kF32, {c.g, s.k, s.n});
  auto cpu = GroupedGemm::Create(Device::Cpu(), static_cast<int>(c.g)).value();
  const Stream st = Stream::Cpu();
  EXPECT_TRUE(cpu->Fprop(st, c.x_perm.View(), c.w.View(), c.counts.View(), c.y_ref.View()).ok());
  EXPECT_TRUE(cpu->Dgrad(st, c.dy_perm.View(), c.w.View(), c.counts.View(), c.dx_ref.View()).ok());
  EXPECT_TRUE(
      cpu->Wgrad(st, c.x_perm.View(), c.dy_perm.View(), c.counts.View(), c.dw_ref.View(), false)
          .ok());
  const float* ref = static_cast<const float*>(c.dw_ref.data());
  const float* init = static_cast<const float*>(c.dw0.data());
  float* acc = static_cast<float*>(c.dw_acc_ref.data());
  for (int64_t e = 0; e < c.g * s.k * s.n; ++e) acc[e] = init[e] + ref[e];
  return c;
}

// Rows [0, valid) of `out` against `ref`; rows past it must keep the 0xFF poison.
void CheckRows(const std::string& what, const Tensor& out, const Buffer& ref, int64_t valid,
               int64_t cols) {
  const std::vector<float> o = testing::ToFloatVector(out);
  const std::vector<float> r = testing::ToFloatVector(ref.View());
  const double err =
      testing::RelativeError(std::vector<float>(o.begin(), o.begin() + valid * cols),
                             std::vector<float>(r.begin(), r.begin() + valid * cols));
  std::vector<uint16_t> raw(out.numel());
  ASSERT_TRUE(CopyTensor(out, Tensor(DType::kBF16, out.shape, Device::Cpu(), raw.data())).ok());
  const bool tail_poisoned =
      std::all_of(raw.begin() + valid * cols, raw.end(), [](uint16_t b) { return b == 0xFFFF; });
  std::printf("    %-34s rel err %.3g (tol %.0e), rows past the total untouched: %s\n",
              what.c_str(), err, kTol, tail_poisoned ? "yes" : "NO");
  EXPECT_LT(err, kTol) << what;
  EXPECT_TRUE(tail_poisoned) << what;
}

// All of dw against `ref`; the groups without rows exactly 0 (fresh) or their initial value.
void CheckDw(const std::string& what, const Tensor& out, const Buffer& ref, const Case& c,
             const Buffer* initial) {
  const std::vector<float> o = testing::ToFloatVector(out);
  const std::vector<float> r = testing::ToFloatVector(ref.View());
  const double err = testing::RelativeError(o, r);
  const int64_t kn = c.shape.k * c.shape.n;
  const float* init = initial ? static_cast<const float*>(initial->data()) : nullptr;
  bool empty_exact = true;
  int64_t offset = 0;
  for (int64_t g = 0; g < c.g; ++g) {
    const int64_t rows = std::max<int64_t>(0, std::min<int64_t>(c.shape.counts[g], c.r - offset));
    offset += c.shape.counts[g];
    if (rows != 0) continue;
    for (int64_t e = g * kn; e < (g + 1) * kn; ++e) empty_exact &= o[e] == (init ? init[e] : 0.0f);
  }
  std::printf("    %-34s rel err %.3g (tol %.0e), empty groups exact: %s\n", what.c_str(), err,
              kTol, empty_exact ? "yes" : "NO");
  EXPECT_LT(err, kTol) << what;
  EXPECT_TRUE(empty_exact) << what;
}

absl::Status Run(GatherGemmCall call) {
  absl::Status st = internal::RunGatherGemmSm90(call);
  if (st.ok() && cudaDeviceSynchronize() != cudaSuccess) {
    return absl::InternalError(cudaGetErrorString(cudaGetLastError()));
  }
  return st;
}

void RunCase(const Case& c, int sm_count) {
  const Shape& s = c.shape;
  std::printf("  G=%ld R=%ld rows kept=%ld S=%ld K=%ld N=%ld, %s\n", c.g, c.r, c.valid, s.sources,
              s.k, s.n, sm_count > 0 ? (std::to_string(sm_count) + " CTAs").c_str() : "all SMs");
  Buffer x_src = testing::Upload(c.x_src), dy_src = testing::Upload(c.dy_src),
         w = testing::Upload(c.w);
  Buffer x_perm = testing::Upload(c.x_perm), dy_perm = testing::Upload(c.dy_perm);
  Buffer counts = testing::Upload(c.counts), index = testing::Upload(c.index_host);
  const int32_t* idx = static_cast<const int32_t*>(index.data());

  GatherGemmCall base;
  base.tokens_per_group = static_cast<const int32_t*>(counts.data());
  base.rows = c.r;
  base.k = s.k;
  base.n = s.n;
  base.groups = static_cast<int>(c.g);
  base.sm_count = sm_count;

  // Fprop (x -> y [R, N]) and Dgrad (dy -> dx [R, K]): gathered A, and A already permuted.
  for (const GroupedGemmOp op : {GroupedGemmOp::kFprop, GroupedGemmOp::kDgrad}) {
    const bool fprop = op == GroupedGemmOp::kFprop;
    const Buffer& src = fprop ? x_src : dy_src;
    const Buffer& perm = fprop ? x_perm : dy_perm;
    const int64_t out_cols = fprop ? s.n : s.k;
    for (const bool gathered : {true, false}) {
      Buffer out = testing::Poisoned(DType::kBF16, {c.r, out_cols});
      GatherGemmCall call = base;
      call.op = op;
      call.a = gathered ? src.data() : perm.data();
      call.a_index = gathered ? idx : nullptr;
      call.b = w.data();
      call.out = out.data();
      const absl::Status st = Run(call);
      ASSERT_TRUE(st.ok()) << st;
      CheckRows(
          std::string(fprop ? "fprop y" : "dgrad dx") + (gathered ? " (gathered)" : " (permuted)"),
          out.View(), fprop ? c.y_ref : c.dx_ref, c.valid, out_cols);
    }
  }

  // Wgrad: each of A, B gathered or permuted; fresh and accumulating.
  for (int mode = 0; mode < 4; ++mode) {
    const bool ga = mode & 1, gb = mode & 2;
    const std::string how = std::string(" (A ") + (ga ? "gathered" : "permuted") + ", B " +
                            (gb ? "gathered" : "permuted") + ")";
    GatherGemmCall wg = base;
    wg.op = GroupedGemmOp::kWgrad;
    wg.out_dtype = DType::kF32;
    wg.a = ga ? x_src.data() : x_perm.data();
    wg.a_index = ga ? idx : nullptr;
    wg.b = gb ? dy_src.data() : dy_perm.data();
    wg.b_index = gb ? idx : nullptr;
    Buffer dw = testing::Poisoned(DType::kF32, {c.g, s.k, s.n});
    wg.out = dw.data();
    absl::Status st = Run(wg);
    ASSERT_TRUE(st.ok()) << st;
    CheckDw("wgrad dw" + how, dw.View(), c.dw_ref, c, nullptr);

    ASSERT_TRUE(CopyTensor(c.dw0.View(), dw.View()).ok());
    wg.accumulate = true;
    st = Run(wg);
    ASSERT_TRUE(st.ok()) << st;
    CheckDw("wgrad dw +=" + how, dw.View(), c.dw_acc_ref, c, &c.dw0);
  }
}

class GatherGemmGpuTest : public ::testing::TestWithParam<Shape> {};

TEST_P(GatherGemmGpuTest, MatchesCpuReferenceOfTheGatheredOperands) {
  SY_REQUIRE_GPU();
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  if (major != 9 || !internal::GatherGemmSm90Compiled()) {
    GTEST_SKIP() << "the gathered grouped GEMM needs compute capability 9.0 (have " << major << ")";
  }
  const Case c = MakeCase(GetParam());
  std::printf("gather grouped gemm %s\n", GetParam().name);
  for (const int sm_count : {0, 1, 3}) {
    SCOPED_TRACE(sm_count);
    RunCase(c, sm_count);
  }
}

// The public GroupedGemm::*Gathered ops on CUDA against the same ops on the CPU (which gather,
// then run the reference), one uneven shape, every op.
TEST(GatherGemmGpuTest, PublicGatheredOpsMatchTheCpuReference) {
  SY_REQUIRE_GPU();
  auto gpu = GroupedGemm::Create(Device::Cuda(0), 8).value();
  if (!gpu->GatherSupported(256, 128)) GTEST_SKIP() << "no SM90 gathered grouped GEMM here";
  const Case c = MakeCase(Shape{"public", {100, 0, 300, 7}, 9, 150, 256, 128});
  auto cpu = GroupedGemm::Create(Device::Cpu(), 8).value();
  const Stream host = Stream::Cpu(), dev{Device::Cuda(0), nullptr};
  Buffer x_src = testing::Upload(c.x_src), dy_src = testing::Upload(c.dy_src),
         w = testing::Upload(c.w);
  Buffer counts = testing::Upload(c.counts), index = testing::Upload(c.index_host);
  const int64_t k = c.shape.k, n = c.shape.n;

  Buffer y = testing::Poisoned(DType::kBF16, {c.r, n});
  Buffer y_ref = Host(DType::kF32, {c.r, n});
  std::memset(y_ref.data(), 0xFF, y_ref.View().bytes());
  absl::Status st =
      gpu->FpropGathered(dev, x_src.View(), index.View(), w.View(), counts.View(), y.View());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_TRUE(cpu->FpropGathered(host, c.x_src.View(), c.index_host.View(), c.w.View(),
                                 c.counts.View(), y_ref.View())
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  CheckRows("public FpropGathered", y.View(), y_ref, c.valid, n);

  Buffer dx = testing::Poisoned(DType::kBF16, {c.r, k});
  Buffer dx_ref = Host(DType::kF32, {c.r, k});
  st = gpu->DgradGathered(dev, dy_src.View(), index.View(), w.View(), counts.View(), dx.View());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_TRUE(cpu->DgradGathered(host, c.dy_src.View(), c.index_host.View(), c.w.View(),
                                 c.counts.View(), dx_ref.View())
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  CheckRows("public DgradGathered", dx.View(), dx_ref, c.valid, k);

  Buffer dw = testing::Upload(c.dw0);
  st = gpu->WgradGathered(dev, x_src.View(), index.View(), dy_src.View(), index.View(),
                          counts.View(), dw.View(), /*accumulate=*/true);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  CheckDw("public WgradGathered +=", dw.View(), c.dw_acc_ref, c, &c.dw0);

  // A bf16 dW is refused on CUDA, naming the rule.
  Buffer dw16 = Buffer::ForTensor(DType::kBF16, {c.g, k, n}, Device::Cuda(0)).value();
  st = gpu->WgradGathered(dev, x_src.View(), index.View(), dy_src.View(), index.View(),
                          counts.View(), dw16.View(), false);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
}

TEST(GatherGemmGpuTest, RejectsShapesItCannotRun) {
  SY_REQUIRE_GPU();
  GatherGemmCall call;
  call.groups = 4;
  call.k = 200;  // not a multiple of 128
  call.n = 256;
  const absl::Status st = internal::RunGatherGemmSm90(call);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("multiples of 128"), absl::string_view::npos) << st;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GatherGemmGpuTest,
    ::testing::Values(
        // Uneven groups with empty ones, rows not multiples of the 256-row tile or the 64-deep
        // Wgrad K tile; K = 384 is 1.5 Wgrad M tiles.
        Shape{"uneven", {300, 0, 17, 256, 513, 1, 0, 64}, 40, 700, 384, 256},
        // The capacity cuts the last groups (the 6th keeps 167 of its 200 rows, the 7th none).
        Shape{"clamped", {120, 90, 0, 255, 257, 200, 150}, -183, 400, 256, 384},
        // The benchmark model's fc1 shape with 40 rows per expert (its step has ~1024): 64
        // experts, K = 1536, N = 768, each source row used 8 times (top-8).
        Shape{"bench_fc1_small", std::vector<int32_t>(64, 40), 0, 320, 1536, 768}),
    [](const ::testing::TestParamInfo<Shape>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace switchyard::kernels
