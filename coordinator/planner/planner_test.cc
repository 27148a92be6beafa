// File: coordinator/planner/planner_test.cc
//
// The planner against numbers computed by hand from the formulas of cost_model.h and
// EstimateEngineMemory (common/model/model_math.h) (derivations in the comments), its rule
// rejections, ranking, the no-fit error and bad input. Memory notation: a = 2 (bf16), r = s = 4
// (fp32 router and statistics), runtime (RuntimeBytes) = kCudaRuntimeBytes 128 MiB and, for
// W > 1, kNcclProcessBytes 2192 MiB + kNcclCommunicatorBytes 46 MiB per NCCL communicator of > 1
// rank + kNcclPeerBytes 391 MiB per point-to-point peer (EngineCommunicators: the process groups
// of rank 0, order tp-cp-ep-dp-pp); every tensor of these models is a multiple of 64
// elements and the regions divide their shard padding, so N = P_d + P_x exactly.
#include "coordinator/planner/planner.h"

#include <chrono>
#include <cmath>
#include <iostream>
#include <string>

#include "absl/strings/match.h"
#include "common/model/model_math.h"
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

// The memory fields of a hand-computed case (bytes), each within 1e-12 relative.
struct ExpectedMemory {
  double weights, gradients, optimizer, activations, total;
};
void ExpectMemory(const v1::MemoryEstimate& m, const ExpectedMemory& e) {
  ExpectRel(m.weights(), e.weights, "weights");
  ExpectRel(m.gradients(), e.gradients, "gradients");
  ExpectRel(m.optimizer_states(), e.optimizer, "optimizer");
  ExpectRel(m.activations(), e.activations, "activations");
  ExpectRel(m.total(), e.total, "memory total");
}

// The step-time terms of a hand-computed case (seconds); 0 means the term must be exactly 0.
struct ExpectedTime {
  double compute, tp, ep, pp, dp, bubble, total;
};
void ExpectTime(const v1::TimeEstimate& t, const ExpectedTime& e) {
  ExpectRel(t.compute(), e.compute, "compute");
  ExpectRel(t.tp_communication(), e.tp, "tp (and cp)");
  ExpectRel(t.ep_communication(), e.ep, "ep");
  ExpectRel(t.pp_communication(), e.pp, "pp");
  ExpectRel(t.dp_communication(), e.dp, "dp");
  ExpectRel(t.pipeline_bubble(), e.bubble, "bubble");
  ExpectRel(t.total(), e.total, "time total");
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
  // P_x = 2 layers * (8/8 experts) * 3*1024*1024 = 6,291,456.  N = 48,256,000.
  // weights 2N = 96,512,000; gradients 4N = 193,024,000;
  // optimizer 20 * (P_d / (DP*CP = 8) + P_x / EDP 1) + 3 norm scratches of 8,204
  //   = 20 * (5,245,568 + 6,291,456) + 24,612 = 230,765,092.
  // Activations, t = 1024 tokens (TP 1, one micro-batch in flight):
  //   layers, per token: residual 2*1024*(2+1) = 6144; per layer n1/mid/n2 6*1024 + rstd 2*4 +
  //     q,o 2*2*8*128 + k,v 2*2*8*128 + lse 4*8 = 14,376, two layers 28,752 -> 34,896 * 1024
  //     = 35,733,504.
  //   MoE layer: per token logits/dlogits 2*4*8 + bf16 dlogits 2*8 + indices 8*2 + probs 2*4*2
  //     = 112 -> 114,688 (the router's dx buffer 2*1024 only with input jitter: without, the
  //     gating GEMM adds into dx itself; was 2160 -> 2,211,840). Alltoall dispatcher
  //     (token-deduplicating): send S = 1024 * min(EP 8, k 2) = 2048 token rows (one buffer for the
  //     outgoing, combined and gradient rows in turn) 2*2048*1024 + routing rows 2*4*2048*2 + probs
  //     4*2048 = 4,235,264; rank routing 8*1024*8 + 2*4*1024*8 + routing rows 2*4*1024*2 = 147,456;
  //     counts 4*(8+8)*(1+8) + tokens per expert 4 = 580; received side (sized by the counts, at
  //     its initial size) Rc = min(8*1024, 2048 + 512) = 2560 rows 2*2560*1024 + routing 2*4*2560*2
  //     + local routing 12*2560*2 = 5,345,280; expert side R = min(bound 8*1024*min(2, 1),
  //     2048 + 512) = 2560 rows, input and output (shared with both gradients) 2*2*2560*1024 +
  //     probs 4*2560 = 10,496,000; permute workspace max((1024/128 + 1)*8*4, (8192/128 +
  //     1)*1*4) = 288 -> 20,224,868. Expert rows (fc1, SwiGLU outputs) 3*2*2560*1024 =
  //     15,728,640. Small: aux stats (8+4+4)*8 + 16*8 + 4*(1+1) + 8 = 272, CUDA aux workspace
  //     (64 chunks) 4096 + 512, router workspace 3*256 -> 5648. Per layer 36,073,844, two
  //     layers 72,147,688; plus the backward-only scratch ONCE (MoEGradScratch, shared by both
  //     layers): da, dh 3*2*2560*1024 + the probs gradient 4*2560 = 15,738,880 -> 87,886,568
  //     (92,080,872 with the dx buffer).
  //   head: per token final norm/g/dn 6*1024 + do,dq,dk,dv 2*2*16*128 + 4*(8+2) = 14,376 ->
  //     14,721,024 + 4; LM-head chunk 1024 rows (512 MiB / (8*32768) = 2048 > t):
  //     1024*32768*6 + 4*1024 + the vocabulary-parallel statistics (allocated at any TP)
  //     3*4*1024 = 201,342,976; RMSNorm ws 256*1024*4 = 1,048,576 + embedding ws
  //     4*(32769 + 32768 + 2048) = 270,340; stats 4 + 4*2*2 + 4*2*8 + 8*2*8 + ids 8*1024 = 8,404
  //     -> 217,391,324.
  //   activations = 35,733,504 + 87,886,568 + 217,391,324 = 341,011,396 (was 345,205,700).
  // runtime: W 8 = EP 8 = DP 8, EDP 1: every role of 8 ranks (dp_cp, tp_dp_cp, ep, etp_ep,
  //   etp_ep_pp) is the world, the others one rank; + grad_world and grad_dp_cp (8 ranks) = 3
  //   communicators; the world runs the all-to-all, 7 peers: 128 + 2192 + 3*46 + 7*391 = 5195 MiB
  //   = 5,447,352,320 (before: 128 MiB + 2 * 1.5 GiB = 3,355,443,200).
  // total = 96,512,000 + 193,024,000 + 230,765,092 + 341,011,396 + 5,447,352,320
  //       = 6,308,664,808 (was 6,312,859,112).
  ExpectMemory(plan->best().memory(), {96512000, 193024000, 230765092, 341011396, 6308664808.0});
  // Time. FLOPs/token forward: attention 2*1024*(1024 + 2*1024) + 2*1024*1024 = 8,388,608;
  // core 2*2*8*128*512 = 2,097,152; router 2*1024*8 = 16,384; experts 2*2*3*1024*1024 =
  // 12,582,912; per layer 23,085,056, two layers 46,170,112; head 2*1024*32768 = 67,108,864;
  // sum 113,278,976, times 3 = 339,836,928. The experts' rows per GEMM: r = t 1024 * k 2 * EP 8 *
  // ETP 1 / E 8 = 2048, so their FLOPs 3 * 2 * 12,582,912 = 75,497,472 count 128 / 2048 extra
  // (kExpertGemmHalfRows): + 4,718,592 -> 344,555,520.
  // compute = 344,555,520 * GBS 8 * S 1024 / (W 8 * 1e14 * 0.5) = 0.0070564970496 s.
  // EP all-to-all: m 1 * 2 MoE layers * 4 * (2 * k 2 * 1024 tokens * 1024) * 7/8 / 1e11 (EP group
  //   = ranks 0..7, one node) = 29,360,128 / 1e11 = 0.00029360128 s.
  // DP: 2 * 7/8 * 4 * P_d / 1e11 = 7 * 41,964,544 / 1e11 = 0.00293751808 s; EDP 1: none.
  // total = 0.0070564970496 + 0.00029360128 + 0.00293751808 = 0.0102876164096 s.
  // (Before the experts' row term: compute 0.00695986028544, total 0.01019097964544.)
  ExpectTime(plan->best().time(),
             {0.0070564970496, 0, 0.00029360128, 0, 0.00293751808, 0, 0.0102876164096});
}

