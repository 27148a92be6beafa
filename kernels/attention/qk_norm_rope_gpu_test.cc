// The fused CUDA QK-norm + RoPE against (a) the composed CUDA path (RmsNorm then RoPE, the
// backward in reverse) — out, rstd and the gradients of pre bit for bit, dw (another summation
// order) to 1e-5 — and (b) the CPU reference, tolerance 1e-5 for f32 and 1e-2 for bf16
// (DESIGN.md). Fresh random inputs, poisoned outputs, random dw (f32, and once bf16) to accumulate
// into; uneven head counts, several sequences, context parallelism, the forward in place, and
// shapes the fused kernels refuse (asserted: the composed path then runs on CUDA, so (a) holds
// trivially and (b) is the check).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kernels/attention/qk_norm_rope.h"
#include "kernels/norm/rmsnorm.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

using testing::ExpectClose;
using testing::Poisoned;
using testing::Upload;

Buffer Download(const Buffer& dev) {
  Buffer host = Buffer::ForTensor(dev.View().dtype, dev.View().shape, Device::Cpu()).value();
  EXPECT_EQ(
      cudaMemcpy(host.View().data, dev.View().data, dev.View().bytes(), cudaMemcpyDeviceToHost),
      cudaSuccess);
  return host;
}

// Elements of a and b (same dtype and shape) whose bytes differ.
int64_t DifferentElements(const Buffer& a, const Buffer& b) {
  const Tensor x = a.View(), y = b.View();
  const size_t es = DTypeSize(x.dtype);
  int64_t n = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    n += std::memcmp(static_cast<const char*>(x.data) + i * es,
                     static_cast<const char*>(y.data) + i * es, es) != 0;
  }
  return n;
}

struct Side {
  Buffer pre, w, rstd, out, grad, dw;  // host
};

Side MakeSide(DType dt, int64_t t_n, int64_t heads, int64_t d, std::mt19937_64& rng,
              DType dw_dtype = DType::kF32) {
  Side s;
  s.pre = Buffer::ForTensor(dt, {t_n, heads, d}, Device::Cpu()).value();
  s.w = Buffer::ForTensor(dt, {d}, Device::Cpu()).value();
  s.rstd = Buffer::ForTensor(DType::kF32, {t_n * heads}, Device::Cpu()).value();
  s.out = Buffer::ForTensor(dt, {t_n, heads, d}, Device::Cpu()).value();
  s.grad = Buffer::ForTensor(dt, {t_n, heads, d}, Device::Cpu()).value();
  s.dw = Buffer::ForTensor(dw_dtype, {d}, Device::Cpu()).value();
  testing::FillRandom(s.pre.View(), rng, 2.0f);
  testing::FillRandom(s.w.View(), rng);
  testing::FillRandom(s.grad.View(), rng);
  testing::FillRandom(s.dw.View(), rng);
  return s;
}

// Device buffers of one side for one run: inputs uploaded, outputs poisoned.
struct DeviceSide {
  Buffer pre, w, rstd, out, grad, dw;
};

DeviceSide ToDevice(const Side& s) {
  DeviceSide d;
  d.pre = Upload(s.pre);
  d.w = Upload(s.w);
  d.rstd = Poisoned(DType::kF32, s.rstd.View().shape);
  d.out = Poisoned(s.out.View().dtype, s.out.View().shape);
  d.grad = Upload(s.grad);
  d.dw = Upload(s.dw);
  return d;
}

Tensor Rows2(const Buffer& b) {
  const Tensor t = b.View();
  return Tensor(t.dtype, {t.dim(0) * t.dim(1), t.dim(2)}, t.device, t.data);
}

