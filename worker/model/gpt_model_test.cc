// CPU tests of the GPT model: the flat parameter layout, the FLOP count, and a finite-difference
// check of the whole model's gradients in fp64 (embedding, attention with GQA, QK-norm and RoPE,
// a MoE layer with a gated shared expert and aux/z losses, a dense SwiGLU layer, tied and untied
// LM heads).
#include "worker/model/gpt_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "kernels/runtime/buffer.h"

namespace switchyard::model {
namespace {

using kernels::Buffer;

GptConfig TinyConfig(DType dtype, bool untie) {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.ffn_hidden_size = 24;
  c.vocab_size = 32;
  c.seq_length = 8;
  c.qk_layernorm = true;
  c.untie_embeddings = untie;
  c.init_method_std = 0.3;
  c.moe_layers = {true, false};
  c.dtype = dtype;
  MoELayerConfig& m = c.moe;
  m.hidden_size = 16;
  m.ffn_hidden_size = 12;
  m.shared_ffn_size = 8;
  m.shared_expert_gate = true;
  m.dtype = dtype;
  m.router.num_experts = 4;
  m.router.topk = 2;
  m.router.seq_length = c.seq_length;
  m.router.aux_losses = {{kernels::AuxLossType::kAuxLoss, 0.05},
                         {kernels::AuxLossType::kSeqAuxLoss, 0.02}};
  m.router.z_loss_coeff = 0.01;
  return c;
}

TEST(GptParamLayoutTest, DecayFirstAlignedAndComplete) {
  GptConfig c = TinyConfig(DType::kF32, /*untie=*/true);
  GptParamLayout layout = MakeGptParamLayout(c);
  bool seen_no_decay = false;
  int64_t end = 0;
  for (const ParamInfo& p : layout.params) {
    EXPECT_EQ(p.offset % 64, 0) << p.name;
    EXPECT_GE(p.offset, end) << p.name;
    end = p.offset + p.numel;
    if (!p.weight_decay) seen_no_decay = true;
    EXPECT_EQ(p.weight_decay, !seen_no_decay) << "decayed tensor after a no-decay one: " << p.name;
    EXPECT_EQ(p.weight_decay, p.offset < layout.decay_end) << p.name;
  }
  EXPECT_LE(end, layout.total);
  ASSERT_NE(layout.Find("layers.0.moe.experts.fc1"), nullptr);
  EXPECT_EQ(layout.Find("layers.0.moe.experts.fc1")->shape, (std::vector<int64_t>{4, 16, 24}));
  ASSERT_NE(layout.Find("layers.1.mlp.fc1.weight"), nullptr);
  EXPECT_EQ(layout.Find("layers.1.mlp.fc1.weight")->shape, (std::vector<int64_t>{48, 16}));
  EXPECT_EQ(layout.Find("layers.1.moe.router.weight"), nullptr);
  EXPECT_NE(layout.Find("output.weight"), nullptr);
  EXPECT_TRUE(layout.Find("layers.0.attention.o.weight")->scaled_init);
  EXPECT_TRUE(layout.Find("final_norm.weight")->ones_init);
  EXPECT_EQ(MakeGptParamLayout(TinyConfig(DType::kF32, false)).Find("output.weight"), nullptr);
}

// Tensor parallelism: column-parallel q/k/v/fc1 keep rows, row-parallel o/fc2 keep columns, fc1
// its rows of both halves; the TP-sharded tensors sit in [expert_end, replicated_begin), padded
// like the dense region, the whole-on-every-rank ones after; CopyTpShard cuts and reassembles.
TEST(GptParamLayoutTest, TensorParallelShardsRegionsAndCopies) {
  GptConfig c = TinyConfig(DType::kF32, /*untie=*/true);
  c.tp_size = 2;
  c.tp_rank = 1;
  c.dense_shard_multiple = 2;
  ASSERT_TRUE(c.Validate().ok());
  const GptParamLayout layout = MakeGptParamLayout(c);
  auto shape = [&](const std::string& n) { return layout.Find(n)->shape; };
  using V = std::vector<int64_t>;
  EXPECT_EQ(shape("layers.0.attention.q.weight"), (V{16, 16}));  // 2 of 4 heads x 8
  EXPECT_EQ(shape("layers.0.attention.k.weight"), (V{8, 16}));   // 1 of 2 groups
  EXPECT_EQ(shape("layers.0.attention.o.weight"), (V{16, 16}));  // columns of 2 heads
  EXPECT_EQ(shape("layers.1.mlp.fc1.weight"), (V{24, 16}));      // gate_r ; up_r
  EXPECT_EQ(shape("layers.1.mlp.fc2.weight"), (V{16, 12}));
  EXPECT_EQ(shape("layers.0.attention.q_norm.weight"), (V{8}));     // whole
  EXPECT_EQ(shape("layers.0.moe.router.weight"), (V{4, 16}));       // whole
  EXPECT_EQ(shape("layers.0.moe.shared_expert.gate"), (V{16, 1}));  // whole
  // Vocabulary-parallel embedding and LM head: rows [16·r, 16·r + 16) of the 32.
  EXPECT_EQ(shape("embedding.weight"), (V{16, 16}));
  EXPECT_EQ(shape("output.weight"), (V{16, 16}));
  EXPECT_EQ(layout.Find("embedding.weight")->global_shape, (V{32, 16}));
  // The shared expert split like the dense MLP: fc1 [H, 2S] by columns (gate_r, up_r), fc2 rows.
  EXPECT_EQ(shape("layers.0.moe.shared_expert.fc1"), (V{16, 8}));
  EXPECT_EQ(shape("layers.0.moe.shared_expert.fc2"), (V{4, 16}));
  EXPECT_EQ(layout.Find("layers.1.mlp.fc1.weight")->global_shape, (V{48, 16}));
  EXPECT_EQ((layout.replicated_begin - layout.expert_end) % 128, 0);
  int sharded = 0;
  for (const ParamInfo& p : layout.params) {
    if (p.expert) {
      EXPECT_LT(p.offset, layout.expert_end) << p.name;
    } else if (p.tp_sharded()) {
      ++sharded;
      EXPECT_GE(p.offset, layout.expert_end) << p.name;
      EXPECT_LE(p.offset + p.numel, layout.replicated_begin) << p.name;
    } else {
      EXPECT_GE(p.offset, layout.replicated_begin) << p.name;
    }
  }
  // q, k, v, o per layer; fc1, fc2 of the dense layer; embedding and output (vocabulary rows);
  // the MoE layer's shared expert fc1 and fc2.
  EXPECT_EQ(sharded, 2 * 4 + 2 + 2 + 2);
  // Without TP nothing is sharded and the layout is the single-process one.
  const GptParamLayout one = MakeGptParamLayout(TinyConfig(DType::kF32, true));
  EXPECT_EQ(one.replicated_begin, one.expert_end);

  // Cut every sharded tensor of an iota whole tensor for both ranks, check a few elements, and
  // put the whole tensor back together.
  for (const ParamInfo& p : layout.params) {
    if (!p.tp_sharded()) continue;
    const int64_t whole_numel = p.numel * 2;
    std::vector<float> whole(whole_numel), back(whole_numel, -1.0f), shard(p.numel);
    for (int64_t i = 0; i < whole_numel; ++i) whole[i] = static_cast<float>(i);
    for (int64_t r = 0; r < 2; ++r) {
      CopyTpShard(p, 2, r, sizeof(float), true, whole.data(), shard.data());
      const int64_t cols = p.global_shape[1];
      if (p.name == "layers.1.mlp.fc1.weight") {
        // Row 0 of the shard is gate row 12·r, row 12 is up row 24 + 12·r.
        EXPECT_EQ(shard[0], static_cast<float>(12 * r * cols)) << p.name;
        EXPECT_EQ(shard[12 * cols], static_cast<float>((24 + 12 * r) * cols)) << p.name;
      }
      if (p.name == "layers.0.attention.o.weight") {
        // Row i of the shard is columns [16·r, 16·r + 16) of row i.
        EXPECT_EQ(shard[3 * 16 + 5], static_cast<float>(3 * cols + 16 * r + 5)) << p.name;
      }
      if (p.name == "layers.0.moe.shared_expert.fc1") {
        // [16, 16] whole = gate columns 0-7, up columns 8-15; rank r: [4r, 4r+4) and [8+4r, +4).
        EXPECT_EQ(shard[0], static_cast<float>(4 * r)) << p.name;
        EXPECT_EQ(shard[4], static_cast<float>(8 + 4 * r)) << p.name;
        EXPECT_EQ(shard[8], static_cast<float>(cols + 4 * r)) << p.name;  // row 1
      }
      if (p.name == "embedding.weight") {
        EXPECT_EQ(shard[0], static_cast<float>(16 * r * cols)) << p.name;  // vocabulary row 16·r
      }
      if (p.name == "layers.0.attention.k.weight") {
        EXPECT_EQ(shard[0], static_cast<float>(8 * r * cols)) << p.name;  // group r's rows
      }
      CopyTpShard(p, 2, r, sizeof(float), false, back.data(), shard.data());
    }
    EXPECT_EQ(back, whole) << p.name;
  }
}

TEST(GptConfigTest, TensorParallelSplitRules) {
  GptConfig c = TinyConfig(DType::kF32, false);
  c.tp_size = 4;  // 2 KV groups do not split over 4 ranks
  absl::Status s = c.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "model.num_query_groups (2) must be divisible by "
            "parallel.tensor_model_parallel_size (4)");
  c = TinyConfig(DType::kF32, false);
  c.tp_size = 2;
  c.seq_length = 7;
  c.moe.router.seq_length = 7;
  s = c.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "model.seq_length (7) must be divisible by parallel.tensor_model_parallel_size (2) "
            "(sequence parallelism)");
  // The vocabulary-parallel embedding / LM head and the TP-split shared expert.
  c = TinyConfig(DType::kF32, false);
  c.tp_size = 2;
  c.vocab_size = 33;
  s = c.Validate();
  EXPECT_EQ(s.message(),
            "model.vocab_size (33) must be divisible by parallel.tensor_model_parallel_size (2) "
            "(vocabulary-parallel embedding and LM head)");
  c = TinyConfig(DType::kF32, false);
  c.tp_size = 2;
  c.moe.shared_ffn_size = 7;
  s = c.Validate();
  EXPECT_EQ(s.message(),
            "model.moe_shared_expert_intermediate_size (7) must be divisible by "
            "parallel.tensor_model_parallel_size (2) (the shared expert is split over TP)");
  c = TinyConfig(DType::kF32, false);
  c.tp_size = 2;
  c.tp_rank = 2;
  EXPECT_EQ(c.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GptConfigTest, FromProtoLayerPatternAndErrors) {
  v1::ModelConfig m;
  m.set_num_layers(4);
  m.set_hidden_size(64);
  m.set_num_attention_heads(4);
  m.set_vocab_size(100);
  m.set_seq_length(16);
  m.set_num_experts(8);
  m.set_moe_router_topk(2);
  m.set_moe_ffn_hidden_size(32);
  m.set_moe_layer_freq(2);
  auto c = GptConfig::FromProto(m, DType::kF32);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe_layers, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->ffn_hidden_size, 256);
  m.add_moe_layer_pattern(1);
  auto bad = GptConfig::FromProto(m, DType::kF32);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.moe_layer_pattern"), std::string::npos)
      << bad.status();
  m.clear_moe_layer_pattern();
  m.set_num_query_groups(3);
  bad = GptConfig::FromProto(m, DType::kF32);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("num_query_groups"), std::string::npos) << bad.status();
  m.set_num_query_groups(2);
  m.set_normalization("LayerNorm");
  bad = GptConfig::FromProto(m, DType::kF32);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.normalization"), std::string::npos);
}

