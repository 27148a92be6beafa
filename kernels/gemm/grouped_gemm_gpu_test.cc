// GroupedGemm on the GPU (CUTLASS SM90 with each tile, and the portable fallback) against the CPU
// reference, on fresh random bf16 inputs with outputs poisoned first (0xFF bytes: NaN). Rows of
// x and dy past the total are NaN on the device, so reading them would show; rows of y and dx
// past the total must keep their poison. Tolerance (DESIGN.md): relative L2 error < 1e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm/grouped_gemm.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

constexpr double kTol = 1e-2;

struct Shape {
  const char* name;
  std::vector<int32_t> counts;
  int64_t pad_rows;  // R = total + pad_rows
  int64_t k, n;
};

struct Variant {
  std::string name;
  GroupedGemmPath path;
  GroupedGemmTile tile;
};

// CUTLASS SM90 with kAuto and with every tile, then the fallback.
std::vector<Variant> Variants() {
  std::vector<Variant> v = {
      {"cutlass_sm90 auto", GroupedGemmPath::kCutlassSm90, GroupedGemmTile::kAuto}};
  for (GroupedGemmTile tile : kGroupedGemmTiles) {
    v.push_back({std::string("cutlass_sm90 ") + GroupedGemmTileName(tile),
                 GroupedGemmPath::kCutlassSm90, tile});
  }
  v.push_back({"fallback", GroupedGemmPath::kFallback, GroupedGemmTile::kAuto});
  return v;
}

Buffer Host(DType dt, std::vector<int64_t> shape) {
  return Buffer::ForTensor(dt, std::move(shape), Device::Cpu()).value();
}

Buffer ToDevice(const Buffer& host) {
  Tensor h = host.View();
  Buffer d = Buffer::ForTensor(h.dtype, h.shape, Device::Cuda(0)).value();
  EXPECT_TRUE(CopyTensor(h, d.View()).ok());
  return d;
}

std::vector<float> Slice(const std::vector<float>& v, int64_t begin, int64_t end) {
  return std::vector<float>(v.begin() + begin, v.begin() + end);
}

// The CPU reference outputs (f32) for one shape, and the inputs they came from.
struct Case {
  Shape shape;
  int64_t g, r, total;
  Buffer x, w, dy, counts, dw0_f32, dw0_bf16;  // host
  Buffer y_ref, dx_ref, dw_ref, dw_acc_f32_ref, dw_acc_bf16_ref;
};

Case MakeCase(const Shape& s) {
  Case c{s};
  c.g = static_cast<int64_t>(s.counts.size());
  c.total = std::accumulate(s.counts.begin(), s.counts.end(), int64_t{0});
  c.r = c.total + s.pad_rows;
  std::mt19937_64 rng(std::random_device{}());
  c.x = Host(DType::kBF16, {c.r, s.k});
  c.w = Host(DType::kBF16, {c.g, s.k, s.n});
  c.dy = Host(DType::kBF16, {c.r, s.n});
  c.counts = Host(DType::kI32, {c.g});
  c.dw0_f32 = Host(DType::kF32, {c.g, s.k, s.n});
  c.dw0_bf16 = Host(DType::kBF16, {c.g, s.k, s.n});
  testing::FillRandom(c.x.View(), rng);
  testing::FillRandom(c.w.View(), rng);
  testing::FillRandom(c.dy.View(), rng);
  testing::FillRandom(c.dw0_f32.View(), rng);
  testing::FillRandom(c.dw0_bf16.View(), rng);
  std::memcpy(c.counts.data(), s.counts.data(), s.counts.size() * sizeof(int32_t));

  c.y_ref = Host(DType::kF32, {c.r, s.n});
  c.dx_ref = Host(DType::kF32, {c.r, s.k});
  c.dw_ref = Host(DType::kF32, {c.g, s.k, s.n});
  auto cpu = GroupedGemm::Create(Device::Cpu(), static_cast<int>(c.g)).value();
  const Stream st = Stream::Cpu();
  EXPECT_TRUE(cpu->Fprop(st, c.x.View(), c.w.View(), c.counts.View(), c.y_ref.View()).ok());
  EXPECT_TRUE(cpu->Dgrad(st, c.dy.View(), c.w.View(), c.counts.View(), c.dx_ref.View()).ok());
  EXPECT_TRUE(
      cpu->Wgrad(st, c.x.View(), c.dy.View(), c.counts.View(), c.dw_ref.View(), false).ok());
  // Accumulating references: the initial dW (as float) plus the fresh reference.
  c.dw_acc_f32_ref = Host(DType::kF32, {c.g, s.k, s.n});
  c.dw_acc_bf16_ref = Host(DType::kF32, {c.g, s.k, s.n});
  const float* ref = static_cast<const float*>(c.dw_ref.data());
  const float* init32 = static_cast<const float*>(c.dw0_f32.data());
  const BF16* init16 = static_cast<const BF16*>(c.dw0_bf16.data());
  float* acc32 = static_cast<float*>(c.dw_acc_f32_ref.data());
  float* acc16 = static_cast<float*>(c.dw_acc_bf16_ref.data());
  for (int64_t e = 0; e < c.g * s.k * s.n; ++e) {
    acc32[e] = init32[e] + ref[e];
    acc16[e] = init16[e].ToFloat() + ref[e];
  }
  // Rows past the total: NaN (bf16 0xFFFF) in the device copies of x and dy.
  std::memset(static_cast<BF16*>(c.x.data()) + c.total * s.k, 0xFF, s.pad_rows * s.k * 2);
  std::memset(static_cast<BF16*>(c.dy.data()) + c.total * s.n, 0xFF, s.pad_rows * s.n * 2);
  return c;
}

