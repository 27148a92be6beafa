// The MoE layer on the CPU: an independent naive forward, a finite-difference gradient check of
// the whole layer in fp64 over the router/capacity/shared-expert (and moe_act recompute) variants
// of the issue, the pad-to-capacity invariant (megatron_moe.md §6: probability-0 padding
// changes nothing), and the backward-only buffers shared by several layers (MoEGradScratch:
// bit-identical, held once).
#include "worker/model/moe_layer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/testing/gpu.h"
#include "worker/model/moe_layer_tensors.h"

namespace switchyard::model {
namespace {

using kernels::AuxLossType;
using kernels::Buffer;
using kernels::CapacityDropPolicy;
using kernels::RouterScoreFunction;

struct Variant {
  std::string name;
  std::function<void(MoELayerConfig*)> apply;
};

MoELayerConfig SmallConfig() {
  MoELayerConfig c;
  c.hidden_size = 8;
  c.ffn_hidden_size = 6;
  c.dtype = DType::kF64;
  c.router.num_experts = 4;
  c.router.topk = 2;
  c.router.seq_length = 6;
  c.router.training = true;
  return c;
}

std::vector<Variant> Variants() {
  return {
      {"softmax_aux",
       [](MoELayerConfig* c) {
         c->router.aux_losses = {{AuxLossType::kAuxLoss, 0.1}};
       }},
      {"softmax_pre_zloss",
       [](MoELayerConfig* c) {
         c->router.pre_softmax = true;
         c->router.z_loss_coeff = 0.01;
       }},
      {"sigmoid_bias_scaling",
       [](MoELayerConfig* c) {
         c->router.score_function = RouterScoreFunction::kSigmoid;
         c->router.use_expert_bias = true;
         c->router.topk_scaling_factor = 2.5;
       }},
      {"sigmoid_top1",
       [](MoELayerConfig* c) {
         c->router.score_function = RouterScoreFunction::kSigmoid;
         c->router.topk = 1;
       }},
      {"group_limited_seq_aux",
       [](MoELayerConfig* c) {
         c->router.num_experts = 8;
         c->router.num_groups = 4;
         c->router.group_topk = 2;
         c->router.aux_losses = {{AuxLossType::kSeqAuxLoss, 0.1}};
       }},
      {"global_aux_plus_aux",
       [](MoELayerConfig* c) {
         c->router.aux_losses = {{AuxLossType::kAuxLoss, 0.05}, {AuxLossType::kGlobalAuxLoss, 0.1}};
       }},
      {"capacity_probs",
       [](MoELayerConfig* c) {
         c->router.capacity_factor = 0.75;
         c->router.drop_policy = CapacityDropPolicy::kProbs;
       }},
      {"capacity_position_padded",
       [](MoELayerConfig* c) {
         c->router.capacity_factor = 0.75;
         c->router.drop_policy = CapacityDropPolicy::kPosition;
         c->pad_to_capacity = true;
       }},
      {"shared_gate_jitter",
       [](MoELayerConfig* c) {
         c->shared_ffn_size = 5;
         c->shared_expert_gate = true;
         c->router.input_jitter_eps = 0.1;
       }},
      {"sinkhorn", [](MoELayerConfig* c) { c->router.sinkhorn = true; }},
      // The permutation fused into the experts (the gathered grouped GEMMs), with drops and a
      // shared expert.
      {"permute_fusion_capacity_shared",
       [](MoELayerConfig* c) {
         c->permute_fusion = true;
         c->router.capacity_factor = 0.75;
         c->shared_ffn_size = 5;
         c->router.aux_losses = {{AuxLossType::kAuxLoss, 0.1}};
       }},
      // moe_act recompute with the layer's own scratch (no MoEActScratch given): the backward's
      // recomputed SwiGLU outputs of the routed and the gated shared expert.
      {"moe_act_recompute_shared_gate",
       [](MoELayerConfig* c) {
         c->shared_ffn_size = 5;
         c->shared_expert_gate = true;
         c->router.aux_losses = {{AuxLossType::kAuxLoss, 0.1}};
         c->recompute_act = true;
       }},
  };
}

// Runs the layer forward and returns J = <y, dy> + scale * sum(losses).
double Objective(MoELayer& layer, const MoELayerTensors& w, const Tensor& x, const Tensor& y,
                 const std::vector<double>& dy, double scale) {
  EXPECT_TRUE(layer.ResetGlobalBatch().ok());
  absl::Status s = layer.Forward(Stream::Cpu(), w.params(), w.router_state(), x, y, 7);
  EXPECT_TRUE(s.ok()) << s;
  double j = 0;
  for (int64_t i = 0; i < y.numel(); ++i) j += y.as<double>()[i] * dy[i];
  const Tensor& l = layer.losses();
  for (int64_t i = 0; i < l.numel(); ++i) j += scale * l.as<double>()[i];
  return j;
}

class MoELayerGradTest : public ::testing::TestWithParam<Variant> {};

TEST_P(MoELayerGradTest, FiniteDifferencesMatchBackwardInFp64) {
  MoELayerConfig config = SmallConfig();
  GetParam().apply(&config);
  ASSERT_TRUE(config.Validate().ok()) << config.Validate();
  const int64_t t = 12, h = config.hidden_size;
  std::mt19937_64 rng(11);
  auto w = MoELayerTensors::Create(config, Device::Cpu(), DType::kF64, DType::kF64).value();
  ASSERT_TRUE(w.RandomizeOnCpu(rng, 0.5f, 0.1f).ok());
  auto layer = MoELayer::Create(config, Device::Cpu(), t).value();
  Buffer xb = Buffer::ForTensor(DType::kF64, {t, h}, Device::Cpu()).value();
  Buffer yb = Buffer::ForTensor(DType::kF64, {t, h}, Device::Cpu()).value();
  Buffer dxb = Buffer::ForTensor(DType::kF64, {t, h}, Device::Cpu()).value();
  testing::FillRandom(xb.View(), rng);
  std::vector<double> dy(t * h);
  Tensor dyt(DType::kF64, {t, h}, Device::Cpu(), dy.data());
  testing::FillRandom(dyt, rng);
  const double scale = 0.5;

  Objective(*layer, w, xb.View(), yb.View(), dy, scale);
  absl::Status s = layer->Backward(Stream::Cpu(), w.params(), w.grads(), dyt, dxb.View(), scale);
  ASSERT_TRUE(s.ok()) << s;

  const double eps = 1e-6;
  double worst = 0;
  std::string worst_name;
  auto check = [&](const std::string& name, const Tensor& p, const Tensor& g) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < p.numel(); ++i) {
      double& v = p.as<double>()[i];
      const double keep = v;
      v = keep + eps;
      const double jp = Objective(*layer, w, xb.View(), yb.View(), dy, scale);
      v = keep - eps;
      const double jm = Objective(*layer, w, xb.View(), yb.View(), dy, scale);
      v = keep;
      const double fd = (jp - jm) / (2 * eps);
      num += (fd - g.as<double>()[i]) * (fd - g.as<double>()[i]);
      den += fd * fd;
    }
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    std::printf("  %-22s %-18s rel err %.2e\n", GetParam().name.c_str(), name.c_str(), rel);
    if (rel > worst) worst = rel, worst_name = name;
  };
  check("x", xb.View(), dxb.View());
  for (auto& [name, shape] : MoELayerTensors::ParamShapes(config)) {
    check(name, w.Param(name), w.Grad(name));
  }
  std::printf("%s: worst relative error %.2e (%s), tolerance 1e-6\n", GetParam().name.c_str(),
              worst, worst_name.c_str());
  EXPECT_LT(worst, 1e-6) << worst_name;
}

