// File: coordinator/planner/cost_model.h
//
// The planner's analytic memory and step-time model of one parallel mapping. Pure arithmetic on
// the model's shape (common/model/model_math.h), the cluster and the mapping; no I/O. Every
// constant and formula the planner ranks by is here.
//
// Notation: L layers (L_moe of them MoE), H hidden, Hq / Hkv heads / query groups, D head dim,
// F dense FFN, E experts, k top-k, Fe expert FFN, Ssh shared-expert FFN, V vocabulary, S sequence
// length; mapping TP CP DP PP (attention grid), ETP EP EDP (expert grid), mbs micro-batch size,
// m micro-batches per step, GBS = mbs·m·DP global batch (sequences), W = TP·CP·DP·PP ranks.
// Sequence parallelism is on whenever TP > 1 (required for MoE, megatron_moe.md §5.2).
//
// MEMORY (bytes per rank; the estimate is that of the pipeline stage with the largest total):
// what the worker's engine allocates, buffer by buffer: EstimateEngineMemory in
// common/model/model_math.h holds the formula (checked against the engine's Buffer counters by
// bench/memory_estimate_test.cc on the CPU and bench/memory_estimate_gpu_test.cc on a GPU).
// In short, with N the stage's flat-layout elements (StageLayoutElements: tensors padded to 64,
// matrices / TP, E/EP experts of width Fe/ETP) and t = mbs·S/CP tokens per micro-batch:
//   weights    = 2·N                         bf16 flat parameter buffer
//   gradients  = 4·N                         fp32 main grads
//   optimizer  = what the worker runs, which depends on W alone (the worker shards whenever
//                W > 1; an explicit parallel.use_distributed_optimizer false is rejected there,
//                common/config/validate_knobs.cc): W = 1, one process,
//                12·N (fp32 master, Adam m, v); W > 1, DistributedAdamW (worker/train/
//                distributed_optimizer.h), 20 bytes per shard element (master, m, v, gradient
//                and parameter shards): 20·(P_d/(DP·CP) + P_x/EDP) with the padded dense and
//                expert regions. With EDP = 1 sharding costs more than replicating would (20 vs
//                12 bytes per expert parameter), but replication is not what runs. PlanJob and
//                MappingOfSpec set Mapping.use_distributed_optimizer = (W > 1), and
//                EstimateMemory estimates with that value whatever the mapping it is given says.
//   activations = ONE micro-batch in flight (the engine runs forward and backward of a
//                micro-batch before the next; under PP > 1 the per-layer terms are multiplied by
//                the micro-batches alive at once on stage s, PipelineAliveMicroBatches of
//                common/model/pipeline_schedule.h, the count the trainer sizes its activation
//                slots by: min(PP − s, m) under 1F1B, more under interleaved 1F1B and on its last
//                stage too, e.g. PP2·VPP2·m 8: 4 and 3; with VPP every chunk keeps its own
//                residual stream, and the trainer's message-buffer pool,
//                PipelinePoolBuffers, is added; to the byte against the CPU engine, bench/
//                memory_estimate_test): per-layer saved activations and scratch (residual, norms,
//                q/k/v/o, lse; dense SwiGLU), the MoE layers' router, dispatcher and expert buffers
//                — the alltoall dispatcher sizes its receive side by the counts, estimated at its
//                initial size ETP·min(B, 1.25·t·k) rows of width H (3 such buffers; B = EP·t·min(k,
//                E/EP), the bound it grows to at most under uneven routing) plus 3·Fe bytes·2 per
//                row for fc1/SwiGLU outputs (their gradients, and the dispatcher's, are one
//                backward scratch per stage, MoEGradScratch) —, the LM head's fp32 logits chunk (≤
//                512 MiB) and bf16 gradient chunk (on the last stage only), backward scratch and
//                statistics.
//   total = weights + gradients + optimizer + activations + runtime, runtime = RuntimeBytes:
//           kCudaRuntimeBytes (cuBLAS, kernel code) and, when W > 1, NCCL's memory by the kind
//           of its communicators (EngineCommunicators, as worker/train/process_groups.cc makes
//           them): kNcclProcessBytes once + kNcclCommunicatorBytes per communicator of > 1 rank
//           + kNcclPeerBytes per point-to-point peer of the communicators that run all-to-all
//           (EP, alltoall dispatcher) or send/recv (PP); fitted to six H200 measurements, the fit
//           next to the constants in common/model/model_math.h.
// Trainer::Create holds nothing beyond the steady state (the distributed optimizer's shards are
// initialised directly); EngineMemory::create_transient is 0.
//
// STEP TIME (seconds; communication is not overlapped with compute, a conservative bound).
// Each pipeline stage s is costed alone (its decoder layers StageLayerIndices: L/PP each, or the
// spec's uneven decoder_first/last_pipeline_num_layers layout; L_s layers of which Lm_s MoE); the
// step runs at the pace of the SLOWEST stage (largest compute + tp + ep + pp), whose terms are
// reported. With PP = 1 the one stage is the whole model, as before.
//   compute_s = (StageTrainingFlopsPerToken(s) + X_s · kExpertGemmHalfRows / r) · GBS · S /
//               ((W/PP) · peak_flops · kComputeEfficiency) + recompute_s: the FLOPs of the
//               stage's layers, plus the LM head on the last stage (the embedding, a lookup,
//               counts 0), over the W/PP ranks of a stage (balanced routing within a stage).
//               The routed experts' training FLOPs X_s = 3 · Lm_s · 2·k·3·H·Fe run at
//               r / (r + kExpertGemmHalfRows) of the others' rate, r = (t/TP)·k·EP·ETP / E the
//               rows each local expert's GEMMs get per micro-batch (balanced routing; ETP peers
//               run the same gathered rows): the term that makes larger micro-batches faster
//               (kExpertGemmHalfRows below).
//               recompute_s (selective recompute, ModelShape::recompute_*; per rank, m
//               micro-batches): the elementwise re-runs are memory-bound, charged their HBM bytes
//               at peak_flops / kFlopsPerHbmByte bytes/s: "moe_act" SwiGLU reads h and writes a,
//               3·2·(t/TP)·(k·Fe + Ssh) per MoE layer; "layernorm" two RMSNorms over the shard,
//               2·2·2·(t/TP)·H per layer; "mlp" the dense layers' SwiGLU 3·2·t·F/TP per dense
//               layer plus fc1 again, 4·t·H·F/TP FLOPs at peak_flops · kComputeEfficiency. (The
//               SP all-gather of the recomputed norm at TP > 1 is not counted.)
//   bandwidth of a group = intra_node when every group of that kind lies inside one node
//               (rank / gpus_per_node equal; groups from common/model/parallel_state.h), else
//               inter_node. A collective over n ranks moves (n−1)/n of its buffer per rank for
//               all-gather or reduce-scatter (ring), 2(n−1)/n for all-reduce.
//   tp_communication_s (per step, m micro-batches):
//               TP: each attention block and each dense MLP does all-gather + reduce-scatter
//               forward and backward (4 collectives) on [t, H] bf16:
//                 m · (4·L_s + 4·(L_s − Lm_s)) · (TP−1)/TP · 2·t·H / bw(TP)
//               CP (counted here too: the attention grid's model-parallel traffic): ring
//               attention passes K and V (2·t·Hkv·D/TP bf16) CP−1 times forward and twice as
//               much backward (K, V and their gradients):
//                 m · L_s · 3·(CP−1) · 2·2·t·Hkv·D/TP / bw(CP)
//   ep_communication_s: per MoE layer, dispatch and combine, forward and backward (4
//               all-to-alls) of k·t/TP routed bf16 tokens of width H, (EP−1)/EP leaving the
//               rank; with ETP > 1 also an all-gather / reduce-scatter of those tokens over ETP:
//                 m · Lm_s · 4 · 2·k·(t/TP)·H · [(EP−1)/EP / bw(EP) + (ETP−1) / bw(ETP)]
//   pp_communication: each micro-batch sends its activations forward and their gradient back,
//               once per model chunk (v = virtual_pipeline_model_parallel_size, ModelShape::
//               pipeline_virtual_stages; 1 without interleaving):
//                 v · m · 2 · 2·t·H/TP / bw(PP)        (0 when PP = 1)
//   dp_communication: gradient reduce-scatter + all-gather (or all-reduce; the same ring
//               volume) of fp32 gradients once per step:
//                 2(n_d−1)/n_d · 4·P_d / bw(DP×CP) + 2(EDP−1)/EDP · 4·P_x / bw(EDP),
//               n_d = DP·CP, P_d and P_x of the stage reported in the memory estimate.
//   pipeline_bubble: T_work = compute + tp + ep + pp communication of the slowest stage runs in
//               m micro-batch slots; (interleaved) 1F1B adds the fill and drain, PP − 1 slots
//               of one chunk's time T_work/(v·m) (Narayanan et al. 2021; megatron_parallel.md
//               §3.3-3.4): bubble = T_work·(PP−1)/(v·m). Lighter stages fill and drain faster
//               than the slowest one; the bound charges them at its pace.
//   total = compute + tp + ep + pp + dp communication + pipeline_bubble.
#ifndef SWITCHYARD_COORDINATOR_PLANNER_COST_MODEL_H_
#define SWITCHYARD_COORDINATOR_PLANNER_COST_MODEL_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/model/model_math.h"
#include "common/model/parallel_state.h"
#include "switchyard/v1/plan.pb.h"