TEST(GptFlopsTest, HandComputedDenseModel) {
  GptConfig c;
  c.num_layers = 1;
  c.hidden_size = 8;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  c.ffn_hidden_size = 16;
  c.vocab_size = 10;
  c.seq_length = 6;
  c.moe_layers = {false};
  // q 8x8, k 8x4, v 8x4, o 8x8 -> 2*(64+32+32+64) = 384; core 2*2*2*4*3 = 96;
  // mlp 2*3*8*16 = 768; head 2*8*10 = 160. Sum 1408, times 3.
  EXPECT_DOUBLE_EQ(GptTrainingFlopsPerToken(c), 3.0 * 1408);
}

// The one model: the parameter counts common/model computes from GptConfig::Shape() equal the
// worker's own flat layout, summed tensor by tensor, for dense and MoE layers, q/k norms, shared
// expert with and without gate, tied and untied heads, and an expert-parallel shard (whose layout
// holds E/EP experts; the counts are of the whole model).
TEST(GptParamCountTest, CommonModelCountsEqualTheLayout) {
  int checked = 0;
  for (bool untie : {false, true}) {
    for (bool gate : {false, true}) {
      for (int ep : {1, 2}) {
        GptConfig c = TinyConfig(DType::kF32, untie);
        c.moe.shared_expert_gate = gate;
        c.moe.ep_size = ep;
        c.moe.ep_rank = ep - 1;
        int64_t layout_total = 0, layout_active = 0;
        for (const ParamInfo& p : MakeGptParamLayout(c).params) {
          if (p.expert) {
            // Local shard: L = E / EP experts; scale to the whole model and to top-k active.
            const int64_t per_expert = p.numel / p.shape[0];
            layout_total += per_expert * c.moe.router.num_experts;
            layout_active += per_expert * c.moe.router.topk;
          } else {
            layout_total += p.numel;
            layout_active += p.numel;
          }
        }
        EXPECT_EQ(GptTotalParams(c), layout_total) << "untie " << untie << " gate " << gate;
        EXPECT_EQ(GptActiveParams(c), layout_active) << "untie " << untie << " gate " << gate;
        EXPECT_LT(GptActiveParams(c), GptTotalParams(c));
        ++checked;
      }
    }
  }
  GptConfig dense = TinyConfig(DType::kF32, false);
  dense.moe_layers = {false, false};
  int64_t dense_total = 0;
  for (const ParamInfo& p : MakeGptParamLayout(dense).params) dense_total += p.numel;
  EXPECT_EQ(GptTotalParams(dense), dense_total);
  EXPECT_EQ(GptActiveParams(dense), dense_total);
  std::cout << "layout == common/model counts for " << checked + 1 << " configurations (e.g. "
            << GptTotalParams(TinyConfig(DType::kF32, true)) << " total, "
            << GptActiveParams(TinyConfig(DType::kF32, true)) << " active)\n";
}