INSTANTIATE_TEST_SUITE_P(Variants, MoELayerGradTest, ::testing::ValuesIn(Variants()),
                         [](const auto& info) { return info.param.name; });

// Independent forward: per token, sum over its kept slots of p·W2ᵀ(silu(x·W1g)·(x·W1l)).
TEST(MoELayerTest, ForwardMatchesNaiveExperts) {
  MoELayerConfig config = SmallConfig();
  config.shared_ffn_size = 3;
  const int64_t t = 12, h = config.hidden_size, f = config.ffn_hidden_size, s = 3;
  std::mt19937_64 rng(5);
  auto w = MoELayerTensors::Create(config, Device::Cpu(), DType::kF64, DType::kF64).value();
  ASSERT_TRUE(w.RandomizeOnCpu(rng, 0.5f).ok());
  auto layer = MoELayer::Create(config, Device::Cpu(), t).value();
  Buffer xb = Buffer::ForTensor(DType::kF64, {t, h}, Device::Cpu()).value();
  Buffer yb = Buffer::ForTensor(DType::kF64, {t, h}, Device::Cpu()).value();
  testing::FillRandom(xb.View(), rng);
  ASSERT_TRUE(
      layer->Forward(Stream::Cpu(), w.params(), w.router_state(), xb.View(), yb.View()).ok());
  const double* x = xb.View().as<double>();
  const double* w1 = w.Param("experts.fc1").as<double>();
  const double* w2 = w.Param("experts.fc2").as<double>();
  const double* s1 = w.Param("shared_expert.fc1").as<double>();
  const double* s2 = w.Param("shared_expert.fc2").as<double>();
  auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  std::vector<double> ref(t * h, 0.0);
  int64_t routed_slots = 0;
  for (int64_t i = 0; i < t; ++i) {
    for (int slot = 0; slot < config.router.topk; ++slot) {
      const int e = layer->topk_idx().as<int32_t>()[i * config.router.topk + slot];
      const double p = layer->topk_probs().as<double>()[i * config.router.topk + slot];
      if (e < 0) continue;
      ++routed_slots;
      for (int64_t j = 0; j < f; ++j) {
        double g = 0, l = 0;
        for (int64_t c = 0; c < h; ++c) {
          g += x[i * h + c] * w1[(e * h + c) * 2 * f + j];
          l += x[i * h + c] * w1[(e * h + c) * 2 * f + f + j];
        }
        const double a = silu(g) * l * p;
        for (int64_t c = 0; c < h; ++c) ref[i * h + c] += a * w2[(e * f + j) * h + c];
      }
    }
    for (int64_t j = 0; j < s; ++j) {
      double g = 0, l = 0;
      for (int64_t c = 0; c < h; ++c) {
        g += x[i * h + c] * s1[c * 2 * s + j];
        l += x[i * h + c] * s1[c * 2 * s + s + j];
      }
      for (int64_t c = 0; c < h; ++c) ref[i * h + c] += silu(g) * l * s2[j * h + c];
    }
  }
  EXPECT_EQ(routed_slots, t * config.router.topk);
  std::vector<float> out = testing::ToFloatVector(yb.View()), reff(ref.begin(), ref.end());
  const double err = testing::RelativeError(out, reff);
  std::printf("moe layer forward vs naive experts: rel err %.2e (tol 1e-6)\n", err);
  EXPECT_LT(err, 1e-6);
}

