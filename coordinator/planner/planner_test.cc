// File: coordinator/planner/planner_test.cc
//
// The planner against numbers computed by hand from the formulas of cost_model.h (derivations in
// the comments), its rule rejections, ranking, the no-fit error and bad input.
#include "coordinator/planner/planner.h"

#include <chrono>
#include <cmath>
#include <iostream>
#include <string>

#include "absl/strings/match.h"
#include "coordinator/planner/cost_model.h"
#include "gtest/gtest.h"

namespace switchyard::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Relative comparison: the planner sums the same terms in another order than the comments.
void ExpectRel(double actual, double expected, const char* what) {
  EXPECT_LE(std::abs(actual - expected), 1e-12 * std::abs(expected))
      << what << ": got " << actual << ", expected " << expected;
}

// A small MoE model: L = 2 (both MoE), H = 1024, 8 heads (D = 128, Hkv = 8), V = 32768,
// S = 1024, E = 8, top-2, Fe = 1024, tied embeddings, no shared expert.
v1::JobSpec SmallMoeSpec() {
  v1::JobSpec spec;
  v1::ModelConfig* m = spec.mutable_model();
  m->set_num_layers(2);
  m->set_hidden_size(1024);
  m->set_num_attention_heads(8);
  m->set_ffn_hidden_size(4096);
  m->set_vocab_size(32768);
  m->set_seq_length(1024);
  m->set_num_experts(8);
  m->set_moe_router_topk(2);
  m->set_moe_ffn_hidden_size(1024);
  m->set_moe_token_dispatcher_type("alltoall");
  spec.mutable_training()->set_train_iters(100);
  spec.mutable_data()->set_mock_data(true);
  return spec;
}

// 8 GPUs, `per_node` per node, 80 GiB, NVLink 1e11 B/s, inter-node 1e10 B/s, 1e14 FLOP/s.
v1::Cluster Cluster8(int per_node) {
  v1::Cluster c;
  c.set_num_gpus(8);
  c.set_gpus_per_node(per_node);
  c.set_gpu_memory_bytes(80 * kGiB);
  c.set_intra_node_bandwidth_bytes_per_second(1e11);
  c.set_inter_node_bandwidth_bytes_per_second(1e10);
  c.set_peak_flops(1e14);
  return c;
}

void FixMapping(v1::JobSpec* spec, int tp, int cp, int pp, int etp, int ep) {
  v1::ParallelConfig* p = spec->mutable_parallel();
  p->set_tensor_model_parallel_size(tp);
  p->set_context_parallel_size(cp);
  p->set_pipeline_model_parallel_size(pp);
  p->set_expert_tensor_parallel_size(etp);
  p->set_expert_model_parallel_size(ep);
}

void Print(const char* name, const v1::PlanCandidate& c) {
  std::cout << name << ": " << MappingToString(c.mapping()) << "\n  memory GiB: weights "
            << c.memory().weights() / kGiB << " grads " << c.memory().gradients() / kGiB
            << " optimizer " << c.memory().optimizer_states() / kGiB << " activations "
            << c.memory().activations() / kGiB << " total " << c.memory().total() / kGiB
            << "\n  time s: compute " << c.time().compute() << " tp " << c.time().tp_communication()
            << " ep " << c.time().ep_communication() << " pp " << c.time().pp_communication()
            << " dp " << c.time().dp_communication() << " bubble " << c.time().pipeline_bubble()
            << " total " << c.time().total() << "\n";
}