// Case B: 8 GPUs, 4 per node (two nodes); TP2 CP1 PP2 DP2, experts ETP1 EP4 EDP1; mbs 1,
// global batch 16 -> m = 16 / (1 * 2) = 8. The spec leaves use_distributed_optimizer false, but
// the worker shards its optimizer whenever W > 1, so the only candidate is the distributed one,
// although a replicated optimizer would need less here (12 bytes per parameter against the
// shards' 20 / DP = 10 per dense and 20 per expert parameter, EDP = 1).
TEST(PlannerTest, HandComputedPipelineAcrossNodes) {
  v1::PlanRequest req;
  *req.mutable_spec() = SmallMoeSpec();
  FixMapping(req.mutable_spec(), 2, 1, 2, 1, 4);
  req.mutable_spec()->mutable_training()->set_global_batch_size(16);
  *req.mutable_cluster() = Cluster8(4);
  auto plan = PlanJob(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  Print("B best", plan->best());
  EXPECT_EQ(plan->alternatives_size(), 0);
  EXPECT_TRUE(plan->best().mapping().use_distributed_optimizer());
  EXPECT_EQ(plan->best().mapping().num_micro_batches(), 8);
  // Stage 1 (last; layer 1): attention 4,194,304/2 + norms 2048 + router 8192 = 2,107,392;
  // + output (tied copy) 32768/TP 2 * 1024 = 16,777,216 (vocabulary-parallel) + final norm 1024
  // -> P_d = 18,885,632; P_x = 8/4 experts * 3*1024*1024 / ETP 1 = 6,291,456.
  // Stage 0 (layer 0): P_d = 2,107,392 + embedding 16,777,216 = 18,884,608, same P_x.
  // t = 1024, TP 2: 512 tokens per rank. Stage 0 has 2 micro-batches in flight (min(PP - 0, m)),
  // stage 1 one but the LM-head loss (only the last stage builds it), and stage 1 is the larger:
  //   layers: (residual 2*1024*2 + one layer 14,376 (case A)) = 18,472 * 512 = 9,457,664, x2.
  //   MoE layer: per token 112 (case A) -> 57,344 (2160 -> 1,105,920 with the dx buffer); send S =
  //   512 * min(4, 2) = 1024 token
  //     rows 2*1024*1024 + 2*4*1024*2 + 4*1024 = 2,117,632; rank routing 8*512*4 + 2*4*512*4 +
  //     2*4*512*2 = 40,960; counts 4*(8+4)*(1+4) + 4*2 = 248; received Rc = min(4*512,
  //     1024 + 256) = 1280 rows 2*1280*1024 + 2*4*1280*2 + 12*1280*2 = 2,672,640; expert side
  //     R = min(EP 4 * 512 * min(2, 8/4) = 4096, 1024 + 256) = 1280 rows 2*2*1280*1024 +
  //     4*1280 = 5,248,000; permute ws max((4+1)*4*4, (16+1)*2*4) = 136 -> 10,079,616; expert
  //     rows 3*2*1280*1024 = 7,864,320; small 272 + aux ws (32 chunks) 2048 + 256 + router ws
  //     768 = 3344 -> 18,004,624 per layer and slot; the backward-only scratch once (da, dh
  //     3*2*1280*1024 + the probs gradient 4*1280 = 7,869,440) -> 25,874,064 (was 26,922,640).
  //   Stage 0: x2 in flight, the scratch once = 43,878,688 (was 45,975,840);
  //   head: 14,376 * 512 + 4 = 7,360,516; RMSNorm ws 1,048,576 + embedding ws of the V/TP =
  //     16,384 rows over t = 1024 tokens 4*(16385 + 16384 + 2048) = 139,268; stats 4*8 +
  //     4*8*2*2 + 4*8*2*8 + 8*2*8 + 8*1024 = 8,992; SP scratch 2 * 2*1024*1024 + the mapped
  //     ids 4*1024 = 4,198,400; the lse of the other 512 tokens 4*512 = 2048 -> 12,757,800.
  //   Stage 1 only: the vocabulary-parallel LM-head loss over the whole micro-batch (a chunk of
  //   all t = 1024 rows of V/TP = 16,384 columns 1024*16384*6 + loss terms 4*1024 + TP
  //   statistics 12*1024 = 100,679,680).
  //   Every stage: the pipeline receive buffers 2 * 2*512*1024 = 2,097,152 and (tied) the other
  //   end's embedding gradient of V/TP rows 4*16384*1024 = 67,108,864.
  //   Stage 1: the trainer's message-buffer pool, 1 buffer (PipelinePoolBuffers(2, 1, 1, 8):
  //   evaluation's forward-only receive) 2*512*1024 = 1,048,576.
  //   Stage 1 (reported) activations = 9,457,664 + 25,874,064 + 12,757,800 + 100,679,680 +
  //   2,097,152 + 67,108,864 + 1,048,576 = 219,023,800 (217,975,224 without the pool, which
  //   evaluation grew past the estimate).
  //   Stage 0: 18,915,328 + 43,878,688 + 12,757,800 + 2,097,152 + 67,108,864 = 144,757,832
  //   (255,404,104 while every stage built the loss, which made stage 0 the reported one).
  // Stage 1: N = 18,885,632 + 6,291,456 = 25,177,088; weights 2N = 50,354,176; gradients 4N =
  //   100,708,352.
  // optimizer (distributed): 20 * (18,885,632 / (DP 2 * CP 1) + 6,291,456 / EDP 1) + 4 norm
  //   scratches (the trainer's and the dense, TP-sharded and expert instances') 32,816 =
  //   20 * 15,734,272 + 32,816 = 314,718,256 (314,710,052 with 3, which left out the TP-sharded
  //   instance: the TP folds' 8,204 B). (A replicated optimizer, 12N + 8,204 = 302,133,260,
  //   would be less here: the worker shards anyway.)
  // runtime: rank 0's groups tp [0,1], dp_cp [0,2], tp_dp_cp [0..3] (= ep = etp_ep: shared),
  //   pp [0,4], etp_ep_pp = the world; world + those 4 + grad_world + grad_dp_cp = 7
  //   communicators; peers: the all-to-all over EP 4, 3, and the pipeline's 1: 128 + 2192 +
  //   7*46 + 4*391 = 4206 MiB = 4,410,310,656 (before: 5 * 1.5 GiB + 128 MiB = 8,187,281,408).
  // total = 50,354,176 + 100,708,352 + 314,718,256 + 219,023,800 + 4,410,310,656
  //   = 5,095,115,240 (also the peak during Create, which holds no full copy; fits 80 GiB).
  //   Stage 0: 50,352,128 + 100,704,256 + 314,708,016 + 144,757,832 + 4,410,310,656 =
  //   5,020,832,888.
  ExpectMemory(plan->best().memory(), {50354176, 100708352, 314718256, 219023800, 5095115240.0});
  // Groups (order tp-cp-ep-dp-pp, 4 GPUs per node): TP [0,1], DP [0,2], EP [0..3] are in one
  // node (1e11); PP [0,4] spans nodes (1e10).
  // Per stage (its own layers; the LM head on the last): FLOPs/token stage 0 = 3 * 23,085,056
  // (layer 0, case A) = 69,255,168; stage 1 = 3 * (23,085,056 + head 67,108,864) = 270,581,760.
  // Stage 1 is the slowest (the same TP, EP and PP traffic, one MoE layer each). The experts'
  // rows r = 1024/TP 2 * k 2 * EP 4 / E 8 = 512: their FLOPs 3 * 12,582,912 = 37,748,736 count
  // 128 / 512 extra, + 9,437,184 -> 280,018,944.
  // compute = 280,018,944 * GBS 16 * 1024 / (W/PP 4 * 1e14 * 0.5) = 0.02293915189248.
  // TP: m 8 * (4*1 + 4*(1 - 1)) * 1/2 * 2*1024*1024 / 1e11 = 33,554,432 / 1e11 = 0.00033554432.
  // EP: 8 * 1 MoE layer * 4 * (2 * 2 * 1024/2 * 1024 = 2,097,152) * 3/4 / 1e11 = 0.00050331648.
  // PP: 8 * 2 * 2*1024*1024/2 / 1e10 = 16,777,216 / 1e10 = 0.0016777216.
  // DP (P_d of stage 1, the stage the memory estimate reports): 2 * 1/2 * 4 * 18,885,632 / 1e11
  //   = 0.00075542528; EDP 1: none.
  // bubble: (0.02293915189248 + 0.00033554432 + 0.00050331648 + 0.0016777216) * (2-1)/(1*8)
  //       = 0.02545573429248 / 8 = 0.00318196678656.
  // total = 0.02545573429248 + 0.00075542528 + 0.00318196678656 = 0.02939312635904.
  // (Before the experts' row term: compute 0.0221660577792, total 0.0285233954816. Before the
  // per-stage model: compute = all FLOPs / W = 0.01391972057088, total 0.01924622516224, as if
  // stage 0 carried half the LM head.)
  ExpectTime(plan->best().time(), {0.02293915189248, 0.00033554432, 0.00050331648, 0.0016777216,
                                   0.00075542528, 0.00318196678656, 0.02939312635904});
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
  // N = P_d (97,522,688 / (64 * DP 2 * CP 2) = 380,948: no padding).
  // weights 195,045,376; gradients 390,090,752; optimizer 20 * P_d / (DP 2 * CP 2) + 2 norm
  // scratches (no expert region) = 487,613,440 + 16,408 = 487,629,848.
  // Activations: t = 2 * 2048 / 2 = 2048 tokens.
  //   layers, per token: residual 2*1024*3 = 6144; per layer 6*1024 + 8 + q,o 2*2*8*128 + k,v
  //     2*2*2*128 + lse 4*8 = 11,304; dense MLP 3*2*4096 = 24,576; 6144 + 2*(11,304 + 24,576)
  //     = 77,904 * 2048 = 159,547,392.
  //   head: per token 6*1024 + 2*2*10*128 + 4*10 = 11,304 -> 23,150,592 + 4; dense backward
  //     dh, da 3*2*4096*2048 = 50,331,648; LM-head chunk 2048 rows: 2048*32768*6 + 4*2048 +
  //     vocabulary-parallel statistics 3*4*2048 = 402,685,952; RMSNorm ws 1,048,576 +
  //     embedding ws 4*(32769 + 32768 + 4096) = 278,532; stats 4*2 + ids 8*2048 = 16,392; CP
  //     K/V gather buffers (issue 13: GptModel::Build), rows of Hkv 2 * D 128 * 2 B = 512 B:
  //     5 * (t 2048 * CP 2) + 2 * S 2048 = 24,576 rows = 12,582,912 -> 490,094,608.
  //   activations = 159,547,392 + 490,094,608 = 649,642,000.
  // runtime: dp_cp, tp_dp_cp and edp (EDP 4) are the world; cp [0,1]; grad_world, grad_dp_cp,
  //   grad_edp: 5 communicators, no point-to-point peer (dense): 128 + 2192 + 5*46 = 2550 MiB
  //   = 2,673,868,800 (before: 4 * 1.5 GiB + 128 MiB = 6,576,668,672).
  // total = 195,045,376 + 390,090,752 + 487,629,848 + 649,642,000 + 2,673,868,800
  //       = 4,396,276,776.
  ExpectMemory(plan->best().memory(), {195045376, 390090752, 487629848, 649642000, 4396276776.0});
  // FLOPs/token forward: attention 2*1024*(1024 + 512) + 2*1024*1024 = 5,242,880; core
  // 2*2*8*128*1024 = 4,194,304; MLP 2*3*1024*4096 = 25,165,824; two layers 69,206,016; head
  // 67,108,864; sum 136,314,880, times 3 = 408,944,640.
  // compute = 408,944,640 * 8 * 2048 / (4 * 1e14 * 0.5) = 0.0335007449088.
  // CP (in tp_communication; CP group [0,1], one node): m 2 * 2 layers * 3 * (2-1) * 2*2*2048
  //   * 2*128 / 1 / 1e11 = 25,165,824 / 1e11 = 0.00025165824.
  // DP over DP x CP = 4 ranks: 2 * 3/4 * 4 * 97,522,688 / 1e11 = 0.00585136128.
  // total = 0.0335007449088 + 0.00025165824 + 0.00585136128 = 0.0396037644288.
  ExpectTime(plan->best().time(),
             {0.0335007449088, 0.00025165824, 0, 0, 0.00585136128, 0, 0.0396037644288});
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
  // 3*2048*1024 / 2 = 3,145,728; router 4*1024 = 4096; shared 3*1024*1024 / TP 2 = 1,572,864
  // (split like the dense MLP) and gate 1024 (whole); routed 3*4*1024*512 / EP 2 / ETP 2 =
  // 1,572,864.
  // MoE layer dense part 2,097,152 + 2048 + 4096 + 1,572,864 + 1024 = 3,677,184; dense layer
  // 2,097,152 + 2048 + 3,145,728 = 5,244,928. Stage 0: 3,677,184 + 5,244,928 + embedding
  // 32768/TP 2 * 1024 = 16,777,216 -> P_d = 25,699,328; P_x = 1,572,864. Stage 1: output +
  // final norm, P_d = 25,700,352, N = 27,273,216.
  // t = 1024, 512 tokens per TP rank. Stage 0 has 2 micro-batches in flight, stage 1 one but
  // the LM-head loss (only the last stage builds it), and stage 1 is the larger:
  //   layers: residual 2*1024*3 = 6144 + 2 * 14,376 (case A) + dense 3*2*2048 = 12,288
  //     -> 47,184 * 512 = 24,158,208, x2 = 48,316,416.
  //   MoE layer: per token 2*4*4 + 2*4 + 16 + 16 = 72 (2120 with the dx buffer); shared expert
  //     2*(6*1024 + 2*1024) = 16,384 and, split over TP, its gathered x and partial sums
  //     2*2*1024*TP 2 = 8,192; gate 2*4 + 2*(2*1024 + 1) = 4106 -> 28,754 * 512 = 14,722,048. Send
  //     S = 512 * min(2, 2) = 1024 token rows 2,117,632 (case B); rank routing 8*512*2 +
  //     2*4*512*2 + 2*4*512*2 = 24,576; counts 4*(4+2)*(1 + 2 + ETP 2*2) + 4*2 = 176; received
  //     Rc = min(2*512, 1024 + 256) = 1024 rows per ETP peer: 2*1024*1024 + 2*4*1024*2 + local
  //     routing 12*ETP 2*1024*2 + the ETP-gathered and padded copies 2*2*2*1024*1024 +
  //     3*4*2*1024*2 = 10,600,448; expert side R = ETP 2 * min(EP 2 * 512 * min(2, 2) = 2048,
  //     1024 + 256) = 2560 rows 2*2*2560*1024 + 4*2560 = 10,496,000; permute ws
  //     max((512/128 + 1)*EP 2*4, (ETP 2*EP 2*512/128 + 1)*L 2*4) = 136 -> 23,238,968; expert rows
  //     3*2*2560*(512/ETP 2) = 3,932,160; small (8+4+4)*4 + 16*4 + 4*2 + 8 = 144 + aux ws 1024 +
  //     256 + router ws 768 = 2192 -> 41,895,368 per layer and slot; the backward-only scratch
  //     once (da, dh 3*2*2560*256 + the probs gradient 4*2560 = 3,942,400)
  //     -> 45,837,768 (stage 0: x2 in flight, the scratch once: 87,733,136; with the dx buffer
  //     46,886,344 and 89,830,288).
  //   head: 14,376 * 512 + 4 = 7,360,516; dense dh, da 3*2*2048*512 = 6,291,456; CUDA ws
  //     1,187,844 (case B); stats 4*2 + 4*2*2*2 + 4*2*2*4 + 8*2*4 + 8*1024 = 8,360; SP scratch
  //     4,198,400 (case B); lse of the other 512 tokens 2048 -> 19,048,624; the pipeline
  //     receive buffers 2,097,152 (case B); on stage 1 only the vocabulary-parallel LM-head loss
  //     of case B, 100,679,680.
  //     Stage 1: the message-buffer pool's 1 buffer 1,048,576 (case B).
  //   Stage 1 (reported) activations = layers 24,158,208 + MoE 45,837,768 + head 19,048,624 +
  //     100,679,680 + 2,097,152 + 1,048,576 = 192,870,008 (191,821,432 without the pool).
  //   Stage 0: 48,316,416 + 87,733,136 + 19,048,624 + 2,097,152 = 157,195,328 (263,914,560
  //     while every stage built the loss, which made stage 0 the reported one).
  // Stage 1: N = 25,700,352 + 1,572,864 = 27,273,216; weights 2N = 54,546,432; gradients 4N =
  //   109,092,864;
  // optimizer 20 * (25,700,352 / 2 + 1,572,864 / 1) + 4 norm scratches 32,816 = 288,493,616
  //   (case B).
  // runtime: rank 0's groups tp [0,1] (= etp), dp_cp [0,2] (= ep), tp_dp_cp [0..3] (= etp_ep),
  //   pp [0,4], etp_ep_pp = the world; world + 4 + grad_world + grad_dp_cp = 7 communicators;
  //   peers: all-to-all over EP 2, 1, and the pipeline's 1: 128 + 2192 + 7*46 + 2*391 =
  //   3424 MiB = 3,590,324,224 (before: 5 * 1.5 GiB + 128 MiB = 8,187,281,408).
  // total = 54,546,432 + 109,092,864 + 288,493,616 + 192,870,008 + 3,590,324,224
  //       = 4,235,327,144 (stage 0: 4,199,636,080).
  ExpectMemory(plan->best().memory(), {54546432, 109092864, 288493616, 192870008, 4235327144.0});
  // FLOPs/token forward: attention 8,388,608 + core 2,097,152 per layer, x4 = 41,943,040;
  // dense MLP 2*3*1024*2048 = 12,582,912, x2 = 25,165,824; MoE router 8192 + experts
  // 2*2*3*1024*512 = 6,291,456 + shared 2*3*1024*1024 = 6,291,456 + gate 2048 = 12,593,152, x2 =
  // 25,186,304; head 67,108,864. Sum 159,404,032, x3 = 478,212,096.
  // Per stage: a MoE layer 8,388,608 + 2,097,152 + 8192 + 6,291,456 + 6,291,456 + 2048 =
  // 23,078,912 and a dense one 8,388,608 + 2,097,152 + 12,582,912 = 23,068,672, so stage 0
  // (layers 0, 1) 46,147,584 and stage 1 (layers 2, 3 + head) 113,256,448, x3 = 339,769,344.
  // Both stages have the same traffic (L_s = 2, Lm_s = 1): stage 1 is the slowest. The experts'
  // rows r = 1024/TP 2 * k 2 * EP 2 * ETP 2 / E 4 = 1024: their FLOPs 3 * 6,291,456 =
  // 18,874,368 count 128 / 1024 extra, + 2,359,296 -> 342,128,640.
  // compute = 342,128,640 * 4 * 1024 / (W/PP 4 * 1e14 * 0.5) = 0.0070067945472.
  // All groups in one node (1e11). L_s = 2, Lm_s = 1, t = 1024.
  // TP: m 2 * (4*2 + 4*(2-1)) * 1/2 * 2*1024*1024 / 1e11 = 25,165,824 / 1e11 = 0.00025165824.
  // EP: 2 * 1 * 4 * (2*2*(1024/2)*1024 = 2,097,152) * (1/2 + (2-1)) / 1e11 = 0.00025165824.
  // PP: 2 * 2 * (2*1024*1024/2 = 1,048,576) / 1e11 = 4,194,304 / 1e11 = 4.194304e-05.
  // DP (stage 1, reported by the memory estimate): 2 * 1/2 * 4 * 25,700,352 / 1e11 =
  //   0.00102801408; EDP 1: none.
  // bubble: (0.0070067945472 + 0.00025165824 + 0.00025165824 + 4.194304e-05) * 1/(1*2)
  //       = 0.0075520540672 / 2 = 0.0037760270336.
  // total = 0.0075520540672 + 0.00102801408 + 0.0037760270336 = 0.0123560951808.
  // (Before the experts' row term: compute 0.00695847616512, total 0.01228361760768; before the
  // per-stage model: compute 0.00489689186304, total 0.00919120019456.)
  ExpectTime(plan->best().time(), {0.0070067945472, 0.00025165824, 0.00025165824, 4.194304e-05,
                                   0.00102801408, 0.0037760270336, 0.0123560951808});
}

// A dense model for the pipeline-time cases: `layers` layers, H 1024, 8 heads (D 128, Hkv 8),
// F 4096, V 32768, S 1024, tied embeddings; parallel.world_size `world`, TP `tp`, PP `pp`
// (CP 1), mbs 1, global batch 4. FLOPs/token forward per layer: attention 2*1024*(1024 +
// 2*1024) + 2*1024*1024 = 8,388,608, core 2*2*8*128*512 = 2,097,152, MLP 2*3*1024*4096 =
// 25,165,824 -> 35,651,584; LM head 2*1024*32768 = 67,108,864 (on the last stage only).
v1::PlanRequest DensePipelineRequest(int layers, int world, int tp, int pp) {
  v1::PlanRequest req;
  v1::JobSpec* spec = req.mutable_spec();
  v1::ModelConfig* m = spec->mutable_model();
  m->set_num_layers(layers);
  m->set_hidden_size(1024);
  m->set_num_attention_heads(8);
  m->set_ffn_hidden_size(4096);
  m->set_vocab_size(32768);
  m->set_seq_length(1024);
  spec->mutable_training()->set_train_iters(100);
  spec->mutable_training()->set_global_batch_size(4);
  spec->mutable_data()->set_mock_data(true);
  v1::ParallelConfig* p = spec->mutable_parallel();
  p->set_world_size(world);
  p->set_tensor_model_parallel_size(tp);
  p->set_context_parallel_size(1);
  p->set_pipeline_model_parallel_size(pp);
  *req.mutable_cluster() = Cluster8(8);
  return req;
}

// Case E: an uneven PP2 layout, decoder_first_pipeline_num_layers 1 (stage 0 layer 0, stage 1
// layers 1-3 and the LM head), L 4, TP2 PP2 DP1 on 4 of the 8 GPUs (one node, 1e11 B/s), m = 4.
// The pipeline runs at the pace of stage 1, which holds 3 layers and the head.
TEST(PlannerTest, HandComputedUnevenPipelineRunsAtTheSlowestStage) {
  v1::PlanRequest req = DensePipelineRequest(4, 4, 2, 2);
  req.mutable_spec()->mutable_parallel()->set_decoder_first_pipeline_num_layers(1);
  auto plan = PlanJob(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  Print("E best", plan->best());
  EXPECT_EQ(plan->best().mapping().num_micro_batches(), 4);
  // FLOPs/token: stage 0 3 * 35,651,584 = 106,954,752; stage 1 3 * (3 * 35,651,584 +
  // 67,108,864) = 522,190,848.
  // compute (stage 1) = 522,190,848 * GBS 4 * 1024 / (W/PP 2 * 1e14 * 0.5) = 0.02138893713408
  //   (stage 0: 0.00438086664192).
  // TP (stage 1, 3 dense layers): m 4 * (4*3 + 4*3) * 1/2 * 2*1024*1024 / 1e11 = 100,663,296 /
  //   1e11 = 0.00100663296 (stage 0: 0.00033554432).
  // PP: 4 * 2 * 2*1024*1024 / TP 2 / 1e11 = 8,388,608 / 1e11 = 8.388608e-05. EP none, DP 1.
  // work = 0.02138893713408 + 0.00100663296 + 8.388608e-05 = 0.02247945617408;
  // bubble = work * (2-1) / (1*4) = 0.00561986404352; total = 0.0280993202176.
  // (Before: compute = all FLOPs / W = 3 * 209,715,200 * 4096 / (4 * 5e13) = 0.012884901888,
  // total 0.01746927616, 38 % less than the pipeline can run.)
  ExpectTime(plan->best().time(), {0.02138893713408, 0.00100663296, 0, 8.388608e-05, 0,
                                   0.00561986404352, 0.0280993202176});
}

// Case F: interleaved 1F1B, PP2 with virtual_pipeline_model_parallel_size 2, L 4 (stage 0 holds
// chunks [0] and [2], stage 1 [1] and [3] with the LM head), TP1 PP2 DP1 on 2 GPUs, m = 4,
// against the same job on plain 1F1B.
TEST(PlannerTest, HandComputedInterleavedPipelineShortensTheBubble) {
  v1::PlanRequest req = DensePipelineRequest(4, 2, 1, 2);
  auto plain = PlanJob(req);
  ASSERT_TRUE(plain.ok()) << plain.status();
  Print("F plain 1F1B", plain->best());
  req.mutable_spec()->mutable_parallel()->set_virtual_pipeline_model_parallel_size(2);
  auto plan = PlanJob(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  Print("F interleaved", plan->best());
  // FLOPs/token of stage 1: 3 * (2 * 35,651,584 + 67,108,864) = 415,236,096 (stage 0:
  // 213,909,504). compute = 415,236,096 * 4 * 1024 / (W/PP 1 * 5e13) = 0.03401614098432.
  // Plain: PP 4 * 2 * 2*1024*1024 / 1e11 = 0.00016777216; work 0.03418391314432; bubble
  //   work * 1/4 = 0.00854597828608; total 0.0427298914304.
  // VPP 2: every micro-batch crosses the stage boundary twice as often: PP 2 * 0.00016777216 =
  //   0.00033554432; work 0.03435168530432; bubble work * (2-1) / (2*4) = 0.00429396066304;
  //   total 0.03864564596736.
  ExpectTime(plain->best().time(),
             {0.03401614098432, 0, 0, 0.00016777216, 0, 0.00854597828608, 0.0427298914304});
  ExpectTime(plan->best().time(),
             {0.03401614098432, 0, 0, 0.00033554432, 0, 0.00429396066304, 0.03864564596736});
  // Memory (issue 14): both report stage 1 (the LM-head loss, 201,342,976, outweighs stage 0's
  // extra slots), whose two dense layers keep per slot, per token, a residual stream 2*1024 per
  // tensor (layers + chunks: 3 plain, 4 with VPP 2) and 2 * (14,376 (case A) + dense h, a
  // 3*2*4096 = 24,576) = 77,904: plain 84,048 * t 1024 = 86,065,152, VPP 86,096 * 1024 =
  // 88,162,304. Plain 1F1B keeps 1 micro-batch alive on stage 1; the interleaved order 3
  // (PipelineAliveMicroBatches(2, 1, 2, 4)). The message-buffer pool of 2*1024*1024 each
  // (PipelinePoolBuffers): 4 with VPP (the interleaved step's), 1 plain (evaluation's
  // forward-only receive): 3 * 88,162,304 - 86,065,152 + 3 * 2,097,152 = 184,713,216 more.
  // (The estimate before counted 1F1B's min(PP - s, m) = 1 slot of 3 tensors and no message
  // buffers under VPP too: the same memory as plain, 0 more; then no pool for plain 1F1B, whose
  // evaluation took a buffer the estimate missed: 186,810,368.)
  EXPECT_EQ(plan->best().memory().activations() - plain->best().memory().activations(),
            184713216.0);
  EXPECT_EQ(plan->best().memory().total() - plain->best().memory().total(), 184713216.0);
}

// Case G: L 8 on PP2 (TP1 DP1, 2 GPUs, m = 4): the even 4 | 4 split leaves the LM head on top of
// stage 1's four layers; decoder_first_pipeline_num_layers 5 (5 | 3) balances the stages, 6 | 2
// overshoots. The step time ranks them 5 | 3, 4 | 4, 6 | 2. Before the per-stage model all three
// had the same time (all FLOPs / W: compute 0.04329327034368, total 0.0543263031296), so the
// memory estimate decided.
TEST(PlannerTest, BalancedPipelineLayoutRanksAboveUnbalanced) {
  // Slowest stage FLOPs/token (x3 of the forward): 4 | 4: stage 1 4 * 35,651,584 + 67,108,864
  // -> 629,145,600; 5 | 3: stage 0 5 * 35,651,584 -> 534,773,760 (stage 1 522,190,848);
  // 6 | 2: stage 0 -> 641,728,512. compute = F * 4 * 1024 / 5e13; PP 0.00016777216 (case F);
  // bubble = work / 4:
  //   4 | 4: 0.051539607552 + 0.00016777216 = 0.051707379712, total 0.06463422464
  //   5 | 3: 0.0438086664192 + 0.00016777216 = 0.0439764385792, total 0.054970548224
  //   6 | 2: 0.05257039970304 + 0.00016777216 = 0.05273817186304, total 0.0659227148288
  struct Layout {
    int first;  // 0: even
    double compute, bubble, total;
  };
  const Layout layouts[] = {{5, 0.0438086664192, 0.0109941096448, 0.054970548224},
                            {0, 0.051539607552, 0.012926844928, 0.06463422464},
                            {6, 0.05257039970304, 0.01318454296576, 0.0659227148288}};
  double previous = 0;
  for (const Layout& l : layouts) {
    v1::PlanRequest req = DensePipelineRequest(8, 2, 1, 2);
    if (l.first > 0) {
      req.mutable_spec()->mutable_parallel()->set_decoder_first_pipeline_num_layers(l.first);
    }
    auto plan = PlanJob(req);
    ASSERT_TRUE(plan.ok()) << plan.status();
    Print(l.first == 0 ? "G even 4 | 4" : l.first == 5 ? "G 5 | 3" : "G 6 | 2", plan->best());
    ExpectTime(plan->best().time(), {l.compute, 0, 0, 0.00016777216, 0, l.bubble, l.total});
    EXPECT_GT(plan->best().time().total(), previous) << "first stage layers " << l.first;
    previous = plan->best().time().total();
  }
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

// Case A's mapping on 6.0 GiB GPUs (6,442,450,944 bytes). Before issue 15 its peak during
// Trainer::Create held 12 N more than the steady state (the full fp32 master and Adam copies,
// 579,072,000 bytes: 6,907,669,992 = 6.43 GiB), and it was rejected. The worker now initialises
// the optimizer shards directly: the peak is the steady state (6,312,859,112 bytes, 5.88 GiB,
// case A; 6,328,597,992 before the MoE layers shared their backward-only buffers), so the
// mapping fits. On 5.8 GiB GPUs (6,227,702,579 bytes) it does not:
// RESOURCE_EXHAUSTED naming the steady-state peak and no Create peak. (The GPU sizes were 4.6 and
// 3.9 GiB while the runtime term was 1.5 GiB per communicator: case A's total was 3.95 GiB.)
TEST(PlannerTest, TheCreatePeakIsTheSteadyState) {
  v1::PlanRequest req;
  *req.mutable_spec() = SmallMoeSpec();
  FixMapping(req.mutable_spec(), 1, 1, 1, 1, 8);
  *req.mutable_cluster() = Cluster8(8);
  req.mutable_cluster()->set_gpu_memory_bytes(6.0 * kGiB);
  auto plan = PlanJob(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  Print("6.0 GiB best", plan->best());
  EXPECT_TRUE(plan->best().mapping().use_distributed_optimizer());
  ExpectRel(plan->best().memory().total(), 6308664808.0, "distributed total");  // case A

  req.mutable_cluster()->set_gpu_memory_bytes(5.8 * kGiB);
  plan = PlanJob(req);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
  std::cout << "5.8 GiB: " << plan.status() << "\n";
  const std::string message(plan.status().message());
  EXPECT_TRUE(absl::StrContains(message, "the smallest peak is 5.88 GiB")) << message;
  EXPECT_TRUE(absl::StrContains(message, "per-rank estimate 5.88 GiB")) << message;
  EXPECT_FALSE(absl::StrContains(message, "during Trainer::Create")) << message;
}

// The optimizer of every candidate is the worker's: sharded for W > 1 when the request leaves
// parallel.use_distributed_optimizer unset, replicated for W = 1 even when the request asks for
// the distributed optimizer (the same computation on one rank). An explicit false with W > 1 is
// rejected, naming the field: there is no replicated optimizer across ranks.
TEST(PlannerTest, OptimizerIsTheWorkersWhateverTheRequestSays) {
  v1::PlanRequest req;
  *req.mutable_spec() = SmallMoeSpec();
  req.mutable_spec()->mutable_parallel()->clear_use_distributed_optimizer();
  *req.mutable_cluster() = Cluster8(8);
  auto plan = PlanJob(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int candidates = 0;
  auto check = [&](const v1::PlanCandidate& c) {
    ++candidates;
    EXPECT_TRUE(c.mapping().use_distributed_optimizer()) << MappingToString(c.mapping());
  };
  check(plan->best());
  for (const v1::PlanCandidate& c : plan->alternatives()) check(c);
  for (const v1::PlanCandidate& c : plan->rejected()) check(c);
  std::cout << "W 8, use_distributed_optimizer unset in the request: " << candidates
            << " candidates, all dist-opt; best " << MappingToString(plan->best().mapping())
            << "\n";

  req.mutable_spec()->mutable_parallel()->set_use_distributed_optimizer(false);
  plan = PlanJob(req);
  std::cout << "W 8, use_distributed_optimizer false: " << plan.status() << "\n";
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(plan.status().message(),
                                "parallel.use_distributed_optimizer (false) with "
                                "parallel.world_size (8) > 1 is not supported"))
      << plan.status();

  // W = 1: N = P_d 41,964,544 (case A) + P_x 2 layers * 8 experts * 3*1024*1024 = 50,331,648
  // = 92,296,192. weights 2N = 184,592,384; gradients 4N = 369,184,768; optimizer 12N + 8,204 =
  // 1,107,562,508; runtime 134,217,728 (no communicator): total - activations = 1,795,557,388.
  req.mutable_spec()->mutable_parallel()->set_world_size(1);
  req.mutable_spec()->mutable_parallel()->set_use_distributed_optimizer(true);
  plan = PlanJob(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  Print("W 1 best", plan->best());
  EXPECT_EQ(plan->alternatives_size(), 0);
  EXPECT_FALSE(plan->best().mapping().use_distributed_optimizer());
  const v1::MemoryEstimate& mem = plan->best().memory();
  ExpectRel(mem.weights(), 184592384, "weights (W 1)");
  ExpectRel(mem.gradients(), 369184768, "gradients (W 1)");
  ExpectRel(mem.optimizer_states(), 1107562508, "optimizer (W 1, replicated)");
  ExpectRel(mem.total() - mem.activations(), 1795557388, "total - activations (W 1)");

  // EstimateMemory takes the worker's optimizer whatever the mapping it is given says.
  v1::Mapping marked = plan->best().mapping();
  marked.set_use_distributed_optimizer(true);
  auto shape = ModelShape::FromProto(req.spec().model());
  ASSERT_TRUE(shape.ok()) << shape.status();
  ExpectRel(EstimateMemory(*shape, marked).optimizer_states(), 1107562508,
            "EstimateMemory, W 1 mapping marked distributed");
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