// Checks rows [0, total) of `out` against `ref` and that rows past the total kept the 0xFF poison.
void CheckRows(const char* what, const Tensor& out, const Buffer& ref, int64_t total,
               int64_t cols) {
  const std::vector<float> o = testing::ToFloatVector(out);
  const std::vector<float> r = testing::ToFloatVector(ref.View());
  const double err = testing::RelativeError(Slice(o, 0, total * cols), Slice(r, 0, total * cols));
  std::vector<uint16_t> raw(out.numel());
  ASSERT_TRUE(CopyTensor(out, Tensor(DType::kBF16, out.shape, Device::Cpu(), raw.data())).ok());
  const bool tail_poisoned =
      std::all_of(raw.begin() + total * cols, raw.end(), [](uint16_t b) { return b == 0xFFFF; });
  std::printf("    %-22s rel err %.3g (tol %.0e), rows past the total untouched: %s\n", what, err,
              kTol, tail_poisoned ? "yes" : "NO");
  EXPECT_LT(err, kTol) << what;
  EXPECT_TRUE(tail_poisoned) << what;
}

// Checks all of dw against `ref`, and the empty groups exactly (0, or the initial value).
void CheckDw(const char* what, const Tensor& out, const Buffer& ref, const Case& c,
             const std::vector<float>* initial) {
  const std::vector<float> o = testing::ToFloatVector(out);
  const std::vector<float> r = testing::ToFloatVector(ref.View());
  const double err = testing::RelativeError(o, r);
  const int64_t kn = c.shape.k * c.shape.n;
  bool empty_exact = true;
  for (int64_t g = 0; g < c.g; ++g) {
    if (c.shape.counts[g] != 0) continue;
    for (int64_t e = g * kn; e < (g + 1) * kn; ++e) {
      empty_exact &= o[e] == (initial ? (*initial)[e] : 0.0f);
    }
  }
  std::printf("    %-22s rel err %.3g (tol %.0e), empty groups exact: %s\n", what, err, kTol,
              empty_exact ? "yes" : "NO");
  EXPECT_LT(err, kTol) << what;
  EXPECT_TRUE(empty_exact) << what;
}

