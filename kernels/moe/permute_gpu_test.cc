// CUDA permutation ops against the CPU reference on fresh random inputs (std::random_device
// seed), every output poisoned (0xFF bytes) first. Pure copies (row_map, tokens_per_expert,
// permuted rows and probs, d_topk_probs, UnpermuteBackward rows) must match exactly; the fp32
// slot sums (Unpermute, PermuteBackward dx) within bf16 rel L2 < 1e-2 (DESIGN.md). Rows past the
// valid total of the inputs are NaN, so a read of an unused row shows up as NaN in the outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/moe/permute.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

enum class Load { kUniform, kSkewed, kOneExpert };

struct Case {
  int64_t t, k, e, h;
  Load load;
  double drop;
  int64_t capacity;  // 0 = dropless / dropping without padding
};

template <typename T>
std::vector<T> Fetch(const Tensor& t) {
  std::vector<T> v(t.bytes() / sizeof(T));
  EXPECT_TRUE(CopyTensor(t, Tensor(t.dtype, t.shape, Device::Cpu(), v.data())).ok());
  return v;
}

Buffer OnDevice(const Tensor& host) {
  Buffer b = Buffer::ForTensor(host.dtype, host.shape, Device::Cuda(0)).value();
  EXPECT_TRUE(CopyTensor(host, b.View()).ok());
  return b;
}

Buffer Poisoned(DType dtype, std::vector<int64_t> shape) {
  Buffer b = Buffer::ForTensor(dtype, std::move(shape), Device::Cuda(0)).value();
  EXPECT_TRUE(FillBytes(b.View(), 0xFF).ok());
  return b;
}

Buffer Host(DType dtype, std::vector<int64_t> shape) {
  return Buffer::ForTensor(dtype, std::move(shape), Device::Cpu()).value();
}

// Distinct experts per token (see permute_test.cc), fp32 probs, optional capacity drops.
void MakeRouting(std::mt19937_64& rng, const Case& c, int32_t* idx, float* probs) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int32_t> perm(c.e);
  const int64_t pool = c.load == Load::kSkewed ? std::max<int64_t>(c.k, c.e / 2) : c.e;
  for (int64_t i = 0; i < c.t; ++i) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.begin() + pool, rng);
    if (c.load == Load::kOneExpert) {
      std::swap(perm[0], *std::find(perm.begin(), perm.end(), c.e - 1));
    }
    for (int64_t s = 0; s < c.k; ++s) {
      idx[i * c.k + s] = u(rng) < c.drop ? -1 : perm[s];
      probs[i * c.k + s] = static_cast<float>(0.05 + u(rng));
    }
  }
  std::vector<int64_t> seen(c.e, 0);
  for (int64_t i = 0; c.capacity > 0 && i < c.t * c.k; ++i) {
    if (idx[i] >= 0 && seen[idx[i]]++ >= c.capacity) idx[i] = -1;
  }
}

// Random bf16 rows [0, valid), NaN rows [valid, rows).
Buffer RowsThenNan(std::mt19937_64& rng, DType dtype, int64_t rows, int64_t cols, int64_t valid) {
  Buffer b = Host(dtype, {rows, cols});
  testing::FillRandom(b.View(), rng);
  const size_t row_bytes = cols * DTypeSize(dtype);
  std::memset(static_cast<char*>(b.data()) + valid * row_bytes, 0xFF, (rows - valid) * row_bytes);
  return b;
}

class PermuteGpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(PermuteGpuTest, MatchesCpuReference) {
  SY_REQUIRE_GPU();
  const Case c = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  const int64_t max_rows = c.capacity > 0 ? c.e * c.capacity : c.t * c.k;
  const Stream cpu = Stream::Cpu(), gpu{Device::Cuda(0), nullptr};

  Buffer x = Host(DType::kBF16, {c.t, c.h}), idx = Host(DType::kI32, {c.t, c.k}),
         probs = Host(DType::kF32, {c.t, c.k});
  testing::FillRandom(x.View(), rng);
  MakeRouting(rng, c, idx.View().as<int32_t>(), probs.View().as<float>());
  Buffer px = Host(DType::kBF16, {max_rows, c.h}), pp = Host(DType::kF32, {max_rows}),
         map = Host(DType::kI32, {c.t, c.k}), tpe = Host(DType::kI32, {c.e});
  absl::Status st = Permute(cpu, x.View(), idx.View(), probs.View(), c.e, c.capacity, px.View(),
                            pp.View(), map.View(), tpe.View(), Tensor());
  ASSERT_TRUE(st.ok()) << st;