namespace switchyard::planner {

// Fraction of peak_flops the GEMMs reach (Megatron-Core reports ~40-47% MFU at scale).
inline constexpr double kComputeEfficiency = 0.5;
// The routed experts' grouped GEMMs slow down when each expert gets few rows (a 256-row tile
// half empty, the per-group setup). Modelled by one number, a half-performance length: with r
// rows per expert they run at r / (r + kExpertGemmHalfRows) of the rate of the other GEMMs.
// Fitted to the CUTLASS Hopper grouped GEMM measured on an H200 (BASELINES.md, "What the expert
// GEMMs alone can reach"; against 806 TFLOP/s at 2048 rows per group): 128 rows per group ran
// at 0.43-0.46 of that (model 0.50), 512 rows at 0.73-0.88 (model 0.80). Not fitted to whole
// training steps: at global batch 16 the benchmark model's step took 426.8 ms at micro-batch 8
// against 481.0 ms at 2 on an H200 (bench/README.md), 11 % less, where this term alone predicts
// 4 % (expert rows 1024 -> 4096): it understates the gain of larger micro-batches (their
// per-micro-batch overheads are not modelled), so it orders micro-batches without overrating them.
inline constexpr double kExpertGemmHalfRows = 128;
// Selective recompute's re-runs of elementwise ops (SwiGLU, RMSNorm) move bytes, not FLOPs:
// charged at peak_flops / kFlopsPerHbmByte bytes/s, the HBM bandwidth of an H100 SXM (989.4
// TFLOP/s bf16 dense over 3.35 TB/s = 295). An H200 (4.8 TB/s) is overcharged ~1.4x.
inline constexpr double kFlopsPerHbmByte = 295;

// Parameters held by one rank of pipeline stage `stage`: StageLayoutElements without the
// regions' shard padding (each tensor padded to 64 elements, as the worker's flat layout).
struct StageParams {
  double dense = 0;   // P_d: replicated over DP×CP
  double expert = 0;  // P_x: replicated over EDP
};
// Preconditions: the mapping's sizes are positive, L % PP == 0, 0 <= stage < PP.
StageParams ParamsOfStage(const ModelShape& model, const v1::Mapping& mapping, int64_t stage);

// Per-rank memory of the largest stage (EstimateEngineMemory of each stage; activations =
// EngineMemory::activations(), total = EngineMemory::total()), of the optimizer the worker runs:
// the mapping's use_distributed_optimizer is taken as W > 1 whatever it says. Preconditions as
// ParamsOfStage; mbs, m > 0. `stage_out` and `detail` (optional) receive the stage reported and its
// breakdown. `options`: the planner plans the CUDA bf16 engine (the default); tests pass the CPU
// engine's.
v1::MemoryEstimate EstimateMemory(const ModelShape& model, const v1::Mapping& mapping,
                                  int64_t* stage_out = nullptr,
                                  const EngineMemoryOptions& options = {},
                                  EngineMemory* detail = nullptr);

// The mapping that a job spec with fixed parallel sizes runs (parallel.world_size, TP, CP, PP,
// EP, ETP; unset sizes count as 1): DP = W / (TP·CP·PP), EDP = W / (ETP·EP·PP), mbs and
// m = GBS / (mbs·DP) from training, use_distributed_optimizer exactly when W > 1 (the worker
// always shards then and never with one process; an explicit parallel.use_distributed_optimizer
// false with W > 1 is rejected by validation, not estimated here).
// For comparing EstimateMemory with a run of that spec. INVALID_ARGUMENT naming the field when a
// size does not divide.
absl::StatusOr<v1::Mapping> MappingOfSpec(const v1::JobSpec& spec);

// The mapping of one folding: attention TP x CP x DP x PP, experts ETP x EP x EDP, and the
// optimizer the worker runs for it (distributed exactly when the world has more than one rank).
v1::Mapping MakeMapping(int64_t tp, int64_t cp, int64_t dp, int64_t pp, int64_t etp, int64_t ep,
                        int64_t edp);

// Step time. `layout` is the mapping's ParallelLayout (for the node placement of groups);
// cluster fields are positive (checked by PlanJob).
v1::TimeEstimate EstimateTime(const ModelShape& model, const v1::Cluster& cluster,
                              const v1::Mapping& mapping, const ParallelLayout& layout);

// Bandwidth of `group`: intra-node when every group of that kind has all its ranks in one node.
double GroupBandwidth(const v1::Cluster& cluster, const ParallelLayout& layout,
                      ParallelGroup group);

}  // namespace switchyard::planner

#endif  // SWITCHYARD_COORDINATOR_PLANNER_COST_MODEL_H_