struct Model {
  std::unique_ptr<GptModel> model;
  Buffer ids, targets;
};

// Builds the fp64 model with random parameters and a random batch of B sequences.
Model MakeModel(const GptConfig& c, int64_t batch, uint64_t seed, int64_t micro_batches = 1) {
  Model m;
  auto model = GptModel::Create(c, Device::Cpu(), batch, micro_batches);
  EXPECT_TRUE(model.ok()) << model.status();
  m.model = std::move(*model);
  const Stream s = Stream::Cpu();
  EXPECT_TRUE(m.model->InitMaster(s, seed, m.model->params()).ok());
  const int64_t t = batch * c.seq_length;
  m.ids = *Buffer::ForTensor(DType::kI32, {t}, Device::Cpu());
  m.targets = *Buffer::ForTensor(DType::kI32, {t}, Device::Cpu());
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < t; ++i) {
    m.ids.View().as<int32_t>()[i] = static_cast<int32_t>(rng() % c.vocab_size);
    m.targets.View().as<int32_t>()[i] = static_cast<int32_t>(rng() % c.vocab_size);
  }
  m.targets.View().as<int32_t>()[3] = kernels::kIgnoreTarget;
  return m;
}

// The objective whose gradient ForwardBackward computes.
double Objective(Model& m, float ce_scale, double aux_scale) {
  const Stream s = Stream::Cpu();
  const int64_t seq = m.model->config().seq_length;
  absl::Status st = m.model->Forward(s, m.ids.View(), m.targets.View(), seq, 0, Tensor());
  EXPECT_TRUE(st.ok()) << st;
  auto stats = m.model->ReadStepStats(s, 1);
  EXPECT_TRUE(stats.ok()) << stats.status();
  double j = static_cast<double>(ce_scale) * stats->loss_sum;
  for (const auto& layer : stats->moe_losses) {
    for (double v : layer) j += aux_scale * v;
  }
  return j;
}