// Case A: 8 GPUs in one node, TP1 CP1 PP1 DP8, experts ETP1 EP8 EDP1, distributed optimizer,
// mbs 1, global batch unset -> mbs * W = 8, so m = 8 / (1 * 8) = 1.
TEST(PlannerTest, HandComputedMoeExpertParallel) {
  v1::PlanRequest req;
  *req.mutable_spec() = SmallMoeSpec();
  FixMapping(req.mutable_spec(), 1, 1, 1, 1, 8);
  req.mutable_spec()->mutable_parallel()->set_use_distributed_optimizer(true);
  *req.mutable_cluster() = Cluster8(8);
  auto plan = PlanJob(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  Print("A best", plan->best());
  EXPECT_EQ(plan->alternatives_size(), 0);
  const v1::Mapping& m = plan->best().mapping();
  EXPECT_EQ(m.data_parallel_size(), 8);
  EXPECT_EQ(m.expert_data_parallel_size(), 1);
  EXPECT_EQ(m.num_micro_batches(), 1);
  EXPECT_EQ(m.micro_batch_size(), 1);
  // Parameters. Attention q,k,v,o: 4 * 1024*1024 = 4,194,304; norms 2*1024 = 2048; router
  // 8*1024 = 8192; embedding 32768*1024 = 33,554,432 (tied: once); final norm 1024.
  // P_d = 2 * (4,194,304 + 2048 + 8192) + 33,554,432 + 1024 = 41,964,544.
  // P_x = 2 layers * (8/8 experts) * 3*1024*1024 = 6,291,456.  P = 48,256,000.
  // weights 2P = 96,512,000; gradients 4P = 193,024,000;
  // optimizer 12 * (P_d / (DP*CP = 8) + P_x / EDP 1) = 12 * (5,245,568 + 6,291,456) = 138,444,288.
  // Activations per token (t = 1 * 1024 / 1 = 1024 tokens, TP 1):
  //   attention 2*2*1024 + 2*(16+16)*128 + 4*8 = 4096 + 8192 + 32 = 12,320
  //   MoE 2*2*1024 + 4*2*8 + 2*2*(2*1*1024 + 3*1024) = 4096 + 64 + 20,480 = 24,640
  //   last stage 2*2*1024 + 4*32768 = 135,168
  //   2 * (12,320 + 24,640) + 135,168 = 209,088 bytes/token * 1024 tokens * 1 in flight
  //   = 214,106,112.
  // total = 96,512,000 + 193,024,000 + 138,444,288 + 214,106,112 + 2 GiB (2,147,483,648)
  //       = 2,789,570,048.
  const v1::MemoryEstimate& mem = plan->best().memory();
  ExpectRel(mem.weights(), 96512000, "weights");
  ExpectRel(mem.gradients(), 193024000, "gradients");
  ExpectRel(mem.optimizer_states(), 138444288, "optimizer");
  ExpectRel(mem.activations(), 214106112, "activations");
  ExpectRel(mem.total(), 2789570048.0, "memory total");
  // Time. FLOPs/token forward: attention 2*1024*(1024 + 2*1024) + 2*1024*1024 = 8,388,608;
  // core 2*2*8*128*512 = 2,097,152; router 2*1024*8 = 16,384; experts 2*2*3*1024*1024 =
  // 12,582,912; per layer 23,085,056, two layers 46,170,112; head 2*1024*32768 = 67,108,864;
  // sum 113,278,976, times 3 = 339,836,928.
  // compute = 339,836,928 * GBS 8 * S 1024 / (W 8 * 1e14 * 0.5) = 0.00695986028544 s.
  // EP all-to-all: m 1 * 2 MoE layers * 4 * (2 * k 2 * 1024 tokens * 1024) * 7/8 / 1e11 (EP group
  //   = ranks 0..7, one node) = 29,360,128 / 1e11 = 0.00029360128 s.
  // DP: 2 * 7/8 * 4 * P_d / 1e11 = 7 * 41,964,544 / 1e11 = 0.00293751808 s; EDP 1: none.
  // total = 0.00695986028544 + 0.00029360128 + 0.00293751808 = 0.01019097964544 s.
  const v1::TimeEstimate& t = plan->best().time();
  ExpectRel(t.compute(), 0.00695986028544, "compute");
  EXPECT_EQ(t.tp_communication(), 0);
  ExpectRel(t.ep_communication(), 0.00029360128, "ep");
  EXPECT_EQ(t.pp_communication(), 0);
  ExpectRel(t.dp_communication(), 0.00293751808, "dp");
  EXPECT_EQ(t.pipeline_bubble(), 0);
  ExpectRel(t.total(), 0.01019097964544, "time total");
}

// Case B: 8 GPUs, 4 per node (two nodes); TP2 CP1 PP2 DP2, experts ETP1 EP4 EDP1; mbs 1,
// global batch 16 -> m = 16 / (1 * 2) = 8. The spec leaves use_distributed_optimizer false, so
// both optimizers are candidates with equal time; the distributed one wins on memory.
TEST(PlannerTest, HandComputedPipelineAcrossNodes) {
  v1::PlanRequest req;
  *req.mutable_spec() = SmallMoeSpec();
  FixMapping(req.mutable_spec(), 2, 1, 2, 1, 4);
  req.mutable_spec()->mutable_training()->set_global_batch_size(16);
  *req.mutable_cluster() = Cluster8(4);
  auto plan = PlanJob(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  Print("B best", plan->best());
  ASSERT_EQ(plan->alternatives_size(), 1);
  Print("B alternative", plan->alternatives(0));
  EXPECT_TRUE(plan->best().mapping().use_distributed_optimizer());
  EXPECT_FALSE(plan->alternatives(0).mapping().use_distributed_optimizer());
  EXPECT_EQ(plan->best().mapping().num_micro_batches(), 8);
  // Stage 1 (last; layer 1) is the larger: attention 4,194,304/2 + norms 2048 + router 8192
  // = 2,107,392; + output (tied copy) 33,554,432/2 = 16,777,216 + final norm 1024
  // -> P_d = 18,885,632; P_x = 8/4 experts * 3*1024*1024 / ETP 1 = 6,291,456. P = 25,177,088.
  // (Stage 0: P_d = 2,107,392 + 16,777,216 = 18,884,608, same P_x.)
  // Activations, t = 1024, TP 2: stage 1 per token (12,320 + 24,640 + 135,168) / 2 = 86,064,
  //   1 micro-batch in flight (PP - 1 = 1): 1024 * 86,064 = 88,129,536.
  //   Stage 0: 36,960 / 2 = 18,480 per token, 2 in flight: 37,847,040.
  // Replicated optimizer, stage 1: 18 * P = 453,187,584 + 88,129,536 = 541,317,120
  //   (stage 0: 18 * 25,176,064 + 37,847,040 = 491,016,192) -> + 2 GiB = 2,688,800,768.
  // Distributed, stage 1: 2P 50,354,176 + 4P 100,708,352 + 12 * (18,885,632/2 + 6,291,456/1)
  //   = 188,811,264, + 88,129,536 = 428,003,328 -> + 2 GiB = 2,575,486,976.
  const v1::MemoryEstimate& dist = plan->best().memory();
  ExpectRel(dist.weights(), 50354176, "weights");
  ExpectRel(dist.gradients(), 100708352, "gradients");
  ExpectRel(dist.optimizer_states(), 188811264, "optimizer (distributed)");
  ExpectRel(dist.activations(), 88129536, "activations");
  ExpectRel(dist.total(), 2575486976.0, "memory total (distributed)");
  ExpectRel(plan->alternatives(0).memory().optimizer_states(), 12.0 * 25177088,
            "optimizer (replicated)");
  ExpectRel(plan->alternatives(0).memory().total(), 2688800768.0, "memory total (replicated)");
  // Groups (order tp-cp-ep-dp-pp, 4 GPUs per node): TP [0,1], DP [0,2], EP [0..3] are in one
  // node (1e11); PP [0,4] spans nodes (1e10).
  // compute = 339,836,928 * 16 * 1024 / (8 * 1e14 * 0.5) = 0.01391972057088.
  // TP: m 8 * (4*1 + 4*(1 - 1)) * 1/2 * 2*1024*1024 / 1e11 = 33,554,432 / 1e11 = 0.00033554432.
  // EP: 8 * 1 MoE layer * 4 * (2 * 2 * 1024/2 * 1024 = 2,097,152) * 3/4 / 1e11 = 0.00050331648.
  // PP: 8 * 2 * 2*1024*1024/2 / 1e10 = 16,777,216 / 1e10 = 0.0016777216.
  // DP: 2 * 1/2 * 4 * 18,885,632 / 1e11 = 0.00075542528; EDP 1: none.
  // bubble: (0.01391972057088 + 0.00033554432 + 0.00050331648 + 0.0016777216) * (2-1)/8
  //       = 0.01643630297088 / 8 = 0.00205453787136.
  // total = 0.01643630297088 + 0.00075542528 + 0.00205453787136 = 0.01924626612224.
  for (const v1::PlanCandidate* c : {&plan->best(), &plan->alternatives(0)}) {
    const v1::TimeEstimate& t = c->time();
    ExpectRel(t.compute(), 0.01391972057088, "compute");
    ExpectRel(t.tp_communication(), 0.00033554432, "tp");
    ExpectRel(t.ep_communication(), 0.00050331648, "ep");
    ExpectRel(t.pp_communication(), 0.0016777216, "pp");
    ExpectRel(t.dp_communication(), 0.00075542528, "dp");
    ExpectRel(t.pipeline_bubble(), 0.00205453787136, "bubble");
    ExpectRel(t.total(), 0.01924626612224, "time total");
  }
}

// Case C: a dense GQA model with context parallelism on 4 of the 8 GPUs (parallel.world_size 4):
// L 2, H 1024, 8 heads / 2 query groups (D 128), F 4096, V 32768, S 2048, untied embeddings.
// TP1 CP2 PP1 DP2 (expert grid: ETP = TP = 1, EP 1, EDP 4), distributed optimizer, mbs 2,
// global batch 8 -> m = 8 / (2 * 2) = 2.
TEST(PlannerTest, HandComputedDenseContextParallel) {
  v1::PlanRequest req;
  v1::JobSpec* spec = req.mutable_spec();
  v1::ModelConfig* m = spec->mutable_model();
  m->set_num_layers(2);
  m->set_hidden_size(1024);
  m->set_num_attention_heads(8);
  m->set_num_query_groups(2);
  m->set_ffn_hidden_size(4096);
  m->set_vocab_size(32768);
  m->set_seq_length(2048);
  m->set_untie_embeddings_and_output_weights(true);
  spec->mutable_training()->set_train_iters(100);
  spec->mutable_training()->set_micro_batch_size(2);
  spec->mutable_training()->set_global_batch_size(8);
  spec->mutable_parallel()->set_world_size(4);
  spec->mutable_parallel()->set_tensor_model_parallel_size(1);
  spec->mutable_parallel()->set_context_parallel_size(2);
  spec->mutable_parallel()->set_pipeline_model_parallel_size(1);
  spec->mutable_parallel()->set_use_distributed_optimizer(true);
  *req.mutable_cluster() = Cluster8(8);
  auto plan = PlanJob(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  Print("C best", plan->best());
  EXPECT_EQ(plan->alternatives_size(), 0);
  const v1::Mapping& mp = plan->best().mapping();
  EXPECT_EQ(mp.data_parallel_size(), 2);
  EXPECT_EQ(mp.expert_tensor_parallel_size(), 1);
  EXPECT_EQ(mp.expert_model_parallel_size(), 1);
  EXPECT_EQ(mp.expert_data_parallel_size(), 4);
  EXPECT_EQ(mp.num_micro_batches(), 2);
  // Parameters: q 1024*1024 + k, v 2 * 1024*256 + o 1024*1024 = 2,621,440; norms 2048;
  // MLP 3*4096*1024 = 12,582,912; per layer 15,206,400, two layers 30,412,800; embedding and
  // output 2 * 33,554,432; final norm 1024 -> P_d = 97,522,688, P_x = 0.
  // weights 195,045,376; gradients 390,090,752; optimizer 12 * P_d / (DP 2 * CP 2) = 292,568,064.
  // Activations: t = 2 * 2048 / 2 = 2048 tokens; per token attention 4096 + 2*(16+4)*128 + 32
  //   = 9,248; dense MLP 4096 + 6*4096 = 28,672; 2 * 37,920 + last stage 4096 + 131,072
  //   = 211,008 -> 2048 * 211,008 = 432,144,384 (1 in flight).
  // total = 195,045,376 + 390,090,752 + 292,568,064 + 432,144,384 + 2 GiB = 3,457,332,224.
  const v1::MemoryEstimate& mem = plan->best().memory();
  ExpectRel(mem.weights(), 195045376, "weights");
  ExpectRel(mem.gradients(), 390090752, "gradients");
  ExpectRel(mem.optimizer_states(), 292568064, "optimizer");
  ExpectRel(mem.activations(), 432144384, "activations");
  ExpectRel(mem.total(), 3457332224.0, "memory total");
  // FLOPs/token forward: attention 2*1024*(1024 + 512) + 2*1024*1024 = 5,242,880; core
  // 2*2*8*128*1024 = 4,194,304; MLP 2*3*1024*4096 = 25,165,824; two layers 69,206,016; head
  // 67,108,864; sum 136,314,880, times 3 = 408,944,640.
  // compute = 408,944,640 * 8 * 2048 / (4 * 1e14 * 0.5) = 0.0335007449088.
  // CP (in tp_communication; CP group [0,1], one node): m 2 * 2 layers * 3 * (2-1) * 2*2*2048
  //   * 2*128 / 1 / 1e11 = 25,165,824 / 1e11 = 0.00025165824.
  // DP over DP x CP = 4 ranks: 2 * 3/4 * 4 * 97,522,688 / 1e11 = 0.00585136128.
  // total = 0.0335007449088 + 0.00025165824 + 0.00585136128 = 0.0396037644288.
  const v1::TimeEstimate& t = plan->best().time();
  ExpectRel(t.compute(), 0.0335007449088, "compute");
  ExpectRel(t.tp_communication(), 0.00025165824, "tp (cp)");
  EXPECT_EQ(t.ep_communication(), 0);
  EXPECT_EQ(t.pp_communication(), 0);
  ExpectRel(t.dp_communication(), 0.00585136128, "dp");
  EXPECT_EQ(t.pipeline_bubble(), 0);
  ExpectRel(t.total(), 0.0396037644288, "time total");
}

// Case D: expert tensor parallelism, a shared expert with gate, MoE every other layer, untied
// embeddings, pipeline stages with one MoE and one dense layer each. Model: L 4 (layers 0 and 2
// MoE), H 1024, 8 heads (D 128, Hkv 8), F 2048, V 32768, S 1024, E 4, top-2, Fe 512, shared
// 1024 + gate. 8 GPUs in one node: TP2 CP1 PP2 DP2, experts ETP2 EP2 EDP1, distributed
// optimizer, mbs 1, global batch 4 -> m = 4 / (1 * 2) = 2.
TEST(PlannerTest, HandComputedExpertTensorParallelMixedLayers) {
  v1::PlanRequest req;
  v1::JobSpec* spec = req.mutable_spec();
  *spec = SmallMoeSpec();
  v1::ModelConfig* m = spec->mutable_model();
  m->set_num_layers(4);
  m->set_ffn_hidden_size(2048);
  m->set_num_experts(4);
  m->set_moe_ffn_hidden_size(512);
  m->set_moe_shared_expert_intermediate_size(1024);
  m->set_moe_shared_expert_gate(true);
  m->set_moe_layer_freq(2);
  m->set_untie_embeddings_and_output_weights(true);
  spec->mutable_training()->set_global_batch_size(4);
  spec->mutable_parallel()->set_use_distributed_optimizer(true);
  FixMapping(spec, 2, 1, 2, 2, 2);
  *req.mutable_cluster() = Cluster8(8);
  auto plan = PlanJob(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  Print("D best", plan->best());
  EXPECT_EQ(plan->alternatives_size(), 0);
  EXPECT_EQ(plan->best().mapping().expert_data_parallel_size(), 1);
  EXPECT_EQ(plan->best().mapping().num_micro_batches(), 2);
  // Per layer: attention 4 * 1024*1024 / TP 2 = 2,097,152; norms 2048; dense MLP
  // 3*2048*1024 / 2 = 3,145,728; router 4*1024 = 4096; shared 3*1024*1024 / 2 = 1,572,864,
  // gate 1024 (replicated); routed 3*4*1024*512 / EP 2 / ETP 2 = 1,572,864.
  // MoE layer dense part 2,097,152 + 2048 + 4096 + 1,572,864 + 1024 = 3,677,184; dense layer
  // 2,097,152 + 2048 + 3,145,728 = 5,244,928. Stage 1: 3,677,184 + 5,244,928 + output
  // 32768*1024/2 = 16,777,216 + final norm 1024 -> P_d = 25,700,352; P_x = 1,572,864;
  // P = 27,273,216. (Stage 0: P_d = 25,699,328 with the embedding, no final norm.)
  // Activations per token: attention 12,320; dense MLP 4096 + 6*2048 = 16,384; MoE 4096 + 8*4
  //   + 2*2*(2*2*1024 + 3*512) + 6*1024 = 4096 + 32 + 22,528 + 6144 = 32,800; stage 1 adds
  //   4096 + 4*32768 = 135,168: (2*12,320 + 16,384 + 32,800 + 135,168) / 2 = 104,496 per token,
  //   1024 tokens, 1 in flight -> 107,003,904. (Stage 0: 73,824 / 2 = 36,912, 2 in flight
  //   -> 75,595,776; its sum 412,299,264 is below stage 1's.)
  // weights 2P = 54,546,432; gradients 4P = 109,092,864;
  // optimizer 12 * (25,700,352 / 2 + 1,572,864 / 1) = 12 * 14,423,040 = 173,076,480.
  // total = 54,546,432 + 109,092,864 + 173,076,480 + 107,003,904 + 2 GiB = 2,591,203,328.
  const v1::MemoryEstimate& mem = plan->best().memory();
  ExpectRel(mem.weights(), 54546432, "weights");
  ExpectRel(mem.gradients(), 109092864, "gradients");
  ExpectRel(mem.optimizer_states(), 173076480, "optimizer");
  ExpectRel(mem.activations(), 107003904, "activations");
  ExpectRel(mem.total(), 2591203328.0, "memory total");
  // FLOPs/token forward: attention 8,388,608 + core 2,097,152 per layer, x4 = 41,943,040;
  // dense MLP 2*3*1024*2048 = 12,582,912, x2 = 25,165,824; MoE router 8192 + experts
  // 2*2*3*1024*512 = 6,291,456 + shared 2*3*1024*1024 = 6,291,456 + gate 2048 = 12,593,152, x2 =
  // 25,186,304; head 67,108,864. Sum 159,404,032, x3 = 478,212,096.
  // compute = 478,212,096 * 4 * 1024 / (8 * 1e14 * 0.5) = 0.00489689186304.
  // All groups in one node (1e11). L_s = 2, Lm_s = 1, t = 1024.
  // TP: m 2 * (4*2 + 4*(2-1)) * 1/2 * 2*1024*1024 / 1e11 = 25,165,824 / 1e11 = 0.00025165824.
  // EP: 2 * 1 * 4 * (2*2*(1024/2)*1024 = 2,097,152) * (1/2 + (2-1)) / 1e11 = 0.00025165824.
  // PP: 2 * 2 * (2*1024*1024/2 = 1,048,576) / 1e11 = 4,194,304 / 1e11 = 4.194304e-05.
  // DP: 2 * 1/2 * 4 * 25,700,352 / 1e11 = 0.00102801408; EDP 1: none.
  // bubble: (0.00489689186304 + 0.00025165824 + 0.00025165824 + 4.194304e-05) * 1/2
  //       = 0.00544215138304 / 2 = 0.00272107569152.
  // total = 0.00544215138304 + 0.00102801408 + 0.00272107569152 = 0.00919124115456.
  const v1::TimeEstimate& t = plan->best().time();
  ExpectRel(t.compute(), 0.00489689186304, "compute");
  ExpectRel(t.tp_communication(), 0.00025165824, "tp");
  ExpectRel(t.ep_communication(), 0.00025165824, "ep");
  ExpectRel(t.pp_communication(), 4.194304e-05, "pp");
  ExpectRel(t.dp_communication(), 0.00102801408, "dp");
  ExpectRel(t.pipeline_bubble(), 0.00272107569152, "bubble");
  ExpectRel(t.total(), 0.00919124115456, "time total");
}

bool HasRejection(const v1::Plan& plan, int tp, int ep, const std::string& text) {
  for (const v1::PlanCandidate& c : plan.rejected()) {
    if ((tp == 0 || c.mapping().tensor_model_parallel_size() == tp) &&
        (ep == 0 || c.mapping().expert_model_parallel_size() == ep) &&
        absl::StrContains(c.rejection(), text)) {
      return true;
    }
  }
  return false;
}

TEST(PlannerTest, RejectsMappingsThatBreakARuleWithTheRuleText) {
  v1::PlanRequest req;
  *req.mutable_spec() = SmallMoeSpec();
  req.mutable_spec()->mutable_model()->set_num_experts(6);
  req.mutable_spec()->mutable_model()->set_seq_length(1000);  // 1000 % 16 != 0: no CP 8
  *req.mutable_cluster() = Cluster8(8);
  auto plan = PlanJob(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(
      HasRejection(*plan, 0, 4,
                   "model.num_experts (6) must be divisible by parallel.expert_model_parallel_size"
                   " (4)"));
  EXPECT_TRUE(HasRejection(*plan, 0, 8, "model.num_experts (6) must be divisible"));
  EXPECT_TRUE(HasRejection(
      *plan, 0, 0,
      "model.seq_length (1000) must be divisible by 2 * parallel.context_parallel_size"));
  EXPECT_TRUE(HasRejection(*plan, 0, 0,
                           "model.num_layers (2) must be divisible by "
                           "parallel.pipeline_model_parallel_size (4)"));
  // Every feasible mapping respects the rules.
  for (const v1::PlanCandidate* c : {&plan->best()}) {
    EXPECT_EQ(6 % c->mapping().expert_model_parallel_size(), 0);
  }
  for (const v1::PlanCandidate& c : plan->alternatives()) {
    EXPECT_EQ(6 % c.mapping().expert_model_parallel_size(), 0) << MappingToString(c.mapping());
    EXPECT_TRUE(c.rejection().empty());
  }
  for (const v1::PlanCandidate& c : plan->rejected()) EXPECT_FALSE(c.rejection().empty());
  std::cout << "feasible " << plan->alternatives_size() + 1 << ", rejected "
            << plan->rejected_size() << "; e.g. " << MappingToString(plan->rejected(0).mapping())
            << ": " << plan->rejected(0).rejection() << "\n";
}

TEST(PlannerTest, RanksByStepTimeThenMemory) {
  v1::PlanRequest req;
  *req.mutable_spec() = SmallMoeSpec();
  req.mutable_spec()->mutable_training()->set_global_batch_size(32);
  *req.mutable_cluster() = Cluster8(4);
  auto plan = PlanJob(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  Print("ranking best", plan->best());
  ASSERT_GT(plan->alternatives_size(), 10);
  const v1::PlanCandidate* prev = &plan->best();
  for (const v1::PlanCandidate& c : plan->alternatives()) {
    ASSERT_LE(prev->time().total(), c.time().total()) << MappingToString(c.mapping());
    if (prev->time().total() == c.time().total()) {
      EXPECT_LE(prev->memory().total(), c.memory().total()) << MappingToString(c.mapping());
    }
    prev = &c;
  }
  // The best is no slower than any alternative and fits; a mapping whose EP group spans the two
  // nodes (EP 8 with 4 GPUs per node) pays inter-node all-to-all and must rank below the same
  // mapping with EP 4.
  EXPECT_LE(plan->best().memory().total(), 80 * kGiB);
  int rank_ep4 = -1, rank_ep8 = -1;
  for (int i = 0; i < plan->alternatives_size(); ++i) {
    const v1::Mapping& m = plan->alternatives(i).mapping();
    if (m.tensor_model_parallel_size() != 1 || m.pipeline_model_parallel_size() != 1 ||
        m.context_parallel_size() != 1 || m.expert_tensor_parallel_size() != 1 ||
        !m.use_distributed_optimizer()) {
      continue;
    }
    if (m.expert_model_parallel_size() == 4) rank_ep4 = i;
    if (m.expert_model_parallel_size() == 8) rank_ep8 = i;
  }
  const v1::Mapping& best = plan->best().mapping();
  if (best.tensor_model_parallel_size() == 1 && best.pipeline_model_parallel_size() == 1 &&
      best.context_parallel_size() == 1 && best.expert_tensor_parallel_size() == 1 &&
      best.use_distributed_optimizer() && best.expert_model_parallel_size() == 4) {
    rank_ep4 = -2;  // the best itself
  }
  ASSERT_NE(rank_ep4, -1);
  ASSERT_NE(rank_ep8, -1);
  EXPECT_LT(rank_ep4, rank_ep8);
  std::cout << "alternatives " << plan->alternatives_size() << ", rejected "
            << plan->rejected_size() << ", EP4 rank " << rank_ep4 << ", EP8 rank " << rank_ep8
            << "\n";
}

TEST(PlannerTest, ModelThatFitsNowhereIsResourceExhausted) {
  v1::PlanRequest req;
  *req.mutable_spec() = SmallMoeSpec();
  v1::ModelConfig* m = req.mutable_spec()->mutable_model();
  m->set_num_layers(64);
  m->set_hidden_size(16384);
  m->set_num_attention_heads(128);
  m->set_num_experts(64);
  m->set_moe_ffn_hidden_size(16384);  // ~3.3e12 parameters
  *req.mutable_cluster() = Cluster8(8);
  auto plan = PlanJob(req);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
  EXPECT_TRUE(absl::StrContains(plan.status().message(),
                                "no parallel mapping fits in cluster.gpu_memory_bytes (80.00 GiB)"))
      << plan.status();
  std::cout << plan.status() << "\n";
}

TEST(PlannerTest, TriesFewerWorkersOnlyWhenAllowed) {
  // GBS 8 with mbs 1 needs DP | 8; on 6 GPUs TP/CP/PP would have to take a factor 3, which
  // breaks heads % TP, seq % 2CP or layers % PP: world 6 (and 5) have no mapping.
  v1::PlanRequest req;
  *req.mutable_spec() = SmallMoeSpec();
  req.mutable_spec()->mutable_training()->set_global_batch_size(8);
  *req.mutable_cluster() = Cluster8(8);
  req.mutable_cluster()->set_num_gpus(6);
  auto plan = PlanJob(req);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  EXPECT_TRUE(absl::StrContains(plan.status().message(),
                                "no parallel mapping of world size 6 satisfies the rules"))
      << plan.status();
  std::cout << plan.status() << "\n";

  req.mutable_spec()->set_min_workers(4);
  plan = PlanJob(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const v1::Mapping& m = plan->best().mapping();
  const int world = m.tensor_model_parallel_size() * m.context_parallel_size() *
                    m.data_parallel_size() * m.pipeline_model_parallel_size();
  EXPECT_EQ(world, 4) << MappingToString(m);
  Print("fewer workers best", plan->best());
}

void ExpectInvalid(const v1::PlanRequest& req, const std::string& needle) {
  auto plan = PlanJob(req);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  EXPECT_TRUE(absl::StrContains(plan.status().message(), needle))
      << plan.status() << " does not name " << needle;
  std::cout << "rejected: " << plan.status() << "\n";
}

TEST(PlannerTest, InvalidRequestsNameTheField) {
  v1::PlanRequest good;
  *good.mutable_spec() = SmallMoeSpec();
  *good.mutable_cluster() = Cluster8(8);
  ASSERT_TRUE(PlanJob(good).ok());

  v1::PlanRequest r = good;
  r.mutable_cluster()->set_num_gpus(0);
  ExpectInvalid(r, "cluster.num_gpus (0) must be positive");
  r = good;
  r.mutable_cluster()->set_gpu_memory_bytes(-1);
  ExpectInvalid(r, "cluster.gpu_memory_bytes");
  r = good;
  r.mutable_cluster()->set_gpus_per_node(0);
  ExpectInvalid(r, "cluster.gpus_per_node");
  r = good;
  r.mutable_cluster()->clear_peak_flops();
  ExpectInvalid(r, "cluster.peak_flops");
  r = good;
  r.mutable_spec()->mutable_model()->set_hidden_size(-5);
  ExpectInvalid(r, "model.hidden_size (-5) must be positive");
  r = good;
  r.mutable_spec()->mutable_model()->clear_hidden_size();
  ExpectInvalid(r, "model.hidden_size is required");
  r = good;
  r.mutable_spec()->mutable_model()->clear_vocab_size();
  ExpectInvalid(r, "model.vocab_size is required");
  r = good;
  r.mutable_spec()->mutable_model()->set_num_experts(-8);
  ExpectInvalid(r, "model.num_experts (-8) must be positive");
  r = good;
  r.mutable_spec()->mutable_parallel()->set_world_size(16);
  ExpectInvalid(r, "parallel.world_size (16) must be at most cluster.num_gpus (8)");
  r = good;
  r.mutable_spec()->mutable_model()->set_num_layers(8);
  r.mutable_spec()->mutable_parallel()->set_tensor_model_parallel_size(2);
  r.mutable_spec()->mutable_parallel()->set_pipeline_model_parallel_size(8);  // 2 * 8 > 8 GPUs
  ExpectInvalid(r,
                "the sizes fixed in parallel (tensor_model_parallel_size 2, "
                "pipeline_model_parallel_size 8) do not divide the world size");
  r = good;
  r.mutable_spec()->mutable_parallel()->set_tensor_model_parallel_size(3);
  ExpectInvalid(r,
                "model.num_attention_heads (8) must be divisible by "
                "parallel.tensor_model_parallel_size (3)");
}

// Mixtral 8x7B on 64 H100s (8 per node; 80 GiB, NVLink ~450 GB/s, IB ~50 GB/s per GPU, 989
// TFLOP/s bf16), GBS 256, seq 4096: the plan must fit, keep its EP group inside a node, and
// planning must stay fast. Megatron's README reference mapping is TP1 EP8 PP4 (VP8).
TEST(PlannerTest, MixtralOn64Gpus) {
  v1::PlanRequest req;
  v1::JobSpec* spec = req.mutable_spec();
  v1::ModelConfig* m = spec->mutable_model();
  m->set_num_layers(32);
  m->set_hidden_size(4096);
  m->set_num_attention_heads(32);
  m->set_num_query_groups(8);
  m->set_ffn_hidden_size(14336);
  m->set_vocab_size(32000);
  m->set_seq_length(4096);
  m->set_num_experts(8);
  m->set_moe_router_topk(2);
  m->set_moe_token_dispatcher_type("alltoall");
  spec->mutable_training()->set_train_iters(100);
  spec->mutable_training()->set_global_batch_size(256);
  v1::Cluster* c = req.mutable_cluster();
  c->set_num_gpus(64);
  c->set_gpus_per_node(8);
  c->set_gpu_memory_bytes(80 * kGiB);
  c->set_intra_node_bandwidth_bytes_per_second(450e9);
  c->set_inter_node_bandwidth_bytes_per_second(50e9);
  c->set_peak_flops(989e12);
  const auto start = std::chrono::steady_clock::now();
  auto plan = PlanJob(req);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(plan.ok()) << plan.status();
  Print("Mixtral best", plan->best());
  for (int i = 0; i < 4 && i < plan->alternatives_size(); ++i) {
    Print("Mixtral alternative", plan->alternatives(i));
  }
  std::cout << "planned in " << seconds << " s: " << plan->alternatives_size() + 1 << " feasible, "
            << plan->rejected_size() << " rejected\n";
  const v1::Mapping& best = plan->best().mapping();
  EXPECT_LE(plan->best().memory().total(), 80 * kGiB);
  EXPECT_LE(best.expert_model_parallel_size() * best.expert_tensor_parallel_size(), 8)
      << MappingToString(best);
  EXPECT_LT(seconds, 30.0);
}

// A DeepSeek-V3-sized MoE (61 layers -> 60 here so PP has choices; 256 experts top-8) on 1024
// GPUs: thousands of candidates; the plan must come back quickly with capped lists.
TEST(PlannerTest, LargeClusterPlansQuickly) {
  v1::PlanRequest req;
  v1::JobSpec* spec = req.mutable_spec();
  v1::ModelConfig* m = spec->mutable_model();
  m->set_num_layers(60);
  m->set_hidden_size(7168);
  m->set_num_attention_heads(128);
  m->set_kv_channels(128);
  m->set_ffn_hidden_size(18432);
  m->set_vocab_size(129280);
  m->set_seq_length(4096);
  m->set_num_experts(256);
  m->set_moe_router_topk(8);
  m->set_moe_ffn_hidden_size(2048);
  m->set_moe_shared_expert_intermediate_size(2048);
  m->set_moe_token_dispatcher_type("alltoall");
  spec->mutable_training()->set_train_iters(100);
  spec->mutable_training()->set_global_batch_size(2048);
  v1::Cluster* c = req.mutable_cluster();
  c->set_num_gpus(1024);
  c->set_gpus_per_node(8);
  c->set_gpu_memory_bytes(80 * kGiB);
  c->set_intra_node_bandwidth_bytes_per_second(450e9);
  c->set_inter_node_bandwidth_bytes_per_second(50e9);
  c->set_peak_flops(989e12);
  const auto start = std::chrono::steady_clock::now();
  auto plan = PlanJob(req);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(plan.ok()) << plan.status();
  Print("DeepSeek-sized best", plan->best());
  std::cout << "planned in " << seconds << " s: " << plan->alternatives_size() + 1
            << " feasible listed, " << plan->rejected_size() << " rejected listed\n";
  EXPECT_LE(plan->alternatives_size(), kMaxListedCandidates);
  EXPECT_LE(plan->rejected_size(), kMaxListedCandidates);
  EXPECT_LE(plan->best().memory().total(), 80 * kGiB);
  EXPECT_LT(seconds, 60.0);
}

}  // namespace
}  // namespace switchyard::planner
