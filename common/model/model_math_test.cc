// File: common/model/model_math_test.cc
#include "common/model/model_math.h"

#include <algorithm>
#include <iostream>
#include <vector>

#include "common/model/pipeline_layout.h"
#include "common/model/pipeline_schedule.h"
#include "gtest/gtest.h"

namespace switchyard {
namespace {

// The dense case of worker/model/gpt_model_test.cc (GptFlopsTest.HandComputedDenseModel), so the
// shared formula is pinned to the worker's number: 3 × 1408.
TEST(ModelMathTest, DenseFlopsMatchTheWorkersHandComputedCase) {
  v1::ModelConfig m;
  m.set_num_layers(1);
  m.set_hidden_size(8);
  m.set_num_attention_heads(2);
  m.set_num_query_groups(1);
  m.set_kv_channels(4);
  m.set_ffn_hidden_size(16);
  m.set_vocab_size(10);
  m.set_seq_length(6);
  auto s = ModelShape::FromProto(m);
  ASSERT_TRUE(s.ok()) << s.status();
  // q 8x8, k 8x4, v 8x4, o 8x8 -> 2*(64+32+32+64) = 384; core 2*2*2*4*3 = 96;
  // mlp 2*3*8*16 = 768; head 2*8*10 = 160. Sum 1408, times 3.
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(*s), 3.0 * 1408);
  // Params: embedding 80; layer: q 64 + k 32 + v 32 + o 64 = 192, norms 16, mlp 3*16*8 = 384;
  // final norm 8. Total 80 + 192 + 16 + 384 + 8 = 680.
  EXPECT_EQ(TotalParams(*s), 680);
}

TEST(ModelMathTest, MoeModelHandComputed) {
  v1::ModelConfig m;
  m.set_num_layers(4);
  m.set_hidden_size(16);
  m.set_num_attention_heads(4);  // D = 4, Hkv = 4
  m.set_ffn_hidden_size(32);
  m.set_vocab_size(100);
  m.set_seq_length(8);
  m.set_num_experts(4);
  m.set_moe_ffn_hidden_size(8);
  m.set_moe_router_topk(2);
  m.set_moe_shared_expert_intermediate_size(8);
  m.set_moe_shared_expert_gate(true);
  m.set_moe_layer_freq(2);  // layers 0 and 2 are MoE
  m.set_qk_layernorm(true);
  m.set_untie_embeddings_and_output_weights(true);
  auto s = ModelShape::FromProto(m);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->moe_layers, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(s->num_moe_layers(), 2);
  // Attention: q,k,v,o 4 * 16*16 = 1024; norms 2*16 + 2*4 = 40.
  EXPECT_EQ(AttentionMatrixParams(*s), 1024);
  EXPECT_EQ(LayerNormParams(*s), 40);
  // Dense MLP 3*32*16 = 1536. MoE: router 4*16 = 64, experts 3*4*16*8 = 1536,
  // shared 3*16*8 + 16 (gate) = 400.
  EXPECT_EQ(DenseMlpParams(*s), 1536);
  EXPECT_EQ(RouterParams(*s), 64);
  EXPECT_EQ(RoutedExpertParams(*s), 1536);
  EXPECT_EQ(SharedExpertParams(*s), 400);
  // Total: 2 * 1600 (embedding + output) + 16 (final norm) + 4 * (1024 + 40)
  //        + 2 * 1536 (dense) + 2 * (64 + 1536 + 400) = 3216 + 4256 + 3072 + 4000 = 14544.
  EXPECT_EQ(TotalParams(*s), 14544);
  // FLOPs per token, forward: attention 2*16*(16+32) + 2*16*16 = 2048 per layer, core
  // 2*2*4*4*(8/2) = 256 per layer -> 4 * 2304 = 9216; dense 2*3*16*32 = 3072 (x2 = 6144);
  // MoE router 2*16*4 = 128, experts 2*2*3*16*8 = 1536, shared 2*3*16*8 = 768, gate 32
  // -> 2464 (x2 = 4928); head 2*16*100 = 3200. Sum 23488, times 3 = 70464.
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(*s), 70464.0);
  std::cout << "params " << TotalParams(*s) << " flops/token " << TrainingFlopsPerToken(*s) << "\n";
}