TEST(QkNormRopeGpuTest, FusedMatchesComposedBitwiseAndCpuReference) {
  SY_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  const Stream gpu{Device::Cuda(0), nullptr};
  const Stream cpu = Stream::Cpu();
  struct Case {
    int64_t t_n, hq, hkv, d, s_len;
    RopeCp cp = {};
    bool bf16_dw = false;  // dw in w's dtype (the bf16 runs only)
  };
  const std::vector<Case> cases = {
      {8192, 12, 4, 128, 4096},  // the benchmark model's micro-batch
      {4096, 16, 16, 128, 2048},
      {37, 3, 1, 128, 16},                    // odd token and head counts
      {300, 5, 2, 64, 100},                   // D = 64: 8 lanes (bf16) / 16 (f32)
      {64, 2, 1, 256, 32},                    // D = 256: 32 lanes (bf16); f32 refused (64 lanes)
      {50, 2, 2, 72, 25},                     // D = 72: refused (9 / 18 lanes), composed on CUDA
      {2048, 8, 2, 128, 1024, RopeCp{4, 1}},  // context parallelism
      {96, 4, 2, 64, 48, RopeCp{2, 1}},
      {512, 6, 2, 128, 256, {}, /*bf16_dw=*/true},
  };
  const float eps = 1e-6f, base = 1e6f;
  for (const Case& c : cases) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      if (c.bf16_dw && dt != DType::kBF16) continue;
      const DType dw_dt = c.bf16_dw ? DType::kBF16 : DType::kF32;
      std::printf("QkNormRope T=%lld hq=%lld hkv=%lld D=%lld S=%lld CP %lld/%lld %s, dw %s\n",
                  (long long)c.t_n, (long long)c.hq, (long long)c.hkv, (long long)c.d,
                  (long long)c.s_len, (long long)c.cp.rank, (long long)c.cp.size, DTypeName(dt),
                  DTypeName(dw_dt));
      Side q = MakeSide(dt, c.t_n, c.hq, c.d, rng, dw_dt);
      Side k = MakeSide(dt, c.t_n, c.hkv, c.d, rng, dw_dt);
      // CPU reference (the composed ops).
      Buffer q_grad_ref = Buffer::ForTensor(dt, q.grad.View().shape, Device::Cpu()).value();
      Buffer k_grad_ref = Buffer::ForTensor(dt, k.grad.View().shape, Device::Cpu()).value();
      std::memcpy(q_grad_ref.View().data, q.grad.View().data, q.grad.View().bytes());
      std::memcpy(k_grad_ref.View().data, k.grad.View().data, k.grad.View().bytes());
      Buffer q_dw_ref = Buffer::ForTensor(dw_dt, {c.d}, Device::Cpu()).value();
      Buffer k_dw_ref = Buffer::ForTensor(dw_dt, {c.d}, Device::Cpu()).value();
      std::memcpy(q_dw_ref.View().data, q.dw.View().data, q.dw.View().bytes());
      std::memcpy(k_dw_ref.View().data, k.dw.View().data, k.dw.View().bytes());
      ASSERT_TRUE(QkNormRopeForward(cpu, {q.pre.View(), q.w.View(), q.out.View(), q.rstd.View()},
                                    {k.pre.View(), k.w.View(), k.out.View(), k.rstd.View()}, eps,
                                    c.s_len, base, c.cp)
                      .ok());
      ASSERT_TRUE(QkNormRopeBackward(
                      cpu,
                      {q.pre.View(), q.w.View(), q.rstd.View(), q_grad_ref.View(), q_dw_ref.View()},
                      {k.pre.View(), k.w.View(), k.rstd.View(), k_grad_ref.View(), k_dw_ref.View()},
                      c.s_len, base, Tensor(), c.cp)
                      .ok());

      const int64_t ws_bytes = QkNormRopeBackwardWorkspaceBytes(c.t_n, c.hq, c.hkv, c.d);
      Buffer ws = Buffer::Allocate(Device::Cuda(0), static_cast<size_t>(ws_bytes)).value();
      // Fused (the op) and composed (the two CUDA ops by hand).
      DeviceSide fq = ToDevice(q), fk = ToDevice(k), cq = ToDevice(q), ck = ToDevice(k);
      // The fused kernels must take every shape here but D = 72 and f32 at D = 256 (64 lanes),
      // asked with the op's own pointers: else "fused == composed" would compare the composed
      // path with itself.
      const bool fused =
          internal::QkNormRopeFusable(fq.pre.View(), fk.pre.View(),
                                      {fq.pre.View().data, fq.w.View().data, fq.out.View().data,
                                       fk.pre.View().data, fk.w.View().data, fk.out.View().data});
      const bool expect_fused = c.d != 72 && !(c.d == 256 && dt == DType::kF32);
      std::printf("  fused kernels: %s\n", fused ? "yes" : "no (composed path)");
      EXPECT_EQ(fused, expect_fused);
      ASSERT_TRUE(QkNormRopeForward(gpu,
                                    {fq.pre.View(), fq.w.View(), fq.out.View(), fq.rstd.View()},
                                    {fk.pre.View(), fk.w.View(), fk.out.View(), fk.rstd.View()},
                                    eps, c.s_len, base, c.cp)
                      .ok());
      ASSERT_TRUE(QkNormRopeBackward(
                      gpu,
                      {fq.pre.View(), fq.w.View(), fq.rstd.View(), fq.grad.View(), fq.dw.View()},
                      {fk.pre.View(), fk.w.View(), fk.rstd.View(), fk.grad.View(), fk.dw.View()},
                      c.s_len, base, ws.View(), c.cp)
                      .ok());
      for (DeviceSide* s : {&cq, &ck}) {
        ASSERT_TRUE(
            RmsNormForward(gpu, Rows2(s->pre), s->w.View(), eps, Rows2(s->out), s->rstd.View())
                .ok());
        ASSERT_TRUE(RopeForward(gpu, s->out.View(), c.s_len, base, s->out.View(), c.cp).ok());
        ASSERT_TRUE(RopeBackward(gpu, s->grad.View(), c.s_len, base, s->grad.View(), c.cp).ok());
        ASSERT_TRUE(RmsNormBackward(gpu, Rows2(s->grad), Rows2(s->pre), s->w.View(), s->rstd.View(),
                                    Rows2(s->grad), s->dw.View(), true, ws.View())
                        .ok());
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const double tol = dt == DType::kBF16 ? 1e-2 : 1e-5;
      const struct {
        const char* what;
        const DeviceSide* f;
        const DeviceSide* c;
        const Side* host;
        const Buffer* grad_ref;
        const Buffer* dw_ref;
      } sides[] = {{"q", &fq, &cq, &q, &q_grad_ref, &q_dw_ref},
                   {"k", &fk, &ck, &k, &k_grad_ref, &k_dw_ref}};
      // In place (out aliases pre): the same bits as out of place.
      DeviceSide iq = ToDevice(q), ik = ToDevice(k);
      ASSERT_TRUE(QkNormRopeForward(gpu,
                                    {iq.pre.View(), iq.w.View(), iq.pre.View(), iq.rstd.View()},
                                    {ik.pre.View(), ik.w.View(), ik.pre.View(), ik.rstd.View()},
                                    eps, c.s_len, base, c.cp)
                      .ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(DifferentElements(Download(iq.pre), Download(fq.out)), 0) << "q in place";
      EXPECT_EQ(DifferentElements(Download(ik.pre), Download(fk.out)), 0) << "k in place";
      // bf16 dw: one rounding of (dw + this call's sum) whose summation order differs.
      const double dw_tol = c.bf16_dw ? 1e-2 : 1e-5;
      for (const auto& s : sides) {
        SCOPED_TRACE(s.what);
        const Buffer out = Download(s.f->out), rstd = Download(s.f->rstd);
        const Buffer grad = Download(s.f->grad), dw = Download(s.f->dw);
        EXPECT_EQ(DifferentElements(out, Download(s.c->out)), 0) << "out vs composed";
        EXPECT_EQ(DifferentElements(rstd, Download(s.c->rstd)), 0) << "rstd vs composed";
        EXPECT_EQ(DifferentElements(grad, Download(s.c->grad)), 0) << "grad vs composed";
        ExpectClose(dw.View(), Download(s.c->dw).View(), dw_tol, "dw vs composed");
        ExpectClose(out.View(), s.host->out.View(), tol, "out vs CPU");
        ExpectClose(rstd.View(), s.host->rstd.View(), 1e-5, "rstd vs CPU");
        ExpectClose(grad.View(), s.grad_ref->View(), tol, "grad vs CPU");
        ExpectClose(dw.View(), s.dw_ref->View(), dt == DType::kBF16 ? 1e-2 : 1e-4, "dw vs CPU");
      }
    }
  }
}

}  // namespace
}  // namespace switchyard::kernels
