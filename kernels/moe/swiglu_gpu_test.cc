// CUDA weighted SwiGLU against the CPU reference on fresh random bf16 inputs (std::random_device
// seed), outputs poisoned (0xFF) first. Valid rows come from device counts; the rows past them
// are NaN in every input and must stay poisoned in every output (never read, never written).
// Tolerances (DESIGN.md): bf16 outputs (a, dh) rel L2 < 1e-2; fp32 dprobs rel L2 < 1e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/moe/swiglu.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

struct Case {
  int64_t n, f;
  int64_t num_counts;  // 0 = no row_counts (all N rows)
  int64_t valid;       // rows the counts sum to
  bool weighted;
};

Buffer OnDevice(const Tensor& host) {
  Buffer b = Buffer::ForTensor(host.dtype, host.shape, Device::Cuda(0)).value();
  EXPECT_TRUE(CopyTensor(host, b.View()).ok());
  return b;
}

Buffer Poisoned(DType dtype, std::vector<int64_t> shape, Device device) {
  Buffer b = Buffer::ForTensor(dtype, std::move(shape), device).value();
  EXPECT_TRUE(FillBytes(b.View(), 0xFF).ok());
  return b;
}

// Random rows [0, valid), NaN bytes after.
Buffer RowsThenNan(std::mt19937_64& rng, DType dtype, std::vector<int64_t> shape, int64_t valid,
                   float scale) {
  Buffer b = Buffer::ForTensor(dtype, shape, Device::Cpu()).value();
  testing::FillRandom(b.View(), rng, scale);
  const int64_t row_bytes = b.bytes() / shape[0];
  std::memset(static_cast<char*>(b.data()) + valid * row_bytes, 0xFF,
              (shape[0] - valid) * row_bytes);
  return b;
}

std::vector<float> FirstRows(const std::vector<float>& v, int64_t rows, int64_t cols) {
  return std::vector<float>(v.begin(), v.begin() + rows * cols);
}

// True when elements [rows * cols, end) are still all-ones bytes (the poison).
bool TailPoisoned(const Tensor& t, int64_t rows, int64_t cols) {
  std::vector<uint8_t> host(t.bytes());
  EXPECT_TRUE(CopyTensor(t, Tensor(t.dtype, t.shape, Device::Cpu(), host.data())).ok());
  return std::all_of(host.begin() + rows * cols * DTypeSize(t.dtype), host.end(),
                     [](uint8_t b) { return b == 0xFF; });
}

class SwigluGpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(SwigluGpuTest, MatchesCpuReference) {
  SY_REQUIRE_GPU();
  const Case c = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  const Stream cpu = Stream::Cpu(), gpu{Device::Cuda(0), nullptr};
  const int64_t n = c.n, f = c.f, valid = c.num_counts > 0 ? c.valid : n;

  Buffer h = RowsThenNan(rng, DType::kBF16, {n, 2 * f}, valid, 2.0f);
  Buffer da = RowsThenNan(rng, DType::kBF16, {n, f}, valid, 1.0f);
  Buffer probs = RowsThenNan(rng, DType::kF32, {n, 1}, valid, 0.5f);
  Buffer counts =
      Buffer::ForTensor(DType::kI32, {std::max<int64_t>(c.num_counts, 1)}, Device::Cpu()).value();
  if (c.num_counts > 0) {  // random split of `valid` rows over the counts, some of them empty
    std::vector<int64_t> cuts(c.num_counts - 1);
    std::uniform_int_distribution<int64_t> u(0, c.valid);
    for (int64_t& x : cuts) x = u(rng);
    cuts.push_back(0);
    cuts.push_back(c.valid);
    std::sort(cuts.begin(), cuts.end());
    for (int64_t i = 0; i < c.num_counts; ++i) {
      counts.View().as<int32_t>()[i] = static_cast<int32_t>(cuts[i + 1] - cuts[i]);
    }
  }
  Tensor hp = c.weighted ? probs.View(DType::kF32, {n}) : Tensor();
  Tensor hc = c.num_counts > 0 ? counts.View() : Tensor();

