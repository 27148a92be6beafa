// File: common/model/model_math.h
//
// Parameter counts and training FLOPs of the decoder-only MoE transformer that the worker builds
// (worker/model/gpt_model.h), computed from a job spec's ModelConfig alone, so the coordinator's
// planner and the worker agree on the model's size without the coordinator depending on worker/.
//
// The counts follow MakeGptParamLayout tensor by tensor (without its 64-element alignment
// padding). The worker computes FLOPs and parameter counts through these functions (GptConfig::
// Shape), so planner, worker and benchmarks share one formula. Per layer:
//   attention matrices   q [Hq·D, H], k and v [Hkv·D, H], o [H, Hq·D]
//   attention norms      input_norm [H], post_attention_norm [H] (+ q_norm, k_norm [D] each)
//   dense MLP            fc1 [2F, H], fc2 [H, F]                      = 3·F·H
//   MoE                  router [E, H]; routed experts fc1 [E, H, 2Fe], fc2 [E, Fe, H]
//                        (= 3·E·H·Fe); shared expert [H, 2S] + [S, H] (= 3·H·S) + gate [H, 1]
// plus the embedding [V, H], the final norm [H] and, when untied, the output layer [V, H].
//
// EstimateEngineMemory is the per-rank device memory of the worker's engine (worker/train/
// trainer.h over worker/model/gpt_model.h), buffer by buffer; see its comment.
#ifndef SWITCHYARD_COMMON_MODEL_MODEL_MATH_H_
#define SWITCHYARD_COMMON_MODEL_MODEL_MATH_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "switchyard/v1/config.pb.h"
#include "switchyard/v1/plan.pb.h"

namespace switchyard {

// The sizes that determine parameters, FLOPs and activations.
struct ModelShape {
  int64_t num_layers = 0;       // L
  int64_t hidden_size = 0;      // H
  int64_t num_heads = 0;        // Hq
  int64_t num_kv_heads = 0;     // Hkv (num_query_groups)
  int64_t head_dim = 0;         // D (kv_channels)
  int64_t ffn_hidden_size = 0;  // F, dense layers
  int64_t vocab_size = 0;       // V
  int64_t seq_length = 0;       // S
  bool qk_layernorm = false;
  bool untie_embeddings = false;
  std::vector<bool> moe_layers;  // one per layer: true = MoE layer, false = dense SwiGLU MLP
  // MoE (meaningful when some layer is MoE).
  int64_t num_experts = 0;          // E
  int64_t moe_topk = 0;             // k
  int64_t moe_ffn_hidden_size = 0;  // Fe
  int64_t shared_ffn_size = 0;      // S_sh (moe_shared_expert_intermediate_size; 0 = none)
  bool shared_expert_gate = false;
  // Router options that size the MoE layer's buffers.
  int64_t moe_aux_terms = 0;       // load-balancing terms (aux_loss, seq_aux_loss, global_aux_loss)
  bool moe_seq_aux = false;        // a seq_aux_loss term: per-sequence statistics
  bool moe_input_jitter = false;   // moe_input_jitter_eps > 0: a jittered copy of the input
  double moe_capacity_factor = 0;  // moe_expert_capacity_factor (<= 0: none)
  bool moe_pad_to_capacity = false;  // moe_pad_expert_input_to_capacity
  // moe_permute_fusion: where it applies (EP = ETP = 1, no padding, H and the expert ffn size
  // multiples of 128: MoELayerConfig::permute_fusion, estimated as on an SM90 GPU), the local
  // dispatcher keeps no permuted input and the backward no permuted output gradient.
  bool moe_permute_fusion = false;
  // moe_token_dispatcher_type allgather (the default) rather than alltoall: the dispatcher's
  // buffers at EP > 1 (EstimateEngineMemory).
  bool moe_allgather = false;
  // Selective activation recompute (model.recompute_modules under recompute_granularity
  // "selective", config.proto): the saved activations the engine drops and recomputes in the
  // backward ("core_attn" changes nothing: the attention keeps only O and the log-sum-exp).
  bool recompute_moe_act = false;    // "moe_act": expert and shared-expert SwiGLU outputs
  bool recompute_layernorm = false;  // "layernorm": the two RMSNorm outputs of every layer
  bool recompute_mlp = false;        // "mlp": the dense MLP's fc1 and SwiGLU outputs
  // Uneven pipeline layouts (parallel.decoder_first/last_pipeline_num_layers; < 0: unset): the
  // decoder layers of the first / last stage (common/model/pipeline_layout.h). Not part of
  // ModelConfig: the planner sets them from the spec's parallel config after FromProto.
  int64_t pipeline_first_layers = -1;
  int64_t pipeline_last_layers = -1;
  // Interleaved 1F1B (parallel.virtual_pipeline_model_parallel_size; 1: plain 1F1B): the model
  // chunks per stage (StageLayerIndices deals the layers chunk-major, as the trainer does). Set by
  // the planner from the spec like the two counts above; meaningful only when PP > 1.
  int64_t pipeline_virtual_stages = 1;

