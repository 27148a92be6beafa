// File: kernels/moe/ep_routing_gpu_test.cc
//
// RouteToRanks / LocalizeRouting on CUDA against the CPU reference (ep_routing.h): fresh random
// routing (std::random_device seed, dropped slots, token counts that are not multiples of the
// block size, an empty batch), every output poisoned (0xFF) first; the ops are integer tests and
// copies, so the outputs must equal the reference bit for bit (tolerance 0).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/moe/ep_routing.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

using switchyard::testing::CudaDeviceCount;
using switchyard::testing::Poisoned;

template <typename T>
std::vector<T> Fetch(const Tensor& t) {
  std::vector<T> v(t.bytes() / sizeof(T));
  EXPECT_TRUE(CopyTensor(t, Tensor(t.dtype, t.shape, Device::Cpu(), v.data())).ok());
  return v;
}

template <typename T>
Buffer Up(DType dtype, std::vector<T>& v, std::vector<int64_t> shape) {
  Buffer b = Buffer::ForTensor(dtype, shape, Device::Cuda(0)).value();
  EXPECT_TRUE(CopyTensor(Tensor(dtype, shape, Device::Cpu(), v.data()), b.View()).ok());
  return b;
}

template <typename T>
Tensor HostView(DType dtype, std::vector<T>& v, std::vector<int64_t> shape) {
  return Tensor(dtype, std::move(shape), Device::Cpu(), v.data());
}

TEST(EpRoutingGpuTest, MatchesCpuReference) {
  std::string why;
  if (CudaDeviceCount(&why) < 1) GTEST_SKIP() << why;
  const uint32_t seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  struct Case {
    int64_t t, k, e, ep;
  };
  for (const Case& c : {Case{0, 8, 64, 2}, Case{1, 1, 4, 4}, Case{8191, 8, 64, 2},
                        Case{3001, 8, 128, 4}, Case{517, 6, 256, 8}, Case{100, 2, 8, 8}}) {
    SCOPED_TRACE(::testing::Message()
                 << "T " << c.t << " k " << c.k << " E " << c.e << " EP " << c.ep);
    std::vector<int32_t> idx;
    std::vector<float> probs;
    std::uniform_real_distribution<float> p(0.0f, 1.0f);
    std::vector<int32_t> perm(c.e);
    for (int64_t i = 0; i < c.t; ++i) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t s = 0; s < c.k; ++s) {
        idx.push_back(p(rng) < 0.1f ? -1 : perm[s]);
        probs.push_back(p(rng));
      }
    }
    std::vector<int32_t> ranks(c.t * c.ep);
    std::vector<float> meta(c.t * 2 * c.k);
    ASSERT_TRUE(RouteToRanks(Stream::Cpu(), HostView(DType::kI32, idx, {c.t, c.k}),
                             HostView(DType::kF32, probs, {c.t, c.k}), c.e, c.ep,
                             HostView(DType::kI32, ranks, {c.t, c.ep}),
                             HostView(DType::kF32, meta, {c.t, 2 * c.k}))
                    .ok());
    const Stream gpu{Device::Cuda(0), nullptr};
    Buffer d_idx = Up(DType::kI32, idx, {c.t, c.k}), d_probs = Up(DType::kF32, probs, {c.t, c.k});
    Buffer d_ranks = Poisoned(DType::kI32, {c.t, c.ep}),
           d_meta = Poisoned(DType::kF32, {c.t, 2 * c.k});
    ASSERT_TRUE(
        RouteToRanks(gpu, d_idx.View(), d_probs.View(), c.e, c.ep, d_ranks.View(), d_meta.View())
            .ok());
    EXPECT_EQ(Fetch<int32_t>(d_ranks.View()), ranks);
    std::vector<float> got_meta = Fetch<float>(d_meta.View());
    EXPECT_EQ(0, std::memcmp(got_meta.data(), meta.data(), meta.size() * sizeof(float)));
    const int64_t local = c.e / c.ep;
    for (int64_t j : {int64_t{0}, c.ep - 1}) {
      std::vector<int32_t> li(c.t * c.k);
      std::vector<float> lp(c.t * c.k);
      ASSERT_TRUE(LocalizeRouting(Stream::Cpu(), HostView(DType::kF32, meta, {c.t, 2 * c.k}),
                                  j * local, local, HostView(DType::kI32, li, {c.t, c.k}),
                                  HostView(DType::kF32, lp, {c.t, c.k}))
                      .ok());
      Buffer d_li = Poisoned(DType::kI32, {c.t, c.k}), d_lp = Poisoned(DType::kF32, {c.t, c.k});
      ASSERT_TRUE(
          LocalizeRouting(gpu, d_meta.View(), j * local, local, d_li.View(), d_lp.View()).ok());
      EXPECT_EQ(Fetch<int32_t>(d_li.View()), li) << "rank " << j;
      std::vector<float> got_lp = Fetch<float>(d_lp.View());
      EXPECT_EQ(0, std::memcmp(got_lp.data(), lp.data(), lp.size() * sizeof(float)))
          << "rank " << j;
    }
  }
}

}  // namespace
}  // namespace switchyard::kernels
