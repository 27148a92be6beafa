// File: coordinator/planner/cost_model.h
//
// The planner's analytic memory and step-time model of one parallel mapping. Pure arithmetic on
// the model's shape (common/model_math.h), the cluster and the mapping; no I/O. Every constant
// and formula the planner ranks by is here.
//
// Notation: L layers (L_moe of them MoE), H hidden, Hq / Hkv heads / query groups, D head dim,
// F dense FFN, E experts, k top-k, Fe expert FFN, Ssh shared-expert FFN, V vocabulary, S sequence
// length; mapping TP CP DP PP (attention grid), ETP EP EDP (expert grid), mbs micro-batch size,
// m micro-batches per step, GBS = mbs·m·DP global batch (sequences), W = TP·CP·DP·PP ranks.
// Sequence parallelism is on whenever TP > 1 (required for MoE, megatron_moe.md §5.2).
//
// MEMORY (bytes per rank; the estimate is that of the pipeline stage with the largest total).
// Stage s holds layers [s·L/PP, (s+1)·L/PP). Its parameters split into
//   dense  P_d = Σ_layers [ (q,k,v,o)/TP + norms + (dense MLP 3FH/TP | router EH + shared 3H·Ssh/TP
//               + gate H) ] + V·H/TP on the first stage + (V·H/TP + H) on the last stage
//               (PP = 1: one V·H/TP, two when untied; PP > 1: the last stage holds the output
//               layer, or the tied copy, as Megatron does). Router and norms are replicated.
//   expert P_x = Σ_MoE layers (E/EP)·3·H·Fe/ETP
//   weights    = kWeightBytesPerParam · (P_d + P_x)            bf16
//   gradients  = kGradBytesPerParam · (P_d + P_x)              fp32 main grads
//   optimizer  = kOptimizerBytesPerParam · (P_d + P_x)         fp32 master + Adam m, v
//                or, with the distributed optimizer, kOptimizerBytesPerParam · (P_d/(DP·CP) +
//                P_x/EDP): dense states shard over the DP×CP gradient group, expert states over
//                EDP (megatron_moe.md §5.1; worker/train/distributed_optimizer.h).
//   activations = t · a_stage · min(PP − s, m), t = mbs·S/CP tokens per micro-batch on the rank,
//                min(PP − s, m) micro-batches in flight on stage s under 1F1B. a_stage, bytes per
//                token, sums over the stage's layers (bf16 = 2 bytes, fp32 = 4; all divided by
//                TP because sequence parallelism shards the token dimension of what TP does not
//                shard by heads or features):
//     attention  [2·2H + 2·(2Hq + 2Hkv)·D + 4·Hq] / TP : layer input and norm output; q, k, v
//                and the attention output; the fp32 log-sum-exp per head. Flash attention keeps
//                no S×S score matrix (it is recomputed in the backward pass).
//     dense MLP  [2·2H + 2·3F] / TP : residual and norm output; fc1 (2F) and SwiGLU (F) outputs.
//     MoE        [2·2H + 4·2E + 2·k·(2·ETP·H + 3·Fe) + 2·3·Ssh] / TP : residual and norm output;
//                fp32 router logits and probabilities; per routed copy (balanced routing: k·ETP
//                copies per local token on each rank of an ETP group) the permuted input and the
//                expert output (2H) and the fc1/SwiGLU outputs (3·Fe/ETP); the shared expert's
//                fc1/SwiGLU outputs.
//     last stage [2·2H + 4·V] / TP : final norm input/output and the fp32 logits of the loss.
//   total = weights + gradients + optimizer + activations + kWorkspaceBytes.
//
// STEP TIME (seconds; communication is not overlapped with compute, a conservative bound).
//   compute   = TrainingFlopsPerToken · GBS · S / (W · peak_flops · kComputeEfficiency)
//               (the work splits evenly over all W ranks under balanced routing)
//   bandwidth of a group = intra_node when every group of that kind lies inside one node
//               (rank / gpus_per_node equal; groups from common/parallel_state.h), else
//               inter_node. A collective over n ranks moves (n−1)/n of its buffer per rank for
//               all-gather or reduce-scatter (ring), 2(n−1)/n for all-reduce.
//   tp_communication (per step, m micro-batches, L_s = L/PP layers of which Lm_s = L_moe/PP MoE):
//               TP: each attention block and each dense MLP does all-gather + reduce-scatter
//               forward and backward (4 collectives) on [t, H] bf16:
//                 m · (4·L_s + 4·(L_s − Lm_s)) · (TP−1)/TP · 2·t·H / bw(TP)
//               CP (counted here too: the attention grid's model-parallel traffic): ring
//               attention passes K and V (2·t·Hkv·D/TP bf16) CP−1 times forward and twice as
//               much backward (K, V and their gradients):
//                 m · L_s · 3·(CP−1) · 2·2·t·Hkv·D/TP / bw(CP)
//   ep_communication: per MoE layer, dispatch and combine, forward and backward (4 all-to-alls)
//               of k·t/TP routed bf16 tokens of width H, (EP−1)/EP leaving the rank; with
//               ETP > 1 also an all-gather / reduce-scatter of those tokens over ETP:
//                 m · Lm_s · 4 · 2·k·(t/TP)·H · [(EP−1)/EP / bw(EP) + (ETP−1) / bw(ETP)]
//   pp_communication: each micro-batch sends its activations forward and their gradient back:
//                 m · 2 · 2·t·H/TP / bw(PP)        (0 when PP = 1)
//   dp_communication: gradient reduce-scatter + all-gather (or all-reduce; the same ring
//               volume) of fp32 gradients once per step:
//                 2(n_d−1)/n_d · 4·P_d / bw(DP×CP) + 2(EDP−1)/EDP · 4·P_x / bw(EDP),
//               n_d = DP·CP, P_d and P_x of the stage reported in the memory estimate.
//   pipeline_bubble: T_work = compute + tp + ep + pp communication runs in m micro-batch slots;
//               1F1B takes m + PP − 1 slots, so the bubble is T_work·(PP−1)/m, i.e. a fraction
//               (PP−1)/(m+PP−1) of the pipelined time.
//   total = compute + tp + ep + pp + dp communication + pipeline_bubble.
#ifndef SWITCHYARD_COORDINATOR_PLANNER_COST_MODEL_H_
#define SWITCHYARD_COORDINATOR_PLANNER_COST_MODEL_H_