  Buffer a = Poisoned(DType::kBF16, {n, f}, Device::Cpu()),
         dh = Poisoned(DType::kBF16, {n, 2 * f}, Device::Cpu()),
         dp = Poisoned(DType::kF32, {n}, Device::Cpu());
  Tensor dp_view = c.weighted ? dp.View() : Tensor();
  ASSERT_TRUE(SwigluForward(cpu, h.View(), hp, hc, a.View()).ok());
  ASSERT_TRUE(SwigluBackward(cpu, da.View(), h.View(), hp, hc, dh.View(), dp_view).ok());

  Buffer g_h = OnDevice(h.View()), g_da = OnDevice(da.View()), g_p = OnDevice(probs.View()),
         g_c = OnDevice(counts.View());
  Buffer g_a = Poisoned(DType::kBF16, {n, f}, Device::Cuda(0)),
         g_dh = Poisoned(DType::kBF16, {n, 2 * f}, Device::Cuda(0)),
         g_dp = Poisoned(DType::kF32, {n}, Device::Cuda(0));
  Tensor gp = c.weighted ? g_p.View(DType::kF32, {n}) : Tensor();
  Tensor gc = c.num_counts > 0 ? g_c.View() : Tensor();
  absl::Status st = SwigluForward(gpu, g_h.View(), gp, gc, g_a.View());
  ASSERT_TRUE(st.ok()) << st;
  st = SwigluBackward(gpu, g_da.View(), g_h.View(), gp, gc, g_dh.View(),
                      c.weighted ? g_dp.View() : Tensor());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  using testing::ToFloatVector;
  const double err_a = testing::RelativeError(FirstRows(ToFloatVector(g_a.View()), valid, f),
                                              FirstRows(ToFloatVector(a.View()), valid, f));
  const double err_dh = testing::RelativeError(FirstRows(ToFloatVector(g_dh.View()), valid, 2 * f),
                                               FirstRows(ToFloatVector(dh.View()), valid, 2 * f));
  double err_dp = 0;
  if (c.weighted) {
    err_dp = testing::RelativeError(FirstRows(ToFloatVector(g_dp.View()), valid, 1),
                                    FirstRows(ToFloatVector(dp.View()), valid, 1));
    EXPECT_LT(err_dp, 1e-5);
    EXPECT_TRUE(TailPoisoned(g_dp.View(), valid, 1)) << "dprobs written past the valid rows";
  }
  EXPECT_LT(err_a, 1e-2);
  EXPECT_LT(err_dh, 1e-2);
  EXPECT_TRUE(TailPoisoned(g_a.View(), valid, f)) << "a written past the valid rows";
  EXPECT_TRUE(TailPoisoned(g_dh.View(), valid, 2 * f)) << "dh written past the valid rows";
  std::printf(
      "swiglu gpu N=%ld F=%ld counts=%ld valid=%ld weighted=%d: rel err a %.3g dh %.3g "
      "(tol 1e-2) dprobs %.3g (tol 1e-5)\n",
      n, f, c.num_counts, valid, c.weighted, err_a, err_dh, err_dp);
}

INSTANTIATE_TEST_SUITE_P(Shapes, SwigluGpuTest,
                         ::testing::Values(Case{1000, 2048, 16, 900, true},
                                           Case{4096, 1408, 64, 4000, true},
                                           Case{16384, 256, 256, 16384, true},  // all rows valid
                                           Case{257, 100, 4, 200, true},        // F % 8 != 0
                                           Case{64, 7, 1, 50, true},            // one total count
                                           Case{1, 64, 1, 1, true},             // N = 1
                                           Case{40, 32, 8, 0, true},            // zero valid rows
                                           Case{512, 256, 0, 0, false},         // shared expert
                                           Case{300, 50, 0, 0, false}));

}  // namespace
}  // namespace switchyard::kernels