// Padding every expert to its capacity with probability-0 zero rows changes nothing.
TEST(MoELayerTest, PadToCapacityChangesNothing) {
  std::mt19937_64 rng(9);
  const int64_t t = 24;
  MoELayerConfig config = SmallConfig();
  config.router.capacity_factor = 0.8;
  MoELayerConfig padded = config;
  padded.pad_to_capacity = true;
  auto w = MoELayerTensors::Create(config, Device::Cpu(), DType::kF64, DType::kF64).value();
  ASSERT_TRUE(w.RandomizeOnCpu(rng, 0.5f).ok());
  auto wp = MoELayerTensors::Create(config, Device::Cpu(), DType::kF64, DType::kF64).value();
  ASSERT_TRUE(wp.CopyParamsFrom(w).ok());
  Buffer xb = Buffer::ForTensor(DType::kF64, {t, config.hidden_size}, Device::Cpu()).value();
  testing::FillRandom(xb.View(), rng);
  std::vector<std::vector<float>> outs, dxs, grads;
  for (const MoELayerConfig* c : {&config, &padded}) {
    MoELayerTensors& ww = c == &config ? w : wp;
    auto layer = MoELayer::Create(*c, Device::Cpu(), t).value();
    Buffer yb = Buffer::ForTensor(DType::kF64, {t, c->hidden_size}, Device::Cpu()).value();
    Buffer dxb = Buffer::ForTensor(DType::kF64, {t, c->hidden_size}, Device::Cpu()).value();
    ASSERT_TRUE(
        layer->Forward(Stream::Cpu(), ww.params(), ww.router_state(), xb.View(), yb.View()).ok());
    ASSERT_TRUE(
        layer->Backward(Stream::Cpu(), ww.params(), ww.grads(), xb.View(), dxb.View(), 1.0).ok());
    outs.push_back(testing::ToFloatVector(yb.View()));
    dxs.push_back(testing::ToFloatVector(dxb.View()));
    grads.push_back(testing::ToFloatVector(ww.Grad("experts.fc1")));
    if (c == &padded) {
      std::vector<float> tpe = testing::ToFloatVector(layer->tokens_per_expert());
      std::printf("padded tokens_per_expert:");
      for (float v : tpe) std::printf(" %g", v);
      std::printf(" (capacity %ld)\n", kernels::ExpertCapacity(c->router, t));
    }
  }
  EXPECT_LT(testing::RelativeError(outs[1], outs[0]), 1e-12);
  EXPECT_LT(testing::RelativeError(dxs[1], dxs[0]), 1e-12);
  EXPECT_LT(testing::RelativeError(grads[1], grads[0]), 1e-12);
}