void CheckGradients(bool untie) {
  const GptConfig c = TinyConfig(DType::kF64, untie);
  Model m = MakeModel(c, /*batch=*/2, /*seed=*/untie ? 7 : 11);
  const Stream s = Stream::Cpu();
  const float ce_scale = 1.0f / 15.0f;  // mean over the 15 valid targets
  const double aux_scale = 0.5;
  ASSERT_TRUE(m.model->ZeroGrads(s).ok());
  absl::Status st = m.model->ForwardBackward(s, m.ids.View(), m.targets.View(), c.seq_length,
                                             ce_scale, aux_scale, 0);
  ASSERT_TRUE(st.ok()) << st;
  const Tensor params = m.model->params(), grads = m.model->grads();
  std::mt19937_64 rng(3);
  double worst = 0;
  int checked = 0;
  for (const ParamInfo& p : m.model->layout().params) {
    for (int rep = 0; rep < 4; ++rep) {
      const int64_t i = p.offset + static_cast<int64_t>(rng() % p.numel);
      double* w = params.as<double>() + i;
      const double saved = *w, h = 1e-6;
      *w = saved + h;
      const double jp = Objective(m, ce_scale, aux_scale);
      *w = saved - h;
      const double jm = Objective(m, ce_scale, aux_scale);
      *w = saved;
      const double fd = (jp - jm) / (2 * h);
      const double an = grads.as<double>()[i];
      const double err = std::abs(fd - an) / std::max(1e-4, std::abs(fd) + std::abs(an));
      worst = std::max(worst, err);
      ++checked;
      EXPECT_LT(err, 1e-5) << p.name << "[" << i - p.offset << "] fd " << fd << " analytic " << an;
    }
  }
  std::printf(
      "fp64 finite differences (%s head): %d entries, worst relative error %.3g "
      "(tolerance 1e-5)\n",
      untie ? "untied" : "tied", checked, worst);
}

