// CUDA RoPE against the CPU reference: fresh random inputs, poisoned outputs, tolerance 1e-5 for
// f32 and 1e-2 for bf16 (DESIGN.md); out of place and in place, forward and backward.
#include <gtest/gtest.h>

#include <random>

#include "kernels/attention/rope.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

using testing::ExpectClose;
using testing::Poisoned;
using testing::Upload;

TEST(RopeGpuTest, MatchesCpuReference) {
  SY_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  const Stream gpu{Device::Cuda(0), nullptr};
  const Stream cpu = Stream::Cpu();
  struct Case {
    int64_t t_n, heads, d, s_len;
    float base;
    RopeCp cp = {};
  };
  std::vector<Case> cases;
  for (int64_t t_n : {1, 37, 4096}) {
    for (int64_t heads : {1, 8, 32}) {
      for (int64_t d : {64, 128}) cases.push_back({t_n, heads, d, t_n >= 4096 ? 2048 : 16, 1e4f});
    }
  }
  cases.push_back({300, 4, 72, 100, 1e6f});  // D/2 = 36: scalar path
  cases.push_back({64, 2, 10, 8, 1e6f});     // tiny odd half
  // Context parallelism: local sequences of 2 chunks placed in the whole sequence.
  cases.push_back({2048, 8, 128, 1024, 1e4f, RopeCp{4, 1}});
  cases.push_back({96, 2, 64, 48, 1e6f, RopeCp{2, 1}});
  for (const Case& c : cases) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      const double tol = dt == DType::kBF16 ? 1e-2 : 1e-5;
      const std::vector<int64_t> shape = {c.t_n, c.heads, c.d};
      std::printf("RoPE T=%lld heads=%lld D=%lld S=%lld base=%g CP %lld/%lld %s\n",
                  (long long)c.t_n, (long long)c.heads, (long long)c.d, (long long)c.s_len, c.base,
                  (long long)c.cp.rank, (long long)c.cp.size, DTypeName(dt));
      Buffer x = Buffer::ForTensor(dt, shape, Device::Cpu()).value();
      Buffer y = Buffer::ForTensor(dt, shape, Device::Cpu()).value();
      Buffer dx = Buffer::ForTensor(dt, shape, Device::Cpu()).value();
      testing::FillRandom(x.View(), rng);
      ASSERT_TRUE(RopeForward(cpu, x.View(), c.s_len, c.base, y.View(), c.cp).ok());
      ASSERT_TRUE(RopeBackward(cpu, x.View(), c.s_len, c.base, dx.View(), c.cp).ok());

      Buffer d_x = Upload(x);
      Buffer d_y = Poisoned(dt, shape), d_dx = Poisoned(dt, shape);
      ASSERT_TRUE(RopeForward(gpu, d_x.View(), c.s_len, c.base, d_y.View(), c.cp).ok());
      ASSERT_TRUE(RopeBackward(gpu, d_x.View(), c.s_len, c.base, d_dx.View(), c.cp).ok());
      Buffer d_inplace = Upload(x);
      ASSERT_TRUE(RopeForward(gpu, d_inplace.View(), c.s_len, c.base, d_inplace.View(), c.cp).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ExpectClose(d_y.View(), y.View(), tol, "forward");
      ExpectClose(d_dx.View(), dx.View(), tol, "backward");
      ExpectClose(d_inplace.View(), y.View(), tol, "forward in place");
    }
  }
}

}  // namespace
}  // namespace switchyard::kernels