// moe_permute_fusion on the CPU (where the gathered ops gather into copies, then run the same
// reference) is bit for bit the unfused layer: outputs, losses, input and every weight gradient,
// over two micro-batches (accumulating); with pad-to-capacity it does not apply.
TEST(MoELayerTest, PermuteFusionIsBitIdenticalOnTheCpu) {
  std::mt19937_64 rng(23);
  const int64_t t = 20;
  MoELayerConfig config = SmallConfig();
  config.router.aux_losses = {{AuxLossType::kAuxLoss, 0.1}};
  config.router.capacity_factor = 0.9;  // some slots dropped
  MoELayerConfig fused = config;
  fused.permute_fusion = true;
  auto w = MoELayerTensors::Create(config, Device::Cpu(), DType::kF64, DType::kF64).value();
  ASSERT_TRUE(w.RandomizeOnCpu(rng, 0.5f).ok());
  auto wf = MoELayerTensors::Create(config, Device::Cpu(), DType::kF64, DType::kF64).value();
  ASSERT_TRUE(wf.CopyParamsFrom(w).ok());
  const int64_t h = config.hidden_size;
  Buffer x1 = Buffer::ForTensor(DType::kF64, {t, h}, Device::Cpu()).value();
  Buffer x2 = Buffer::ForTensor(DType::kF64, {t, h}, Device::Cpu()).value();
  Buffer dy = Buffer::ForTensor(DType::kF64, {t, h}, Device::Cpu()).value();
  testing::FillRandom(x1.View(), rng);
  testing::FillRandom(x2.View(), rng);
  testing::FillRandom(dy.View(), rng);
  std::vector<std::vector<double>> runs;
  for (const MoELayerConfig* c : {&config, &fused}) {
    MoELayerTensors& ww = c == &config ? w : wf;
    auto layer = MoELayer::Create(*c, Device::Cpu(), t).value();
    EXPECT_EQ(layer->permute_fused(), c == &fused);
    ASSERT_TRUE(ww.ZeroGrads().ok());
    std::vector<double> all;
    auto append = [&all](const Tensor& v) {  // f64 tensors, exactly
      ASSERT_EQ(v.dtype, DType::kF64);
      all.insert(all.end(), v.as<double>(), v.as<double>() + v.numel());
    };
    for (const Buffer* x : {&x1, &x2}) {
      Buffer y = Buffer::ForTensor(DType::kF64, {t, h}, Device::Cpu()).value();
      Buffer dx = Buffer::ForTensor(DType::kF64, {t, h}, Device::Cpu()).value();
      ASSERT_TRUE(
          layer->Forward(Stream::Cpu(), ww.params(), ww.router_state(), x->View(), y.View()).ok());
      const absl::Status st =
          layer->Backward(Stream::Cpu(), ww.params(), ww.grads(), dy.View(), dx.View(), 1.0);
      ASSERT_TRUE(st.ok()) << st;
      for (const Tensor& v : {y.View(), dx.View(), layer->losses()}) append(v);
    }
    for (auto& [name, shape] : MoELayerTensors::ParamShapes(config)) append(ww.Grad(name));
    runs.push_back(std::move(all));
  }
  EXPECT_EQ(runs[0], runs[1]);
  MoELayerConfig padded = fused;
  padded.pad_to_capacity = true;
  EXPECT_FALSE(MoELayer::Create(padded, Device::Cpu(), t).value()->permute_fused());
}