// Pipeline stages hold the layers of common/model/pipeline_layout.h: even (2 | 2) without an
// uneven layout, 1 | 3 with decoder_first_pipeline_num_layers 1, and the stage's parameter
// elements follow (stage 1 of 1 | 3 holds three layers' norms: 3 · 2 · Align64(16) = 384 of them
// against two layers' 256 in the even split, besides attention and MLPs).
TEST(ModelMathTest, StageLayersFollowThePipelineLayout) {
  v1::ModelConfig m;
  m.set_num_layers(4);
  m.set_hidden_size(16);
  m.set_num_attention_heads(4);
  m.set_ffn_hidden_size(32);
  m.set_vocab_size(100);
  m.set_seq_length(8);
  m.set_untie_embeddings_and_output_weights(true);
  auto s = ModelShape::FromProto(m);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(StageLayerRange(*s, 2, 0), (std::pair<int64_t, int64_t>{0, 2}));
  EXPECT_EQ(StageLayerRange(*s, 2, 1), (std::pair<int64_t, int64_t>{2, 4}));
  v1::Mapping pp2;
  pp2.set_pipeline_model_parallel_size(2);
  const StageParamElements even0 = StageLayoutElements(*s, pp2, 0);
  const StageParamElements even1 = StageLayoutElements(*s, pp2, 1);
  ModelShape uneven = *s;
  uneven.pipeline_first_layers = 1;
  EXPECT_EQ(StageLayerRange(uneven, 2, 0), (std::pair<int64_t, int64_t>{0, 1}));
  EXPECT_EQ(StageLayerRange(uneven, 2, 1), (std::pair<int64_t, int64_t>{1, 4}));
  const StageParamElements first = StageLayoutElements(uneven, pp2, 0);
  const StageParamElements last = StageLayoutElements(uneven, pp2, 1);
  // One layer: norms 2·64, q, k, v, o 4·Align64(256) = 1024, MLP Align64(1024) + Align64(512).
  const int64_t layer = 2 * 64 + 4 * 256 + 1024 + 512;
  EXPECT_EQ(layer, 2688);
  EXPECT_EQ(even0.dense - first.dense, layer);
  EXPECT_EQ(last.dense - even1.dense, layer);
  std::cout << "stage dense elements: even " << even0.dense << " | " << even1.dense
            << ", first 1: " << first.dense << " | " << last.dense << "\n";
}