TEST(GptModelTest, FiniteDifferenceGradientsTiedHead) { CheckGradients(false); }
TEST(GptModelTest, FiniteDifferenceGradientsUntiedHead) { CheckGradients(true); }

TEST(GptModelTest, GradientsAccumulateOverMicroBatches) {
  const GptConfig c = TinyConfig(DType::kF64, false);
  Model m = MakeModel(c, 2, 5);
  const Stream s = Stream::Cpu();
  ASSERT_TRUE(m.model->ZeroGrads(s).ok());
  ASSERT_TRUE(
      m.model->ForwardBackward(s, m.ids.View(), m.targets.View(), c.seq_length, 0.1f, 0.5, 0).ok());
  std::vector<double> once(m.model->grads().as<double>(),
                           m.model->grads().as<double>() + m.model->grads().numel());
  ASSERT_TRUE(
      m.model->ForwardBackward(s, m.ids.View(), m.targets.View(), c.seq_length, 0.1f, 0.5, 0).ok());
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < once.size(); ++i) {
    max_err = std::max(max_err, std::abs(m.model->grads().as<double>()[i] - 2 * once[i]));
    max_ref = std::max(max_ref, std::abs(once[i]));
  }
  EXPECT_GT(max_ref, 0);
  EXPECT_LT(max_err, 1e-12 * std::max(1.0, max_ref));
}