  Buffer dx_in = OnDevice(x.View()), d_idx = OnDevice(idx.View()), d_probs = OnDevice(probs.View());
  Buffer d_px = Poisoned(DType::kBF16, {max_rows, c.h}), d_pp = Poisoned(DType::kF32, {max_rows}),
         d_map = Poisoned(DType::kI32, {c.t, c.k}), d_tpe = Poisoned(DType::kI32, {c.e}),
         d_cnt = Poisoned(DType::kI32, {c.e}),
         ws = Poisoned(DType::kU8, {std::max<int64_t>(1, PermuteWorkspaceBytes(c.t, c.e))});
  st = Permute(gpu, dx_in.View(), d_idx.View(), d_probs.View(), c.e, c.capacity, d_px.View(),
               d_pp.View(), d_map.View(), d_tpe.View(), ws.View());
  ASSERT_TRUE(st.ok()) << st;
  st = TokensPerExpert(gpu, d_idx.View(), c.e, d_cnt.View());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const std::vector<int32_t> ref_map = Fetch<int32_t>(map.View()),
                             ref_tpe = Fetch<int32_t>(tpe.View());
  EXPECT_EQ(Fetch<int32_t>(d_map.View()), ref_map);
  EXPECT_EQ(Fetch<int32_t>(d_tpe.View()), ref_tpe);
  std::vector<int32_t> counts(c.e, 0);
  for (int32_t e : Fetch<int32_t>(idx.View()))
    if (e >= 0) ++counts[e];
  EXPECT_EQ(Fetch<int32_t>(d_cnt.View()), counts);
  const int64_t valid = std::accumulate(ref_tpe.begin(), ref_tpe.end(), int64_t{0});
  {
    const std::vector<uint16_t> got = Fetch<uint16_t>(d_px.View()),
                                ref = Fetch<uint16_t>(px.View());
    EXPECT_TRUE(std::equal(ref.begin(), ref.begin() + valid * c.h, got.begin()))
        << "permuted_x rows differ from the CPU copy";
    const std::vector<float> gp = Fetch<float>(d_pp.View()), rp = Fetch<float>(pp.View());
    EXPECT_TRUE(std::equal(rp.begin(), rp.begin() + valid, gp.begin())) << "permuted_probs differ";
  }

  if (c.capacity == 0) {
    // PermuteIndex (dropless): Permute's map, counts and probs exactly, and the source token of
    // every row Permute copied (rows past the total keep their poison).
    Buffer i_pp = Poisoned(DType::kF32, {max_rows}), i_map = Poisoned(DType::kI32, {c.t, c.k}),
           i_tpe = Poisoned(DType::kI32, {c.e}), i_src = Poisoned(DType::kI32, {max_rows});
    st = PermuteIndex(gpu, d_idx.View(), d_probs.View(), c.e, i_pp.View(), i_map.View(),
                      i_src.View(), i_tpe.View(), ws.View());
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(Fetch<int32_t>(i_map.View()), ref_map);
    EXPECT_EQ(Fetch<int32_t>(i_tpe.View()), ref_tpe);
    const std::vector<float> gp = Fetch<float>(i_pp.View()), rp = Fetch<float>(pp.View());
    EXPECT_TRUE(std::equal(rp.begin(), rp.begin() + valid, gp.begin())) << "PermuteIndex probs";
    const std::vector<int32_t> src = Fetch<int32_t>(i_src.View());
    const std::vector<uint16_t> xs = Fetch<uint16_t>(x.View()), ref = Fetch<uint16_t>(px.View());
    int64_t wrong = 0;
    for (int64_t row = 0; row < valid; ++row) {
      if (src[row] < 0 || src[row] >= c.t ||
          !std::equal(ref.begin() + row * c.h, ref.begin() + (row + 1) * c.h,
                      xs.begin() + src[row] * c.h)) {
        ++wrong;
      }
    }
    EXPECT_EQ(wrong, 0) << "PermuteIndex source rows not the rows Permute copied";
    EXPECT_TRUE(std::all_of(src.begin() + valid, src.end(), [](int32_t v) { return v == -1; }))
        << "PermuteIndex wrote past the total";
  }