  // From a ModelConfig, defaults applied as in common/config/config_defaults.cc and
  // worker/model/gpt_model.cc (num_layers 2, num_query_groups = heads, kv_channels = H / heads,
  // ffn 4·H, seq 1024, moe_ffn = ffn, top-k 2, moe_layer_freq 1). INVALID_ARGUMENT naming the
  // field when hidden_size, num_attention_heads or vocab_size is missing or not positive, a
  // size is negative, or moe_layer_pattern has the wrong length; naming model.recompute_* for a
  // granularity other than unset / "selective", modules without "selective", and a module the
  // engine does not run (common/config/validate_knobs.cc has the full rules and messages).
  static absl::StatusOr<ModelShape> FromProto(const v1::ModelConfig& model);

  bool is_moe(int64_t layer) const { return moe_layers[static_cast<size_t>(layer)]; }
  int64_t num_moe_layers() const;
};

// Per-layer parameter counts, unsharded.
int64_t AttentionMatrixParams(const ModelShape& m);  // q, k, v, o
int64_t LayerNormParams(const ModelShape& m);        // input/post-attention norms (+ q/k norms)
int64_t DenseMlpParams(const ModelShape& m);         // 3·F·H
int64_t RouterParams(const ModelShape& m);           // E·H
int64_t RoutedExpertParams(const ModelShape& m);     // 3·E·H·Fe (all experts of one layer)
int64_t SharedExpertParams(const ModelShape& m);     // 3·H·S_sh (+ H for the gate)
int64_t EmbeddingParams(const ModelShape& m);        // V·H (one of embedding / output layer)

// Every parameter of the model (what the worker's GptParamLayout holds, without alignment
// padding; the worker's GptTotalParams is this function).
int64_t TotalParams(const ModelShape& m);
// Parameters active per token: TotalParams with the top-k routed experts of each MoE layer in
// place of all E (the worker's GptActiveParams is this function).
int64_t ActiveParams(const ModelShape& m);

// Training FLOPs per token (forward + backward = 3 × forward), the one formula (the worker's
// GptTrainingFlopsPerToken calls it):
// 2 FLOPs per multiply-add of every GEMM with active parameters (q, k, v, o; router; top-k
// routed experts; shared expert and its gate; dense MLP; LM head) plus the causal attention
// products q·kᵀ and p·v (2·2·Hq·D·S/2 per token). Embedding lookups, norms and elementwise ops
// are not counted.
double TrainingFlopsPerToken(const ModelShape& m);
// The same formula restricted to pipeline stage `stage` of `pp`: the decoder layers of
// StageLayerIndices, plus the LM head on the last stage (the embedding, a lookup, counts 0 on the
// first). Over the stages of any layout it sums to TrainingFlopsPerToken; with pp = 1 it is it.
double StageTrainingFlopsPerToken(const ModelShape& m, int64_t pp, int64_t stage);

// ---------------------------------------------------------------------------------------------
// Memory of the engine.
//
// Elements of one rank's flat parameter buffer for pipeline stage `stage` (GptParamLayout of
// worker/model/gpt_model.h): every tensor padded to 64 elements; attention and dense-MLP
// matrices split by TP, experts E/EP per rank with Fe/ETP columns, the shared expert's fc1 / fc2
// split by TP like the dense MLP, embedding and output layer V/TP vocabulary rows per TP rank
// (vocabulary-parallel, as MakeGptParamLayout); norms, router and the shared-expert gate WHOLE on
// every TP rank. Stage s holds the layers common/model/pipeline_layout.h StageLayers gives it
// ([s·L/PP, (s+1)·L/PP) without an uneven layout; StageLayerIndices below); PP = 1: embedding +
// final norm (+ output when untied); PP > 1: embedding on the first stage, final norm + output (or
// the tied copy) on the last. `*_padded`: the regions as the layout pads them for the distributed
// optimizer (dense to 64·DP·CP, with TP its TP-sharded and its replicated part each; expert to
// 64·EDP elements). Preconditions: mapping sizes positive
// and dividing the model (as validate.h checks), 0 <= stage < PP.
struct StageParamElements {
  int64_t dense = 0, expert = 0;
  int64_t dense_tp_sharded = 0;  // of `dense`, the TP-sharded tensors' (0 without TP)
  int64_t dense_padded = 0, expert_padded = 0;
  int64_t total() const { return dense_padded + expert_padded; }
};
StageParamElements StageLayoutElements(const ModelShape& m, const v1::Mapping& mapping,
                                       int64_t stage);

// The decoder layers [begin, end) of pipeline stage `stage` of `pp` (StageLayers with the shape's
// uneven first/last counts). A split the layout rules refuse (which validation reports first)
// falls back to the even one, floor(L / PP) per stage.
std::pair<int64_t, int64_t> StageLayerRange(const ModelShape& m, int64_t pp, int64_t stage);
// The global indices, ascending, of every decoder layer stage `stage` of `pp` holds over all its
// model chunks (m.pipeline_virtual_stages of them, StageLayers chunk by chunk: with VPP 2, L 8,
// PP 2 stage 0 holds 0, 1, 4, 5). What the estimates size a stage by (memory and step time): the
// same layer count as StageLayerRange, but the layers themselves (MoE or dense) differ under
// interleaving. A split the rules refuse falls back as StageLayerRange does, without chunks.
std::vector<int64_t> StageLayerIndices(const ModelShape& m, int64_t pp, int64_t stage);

// The engine's precision and the memory it uses outside its own buffers.
struct EngineMemoryOptions {
  bool cuda = true;         // CUDA engine, or the CPU reference engine
  int64_t param_bytes = 2;  // parameters and activations: 2 (bf16, CUDA), 4 (f32), 8 (f64, CPU)
  // Device memory outside Buffers (cuBLAS workspaces and kernel code, NCCL communicators).
  // < 0: the default: CUDA RuntimeBytes (below); CPU 0.
  double runtime_bytes = -1;
};

// CUDA, measured on one H200 with the benchmark model (bench/train_benchmark.cc): one GPU used
// 41.4 GiB where the buffers below sum to 41.29 GiB, so cuBLAS handles, lazily loaded kernel code
// and the CUDA allocator's rounding take ~0.1 GiB.
inline constexpr double kCudaRuntimeBytes = 128.0 * 1024 * 1024;
// The NCCL communicators one rank holds, as worker/train/process_groups.cc
// CreateNcclProcessGroups makes them for `mapping` (rank 0's; every rank's are alike): the world;
// one communicator per distinct member list among the roles tp, dp_cp, cp, tp_dp_cp, ep, etp,
// etp_ep, edp, etp_ep_pp and pp (FillRoles: a role whose members equal the world's or an
// earlier role's shares that communicator); a second world, grad_world, the parent of the
// gradient groups (it runs no collective itself); grad_dp_cp and grad_edp, split from it, never
// shared. Only those of more than one rank are counted: a one-rank communicator connects to no
// peer (and there is none at all when W = 1: one process, no process groups).
struct EngineCommunicatorSet {
  // Communicators of > 1 rank, grad_world included (the Gloo groups have no grad_world: they
  // hold communicators - 1 of them).
  int64_t communicators = 0;
  // Point-to-point connections, summed over the communicators that run all-to-all or send/recv:
  // the ep communicator, min(EP − 1, kNcclMaxCountedPeers) peers, when MoE layers use the
  // alltoall dispatcher (the allgather dispatcher gathers over etp_ep instead); the pp
  // communicator, min(PP − 1, 2) peers (a stage sends to the next and receives from the
  // previous, the interleaved schedule wraps around).
  int64_t p2p_peers = 0;
};
EngineCommunicatorSet EngineCommunicators(const ModelShape& m, const v1::Mapping& mapping);

// NCCL's device memory (its kernels, channels and protocol buffers), as measured on H200s with
// NCCL 2.28 over NVLink (NCCL_NVLS_ENABLE=0): runtime = cudaMemGetInfo delta − the Buffer
// counter, so kCudaRuntimeBytes included. These are all the measurements there are (benchmark
// model "bench" and "small" model of bench/bench_model.h; communicators as EngineCommunicators
// counts them: n of > 1 rank, p point-to-point peers):
//   layout                                   n  p   measured  estimate  est/measured  (old term)
//   bench TP2·SP ETP2, W 2 (world ring only) 2  0   2.31 GiB  2.36      1.020         4.63
//   small TP2 (ETP1, EDP2), W 2              3  0   2.40      2.40      1.000         6.13
//   small CP2 (EDP2), W 2                    4  0   2.40      2.45      1.019         6.13
//   bench DP2·EP2 = W 2 (world: all-to-all)  3  1   2.80      2.78      0.994         3.13
//     the same, latest run                   3  1   2.91      2.78      0.956         3.13
//   bench DP4·EP4 = W 4                      3  3   3.50      3.55      1.013         3.13
// A constant per communicator does not fit them (least squares of base + per-peer alone leaves
// 0.68 to 1.25: CP2 holds twice the communicators of bench TP2 and measured the same), so most
// of the cost is per process, paid once NCCL runs (W > 1), with a small base per communicator
// (these layouts cannot separate the two well: every one holds 5 communicators counting the
// one-rank ones) and a term per point-to-point peer (all-to-all connects every peer; ring
// collectives only the neighbours). Least-squares fit of the six points: process 2.14 GiB,
// communicator 0.045 GiB, peer 0.38 GiB. Not measured: PP (its peers), EP < W, more than 4
// ranks; the per-peer term extrapolates to EP 8 as 7 × 0.38 GiB.
inline constexpr double kNcclProcessBytes = 2192.0 * 1024 * 1024;
inline constexpr double kNcclCommunicatorBytes = 46.0 * 1024 * 1024;
inline constexpr double kNcclPeerBytes = 391.0 * 1024 * 1024;
// Point-to-point peers counted per communicator at most: the 7 other GPUs of an 8-GPU node. The
// 391 MiB per peer were measured over NVLink (NCCL's P2P transport, which connects only the GPUs of
// one node); peers on other nodes go through the network transport, whose device buffers per peer
// are not measured. Extrapolating the NVLink rate to them (EP 256: 97 GiB) would rule out the large
// expert-parallel meshes Megatron trains on 80 GB GPUs, so they are not counted: for EP > 8 the
// term is a lower bound until a multi-node run measures it.
inline constexpr int64_t kNcclMaxCountedPeers = 7;
// The CUDA engine's device memory outside its Buffers for `mapping`: kCudaRuntimeBytes, plus,
// when W > 1, kNcclProcessBytes + kNcclCommunicatorBytes · communicators + kNcclPeerBytes ·
// p2p_peers (EngineCommunicators).
double RuntimeBytes(const ModelShape& m, const v1::Mapping& mapping);

// Per-rank memory of the engine for pipeline stage `stage`, in bytes, buffer by buffer as
// Trainer::Create allocates them (every buffer at Create; nothing inside a step). Notation as
// cost_model.h: t = mbs·S/CP tokens per micro-batch, m = num_micro_batches, N = the stage's
// StageLayoutElements().total(); a = param_bytes, g = gradient/master bytes (4; 8 for f64),
// r = the router's fp32 (8 for f64), s = statistics dtype (CUDA 4, CPU 8).
//   weights     a·N (the flat parameter buffer), gradients g·N (fp32 main grads)
//   optimizer   one process: master, exp_avg, exp_avg_sq g·3N (also what a replicated optimizer
//               holds: use_distributed_optimizer false; the worker itself shards whenever W > 1,
//               so for W > 1 only the distributed estimate describes it); distributed: two
//               DistributedAdamW, each 5 fp32 shards (master, exp_avg, exp_avg_sq, grad shard,
//               param shard) of its padded region / its group: 20·(dense_padded/(DP·CP) +
//               expert_padded/EDP). Plus the norm scratch (8 KiB each).
//   layer activations (ONE micro-batch in flight: ForwardBackward runs forward and backward
//               before the next micro-batch, so nothing scales with m; pipelines: see "PP > 1"
//               below), per token of t: residual stream a·H·(L_s + VPP) (each model chunk's
//               x_0 .. x_n; VPP = 1 without interleaving); per layer n1, mid, n2 3a·H, q and o
//               2a·Hq·D, k, v 2a·Hkv·D, rstd1/rstd2 2s, lse s·Hq, with qk_layernorm a·(Hq+Hkv)·D +
//               s·(Hq+Hkv); dense layers h, a 3a·F.
//   MoE buffers, per MoE layer (MoELayer, its dispatcher, its grouped GEMM), per token: logits
//               and dlogits 2r·E, bf16 dlogits 2E (a = 2), topk/selected indices 8k, topk probs
//               and their gradient 2r·k, with input jitter 2a·H (the jittered input and the
//               router's input gradient before its jitter; without jitter the gating GEMM adds into
//               dx itself); shared expert a·(6Ssh + 2H) (fc1/SwiGLU over the TP-gathered tokens
//               with Ssh/TP units: the same 6Ssh per shard token) + at TP > 1 its gathered x and
//               partial sums 2a·H·TP (+ gate 2r + a·(2H + 1)); the expert rows R: fc1/SwiGLU
//               outputs 3a·R·Fe/ETP (their gradients are the backward scratch below); the
//               dispatcher:
//                 local (EP = ETP = 1): R = t·k (pad-to-capacity: E·C), expert in/out 2a·R·H,
//                   probs r·R, row map 4t·k, tokens per expert 4E;
//                 allgather (EP or ETP > 1, moe_allgather): g = EP·ETP·t gathered tokens, R = g·k
//                   rows: gathered x, y, padded y 3a·g·H, indices 12g·k, probs 3r·g·k,
//                   reduced y and probs a·t·H + r·t·k, expert side 2a·R·H + r·R;
//                 alltoall (EP or ETP > 1, token-deduplicating): send side S = t·min(EP, k)
//                   token rows a·S·H + routing rows 2r·S·k + r·S, rank routing 8t·EP +
//                   2r·t·EP + 2r·t·k, counts; received side at its initial size
//                   Rc = min(EP·t, S + ⌊S/4⌋) token rows per ETP peer: a·Rc·H + 2r·Rc·k +
//                   local routing (8 + r)·ETP·Rc·k (+ with ETP > 1 the gathered and padded
//                   copies 2a·ETP·Rc·H + 3r·ETP·Rc·k); expert side R = ETP·min(B, t·k + ⌊t·k/4⌋)
//                   rows (B = EP·t·min(k, E/EP), the bound): 2a·R·H + r·R (input, and one
//                   buffer for the output and both gradients); both sides follow the counts
//                   (alltoall_dispatcher.h "Receive buffers"): routing more uneven than 1.25x
//                   the mean grows them (and the R terms above and below) on the ranks that
//                   receive more, up to their bounds;
//               plus the per-sequence aux statistics (8 + 4 + r)·E·b (b = t/S with
//               seq_aux_loss, else 1), the layer's expert counts 3·4E (+ 4E, the step's counts
//               summed over TP×DP×CP, when W > 1) and CUDA workspaces (router, aux loss,
//               permute).
//               The backward-only scratch (MoEGradScratch, worker/model/moe_layer.h), ONCE per
//               stage, not per MoE layer and slot (every MoE layer and in-flight slot shares it):
//               da, dh 3a·R·Fe/ETP, and the dispatcher's d_expert_out, d_expert_x, d_expert_probs
//               2a·R·H + r·R (local, allgather) or r·R (alltoall: its gradients share its
//               output buffer).
//   head buffers: final norm output and the backward scratch (g, dn, do, dq, dk, dv, delta; dense
//               dh, da) per token 3a·H + a·(2Hq+2Hkv)·D + s·(Hq + 2) (+ 3a·F), the fused
//               vocabulary-parallel LM-head cross-entropy over the whole micro-batch (t tokens,
//               Vl = V/TP rows; on the last pipeline stage only, which holds the LM head): its
//               logits chunk (c = min(t, budget / 8Vl) rows, budget 512 MiB CUDA / 64 MiB CPU)
//               c·Vl·(4 + 2) + 4t + 12c on CUDA (fp32 logits + bf16 gradient, loss terms, TP
//               statistics), c·Vl·8 + 24c on the CPU; on every stage the lse of t tokens; CUDA
//               RMSNorm and embedding backward (t, Vl) workspaces; statistics slots per
//               micro-batch; ids and targets 8t. TP > 1: the SP scratch, gathered input and partial
//               sums a·t·H each (+ a permuted copy a·t·H when mbs > 1) and the ids mapped to this
//               rank's vocabulary rows 4t. CP > 1: the K/V gather buffers, 5 of mbs·S rows
//               (gathered, whole K, V, dK, dV) and 2 of S rows (partial dK, dV), each row
//               a·(Hkv/TP)·D. PP > 1: the pipeline receive buffers 2a·t·H/TP plus the trainer's
//               message-buffer pool, PipelinePoolBuffers of a·t·H/TP (the interleaved step's and
//               evaluation's receives), and with a tied embedding on the first and the last
//               stage the other stage's embedding gradient g·Vl·H.
//   runtime     EngineMemoryOptions::runtime_bytes.
//   create_transient: 0. (A distributed trainer used to hold the full fp32 master, exp_avg and
//               exp_avg_sq, 12·N, during Create before sharding; it now initialises the shards
//               directly through the fp32 gradient buffer: worker/train/create_memory_test.)
//               Kept so that callers that add it to the peak stay correct.
// TP, CP and ETP follow the engine (bench/memory_estimate_test checks TP2, CP2, TP2·CP2 and
// ETP2·EP2 on every rank within 5 %): every per-token term is divided by TP (sequence
// parallelism), tokens by CP, expert widths by ETP (ETP > 1 uses the EP dispatchers, even at
// EP = 1, as MoELayer::Create does), the SP and CP scratch above. PP > 1 multiplies the
// per-layer terms (layer activations and MoE buffers, not their shared scratch) by the
// micro-batches alive at once on the stage, EngineMemory::in_flight = PipelineAliveMicroBatches
// (common/model/pipeline_schedule.h; the count the trainer sizes its activation slots by):
// min(PP − stage, m) under 1F1B; under interleaved 1F1B (VPP = pipeline_virtual_stages > 1)
// more, on the last stage too, e.g. PP2·VPP2·m 8: 4 and 3, PP4·VPP2·m 8: 8, 8, 7, 5, at most
// min(2·PP, m). A micro-batch count the schedule refuses (validation reports it first) keeps the
// 1F1B count. bench/memory_estimate_test: PP2, tied PP2·EP2, PP2·VPP2, PP4·VPP2 and an uneven
// tied PP2·VPP2, every stage equal to the engine's Buffer counters to the byte on the CPU.
// Selective recompute (ModelShape::recompute_*, worker/model/gpt_model.h "Selective recompute")
// takes terms out of every layer and slot and counts one shared scratch per stage instead:
// "layernorm" n1 and n2 (2a·H per token and layer) for one a·H; "mlp" the dense h, a (3a·F/TP
// per token of t and dense layer) for one; "moe_act" the expert and shared-expert SwiGLU outputs
// (a·R·Fe/ETP and a·Ssh per shard token, per MoE layer) for one (bench/memory_estimate_test: the
// saving equals the measured one).
struct EngineMemory {
  double weights = 0, gradients = 0, optimizer_states = 0;
  double layer_activations = 0, moe_buffers = 0, head_buffers = 0;
  double runtime = 0;
  double create_transient = 0;
  // The micro-batches whose per-layer buffers (layer_activations and moe_buffers, less the shared
  // scratch) the stage holds at once: PipelineAliveMicroBatches (1 without a pipeline).
  int64_t in_flight = 1;
  double activations() const { return layer_activations + moe_buffers + head_buffers; }
  // What the engine's Buffers hold after Create (steady state).
  double buffers() const { return weights + gradients + optimizer_states + activations(); }
  double total() const { return buffers() + runtime; }
};
EngineMemory EstimateEngineMemory(const ModelShape& m, const v1::Mapping& mapping, int64_t stage,
                                  const EngineMemoryOptions& options = {});

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_MODEL_MODEL_MATH_H_