// ZeroGrads(kOverwrite) leaves the expert gradients as they are (here NaN) and the MoE layers'
// first backward writes them: two micro-batches then give exactly the gradients of zeroing
// everything and adding, in every element; and the flags are spent by the first backward (a
// third micro-batch adds).
TEST(GptModelTest, ExpertGradsOverwrittenByTheFirstBackwardEqualZeroingThem) {
  GptConfig c = TinyConfig(DType::kF64, true);
  c.num_layers = 3;
  c.moe_layers = {true, false, true};
  Model m = MakeModel(c, 2, 21, /*micro_batches=*/3);
  const Stream s = Stream::Cpu();
  const Tensor grads = m.model->grads();
  const int64_t n = grads.numel(), expert_end = m.model->layout().expert_end;
  ASSERT_GT(expert_end, 0);
  ASSERT_LT(expert_end, n);
  double* gd = grads.as<double>();
  int32_t* targets = m.targets.View().as<int32_t>();
  const std::vector<int32_t> targets0(targets, targets + m.targets.View().numel());
  auto run = [&](GptModel::ExpertGrads mode, int micro_batches) {
    // Every tensor poisoned (the padding between tensors stays 0, as nothing writes it).
    for (const ParamInfo& p : m.model->layout().params) {
      std::fill(gd + p.offset, gd + p.offset + p.numel, std::numeric_limits<double>::quiet_NaN());
    }
    EXPECT_TRUE(m.model->ZeroGrads(s, mode).ok());
    for (int j = 0; j < micro_batches; ++j) {
      // Another batch each micro-batch (the targets shifted), the same in both runs.
      for (size_t i = 0; i < targets0.size(); ++i) {
        targets[i] = targets0[i] < 0 ? targets0[i] : (targets0[i] + j) % c.vocab_size;
      }
      absl::Status st =
          m.model->ForwardBackward(s, m.ids.View(), m.targets.View(), c.seq_length, 0.1f, 0.5, j);
      EXPECT_TRUE(st.ok()) << st;
    }
    return std::vector<double>(gd, gd + n);
  };
  // kZero after the poison: every element is a number again.
  const std::vector<double> zeroed = run(GptModel::ExpertGrads::kZero, 2);
  const std::vector<double> overwritten = run(GptModel::ExpertGrads::kOverwrite, 2);
  int64_t differ = 0, nonzero_expert = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!(zeroed[i] == overwritten[i])) ++differ;  // NaN counts as a difference
    if (i < expert_end && zeroed[i] != 0) ++nonzero_expert;
  }
  EXPECT_EQ(differ, 0) << "of " << n << " gradient elements";
  EXPECT_GT(nonzero_expert, expert_end / 2) << "the expert region must carry gradients";
  // Three micro-batches: the third adds (the flags were spent by the first).
  const std::vector<double> zeroed3 = run(GptModel::ExpertGrads::kZero, 3);
  const std::vector<double> overwritten3 = run(GptModel::ExpertGrads::kOverwrite, 3);
  differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += zeroed3[i] == overwritten3[i] ? 0 : 1;
  EXPECT_EQ(differ, 0);
  std::printf(
      "expert gradients [0, %lld) of %lld: overwritten by the first backward == zeroed, bitwise, "
      "over 2 and 3 micro-batches\n",
      static_cast<long long>(expert_end), static_cast<long long>(n));
}

TEST(GptModelTest, NoInformationFlowsFromLaterTokens) {
  const GptConfig c = TinyConfig(DType::kF64, true);
  Model m = MakeModel(c, 2, 9);
  const Stream s = Stream::Cpu();
  const int64_t t = 2 * c.seq_length, v = c.vocab_size;
  auto logits_of = [&]() {
    Buffer logits = *Buffer::ForTensor(DType::kF32, {t, v}, Device::Cpu());
    EXPECT_TRUE(m.model->Forward(s, m.ids.View(), Tensor(), c.seq_length, 0, logits.View()).ok());
    return std::vector<float>(logits.View().as<float>(), logits.View().as<float>() + t * v);
  };
  const std::vector<float> before = logits_of();
  const int64_t p = 5;
  m.ids.View().as<int32_t>()[p] = (m.ids.View().as<int32_t>()[p] + 1) % v;
  const std::vector<float> after = logits_of();
  for (int64_t i = 0; i < t * v; ++i) {
    const int64_t row = i / v;
    if (row < p || row >= c.seq_length) {
      ASSERT_EQ(before[i], after[i]) << "row " << row;
    }
  }
  double later = 0;
  for (int64_t i = p * v; i < c.seq_length * v; ++i) {
    later = std::max(later, std::abs(double(before[i]) - after[i]));
  }
  EXPECT_GT(later, 0.0);
}

TEST(GptModelTest, RejectsBadInputs) {
  const GptConfig c = TinyConfig(DType::kF64, false);
  Model m = MakeModel(c, 2, 5);
  const Stream s = Stream::Cpu();
  Tensor short_ids = m.ids.View();
  short_ids.shape = {5};
  absl::Status st = m.model->ForwardBackward(s, short_ids, m.targets.View(), c.seq_length, 1, 1, 0);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  st = m.model->ForwardBackward(s, m.ids.View(), m.targets.View(), c.seq_length, 1, 1, 3);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  m.ids.View().as<int32_t>()[0] = 99;  // outside the vocabulary
  st = m.model->ForwardBackward(s, m.ids.View(), m.targets.View(), c.seq_length, 1, 1, 0);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_FALSE(m.model->Param("nope").ok());
}

}  // namespace
}  // namespace switchyard::model