  // Unpermute and PermuteBackward (same gather): y and dprobs are NaN past the valid rows.
  Buffer y = RowsThenNan(rng, DType::kBF16, max_rows, c.h, valid);
  Buffer dpp = RowsThenNan(rng, DType::kF32, max_rows, 1, valid);
  Tensor dpp_v = dpp.View(DType::kF32, {max_rows});
  Buffer out = Host(DType::kBF16, {c.t, c.h}), dx = Host(DType::kBF16, {c.t, c.h}),
         dtp = Host(DType::kF32, {c.t, c.k});
  ASSERT_TRUE(Unpermute(cpu, y.View(), map.View(), out.View()).ok());
  ASSERT_TRUE(PermuteBackward(cpu, y.View(), dpp_v, map.View(), dx.View(), dtp.View()).ok());
  Buffer d_y = OnDevice(y.View()), d_dpp = OnDevice(dpp_v);
  Buffer d_out = Poisoned(DType::kBF16, {c.t, c.h}), d_out2 = Poisoned(DType::kBF16, {c.t, c.h}),
         d_dx = Poisoned(DType::kBF16, {c.t, c.h}), d_dtp = Poisoned(DType::kF32, {c.t, c.k});
  ASSERT_TRUE(Unpermute(gpu, d_y.View(), d_map.View(), d_out.View()).ok());
  ASSERT_TRUE(Unpermute(gpu, d_y.View(), d_map.View(), d_out2.View()).ok());
  st = PermuteBackward(gpu, d_y.View(), d_dpp.View(DType::kF32, {max_rows}), d_map.View(),
                       d_dx.View(), d_dtp.View());
  ASSERT_TRUE(st.ok()) << st;

