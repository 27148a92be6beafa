// CUDA router and aux losses against the CPU reference on fresh random inputs, outputs poisoned
// (0xFF) first: identical topk_idx / selected_idx / counts, and probabilities, losses and gradients
// within the fp32 tolerance of DESIGN.md (relative L2 error < 1e-5). The kernels evaluate the
// same fp64 expressions in the same order as the reference (router_math.h), so the observed error
// is usually 0. Each GPU op runs twice to check run-to-run determinism (bitwise).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/moe/aux_loss.h"
#include "kernels/moe/rng.h"
#include "kernels/moe/router.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

using testing::RelativeError;
using testing::ToFloatVector;

template <typename T>
constexpr DType DTypeOf() {
  if constexpr (std::is_same_v<T, float>) return DType::kF32;
  if constexpr (std::is_same_v<T, double>) return DType::kF64;
  return DType::kI32;
}

template <typename T>
Tensor HostView(std::vector<T>& v, std::vector<int64_t> shape) {
  return Tensor(DTypeOf<T>(), std::move(shape), Device::Cpu(), v.data());
}

Buffer Device0(DType dtype, std::vector<int64_t> shape) {
  Buffer b = Buffer::ForTensor(dtype, std::move(shape), Device::Cuda(0)).value();
  EXPECT_TRUE(FillBytes(b.View(), 0xFF).ok());  // NaN / -1 poison
  return b;
}

template <typename T>
Buffer ToDevice(std::vector<T>& v, std::vector<int64_t> shape) {
  Buffer b = Device0(DTypeOf<T>(), shape);
  EXPECT_TRUE(CopyTensor(HostView(v, shape), b.View()).ok());
  return b;
}

template <typename T>
std::vector<T> ToHost(const Buffer& b) {
  std::vector<T> v(b.View().numel());
  EXPECT_TRUE(CopyTensor(b.View(), HostView(v, b.View().shape)).ok());
  return v;
}

struct Case {
  std::string mode;
  int64_t t;
  int e, k;
};

RouterConfig ConfigFor(const Case& c) {
  RouterConfig r;
  r.num_experts = c.e;
  r.topk = c.k;
  r.seq_length = c.t % 4 == 0 ? c.t / 4 : c.t;
  const int groups = c.e >= 64 ? 8 : 4, gs = c.e / groups;
  const int group_topk = std::max(2, (c.k + gs - 1) / gs);
  if (c.mode == "sigmoid" || c.mode == "sigmoid_bias_group") {
    r.score_function = RouterScoreFunction::kSigmoid;
    if (c.k > 1) r.topk_scaling_factor = 2.5;
  }
  if (c.mode == "pre_softmax") r.pre_softmax = true;
  if (c.mode == "group" || c.mode == "sigmoid_bias_group") {
    r.num_groups = groups;
    r.group_topk = group_topk;
  }
  if (c.mode == "sigmoid_bias_group") r.use_expert_bias = true;
  if (c.mode == "capacity_probs" || c.mode == "capacity_position") r.capacity_factor = 1.0;
  if (c.mode == "capacity_position") r.drop_policy = CapacityDropPolicy::kPosition;
  r.sinkhorn = c.mode == "sinkhorn";
  if (!r.sinkhorn) {
    r.aux_losses = {{AuxLossType::kAuxLoss, 0.01},
                    {AuxLossType::kSeqAuxLoss, 0.02},
                    {AuxLossType::kGlobalAuxLoss, 0.03}};
  }
  r.z_loss_coeff = 1e-3;
  return r;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (int64_t t : {1, 7, 4096}) {
    for (int e : {8, 64, 256}) {
      for (int k : {1, 2, 8}) {
        if (k > e) continue;
        std::vector<std::string> modes = {"sigmoid", "pre_softmax"};
        if (k > 1) {
          modes = {
              "softmax",        "sigmoid",          "pre_softmax", "group", "sigmoid_bias_group",
              "capacity_probs", "capacity_position"};
        }
        if (e <= 64 || t <= 7) modes.push_back("sinkhorn");
        for (const std::string& m : modes) cases.push_back({m, t, e, k});
      }
    }
  }
  for (const char* m : {"softmax", "sigmoid_bias_group", "capacity_probs"}) {
    cases.push_back({m, 16384, 512, 8});  // the largest supported shape
  }
  return cases;
}

class RouterGpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(RouterGpuTest, MatchesCpuReference) {
  SY_REQUIRE_GPU();
  const Case& cs = GetParam();
  const RouterConfig cfg = ConfigFor(cs);
  ASSERT_TRUE(cfg.Validate().ok()) << cfg.Validate();
  const int64_t t = cs.t, e = cs.e, k = cs.k;
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> logits(t * e), bias(e), dprobs(t * k), local(e, 3.0f);
  for (float& v : logits) v = normal(rng);
  for (float& v : bias) v = 0.2f * normal(rng);
  for (float& v : dprobs) v = normal(rng);

  // CPU reference.
  std::vector<int32_t> idx(t * k), sel(t * k), tpe(e);
  std::vector<float> probs(t * k), dlogits(t * e), local_ref = local;
  const Stream cpu = Stream::Cpu();
  RouterOutputs ref{HostView(idx, {t, k}), HostView(probs, {t, k}), HostView(sel, {t, k}),
                    HostView(tpe, {e})};
  ASSERT_TRUE(RouterForward(cpu, cfg, HostView(logits, {t, e}), HostView(bias, {e}),
                            HostView(local_ref, {e}), ref, Tensor())
                  .ok());
  ASSERT_TRUE(RouterBackward(cpu, cfg, HostView(logits, {t, e}), ref.selected_idx, ref.topk_idx,
                             HostView(dprobs, {t, k}), HostView(dlogits, {t, e}))
                  .ok());
  const int64_t b = AuxLossNumSequences(cfg, t), n = cfg.aux_losses.size() + 1;
  std::vector<double> psum(b * e), zsum(1);
  std::vector<float> counts(b * e), losses(n), gw(b * e), gcounts(e, 0.0f);
  AuxLossStats ref_stats{HostView(psum, {b, e}), HostView(counts, {b, e}), HostView(zsum, {1})};
  ASSERT_TRUE(AuxLossStatsForward(cpu, cfg, HostView(logits, {t, e}), ref_stats, Tensor()).ok());
  for (int64_t i = 0; i < b * e; ++i) gcounts[i % e] += 2 * counts[i];
  AuxLossNorms norms;
  norms.global_num_tokens = 2.0 * t;
  norms.dp_size = 2;
  norms.global_counts = HostView(gcounts, {e});
  ASSERT_TRUE(
      AuxLossForward(cpu, cfg, t, ref_stats, norms, HostView(losses, {n}), HostView(gw, {b, e}))
          .ok());
  ASSERT_TRUE(AuxLossBackward(cpu, cfg, HostView(logits, {t, e}), HostView(gw, {b, e}), 0.5,
                              HostView(dlogits, {t, e}))
                  .ok());