// kOverwrite writes the gradients without reading them; kAccumulate adds to them.
TEST(MoELayerTest, GradModeOverwriteAndAccumulate) {
  MoELayerConfig config = SmallConfig();
  config.shared_ffn_size = 4;
  config.shared_expert_gate = true;
  config.router.aux_losses = {{AuxLossType::kAuxLoss, 0.1}};
  const int64_t t = 10, h = config.hidden_size;
  std::mt19937_64 rng(21);
  auto w = MoELayerTensors::Create(config, Device::Cpu(), DType::kF64, DType::kF64).value();
  ASSERT_TRUE(w.RandomizeOnCpu(rng, 0.5f).ok());
  auto layer = MoELayer::Create(config, Device::Cpu(), t).value();
  Buffer x = Buffer::ForTensor(DType::kF64, {t, h}, Device::Cpu()).value();
  Buffer y = Buffer::ForTensor(DType::kF64, {t, h}, Device::Cpu()).value();
  Buffer dx = Buffer::ForTensor(DType::kF64, {t, h}, Device::Cpu()).value();
  testing::FillRandom(x.View(), rng);
  auto run = [&](MoELayer::GradMode mode) {
    ASSERT_TRUE(
        layer->Forward(Stream::Cpu(), w.params(), w.router_state(), x.View(), y.View()).ok());
    ASSERT_TRUE(
        layer->Backward(Stream::Cpu(), w.params(), w.grads(), x.View(), dx.View(), 1.0, mode).ok());
  };
  auto grads = [&]() {
    std::vector<float> all;
    for (auto& [name, shape] : MoELayerTensors::ParamShapes(config)) {
      std::vector<float> g = testing::ToFloatVector(w.Grad(name));
      all.insert(all.end(), g.begin(), g.end());
    }
    return all;
  };
  ASSERT_TRUE(w.ZeroGrads().ok());
  run(MoELayer::GradMode::kAccumulate);
  const std::vector<float> once = grads();
  for (auto& [name, shape] : MoELayerTensors::ParamShapes(config)) {
    ASSERT_TRUE(kernels::FillBytes(w.Grad(name), 0x7F).ok());  // garbage, must not be read
  }
  run(MoELayer::GradMode::kOverwrite);
  EXPECT_EQ(grads(), once);
  run(MoELayer::GradMode::kAccumulate);
  std::vector<float> twice = grads();
  for (float& v : twice) v /= 2;
  EXPECT_LT(testing::RelativeError(twice, once), 1e-6);
}