#include <cstdint>

#include "common/model_math.h"
#include "common/parallel_state.h"
#include "switchyard/v1/plan.pb.h"

namespace switchyard::planner {

inline constexpr double kWeightBytesPerParam = 2.0;      // bf16 weights
inline constexpr double kGradBytesPerParam = 4.0;        // fp32 gradients
inline constexpr double kOptimizerBytesPerParam = 12.0;  // fp32 master, Adam m and v
// CUDA context, cuBLAS/NCCL workspaces and allocator fragmentation, per rank.
inline constexpr double kWorkspaceBytes = 2.0 * 1024 * 1024 * 1024;
// Fraction of peak_flops the GEMMs reach (Megatron-Core reports ~40-47% MFU at scale).
inline constexpr double kComputeEfficiency = 0.5;

// Parameters held by one rank of pipeline stage `stage` (see the file comment).
struct StageParams {
  double dense = 0;   // P_d: replicated over DP×CP
  double expert = 0;  // P_x: replicated over EDP
};
// Preconditions: the mapping's sizes are positive, L % PP == 0, 0 <= stage < PP.
StageParams ParamsOfStage(const ModelShape& model, const v1::Mapping& mapping, int64_t stage);

// Per-rank memory of the largest stage. Preconditions as ParamsOfStage; mbs, m > 0.
// `stage_out` (optional) receives the stage reported.
v1::MemoryEstimate EstimateMemory(const ModelShape& model, const v1::Mapping& mapping,
                                  int64_t* stage_out = nullptr);

// Step time. `layout` is the mapping's ParallelLayout (for the node placement of groups);
// cluster fields are positive (checked by PlanJob).
v1::TimeEstimate EstimateTime(const ModelShape& model, const v1::Cluster& cluster,
                              const v1::Mapping& mapping, const ParallelLayout& layout);

// Bandwidth of `group`: intra-node when every group of that kind has all its ranks in one node.
double GroupBandwidth(const v1::Cluster& cluster, const ParallelLayout& layout,
                      ParallelGroup group);

}  // namespace switchyard::planner

#endif  // SWITCHYARD_COORDINATOR_PLANNER_COST_MODEL_H_