  // CUDA, twice.
  const Stream gpu{Device::Cuda(0), nullptr};
  Buffer d_logits = ToDevice(logits, {t, e}), d_bias = ToDevice(bias, {e});
  Buffer d_dprobs = ToDevice(dprobs, {t, k}), d_gcounts = ToDevice(gcounts, {e});
  Buffer ws = Buffer::Allocate(Device::Cuda(0),
                               std::max<int64_t>(256, std::max(RouterWorkspaceBytes(cfg, t),
                                                               AuxLossWorkspaceBytes(cfg, t))))
                  .value();
  std::vector<float> first_probs, first_dlogits;
  std::vector<double> first_psum, first_zsum;
  for (int run = 0; run < 2; ++run) {
    Buffer d_idx = Device0(DType::kI32, {t, k}), d_sel = Device0(DType::kI32, {t, k});
    Buffer d_probs = Device0(DType::kF32, {t, k}), d_tpe = Device0(DType::kI32, {e});
    Buffer d_local = ToDevice(local, {e}), d_dlogits = Device0(DType::kF32, {t, e});
    Buffer d_psum = Device0(DType::kF64, {b, e}), d_counts = Device0(DType::kF32, {b, e});
    Buffer d_zsum = Device0(DType::kF64, {1}), d_losses = Device0(DType::kF32, {n});
    Buffer d_gw = Device0(DType::kF32, {b, e});
    RouterOutputs out{d_idx.View(), d_probs.View(), d_sel.View(), d_tpe.View()};
    absl::Status s =
        RouterForward(gpu, cfg, d_logits.View(), d_bias.View(), d_local.View(), out, ws.View());
    ASSERT_TRUE(s.ok()) << s;
    s = RouterBackward(gpu, cfg, d_logits.View(), d_sel.View(), d_idx.View(), d_dprobs.View(),
                       d_dlogits.View());
    ASSERT_TRUE(s.ok()) << s;
    AuxLossStats stats{d_psum.View(), d_counts.View(), d_zsum.View()};
    // Run 1 counts from the router's selection where it is the losses' top-k (the reference
    // always runs its own top-k): the counts must not change.
    s = AuxLossStatsForward(gpu, cfg, d_logits.View(), stats, ws.View(),
                            run == 1 ? d_sel.View() : Tensor());
    ASSERT_TRUE(s.ok()) << s;
    AuxLossNorms dn = norms;
    dn.global_counts = d_gcounts.View();
    s = AuxLossForward(gpu, cfg, t, stats, dn, d_losses.View(), d_gw.View());
    ASSERT_TRUE(s.ok()) << s;
    s = AuxLossBackward(gpu, cfg, d_logits.View(), d_gw.View(), 0.5, d_dlogits.View());
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    EXPECT_EQ(ToHost<int32_t>(d_idx), idx);
    EXPECT_EQ(ToHost<int32_t>(d_sel), sel);
    EXPECT_EQ(ToHost<int32_t>(d_tpe), tpe);
    EXPECT_EQ(ToHost<float>(d_local), local_ref);
    EXPECT_EQ(ToHost<float>(d_counts), counts);
    const std::vector<float> got_probs = ToHost<float>(d_probs);
    const std::vector<float> got_dlogits = ToHost<float>(d_dlogits);
    const double e_probs = RelativeError(got_probs, probs);
    const double e_psum =
        RelativeError(ToFloatVector(d_psum.View()), ToFloatVector(ref_stats.prob_sums));
    const double e_loss = RelativeError(ToHost<float>(d_losses), losses);
    const double e_gw = RelativeError(ToHost<float>(d_gw), gw);
    const double e_dz = RelativeError(got_dlogits, dlogits);
    if (run == 0) {
      std::printf(
          "%s T=%ld E=%ld k=%ld: rel err probs %.2g, prob_sums %.2g, losses %.2g, "
          "grad_weights %.2g, dlogits %.2g (tol 1e-5); idx/counts identical: %s\n",
          cs.mode.c_str(), t, e, k, e_probs, e_psum, e_loss, e_gw, e_dz,
          ToHost<int32_t>(d_idx) == idx ? "yes" : "NO");
      first_probs = got_probs;
      first_dlogits = got_dlogits;
      first_psum = ToHost<double>(d_psum);
      first_zsum = ToHost<double>(d_zsum);
    } else {
      EXPECT_EQ(0, std::memcmp(first_probs.data(), got_probs.data(), 4 * got_probs.size()));
      EXPECT_EQ(0, std::memcmp(first_dlogits.data(), got_dlogits.data(), 4 * got_dlogits.size()));
      // The aux statistics' fixed-order sums: the same bits on every run.
      EXPECT_EQ(
          0, std::memcmp(first_psum.data(), ToHost<double>(d_psum).data(), 8 * first_psum.size()));
      EXPECT_EQ(0, std::memcmp(first_zsum.data(), ToHost<double>(d_zsum).data(), 8));
    }
    EXPECT_LT(e_probs, 1e-5);
    EXPECT_LT(e_psum, 1e-5);
    EXPECT_LT(e_loss, 1e-5);
    EXPECT_LT(e_gw, 1e-5);
    EXPECT_LT(e_dz, 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RouterGpuTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return i.param.mode + "_T" + std::to_string(i.param.t) + "_E" +
                                  std::to_string(i.param.e) + "_k" + std::to_string(i.param.k);
                         });

TEST(RouterGpuMiscTest, ExpertBiasUpdateAndJitterMatchCpuBitwise) {
  SY_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  const int64_t e = 256;
  std::vector<float> counts(e), bias(e);
  for (int64_t i = 0; i < e; ++i) counts[i] = static_cast<float>(rng() % 64), bias[i] = 0.01f * i;
  Buffer d_counts = ToDevice(counts, {e}), d_bias = ToDevice(bias, {e});
  ASSERT_TRUE(
      UpdateExpertBias(Stream::Cpu(), HostView(counts, {e}), HostView(bias, {e}), 1e-3f).ok());
  ASSERT_TRUE(
      UpdateExpertBias({Device::Cuda(0), nullptr}, d_counts.View(), d_bias.View(), 1e-3f).ok());
  EXPECT_EQ(ToHost<float>(d_bias), bias);
  EXPECT_EQ(ToHost<float>(d_counts), counts);

  const int64_t t = 1000, h = 777;
  std::vector<float> x(t * h), y(t * h);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  Buffer d_x = ToDevice(x, {t, h}), d_y = Device0(DType::kF32, {t, h});
  const uint64_t seed = rng(), offset = rng() >> 20;
  ASSERT_TRUE(
      ApplyInputJitter(Stream::Cpu(), HostView(x, {t, h}), 0.01f, seed, offset, HostView(y, {t, h}))
          .ok());
  ASSERT_TRUE(
      ApplyInputJitter({Device::Cuda(0), nullptr}, d_x.View(), 0.01f, seed, offset, d_y.View())
          .ok());
  EXPECT_EQ(ToHost<float>(d_y), y);
  Buffer hb = Buffer::ForTensor(DType::kBF16, {t, h}, Device::Cpu()).value();
  Buffer hyb = Buffer::ForTensor(DType::kBF16, {t, h}, Device::Cpu()).value();
  testing::FillRandom(hb.View(), rng);
  Buffer db = Device0(DType::kBF16, {t, h}), dyb = Device0(DType::kBF16, {t, h});
  ASSERT_TRUE(CopyTensor(hb.View(), db.View()).ok());
  ASSERT_TRUE(InputJitterBackward(Stream::Cpu(), hb.View(), 0.01f, seed, offset, hyb.View()).ok());
  ASSERT_TRUE(
      InputJitterBackward({Device::Cuda(0), nullptr}, db.View(), 0.01f, seed, offset, dyb.View())
          .ok());
  EXPECT_EQ(ToFloatVector(dyb.View()), ToFloatVector(hyb.View()));
  std::printf("expert bias update (E=%ld) and jitter (%ldx%ld f32, bf16): bitwise equal to CPU\n",
              e, t, h);
}

TEST(RouterGpuMiscTest, Bf16GatingMatchesCpuReference) {
  SY_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  const int64_t t = 512, h = 1024, e = 64;
  const Device cpu = Device::Cpu(), cuda = Device::Cuda(0);
  auto make = [&](DType dt, std::vector<int64_t> shape, Device dev) {
    return Buffer::ForTensor(dt, std::move(shape), dev).value();
  };
  Buffer hx = make(DType::kBF16, {t, h}, cpu), hw = make(DType::kBF16, {e, h}, cpu);
  Buffer hg = make(DType::kF32, {t, e}, cpu), hl = make(DType::kF32, {t, e}, cpu);
  Buffer hlow = make(DType::kBF16, {t, e}, cpu), hdx = make(DType::kBF16, {t, h}, cpu);
  Buffer hdw = make(DType::kF32, {e, h}, cpu);
  testing::FillRandom(hx.View(), rng);
  testing::FillRandom(hw.View(), rng, 0.05f);
  testing::FillRandom(hg.View(), rng);
  ASSERT_TRUE(RouterGatingForward(Stream::Cpu(), hx.View(), hw.View(), hl.View()).ok());
  ASSERT_TRUE(RouterGatingBackward(Stream::Cpu(), hg.View(), hx.View(), hw.View(), hlow.View(),
                                   hdx.View(), hdw.View(), 0.0f)
                  .ok());
  Buffer dx = Device0(DType::kBF16, {t, h}), dw = Device0(DType::kBF16, {e, h});
  Buffer dg = Device0(DType::kF32, {t, e}), dl = Device0(DType::kF32, {t, e});
  Buffer dlow = Device0(DType::kBF16, {t, e}), ddx = Device0(DType::kBF16, {t, h});
  Buffer ddw = Device0(DType::kF32, {e, h});
  ASSERT_TRUE(CopyTensor(hx.View(), dx.View()).ok());
  ASSERT_TRUE(CopyTensor(hw.View(), dw.View()).ok());
  ASSERT_TRUE(CopyTensor(hg.View(), dg.View()).ok());
  const Stream gpu{cuda, nullptr};
  ASSERT_TRUE(RouterGatingForward(gpu, dx.View(), dw.View(), dl.View()).ok());
  ASSERT_TRUE(RouterGatingBackward(gpu, dg.View(), dx.View(), dw.View(), dlow.View(), ddx.View(),
                                   ddw.View(), 0.0f)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const double el = RelativeError(ToFloatVector(dl.View()), ToFloatVector(hl.View()));
  const double edx = RelativeError(ToFloatVector(ddx.View()), ToFloatVector(hdx.View()));
  const double edw = RelativeError(ToFloatVector(ddw.View()), ToFloatVector(hdw.View()));
  std::printf("bf16 gating T=%ld H=%ld E=%ld: rel err logits %.2g, dx %.2g, dw %.2g (tol 1e-2)\n",
              t, h, e, el, edx, edw);
  EXPECT_LT(el, 1e-2);
  EXPECT_LT(edx, 1e-2);
  EXPECT_LT(edw, 1e-2);
}

}  // namespace
}  // namespace switchyard::kernels