// Interleaved stages (VPP 2, L 8, PP 2) hold their chunks' layers, chunk-major: stage 0 the
// layers 0, 1, 4, 5, stage 1 2, 3, 6, 7 (megatron_parallel.md §3.4), and with a MoE layer every
// other layer each stage holds two of them either way. The stage FLOPs (its layers, the LM head
// on the last) sum to the model's.
TEST(ModelMathTest, StageLayerIndicesAndFlopsFollowVirtualStages) {
  v1::ModelConfig m;
  m.set_num_layers(8);
  m.set_hidden_size(16);
  m.set_num_attention_heads(4);
  m.set_ffn_hidden_size(32);
  m.set_vocab_size(100);
  m.set_seq_length(8);
  m.set_num_experts(4);
  m.set_moe_ffn_hidden_size(8);
  m.set_moe_router_topk(2);
  for (int moe : {1, 1, 0, 0, 1, 1, 0, 0}) m.add_moe_layer_pattern(moe);
  auto s = ModelShape::FromProto(m);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(StageLayerIndices(*s, 2, 0), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(StageLayerIndices(*s, 2, 1), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(StageLayerIndices(*s, 1, 0), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  ModelShape vpp = *s;
  vpp.pipeline_virtual_stages = 2;
  EXPECT_EQ(StageLayerIndices(vpp, 2, 0), (std::vector<int64_t>{0, 1, 4, 5}));
  EXPECT_EQ(StageLayerIndices(vpp, 2, 1), (std::vector<int64_t>{2, 3, 6, 7}));
  // Forward FLOPs/token: attention 2*16*48 + 2*16*16 = 2048 + core 2*2*4*4*4 = 256 -> 2304 per
  // layer; MoE router 2*16*4 = 128 + experts 2*2*3*16*8 = 1536; dense 2*3*16*32 = 3072; head
  // 2*16*100 = 3200. MoE layer 3968, dense 5376.
  // Even: stage 0 = layers 0-3 = 2 MoE + 2 dense = 18,688, stage 1 the same + head = 21,888.
  // VPP 2: stage 0 = 0, 1, 4, 5 = 4 MoE = 15,872; stage 1 = 4 dense + head = 24,704.
  EXPECT_DOUBLE_EQ(StageTrainingFlopsPerToken(*s, 2, 0), 3.0 * 18688);
  EXPECT_DOUBLE_EQ(StageTrainingFlopsPerToken(*s, 2, 1), 3.0 * 21888);
  EXPECT_DOUBLE_EQ(StageTrainingFlopsPerToken(vpp, 2, 0), 3.0 * 15872);
  EXPECT_DOUBLE_EQ(StageTrainingFlopsPerToken(vpp, 2, 1), 3.0 * 24704);
  EXPECT_DOUBLE_EQ(StageTrainingFlopsPerToken(*s, 1, 0), TrainingFlopsPerToken(*s));
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(*s), 3.0 * 40576);
  // The memory estimate sizes stage 0 by its own layers too: under VPP it holds four MoE layers'
  // experts instead of two, 2 * (fc1 4*16*2*8 + fc2 4*8*16) = 3072 more expert elements.
  v1::Mapping pp2;
  pp2.set_pipeline_model_parallel_size(2);
  EXPECT_EQ(StageLayoutElements(vpp, pp2, 0).expert - StageLayoutElements(*s, pp2, 0).expert, 3072);
}

v1::Mapping Fold(int tp, int cp, int dp, int pp, int etp, int ep) {
  v1::Mapping m;
  m.set_tensor_model_parallel_size(tp);
  m.set_context_parallel_size(cp);
  m.set_data_parallel_size(dp);
  m.set_pipeline_model_parallel_size(pp);
  m.set_expert_tensor_parallel_size(etp);
  m.set_expert_model_parallel_size(ep);
  m.set_expert_data_parallel_size(tp * cp * dp / (etp * ep));
  return m;
}

// The communicators of worker/train/process_groups.cc, counted by hand for the layouts the NCCL
// runtime term was fitted on (model_math.h) and for two pipeline layouts. Ranks in the default
// order tp-cp-ep-dp-pp; rank 0's groups.
TEST(ModelMathTest, EngineCommunicatorsFollowTheProcessGroups) {
  v1::ModelConfig c;
  c.set_num_layers(4);
  c.set_hidden_size(16);
  c.set_num_attention_heads(4);
  c.set_vocab_size(128);
  c.set_num_experts(8);
  c.set_moe_token_dispatcher_type("alltoall");
  auto moe = ModelShape::FromProto(c);
  ASSERT_TRUE(moe.ok()) << moe.status();
  c.set_moe_token_dispatcher_type("allgather");
  auto allgather = ModelShape::FromProto(c);
  ASSERT_TRUE(allgather.ok()) << allgather.status();
  c.clear_num_experts();
  auto dense = ModelShape::FromProto(c);
  ASSERT_TRUE(dense.ok()) << dense.status();
  auto count = [](const ModelShape& m, const v1::Mapping& p) {
    const EngineCommunicatorSet s = EngineCommunicators(m, p);
    return std::pair<int64_t, int64_t>{s.communicators, s.p2p_peers};
  };
  using P = std::pair<int64_t, int64_t>;
  // One process: none, and the runtime is the CUDA term alone.
  EXPECT_EQ(count(*moe, Fold(1, 1, 1, 1, 1, 1)), (P{0, 0}));
  EXPECT_EQ(RuntimeBytes(*moe, Fold(1, 1, 1, 1, 1, 1)), kCudaRuntimeBytes);
  // TP2 ETP2, W 2: every role of 2 ranks is the world ([0,1]), the others [0]; grad_world; EDP 1
  // and DP·CP 1, so grad_edp and grad_dp_cp are one rank: world + grad_world.
  EXPECT_EQ(count(*moe, Fold(2, 1, 1, 1, 2, 1)), (P{2, 0}));
  // TP2 ETP1, W 2: EDP 2 (edp = the world): world, grad_world, grad_edp.
  EXPECT_EQ(count(*moe, Fold(2, 1, 1, 1, 1, 1)), (P{3, 0}));
  // CP2, W 2: dp_cp, cp, edp are the world; grad_world, grad_dp_cp, grad_edp.
  EXPECT_EQ(count(*moe, Fold(1, 2, 1, 1, 1, 1)), (P{4, 0}));
  // DP2·EP2 = W 2: dp_cp, ep, etp_ep are the world, which runs the all-to-all (1 peer);
  // grad_world, grad_dp_cp. The allgather dispatcher runs no all-to-all; a dense model neither.
  EXPECT_EQ(count(*moe, Fold(1, 1, 2, 1, 1, 2)), (P{3, 1}));
  EXPECT_EQ(count(*allgather, Fold(1, 1, 2, 1, 1, 2)), (P{3, 0}));
  EXPECT_EQ(count(*moe, Fold(1, 1, 4, 1, 1, 4)), (P{3, 3}));
  // TP2 PP2 DP2, EP4 (W 8): tp [0,1], dp_cp [0,2], tp_dp_cp [0..3] (shared by ep), pp [0,4];
  // etp_ep_pp is the world; world, grad_world, grad_dp_cp: 7; peers EP 3 + PP 1.
  EXPECT_EQ(count(*moe, Fold(2, 1, 2, 2, 1, 4)), (P{7, 4}));
  // PP4 DP2 (dense, W 8): dp_cp = tp_dp_cp = edp [0,1] (ETP = TP = 1), pp [0,2,4,6]; world,
  // grad_world, grad_dp_cp, grad_edp: 6; a middle stage has two pipeline peers.
  EXPECT_EQ(count(*dense, Fold(1, 1, 2, 4, 1, 1)), (P{6, 2}));
  // The runtime term of DP4·EP4: 128 MiB + 2192 MiB + 3 · 46 MiB + 3 · 391 MiB = 3631 MiB.
  EXPECT_EQ(RuntimeBytes(*moe, Fold(1, 1, 4, 1, 1, 4)), 3631.0 * 1024 * 1024);
}

// One rank's flat layout at TP1 and TP2 (StageLayoutElements, the engine's GptParamLayout):
// attention, dense MLP, the shared expert (fc1 columns, fc2 rows) and the vocabulary-parallel
// embedding / output are divided by TP; norms, router and the shared-expert gate are whole.
TEST(ModelMathTest, TensorParallelLayoutShardsVocabularyAndSharedExpert) {
  v1::ModelConfig m;
  m.set_num_layers(4);
  m.set_hidden_size(16);
  m.set_num_attention_heads(4);  // D = 4, Hkv = 4
  m.set_ffn_hidden_size(32);
  m.set_vocab_size(128);
  m.set_seq_length(8);
  m.set_num_experts(4);
  m.set_moe_ffn_hidden_size(8);
  m.set_moe_router_topk(2);
  m.set_moe_shared_expert_intermediate_size(8);
  m.set_moe_shared_expert_gate(true);
  m.set_moe_layer_freq(2);  // layers 0 and 2 are MoE
  m.set_qk_layernorm(true);
  m.set_untie_embeddings_and_output_weights(true);
  auto s = ModelShape::FromProto(m);
  ASSERT_TRUE(s.ok()) << s.status();
  auto mapping = [](int tp) {
    v1::Mapping p;
    p.set_tensor_model_parallel_size(tp);
    p.set_context_parallel_size(1);
    p.set_data_parallel_size(1);
    p.set_pipeline_model_parallel_size(1);
    p.set_expert_tensor_parallel_size(1);
    p.set_expert_model_parallel_size(1);
    p.set_expert_data_parallel_size(tp);
    p.set_micro_batch_size(1);
    p.set_num_micro_batches(1);
    return p;
  };
  // Every tensor 64-aligned. TP1: per layer norms 2*64 + QK-norms 2*64 + q, o 2*256 + k, v 2*256
  // = 1280 (x4 = 5120); MoE layer router 64 + shared fc1 256 + fc2 128 + gate 64 = 512 (x2);
  // dense MLP 1024 + 512 = 1536 (x2); embedding + output 2*2048 + final norm 64 = 4160.
  // dense = 5120 + 1024 + 3072 + 4160 = 13,376; experts 2 * (1024 + 512) = 3072.
  const StageParamElements one = StageLayoutElements(*s, mapping(1), 0);
  EXPECT_EQ(one.dense, 13376);
  EXPECT_EQ(one.expert, 3072);
  // TP2: per layer 128 + 128 + q, o 2*128 + k, v 2*128 = 768 (x4 = 3072); MoE layer router 64 +
  // shared fc1 [16, 2*4] 128 + fc2 [4, 16] 64 + gate 64 = 320 (x2); dense MLP 512 + 256 = 768
  // (x2); embedding + output 2 * (128/2 * 16 = 1024) + 64 = 2112.
  // dense = 3072 + 640 + 1536 + 2112 = 7360; experts (EP 1) unchanged.
  const StageParamElements two = StageLayoutElements(*s, mapping(2), 0);
  EXPECT_EQ(two.dense, 7360);
  EXPECT_EQ(two.expert, 3072);
}

// The estimate's in-flight micro-batches of a stage are the orders' own count (issue 14): for
// every stage of PP 1..4, VPP 1..3, M up to 8·PP (1F1B every M, interleaved every multiple of PP),
// EngineMemory::in_flight is MaxAliveMicroBatches(PipelineSchedule(...)): the stage with the LM
// head (the last) and the first (the largest) included, on an even and an uneven layout. M the
// schedule refuses (M < PP; not a multiple of PP with VPP > 1; validation reports it first) keeps
// 1F1B's min(PP − s, M). And it is what multiplies the per-layer buffers: a stage's
// layer_activations per in-flight micro-batch are the same at every M.
TEST(ModelMathTest, InFlightMicroBatchesAreThePipelineSchedules) {
  v1::ModelConfig c;
  c.set_num_layers(72);  // divisible by every PP·VPP below
  c.set_hidden_size(16);
  c.set_num_attention_heads(4);
  c.set_ffn_hidden_size(32);
  c.set_vocab_size(64);
  c.set_seq_length(8);
  auto shape = ModelShape::FromProto(c);
  ASSERT_TRUE(shape.ok()) << shape.status();
  int64_t checked = 0, refused = 0;
  for (int64_t pp = 1; pp <= 4; ++pp) {
    for (int64_t vpp = 1; vpp <= (pp > 1 ? 3 : 1); ++vpp) {
      for (bool uneven : {false, true}) {
        if (uneven && pp == 1) continue;
        ModelShape m = *shape;
        m.pipeline_virtual_stages = vpp;
        // Uneven: the lightest first stage the layout rules allow (decoder_first_pipeline_
        // num_layers a multiple of VPP, the rest shared evenly in multiples of VPP).
        for (int64_t first = vpp; uneven && m.pipeline_first_layers < 0 && first < 72;
             first += vpp) {
          PipelineSplit split{72, pp, vpp, first, -1};
          if (first != 72 / pp && ValidatePipelineSplit(split).ok()) {
            m.pipeline_first_layers = first;
          }
        }
        v1::Mapping mapping;
        mapping.set_pipeline_model_parallel_size(static_cast<int32_t>(pp));
        mapping.set_micro_batch_size(1);
        for (int64_t s = 0; s < pp; ++s) {
          double per_slot = -1;
          if (uneven) {
            ASSERT_GT(m.pipeline_first_layers, 0) << "PP " << pp << " VPP " << vpp;
          }
          for (int64_t micro = 1; micro <= 8 * pp; ++micro) {
            mapping.set_num_micro_batches(static_cast<int32_t>(micro));
            const EngineMemory e = EstimateEngineMemory(m, mapping, s);
            auto ops = PipelineSchedule(pp, s, vpp, micro);
            const int64_t want = ops.ok() ? MaxAliveMicroBatches(*ops) : std::min(pp - s, micro);
            (ops.ok() ? checked : refused) += 1;
            EXPECT_EQ(e.in_flight, want) << "PP " << pp << " VPP " << vpp << " M " << micro
                                         << " stage " << s << (uneven ? " uneven" : "");
            const double slot = e.layer_activations / static_cast<double>(e.in_flight);
            if (per_slot < 0) per_slot = slot;
            EXPECT_DOUBLE_EQ(slot, per_slot) << "PP " << pp << " VPP " << vpp << " M " << micro;
          }
        }
      }
    }
  }
  // 1400 estimates: 720 of M the schedule runs, 680 it refuses.
  EXPECT_EQ(checked, 720);
  EXPECT_EQ(refused, 680);
  // PP 2·VPP 2·M 8 (pipeline_schedule_test's hand-checked orders): 4 and 3, where 1F1B's count
  // would be 2 and 1; PP 4·VPP 2·M 8: 8, 8, 7, 5 (1F1B: 4, 3, 2, 1).
  ModelShape vpp2 = *shape;
  vpp2.pipeline_virtual_stages = 2;
  v1::Mapping pp2;
  pp2.set_pipeline_model_parallel_size(2);
  pp2.set_num_micro_batches(8);
  EXPECT_EQ(EstimateEngineMemory(vpp2, pp2, 0).in_flight, 4);
  EXPECT_EQ(EstimateEngineMemory(vpp2, pp2, 1).in_flight, 3);
  v1::Mapping pp4 = pp2;
  pp4.set_pipeline_model_parallel_size(4);
  std::vector<int64_t> counts;
  for (int64_t s = 0; s < 4; ++s) counts.push_back(EstimateEngineMemory(vpp2, pp4, s).in_flight);
  EXPECT_EQ(counts, (std::vector<int64_t>{8, 8, 7, 5}));
}

// moe_permute_fusion at EP = 1: per MoE layer and micro-batch in flight, the permuted input a·R·H
// less and the row index 4R more; the shared backward scratch a·R·H less. Where it does not
// apply (pad to capacity; an expert ffn size not a multiple of 128) nothing changes.
TEST(ModelMathTest, PermuteFusionDropsThePermutedCopies) {
  v1::ModelConfig c;
  c.set_num_layers(4);
  c.set_hidden_size(256);
  c.set_num_attention_heads(4);
  c.set_ffn_hidden_size(512);
  c.set_vocab_size(512);
  c.set_seq_length(64);
  c.set_num_experts(8);
  c.set_moe_router_topk(2);
  c.set_moe_ffn_hidden_size(128);
  auto shape = ModelShape::FromProto(c);
  ASSERT_TRUE(shape.ok()) << shape.status();
  v1::Mapping mapping;
  mapping.set_micro_batch_size(2);
  mapping.set_num_micro_batches(4);
  ModelShape fused = *shape;
  fused.moe_permute_fusion = true;
  const EngineMemory plain = EstimateEngineMemory(*shape, mapping, 0);
  const EngineMemory with = EstimateEngineMemory(fused, mapping, 0);
  const double rows = 2 * 64 * 2, a = 2;  // R = t·k, bf16
  EXPECT_DOUBLE_EQ(plain.moe_buffers - with.moe_buffers,
                   4 * (a * rows * 256 - 4 * rows) + a * rows * 256);
  fused.moe_ffn_hidden_size = 96;
  ModelShape plain96 = *shape;
  plain96.moe_ffn_hidden_size = 96;
  EXPECT_DOUBLE_EQ(EstimateEngineMemory(fused, mapping, 0).moe_buffers,
                   EstimateEngineMemory(plain96, mapping, 0).moe_buffers);
}

TEST(ModelMathTest, MissingOrBadFieldsNameTheField) {
  v1::ModelConfig m;
  m.set_num_attention_heads(2);
  m.set_vocab_size(10);
  auto s = ModelShape::FromProto(m);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("model.hidden_size"), std::string::npos) << s.status();

  m.set_hidden_size(8);
  m.clear_vocab_size();
  s = ModelShape::FromProto(m);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("model.vocab_size"), std::string::npos) << s.status();

  m.set_vocab_size(10);
  m.set_seq_length(-4);
  s = ModelShape::FromProto(m);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(), "model.seq_length (-4) must be positive");

  m.set_seq_length(4);
  m.set_num_experts(4);
  m.add_moe_layer_pattern(1);
  s = ModelShape::FromProto(m);  // num_layers defaults to 2: the pattern needs 2 entries
  ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("model.moe_layer_pattern"), std::string::npos) << s.status();
  std::cout << "last error: " << s.status() << "\n";
}

}  // namespace
}  // namespace switchyard