// MoEGradScratch: two layers (different weights) that share ONE set of backward-only buffers, run
// in a model's order (forward 1, forward 2, backward 2, backward 1, twice), give bit for bit the
// outputs, input gradients and weight gradients of the same two layers with their own buffers,
// and hold exactly one set of those buffers less: da [R, F'], dh [R, 2F'], d_expert_out and
// d_expert_x [R, H], d_expert_probs [R] (fp64, R = T·k; E·C with pad-to-capacity).
TEST(MoELayerTest, SharedGradScratchIsBitIdenticalAndHeldOnce) {
  struct Case {
    const char* name;
    std::function<void(MoELayerConfig*)> apply;
  };
  const Case cases[] = {
      {"aux_shared_gate",
       [](MoELayerConfig* c) {
         c->shared_ffn_size = 5;
         c->shared_expert_gate = true;
         c->router.aux_losses = {{AuxLossType::kAuxLoss, 0.1}};
       }},
      {"capacity_padded",
       [](MoELayerConfig* c) {
         c->router.capacity_factor = 0.75;
         c->pad_to_capacity = true;
       }},
      {"moe_act_recompute", [](MoELayerConfig* c) { c->recompute_act = true; }},
  };
  for (const Case& k : cases) {
    MoELayerConfig config = SmallConfig();
    k.apply(&config);
    const int64_t t = 12, h = config.hidden_size, f = config.ffn_hidden_size;
    std::mt19937_64 rng(31);
    std::vector<MoELayerTensors> w;
    for (int i = 0; i < 2; ++i) {
      w.push_back(MoELayerTensors::Create(config, Device::Cpu(), DType::kF64, DType::kF64).value());
      ASSERT_TRUE(w.back().RandomizeOnCpu(rng, 0.5f).ok());
    }
    Buffer x = Buffer::ForTensor(DType::kF64, {t, h}, Device::Cpu()).value();
    Buffer dy = Buffer::ForTensor(DType::kF64, {t, h}, Device::Cpu()).value();
    testing::FillRandom(x.View(), rng);
    testing::FillRandom(dy.View(), rng);
    // Outputs, input gradients and weight gradients of both layers, as raw bytes; and the Buffer
    // bytes the two layers (and the shared scratch) hold.
    auto run = [&](bool shared, int64_t* held) {
      std::vector<char> out;
      auto keep = [&](const Tensor& v) {
        const char* b = static_cast<const char*>(v.data);
        out.insert(out.end(), b, b + v.bytes());
      };
      const int64_t before = kernels::BufferMemory(DeviceType::kCpu).current_bytes;
      std::unique_ptr<MoEGradBuffers> scratch;
      if (shared) scratch = std::make_unique<MoEGradBuffers>(Device::Cpu());
      const MoEGradScratch g = shared ? scratch->scratch() : MoEGradScratch{};
      std::vector<std::unique_ptr<MoELayer>> layers;
      for (int i = 0; i < 2; ++i) {
        layers.push_back(MoELayer::Create(config, Device::Cpu(), t, {}, {}, g).value());
      }
      *held = kernels::BufferMemory(DeviceType::kCpu).current_bytes - before;
      std::vector<Buffer> y, dx;
      for (int i = 0; i < 2; ++i) {
        y.push_back(Buffer::ForTensor(DType::kF64, {t, h}, Device::Cpu()).value());
        dx.push_back(Buffer::ForTensor(DType::kF64, {t, h}, Device::Cpu()).value());
        EXPECT_TRUE(w[i].ZeroGrads().ok());
      }
      for (int step = 0; step < 2; ++step) {
        // Layer 2 reads layer 1's output; the backward runs in reverse.
        for (int i = 0; i < 2; ++i) {
          const Tensor in = i == 0 ? x.View() : y[0].View();
          EXPECT_TRUE(layers[i]
                          ->Forward(Stream::Cpu(), w[i].params(), w[i].router_state(), in,
                                    y[i].View(), /*jitter_offset=*/step)
                          .ok());
        }
        for (int i = 1; i >= 0; --i) {
          const Tensor d = i == 1 ? dy.View() : dx[1].View();
          EXPECT_TRUE(
              layers[i]
                  ->Backward(Stream::Cpu(), w[i].params(), w[i].grads(), d, dx[i].View(), 0.5)
                  .ok());
        }
        for (int i = 0; i < 2; ++i) {
          keep(y[i].View());
          keep(dx[i].View());
        }
      }
      for (int i = 0; i < 2; ++i) {
        for (auto& [name, shape] : MoELayerTensors::ParamShapes(config)) keep(w[i].Grad(name));
      }
      return out;
    };
    int64_t held_own = 0, held_shared = 0;
    const std::vector<char> own = run(false, &held_own);
    const std::vector<char> shared = run(true, &held_shared);
    const int64_t c = kernels::ExpertCapacity(config.router, t);
    const int64_t r =
        config.pad_to_capacity ? config.router.num_experts * c : t * config.router.topk;
    const int64_t one_set = r * (f + 2 * f + 2 * h + 1) * 8;
    std::printf(
        "%s: 2 layers, own backward buffers %lld B, shared %lld B: %lld B less (one set: R %lld x "
        "(3F' + 2H + 1) x 8 = %lld B); results %zu bytes, %s\n",
        k.name, static_cast<long long>(held_own), static_cast<long long>(held_shared),
        static_cast<long long>(held_own - held_shared), static_cast<long long>(r),
        static_cast<long long>(one_set), own.size(), own == shared ? "bit-identical" : "DIFFER");
    EXPECT_EQ(own, shared) << k.name;
    EXPECT_EQ(held_own - held_shared, one_set) << k.name;
  }
}

TEST(MoELayerTest, RejectsBadConfigAndShapes) {
  MoELayerConfig config = SmallConfig();
  config.shared_expert_gate = true;
  EXPECT_EQ(MoELayer::Create(config, Device::Cpu(), 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  config = SmallConfig();
  auto layer = MoELayer::Create(config, Device::Cpu(), 4).value();
  auto w = MoELayerTensors::Create(config, Device::Cpu(), DType::kF64, DType::kF64).value();
  Buffer xb = Buffer::ForTensor(DType::kF64, {5, config.hidden_size}, Device::Cpu()).value();
  absl::Status s =
      layer->Forward(Stream::Cpu(), w.params(), w.router_state(), xb.View(), xb.View());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("exceed"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace switchyard::model