void RunVariant(const Case& c, const Variant& v) {
  const Shape& s = c.shape;
  GroupedGemmOptions opts;
  opts.path = v.path;
  opts.tile = v.tile;
  auto created = GroupedGemm::Create(Device::Cuda(0), static_cast<int>(c.g), opts);
  if (v.path == GroupedGemmPath::kCutlassSm90 &&
      created.status().code() == absl::StatusCode::kFailedPrecondition) {
    std::printf("  %s: not available here (%s)\n", v.name.c_str(),
                std::string(created.status().message()).c_str());
    return;
  }
  ASSERT_TRUE(created.ok()) << created.status();
  GroupedGemm& gg = **created;
  std::printf("  %s (G=%ld R=%ld total=%ld K=%ld N=%ld, auto fprop tile %s)\n", v.name.c_str(), c.g,
              c.r, c.total, s.k, s.n,
              GroupedGemmTileName(internal::ChooseGroupedGemmTile(
                  internal::GroupedGemmOp::kFprop, c.r, static_cast<int>(c.g), s.k, s.n)));
  Buffer x = ToDevice(c.x), w = ToDevice(c.w), dy = ToDevice(c.dy), counts = ToDevice(c.counts);
  const Stream stream{Device::Cuda(0), nullptr};
  const bool aligned = s.k % 8 == 0 && s.n % 8 == 0;

  Buffer y = Buffer::ForTensor(DType::kBF16, {c.r, s.n}, Device::Cuda(0)).value();
  ASSERT_TRUE(FillBytes(y.View(), 0xFF).ok());
  absl::Status st = gg.Fprop(stream, x.View(), w.View(), counts.View(), y.View());
  if (v.path == GroupedGemmPath::kCutlassSm90 && !aligned) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("multiples of 8"), absl::string_view::npos) << st;
    std::printf("    unaligned shape rejected as expected: %s\n",
                std::string(st.message()).c_str());
    return;
  }
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  CheckRows("fprop y", y.View(), c.y_ref, c.total, s.n);

  Buffer dx = Buffer::ForTensor(DType::kBF16, {c.r, s.k}, Device::Cuda(0)).value();
  ASSERT_TRUE(FillBytes(dx.View(), 0xFF).ok());
  st = gg.Dgrad(stream, dy.View(), w.View(), counts.View(), dx.View());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  CheckRows("dgrad dx", dx.View(), c.dx_ref, c.total, s.k);

  for (DType dt : {DType::kF32, DType::kBF16}) {
    const bool f32 = dt == DType::kF32;
    Buffer dw = Buffer::ForTensor(dt, {c.g, s.k, s.n}, Device::Cuda(0)).value();
    ASSERT_TRUE(FillBytes(dw.View(), 0xFF).ok());
    st = gg.Wgrad(stream, x.View(), dy.View(), counts.View(), dw.View(), /*accumulate=*/false);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    CheckDw(f32 ? "wgrad dw f32" : "wgrad dw bf16", dw.View(), c.dw_ref, c, nullptr);

    const Buffer& dw0 = f32 ? c.dw0_f32 : c.dw0_bf16;
    ASSERT_TRUE(CopyTensor(dw0.View(), dw.View()).ok());
    st = gg.Wgrad(stream, x.View(), dy.View(), counts.View(), dw.View(), /*accumulate=*/true);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> initial = testing::ToFloatVector(dw0.View());
    CheckDw(f32 ? "wgrad dw f32 +=" : "wgrad dw bf16 +=", dw.View(),
            f32 ? c.dw_acc_f32_ref : c.dw_acc_bf16_ref, c, &initial);
  }
}

class GroupedGemmGpuTest : public ::testing::TestWithParam<Shape> {};

TEST_P(GroupedGemmGpuTest, MatchesCpuReference) {
  SY_REQUIRE_GPU();
  const Case c = MakeCase(GetParam());
  std::printf("grouped gemm %s\n", GetParam().name);
  for (const Variant& v : Variants()) {
    SCOPED_TRACE(v.name);
    RunVariant(c, v);
  }
}

std::vector<int32_t> MoeCounts(int groups, int max_rows, int zero_every, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(1, max_rows);
  std::vector<int32_t> counts(groups);
  for (int g = 0; g < groups; ++g) counts[g] = g % zero_every == 3 ? 0 : dist(rng);
  return counts;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GroupedGemmGpuTest,
    ::testing::Values(
        // Small, with a zero group; K and N multiples of 8 (TMA-aligned).
        Shape{"small", {37, 0, 21}, 6, 40, 24},
        // Odd K and N: fallback only (CUTLASS rejects them with INVALID_ARGUMENT).
        Shape{"odd", {5, 0, 30}, 3, 37, 19},
        // One group, rows not a multiple of any tile.
        Shape{"single", {333}, 0, 64, 136},
        // MoE-like, uneven (8 experts).
        Shape{"moe8", {700, 13, 0, 1500, 256, 1, 389, 1024}, 16, 512, 1024},
        // qwen3-like fc1: 128 experts, ~64 rows per group, some empty.
        Shape{"moe128", MoeCounts(128, 127, 9, 7), 37, 2048, 1536},
        // Small groups (1-160 rows, some empty: partial 64- and 128-row tiles, Wgrad reductions
        // shorter than one 64-deep K tile) with N = 640 and K = 384, which are 5 and 3 tiles of
        // 128 and 2.5 and 1.5 tiles of 256: the 1x2 clusters round up to a tile past the end.
        Shape{"small_groups", MoeCounts(24, 160, 7, 11), 9, 384, 640}),
    [](const ::testing::TestParamInfo<Shape>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace switchyard::kernels