  // UnpermuteBackward: copies; in pad mode the padding rows must come back as zeros.
  Buffer dout = Host(DType::kBF16, {c.t, c.h}), dy = Host(DType::kBF16, {max_rows, c.h});
  testing::FillRandom(dout.View(), rng);
  std::memset(dy.data(), 0xFF, dy.bytes());
  const bool pad = c.capacity > 0;
  ASSERT_TRUE(UnpermuteBackward(cpu, dout.View(), map.View(), dy.View(), pad).ok());
  Buffer d_dout = OnDevice(dout.View()), d_dy = Poisoned(DType::kBF16, {max_rows, c.h});
  ASSERT_TRUE(UnpermuteBackward(gpu, d_dout.View(), d_map.View(), d_dy.View(), pad).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const double err_out = testing::RelativeError(testing::ToFloatVector(d_out.View()),
                                                testing::ToFloatVector(out.View()));
  const double err_dx = testing::RelativeError(testing::ToFloatVector(d_dx.View()),
                                               testing::ToFloatVector(dx.View()));
  EXPECT_LT(err_out, 1e-2);
  EXPECT_LT(err_dx, 1e-2);
  EXPECT_EQ(Fetch<uint16_t>(d_out.View()), Fetch<uint16_t>(d_out2.View())) << "not deterministic";
  EXPECT_EQ(Fetch<float>(d_dtp.View()), Fetch<float>(dtp.View()));
  const int64_t dy_rows = pad ? max_rows : valid;  // past `valid`, non-pad rows are unspecified
  const std::vector<uint16_t> gdy = Fetch<uint16_t>(d_dy.View()), rdy = Fetch<uint16_t>(dy.View());
  EXPECT_TRUE(std::equal(rdy.begin(), rdy.begin() + dy_rows * c.h, gdy.begin()))
      << "UnpermuteBackward rows differ";
  std::printf(
      "permute gpu T=%ld k=%ld E=%ld H=%ld C=%ld rows=%ld/%ld: map/counts/rows exact; "
      "unpermute rel err %.3g, dx rel err %.3g (tol 1e-2)\n",
      c.t, c.k, c.e, c.h, c.capacity, valid, max_rows, err_out, err_dx);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PermuteGpuTest,
    ::testing::Values(Case{256, 8, 64, 512, Load::kUniform, 0.05, 0},
                      Case{1, 4, 8, 64, Load::kUniform, 0.0, 0},      // T = 1
                      Case{300, 2, 16, 100, Load::kSkewed, 0.1, 0},   // H % 8 != 0, empty experts
                      Case{129, 3, 8, 7, Load::kOneExpert, 0.0, 0},   // odd H (scalar path)
                      Case{500, 2, 32, 256, Load::kSkewed, 0.0, 40},  // pad to capacity
                      Case{4096, 6, 160, 1024, Load::kOneExpert, 0.0, 0},
                      Case{1000, 4, 1024, 64, Load::kSkewed, 0.1, 0},  // E = kMaxExpertsCuda
                      Case{16384, 8, 256, 128, Load::kUniform, 0.02, 0},
                      Case{2048, 8, 256, 7168, Load::kUniform, 0.0, 0}));

// Error states the router never produces (the CPU path rejects them): on CUDA, tokens past an
// expert's capacity and invalid expert ids are dropped, and nothing is written out of bounds.
TEST(PermuteGpuTest, ClampsOverCapacityAndInvalidIdsWithoutOutOfBoundsWrites) {
  SY_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  const Case c{300, 2, 4, 24, Load::kUniform, 0.0, 10};
  const int64_t rows = c.e * c.capacity, guard = 64;
  Buffer x = Host(DType::kBF16, {c.t, c.h}), idx = Host(DType::kI32, {c.t, c.k}),
         probs = Host(DType::kF32, {c.t, c.k});
  testing::FillRandom(x.View(), rng);
  MakeRouting(rng, Case{c.t, c.k, c.e, c.h, Load::kUniform, 0.0, 0}, idx.View().as<int32_t>(),
              probs.View().as<float>());
  int32_t* id = idx.View().as<int32_t>();
  id[5] = static_cast<int32_t>(c.e + 5);
  id[17] = -7;
  std::vector<int32_t> ref_map(c.t * c.k, -1), seen(c.e, 0);
  for (int64_t i = 0; i < c.t * c.k; ++i) {
    if (id[i] >= 0 && id[i] < c.e && seen[id[i]] < c.capacity) {
      ref_map[i] = static_cast<int32_t>(id[i] * c.capacity + seen[id[i]]++);
    }
  }
  const Stream gpu{Device::Cuda(0), nullptr};
  Buffer d_x = OnDevice(x.View()), d_idx = OnDevice(idx.View()), d_probs = OnDevice(probs.View());
  Buffer d_px = Poisoned(DType::kBF16, {rows + guard, c.h}),
         d_pp = Poisoned(DType::kF32, {rows + guard}), d_map = Poisoned(DType::kI32, {c.t, c.k}),
         d_tpe = Poisoned(DType::kI32, {c.e}),
         ws = Poisoned(DType::kU8, {PermuteWorkspaceBytes(c.t, c.e)});
  absl::Status st = Permute(gpu, d_x.View(), d_idx.View(), d_probs.View(), c.e, c.capacity,
                            d_px.View(DType::kBF16, {rows, c.h}), d_pp.View(DType::kF32, {rows}),
                            d_map.View(), d_tpe.View(), ws.View());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(Fetch<int32_t>(d_map.View()), ref_map);
  EXPECT_EQ(Fetch<int32_t>(d_tpe.View()), std::vector<int32_t>(c.e, c.capacity));
  const std::vector<uint16_t> px = Fetch<uint16_t>(d_px.View());
  const std::vector<float> pp = Fetch<float>(d_pp.View());
  EXPECT_TRUE(
      std::all_of(px.begin() + rows * c.h, px.end(), [](uint16_t v) { return v == 0xFFFF; }));
  std::vector<float> guard_pp(pp.begin() + rows, pp.end());
  for (float v : guard_pp) EXPECT_TRUE(std::isnan(v)) << "write past max_rows";
  std::printf("permute gpu over-capacity clamp T=%ld E=%ld C=%ld: row_map exact, guard intact\n",
              c.t, c.e, c.capacity);
}

TEST(PermuteGpuTest, RejectsSmallWorkspaceAndTooManyExperts) {
  SY_REQUIRE_GPU();
  const Stream gpu{Device::Cuda(0), nullptr};
  Buffer x = Poisoned(DType::kBF16, {4, 8}), idx = Poisoned(DType::kI32, {4, 2}),
         probs = Poisoned(DType::kF32, {4, 2}), px = Poisoned(DType::kBF16, {8, 8}),
         pp = Poisoned(DType::kF32, {8}), map = Poisoned(DType::kI32, {4, 2}),
         tpe = Poisoned(DType::kI32, {4}), ws = Poisoned(DType::kU8, {4});
  absl::Status s = Permute(gpu, x.View(), idx.View(), probs.View(), 4, 0, px.View(), pp.View(),
                           map.View(), tpe.View(), ws.View());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("PermuteWorkspaceBytes"), absl::string_view::npos) << s;
  Buffer big = Poisoned(DType::kI32, {kMaxExpertsCuda + 1});
  s = TokensPerExpert(gpu, idx.View(), kMaxExpertsCuda + 1, big.View());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace switchyard::kernels
