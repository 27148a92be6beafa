// File: worker/model/gpt_model.h
//
// The decoder-only MoE transformer (Mixtral / Qwen3-MoE / DeepSeek-V3-lite style) with explicit
// forward and backward (DESIGN.md layer contract; no autograd):
//
//   x_0 = embedding[ids]
//   for each layer l:
//     n      = RMSNorm(x_l)
//     q, k, v = n·Wqᵀ, n·Wkᵀ, n·Wvᵀ   (per head: optional QK RMSNorm over D, then RoPE)
//     m      = x_l + CausalAttention(q, k, v)·Woᵀ          (GQA, scale 1/sqrt(D))
//     x_l+1  = m + MLP(RMSNorm(m))       MLP = MoE layer, or a dense SwiGLU MLP where
//                                        moe_layer_freq / moe_layer_pattern say so
//   logits = RMSNorm(x_L)·Woutᵀ         (Wout = the embedding when tied)
//   loss   = mean cross-entropy (+ the MoE aux / z losses, seeded into the routers' gradients)
//
// Parameters live in ONE flat buffer (dtype: bf16 on CUDA; bf16, f32 or f64 on the CPU) and
// gradients in one flat buffer (f32; f64 for an f64 model), laid out by GptParamLayout:
// weights with weight decay first (rank >= 2), then the norm weights (rank 1, no decay, as
// Megatron's param groups), each tensor at a 64-element-aligned offset. The optimizer and the
// checkpoint work on these flat buffers; layers see views.
//
// Tensor names and layouts (the names the checkpoint and the HF converter use). Linear weights
// are stored [out, in] like PyTorch's nn.Linear (y = x·Wᵀ); the expert weights use the MoE
// layer's x·W form:
//   embedding.weight                       [V, H]
//   layers.{l}.input_norm.weight           [H]
//   layers.{l}.attention.q.weight          [Hq·D, H]
//   layers.{l}.attention.k.weight          [Hkv·D, H]
//   layers.{l}.attention.v.weight          [Hkv·D, H]
//   layers.{l}.attention.o.weight          [H, Hq·D]
//   layers.{l}.attention.q_norm.weight     [D]          (qk_layernorm)
//   layers.{l}.attention.k_norm.weight     [D]          (qk_layernorm)
//   layers.{l}.post_attention_norm.weight  [H]
//   dense layers:  layers.{l}.mlp.fc1.weight [2F, H] (gate rows, then up rows);
//                  layers.{l}.mlp.fc2.weight [H, F]
//   MoE layers:    layers.{l}.moe.router.weight [E, H], layers.{l}.moe.experts.fc1 [E, H, 2Fe],
//                  layers.{l}.moe.experts.fc2 [E, Fe, H], layers.{l}.moe.shared_expert.fc1
//                  [H, 2S], .fc2 [S, H], .gate [H, 1] (worker/model/moe_layer_tensors.h)
//   final_norm.weight                      [H]
//   output.weight                          [V, H]       (untie_embeddings_and_output_weights)
// Router state (not trained, f32): layers.{l}.moe.router.expert_bias [E].
//
// Initialisation (Megatron's): weights ~ N(0, init_method_std²); the output projections of
// attention and MLP (attention.o, mlp.fc2, experts.fc2, shared_expert.fc2) use the scaled std
// init_method_std / sqrt(2·num_layers); norm weights 1; expert bias 0. Values come from
// kernels::FillNormal with a per-tensor seed, so the CPU and the GPU initialise identically.
//
// Tensor and sequence parallelism (tp_size > 1; Megatron's layout, megatron_parallel.md §1.4-1.9,
// SP always on as Megatron requires for MoE):
//   q, k, v       column-parallel: rank r holds heads [r·Hq/TP, ...) and KV groups
//                 [r·Hkv/TP, ...) (rows of the weights), so GQA stays local (Hq % TP == 0 and
//                 Hkv % TP == 0: common/config/validate.cc; one KV head at TP = 2 is rejected,
//                 not replicated)
//   o, mlp.fc2    row-parallel: rank r holds the columns of its heads / its F/TP units
//   mlp.fc1       column-parallel over both halves: rows [gate_r ; up_r], SwiGLU stays local
//   embedding, output   vocabulary-parallel (§1.7-1.8): rank r holds rows [r·V/TP, (r+1)·V/TP)
//                 (model.vocab_size % TP == 0: no padded vocabulary in the spec; the checkpoint
//                 keeps the whole [V, H] under the same names)
//   everything else (norms, q_norm / k_norm, the MoE router and shared expert)
//                 whole on every TP rank, gradients all-reduced over TP (§1.9); the expert
//                 weights follow EP (and ETP, moe_layer.h)
// The residual stream between blocks, the norms and the MoE layers work on this rank's SEQUENCE
// SHARD; the all-gather of the normed input precedes q/k/v and fc1, the reduce-scatter follows
// o-proj and fc2 (in the backward: all-gather of the output gradient, reduce-scatter of the input
// gradient; the normed inputs are gathered again for the weight gradients, as Megatron does).
// The shard: rank r holds positions [r·S/TP, (r+1)·S/TP) of EVERY sequence of the micro-batch
// (rows b·S/TP + j, batch-major), not a contiguous 1/TP of the flat B·S tokens. Why: it is
// Megatron's layout ([s, b] activations cut on s), so every per-sequence statistic has the same
// meaning: seq_aux_loss sums a sequence's shards over TP exactly as the spec (§1.11 /
// megatron_moe.md §2.3), and the MoE jitter and RoPE positions map one-to-one; with B = 1 the
// all-gather needs no reordering, with B > 1 one copy per (sequence, rank) block.
// Every TP rank is given the whole micro-batch (ids, targets). The embedding looks every token up
// in this rank's vocabulary rows (zero rows for ids another rank owns,
// kernels::VocabShardEmbeddingForward) and reduce-scatters the [t, H] partial sums onto the
// sequence shard (one non-zero term per token); its backward all-gathers the shard gradients and
// gives this rank's rows every token they embedded. The LM head all-gathers the final norm's
// shards and runs the fused vocabulary-parallel cross-entropy over the whole micro-batch against
// its V/TP rows (kernels::FusedLinearCrossEntropy::VocabParallelForwardBackward: max and
// (sum-exp, target logit) all-reduced over TP per chunk, never the logits); the input gradient,
// a partial sum over this rank's rows, is reduce-scattered onto the shard; the weight gradients
// are whole for this rank's rows (no TP all-reduce). Tied embeddings share the vocabulary slice.
// The loss sum of a micro-batch is then the same on every TP rank: TP rank 0 reports it, the
// others 0. MoE statistics are this rank's share. The trainer sums both over TP×DP×CP.
//
// Activations are bf16 on CUDA (fp32 math in kernels), the parameter dtype on the CPU. The model
// holds one micro-batch in flight: ForwardBackward runs both passes. Nothing synchronises with
// the host inside a step except ReadStepStats.
//
// Context parallelism (CP, cp_size > 1; megatron_parallel.md §2): every sequence of S tokens is
// cut into 2·CP chunks of c = S/(2·CP) and this rank holds chunks r and 2·CP−1−r (causal load
// balance: an early chunk sees little context, a late one much), in that order, as a local
// sequence of S/CP tokens. ids/targets passed to ForwardBackward are those local tokens (the
// trainer slices them, kernels::CpGlobalPosition); everything but attention is per token and runs
// unchanged. RoPE rotates each local token by its global position (kernels::RopeCp). Attention
// over the whole context uses the ALL-GATHER scheme (§2.6), not the P2P ring (§2.4-2.5):
//   forward:  all-gather K and V over CP, put the chunks in natural order; each local chunk
//             attends causally to the K/V prefix that ends at its own end, i.e. a bottom-right
//             causal mask with q_len = c <= kv_len = (chunk+1)·c (kernels::AttentionForward with
//             kv_seq_len); the outputs are already in local order, so no softmax merge;
//   backward: all-gather K and V again (not kept from the forward: CP exists to save activation
//             memory), dK/dV of the two chunks summed over the whole-sequence buffer, put back in
//             CP order and reduce-scattered over CP (each rank gets the sum of every rank's
//             gradient for its own K/V rows).
// Why all-gather for now: it needs one new kernel mode (the bottom-right mask) instead of an
// online-softmax merge of partial results in forward and a K/V+dK/dV ring in backward, it gives
// the same result on every rank ordering (no merge rounding), and on the CPU/Gloo path, where
// nothing overlaps anyway, its two collectives per layer and pass cost less than 2·(CP−1) P2P
// steps. Its cost: a whole-sequence K/V buffer per layer in flight ([B·S, Hkv, D], shared by the
// layers) and no overlap of communication with compute; the ring is the better choice at large
// CP on GPUs and is left for later. Loss: each rank's CE sum over its own tokens; the trainer's
// 1/(global tokens) scale and the SUM of gradients over DP×CP make it the one-process loss. The
// MoE aux losses reduce their counts over CP (MoEParallelGroups::cp). On CUDA the same code runs
// on device: the K/V all-gather and dK/dV reduce-scatter over the CP communicator (NCCL), the
// chunk re-ordering as device copies, RoPE with CP positions (rope.cu), and the bottom-right mask
// in cuDNN and in both native attention kernel families. The CUDA CP path is compiled but has not
// run on a GPU yet (distributed_gpu_test's CP cases, attention_gpu_test's bottom-right cases).
//
// Tensor and context parallelism (tp_size > 1 and cp_size > 1, megatron_parallel.md §2.9): CP
// chooses the positions this rank holds (chunks cp_rank and 2·CP−1−cp_rank, a local sequence of
// S/CP), and SP then shards THAT local sequence over TP exactly as above (rank tp_rank holds local
// positions [tp_rank·S/(CP·TP), +S/(CP·TP)) of every sequence; hence seq_length % (2·CP·TP) ==
// 0). Every TP rank of a CP rank gets the CP rank's S/CP tokens per sequence (ForwardBackward's
// seq_len is S/CP) and keeps its shard. After the SP all-gather, q/k/v hold the CP rank's whole
// local sequence for this TP rank's heads, so the K/V all-gather and dK/dV reduce-scatter run over
// the CP group (the CP peers of the same tp_rank hold the same heads). The MoE layers see
// S/(CP·TP) positions per sequence: their counts are summed over TP and CP, N over both, and the
// z-loss coefficient divided by TP·CP (moe_layer.h, MoEParallelGroups). Why this order: it is
// Megatron's (the CP split happens in the data loader, SP inside the model), so the per-sequence
// statistics, RoPE and jitter positions keep the meanings the two features have alone.
//
// Pipeline parallelism (pp_size > 1; megatron_parallel.md PP, Megatron's non-interleaved 1F1B):
// this stage holds only layers [layer_begin, layer_end) under their GLOBAL names and indices
// (init seeds, jitter offsets, checkpoint names as one process); the first stage also holds the
// embedding, the last the final norm and the LM head (output.weight; with tied embeddings a copy
// of embedding.weight, initialised as the first stage's, whose gradient the trainer sums over
// the first and the last stage: Megatron's embedding group). The trainer drives the schedule: a
// stage that is not the last runs ForwardStage (input: the received activation [t/TP, H], or the
// embedding on the first stage) and later BackwardStage (the received gradient of its output); the
// last stage runs ForwardBackward with the received input and returns the gradient of that input.
// Interleaved (virtual stages, GptConfig::chunk_begin/chunk_end): the stage holds several model
// chunks (non-contiguous layer ranges); every pass names its chunk. The embedding is in chunk 0
// of the first stage, the final norm and LM head in the last chunk of the last stage (the only
// chunk that runs ForwardBackward); every other chunk of every stage runs ForwardStage /
// BackwardStage, taking its input from and handing its output to the trainer. Each chunk has
// its own stretch of the slot's residual stream (chunk v's x_0 .. x_n), so the chunks of one
// micro-batch never overwrite each other's saved activations.
// Several micro-batches are in flight between a stage's forward and its backward (at most pp_size -
// pp_rank with 1F1B; with the interleaved schedule the trainer's GptConfig::pipeline_slots, on
// the last stage too), so every per-micro-batch activation (residual stream, each layer's saved
// tensors and its MoE layer with its dispatcher state) exists once per in-flight SLOT (micro-batch
// m uses slot m % slots); the scratch used only inside one pass is shared (the backward's, and the
// MoE layers' backward-only buffers, MoEGradScratch, one per role for all). The MoE layers of all
// slots share the expert-bias and token-count buffers (one update per global batch) and the running
// global_aux_loss counts (slot 0's MoE layer holds them, MoELayer::ShareGlobalAuxCounts), which
// the micro-batches then accumulate in order, as in one process.
//
// Selective recompute (model.recompute_granularity "selective", recompute_modules; Megatron's
// names, config.proto): activations that a recomputing layer does not keep between its forward
// and its backward live in ONE scratch per role shared by every layer of the stage and every
// in-flight slot (worker/model/scratch_buffer.h): they are written and read within one pass of
// one layer, and passes run one after another on the stream. The backward recomputes them with
// the forward's own deterministic kernels from what is kept, so results are bit-identical:
//   "layernorm": n1 = RMSNorm(x_l) and n2 = RMSNorm(mid) are the norm scratch [t/TP, H]; the
//       backward runs the forward norm again (on the kept x_l / mid and weight; it rewrites the
//       kept rstd with the same values) before their readers: n2 before the MLP / MoE backward
//       (dense fc1 and the MoE router, shared expert and gate weight gradients read it), n1
//       before the q/k/v weight gradients. The norms' own backward reads x_l / mid and rstd only.
//   "mlp" (dense layers): h = n2·W1ᵀ and a = SwiGLU(h) are the MLP scratch [t, 2F/TP], [t, F/TP];
//       the backward runs fc1 (with the SP all-gather of n2 at TP > 1) and SwiGLU again first.
//   "moe_act": the MoE layers' SwiGLU outputs (MoELayerConfig::recompute_act, MoEActScratch).
//   "core_attn": nothing to do: attention keeps only O and the log-sum-exp and its backward
//       recomputes the probabilities (kernels/attention), which is what Megatron's core_attn
//       recompute buys.
// Cost: one RMSNorm forward per norm, one fc1 GEMM per dense layer, one SwiGLU per MoE layer and
// pass. The saving scales with the layers and slots (common/model/model_math.h
// EstimateEngineMemory).
//
// Phases are NVTX ranges, timed by CUDA events (host clock on the CPU) when a PhaseTimer is
// active (worker/model/profiling.h): "forward_backward"[micro] > embedding.fwd, layer.fwd[l] >
// {norm_qkv_rope, attention, oproj_residual_norm, moe (> moe.fwd > its phases) | mlp},
// final_norm.fwd, lm_head_loss, final_norm.bwd, layer.bwd[l] > {moe | mlp, oproj_residual_norm,
// attention, norm_qkv_rope}, embedding.bwd. The backward hook runs inside forward_backward.
#ifndef SWITCHYARD_WORKER_MODEL_GPT_MODEL_H_
#define SWITCHYARD_WORKER_MODEL_GPT_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/model_math.h"
#include "common/tensor.h"
#include "kernels/loss/cross_entropy.h"
#include "kernels/runtime/buffer.h"
#include "switchyard/v1/config.pb.h"
#include "worker/model/moe_layer.h"
#include "worker/model/scratch_buffer.h"

namespace switchyard::model {

struct GptConfig {
  int64_t num_layers = 0;
  int64_t hidden_size = 0;      // H
  int64_t num_heads = 0;        // Hq
  int64_t num_kv_heads = 0;     // Hkv (num_query_groups)
  int64_t head_dim = 0;         // D (kv_channels)
  int64_t ffn_hidden_size = 0;  // F of the dense layers
  int64_t vocab_size = 0;       // V
  int64_t seq_length = 0;       // S of training micro-batches
  double norm_epsilon = 1e-5;
  double rotary_base = 10000.0;
  double init_method_std = 0.02;
  bool qk_layernorm = false;
  bool untie_embeddings = false;
  std::vector<bool> moe_layers;           // one entry per layer: true = MoE, false = dense SwiGLU
  double expert_bias_update_rate = 1e-3;  // moe_router_bias_update_rate
  MoELayerConfig moe;                     // used by the MoE layers (hidden_size etc. filled in)
                                          // moe.ep_size/ep_rank: this rank's expert shard
  DType dtype = DType::kBF16;             // parameters and activations
  // Selective activation recompute (model.recompute_modules; see "Selective recompute" below).
  // "moe_act" is moe.recompute_act; "core_attn" needs nothing (flash-style attention).
  bool recompute_layernorm = false;  // "layernorm": n1, n2 recomputed, not kept per layer
  bool recompute_mlp = false;        // "mlp": the dense MLP's h, a recomputed, not kept
  // Context parallelism (see "Context parallelism" below): this rank holds chunks cp_rank and
  // 2·cp_size−1−cp_rank of every sequence; seq_length stays the WHOLE sequence's length.
  int64_t cp_size = 1, cp_rank = 0;
  // Padding of the flat layout for the distributed optimizer: the expert region is padded to a
  // multiple of 64·expert_shard_multiple elements (the EDP size) and the dense region to a
  // multiple of 64·dense_shard_multiple (the DP×CP size), so each divides into equal shards.
  int64_t expert_shard_multiple = 1;
  int64_t dense_shard_multiple = 1;
  // Tensor parallelism with sequence parallelism (see "Tensor and sequence parallelism" above):
  // this rank is tp_rank of tp_size; GptParallelGroups::tp must be that group when tp_size > 1.
  int64_t tp_size = 1, tp_rank = 0;
  // Pipeline parallelism (see "Pipeline parallelism" below): this rank is stage pp_rank of
  // pp_size and holds the layers [layer_begin, layer_end) (global indices; layer_end = -1: all);
  // num_layers stays the WHOLE model's count (scaled init, names and RNG match one process).
  int64_t pp_size = 1, pp_rank = 0;
  int64_t layer_begin = 0, layer_end = -1;
  // Interleaved pipeline (virtual stages, see "Pipeline parallelism"): this stage's model chunks,
  // chunk v holding the global layers [chunk_begin[v], chunk_end[v]) (ascending, disjoint, the
  // layout of common/model/pipeline_layout.h). Empty: one chunk, [layer_begin, stage_layer_end()).
  std::vector<int64_t> chunk_begin, chunk_end;
  // In-flight activation slots (micro-batch m uses slot m % slots); 0: 1F1B's count
  // (pp_size - pp_rank on a stage before the last, 1 on the last). The interleaved schedule's
  // trainer sets it (common/model/pipeline_schedule.h PipelineAliveMicroBatches).
  int64_t pipeline_slots = 0;
  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == pp_size - 1; }
  int64_t stage_layer_end() const { return layer_end < 0 ? num_layers : layer_end; }
  int64_t num_chunks() const {
    return chunk_begin.empty() ? 1 : static_cast<int64_t>(chunk_begin.size());
  }
  int64_t ChunkBegin(int64_t v) const { return chunk_begin.empty() ? layer_begin : chunk_begin[v]; }
  int64_t ChunkEnd(int64_t v) const {
    return chunk_begin.empty() ? stage_layer_end() : chunk_end[v];
  }
  bool HoldsLayer(int64_t l) const {
    for (int64_t v = 0; v < num_chunks(); ++v) {
      if (l >= ChunkBegin(v) && l < ChunkEnd(v)) return true;
    }
    return false;
  }
  // The chunk that embeds (chunk 0 of the first stage) and the one that holds the final norm and
  // LM head (the last chunk of the last stage): Megatron's pre_process / post_process.
  bool EmbedsIn(int64_t chunk) const { return first_stage() && chunk == 0; }
  bool HeadIn(int64_t chunk) const { return last_stage() && chunk == num_chunks() - 1; }

  // From a defaulted and validated ModelConfig (common/config/config_defaults.h, validate.h).
  static absl::StatusOr<GptConfig> FromProto(const v1::ModelConfig& model, DType dtype);
  absl::Status Validate() const;
  int64_t num_moe_layers() const;
  // The shape common/model computes parameter counts, FLOPs and memory from (the one model of a
  // job shared with the planner and the benchmarks).
  ModelShape Shape() const;
  // Gradient dtype: f32 (fp32 accumulation, also for bf16 parameters on the CPU, so the CPU
  // reference of a bf16 model accumulates like the GPU), f64 for an f64 model.
  DType GradDType(Device device) const;
};

// One tensor of the flat layout.
struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in elements, into the flat buffer
  int64_t numel = 0;
  bool weight_decay = true;
  bool scaled_init = false;  // output projection: std / sqrt(2 * num_layers)
  bool ones_init = false;    // norm weight
  // Expert-parallel tensor (layers.{l}.moe.experts.*): this rank holds experts
  // [ep_rank·L, (ep_rank+1)·L) of global_shape[0] = E; shape[0] = L. Reduced over EDP.
  // With ETP > 1 it holds the ETP slice of those experts (moe_layer.h): fc1 [L, H, 2F'] is the
  // gate columns [etp_rank·F', +F') then the up columns [F + etp_rank·F', +F') of the global
  // [E, H, 2F]; fc2 [L, F', H] is the rows [etp_rank·F', +F') of the global [E, F, H].
  bool expert = false;
  std::vector<int64_t> global_shape;  // == shape for a dense tensor
  int64_t global_offset = 0;          // first element of this shard in the global tensor
  // The shard in the global tensor: shard_runs runs of numel / shard_runs contiguous elements,
  // run i starting at global_offset + i·run_pitch (one run without ETP). etp_step: how far ETP
  // rank t's shard starts after ETP rank 0's of the same EP rank (ShardGlobalOffset).
  int64_t shard_runs = 1;
  int64_t run_pitch = 0;
  int64_t etp_step = 0;
  // Tensor-parallel shard (tp_size > 1; see "Tensor and sequence parallelism"): -1 = the whole
  // tensor on every TP rank (a TP-replicated dense tensor: its gradient is all-reduced over TP);
  // else dimension tp_dim of global_shape is cut into tp_parts equal parts (fc1: gate, up), each
  // part into tp_size pieces, and this rank holds piece tp_rank of every part, concatenated.
  int tp_dim = -1;
  int tp_parts = 1;
  bool tp_sharded() const { return tp_dim >= 0; }
  uint64_t seed_index = 0;  // per-tensor init seed (definition order; layout-independent)
};

// Regions of the flat buffer, in this order (each tensor 64-element aligned, padding zero):
//   [0, expert_end)                 expert tensors (weight decay; reduced over EDP)
//   [expert_end, replicated_begin)  TP-sharded dense tensors (weight decay; reduced over DP×CP;
//                                   empty when tp_size == 1)
//   [replicated_begin, decay_end)   dense tensors with weight decay, whole on every TP rank
//   [decay_end, total)              dense tensors without weight decay (norm weights)
// so [0, decay_end) takes weight decay, [expert_end, total) is the dense region and
// [replicated_begin, total) holds every TP-replicated tensor (gradients all-reduced over TP,
// counted once in the global norm). replicated_begin - expert_end is a multiple of
// 64·dense_shard_multiple like the dense region.
struct GptParamLayout {
  std::vector<ParamInfo> params;
  int64_t total = 0;             // elements of the flat buffer (padding included)
  int64_t decay_end = 0;         // [0, decay_end) takes weight decay, [decay_end, total) does not
  int64_t expert_end = 0;        // [0, expert_end): expert tensors (0 without MoE layers)
  int64_t replicated_begin = 0;  // == expert_end when tp_size == 1
  const ParamInfo* Find(const std::string& name) const;
};
GptParamLayout MakeGptParamLayout(const GptConfig& config);

// global_offset of `p`'s shard on the rank with this EP and ETP rank (p from any rank's layout;
// ETP and EP sizes those of the layout). 0 for a dense tensor.
int64_t ShardGlobalOffset(const ParamInfo& p, int64_t ep_rank, int64_t etp_rank, int64_t etp_size);
// Copies between a shard [p.numel] and the global tensor [prod(p.global_shape)] of `p`, the shard
// starting at `global_offset` (ShardGlobalOffset), run by run (ParamInfo::shard_runs): into the
// global tensor when `to_global`, else out of it. Host tensors of one dtype; INTERNAL if a run
// falls outside the global tensor.
absl::Status CopyShard(const ParamInfo& p, int64_t global_offset, const Tensor& global,
                       const Tensor& shard, bool to_global);
// Copies between a whole tensor (global_shape, row-major) and this rank's TP shard of it (shape):
// to_shard = true reads `whole` and writes `shard`, false the reverse. Host memory, elements of
// `elem_bytes` bytes. For a tensor that is not TP-sharded both are the same elements.
void CopyTpShard(const ParamInfo& p, int64_t tp_size, int64_t tp_rank, int64_t elem_bytes,
                 bool to_shard, void* whole, void* shard);

// Model FLOPs per token of one training step (forward + backward = 3 × forward), Megatron-style:
// every GEMM of the active parameters (top-k routed experts, shared expert, router), the
// attention score and value products counted causally (half of the S×S square), and the LM
// head. Embedding lookups, norms and elementwise ops are not counted. Used for TFLOP/s and MFU.
// = TrainingFlopsPerToken(config.Shape()) (common/model/model_math.h): one formula.
double GptTrainingFlopsPerToken(const GptConfig& config);
// Parameter counts of the whole model (all experts, whatever this rank's shard): total, and
// active per token (top-k experts instead of all). = TotalParams / ActiveParams of
// config.Shape() (common/model/model_math.h); gpt_model_test checks them against the layout.
int64_t GptTotalParams(const GptConfig& config);
int64_t GptActiveParams(const GptConfig& config);

// Per-step statistics, gathered on the device during the micro-batches and read once.
struct GptStepStats {
  double loss_sum = 0;  // sum of the cross-entropy terms over all micro-batches
  int64_t tokens = 0;   // tokens counted in loss_sum
  // Per MoE layer: every aux term (coefficient included) and the z-loss, averaged over the
  // micro-batches; tokens routed to each expert, summed over the micro-batches.
  std::vector<std::vector<double>> moe_losses;      // [moe layers][aux terms + 1]
  std::vector<std::vector<int64_t>> expert_tokens;  // [moe layers][E]
};

// Process groups of a distributed model (borrowed; outlive the model). None for one process.
//   ep:  the EP group (config.moe.ep_size ranks): the MoE layers' token dispatchers.
//   etp, etp_ep: the ETP and ETP×EP groups (config.moe.etp_size > 1): the alltoall dispatcher's
//        ETP all-gather / reduce-scatter and the allgather dispatcher's group (moe_layer.h).
//   tdc: TP×DP×CP: global_aux_loss counts per micro-batch and the expert-bias token counts per
//        global batch are all-reduced over it (megatron_moe.md §1.5, §2.3).
//   tp:  the TP group (config.tp_size ranks; required when tp_size > 1): the sequence-parallel
//        all-gathers / reduce-scatters and the MoE layers' aux-loss counts over TP.
//   cp:  the CP group (config.cp_size ranks, this rank = config.cp_rank): the attention's K/V
//        all-gather and dK/dV reduce-scatter, and the MoE aux-loss counts (MoEParallelGroups).
struct GptParallelGroups {
  comm::Communicator* ep = nullptr;
  comm::Communicator* tdc = nullptr;
  comm::Communicator* etp = nullptr;
  comm::Communicator* etp_ep = nullptr;
  comm::Communicator* tp = nullptr;
  comm::Communicator* cp = nullptr;
};

class GptModel {
 public:
  // Plans the model on `device` for micro-batches of up to `max_micro_batch` sequences of
  // `config.seq_length` tokens and up to `max_micro_batches` micro-batches per step (stats
  // slots). Allocates parameters, gradients, activations and workspaces; parameters start at 0
  // (call InitMaster, then LoadParams or the optimizer's cast).
  static absl::StatusOr<std::unique_ptr<GptModel>> Create(const GptConfig& config, Device device,
                                                          int64_t max_micro_batch,
                                                          int64_t max_micro_batches,
                                                          const GptParallelGroups& groups = {});
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;
  ~GptModel();

  const GptConfig& config() const { return config_; }
  const GptParamLayout& layout() const { return layout_; }
  Device device() const { return device_; }
  // Flat parameter [total] (config dtype) and gradient [total] (GradDType) buffers.
  Tensor params() const { return params_.View(); }
  Tensor grads() const { return grads_.View(); }
  // Views of one named tensor (shape of the layout); NotFound for an unknown name.
  absl::StatusOr<Tensor> Param(const std::string& name) const;
  absl::StatusOr<Tensor> Grad(const std::string& name) const;
  // Router state [num_moe_layers, E] f32: the expert biases (empty when no MoE layer).
  Tensor expert_bias() const { return expert_bias_.View(); }

  // Writes the initial values (see the file comment) into `master` [total] (f32, or f64 on the
  // CPU) on the model's device; padding elements are 0.
  absl::Status InitMaster(const Stream& stream, uint64_t seed, const Tensor& master) const;
  // What ZeroGrads does with the expert gradients, [0, layout().expert_end) of grads().
  enum class ExpertGrads {
    kZero,  // zeroed with the rest
    // Left as they are (any values, NaN included): each MoE layer's next Backward WRITES its
    // gradients (MoELayer::GradMode::kOverwrite) instead of adding to zeros, and the ones after
    // it add as usual. The expert gradients are most of the buffer (the benchmark model: 5.4 of
    // 6.2 GB) and their weight-gradient GEMMs are bound by the fp32 read-modify-write, so this
    // saves the memset and the first micro-batch's read of them. Only Backward may touch them
    // next (padding between expert tensors is never written, so it stays 0).
    kOverwrite,
  };
  absl::Status ZeroGrads(const Stream& stream, ExpertGrads experts = ExpertGrads::kZero);

  // One micro-batch: forward, loss, backward; ADDS the gradients of
  //   ce_scale · sum_t CE_t + aux_grad_scale · (MoE aux and z losses)
  // to grads(). ids, targets: [B·S] i32 on the model's device (B <= max_micro_batch, S =
  // seq_len <= config.seq_length; targets may be kernels::kIgnoreTarget). The loss sum and the
  // MoE statistics go to stats slot `micro` (< max_micro_batches).
  // Pipeline (not the first stage): `input` [B·S/TP, H] is the previous stage's output for this
  // micro-batch (model dtype, model device) and *input_grad receives a view of its gradient
  // (valid until the next pass). On the last stage only (it holds the LM head).
  // Interleaved: the pass of the last chunk (the one with the LM head) in in-flight slot `slot`.
  absl::Status ForwardBackward(const Stream& stream, const Tensor& ids, const Tensor& targets,
                               int64_t seq_len, float ce_scale, double aux_grad_scale, int micro,
                               const Tensor& input = Tensor(), Tensor* input_grad = nullptr,
                               int slot = 0);
  // Pipeline, a stage that is not the last (see "Pipeline parallelism"): the forward of this
  // stage's layers for micro-batch `micro` into in-flight slot `slot` (< num_slots()); `input` as
  // in ForwardBackward (ignored on the first stage, which embeds `ids`). *output: a view of the
  // stage's output [B·S/TP, H], valid until the slot is used again.
  // Interleaved: of model chunk `chunk` (any but the last stage's last; the embedding only in
  // the first stage's chunk 0).
  absl::Status ForwardStage(const Stream& stream, const Tensor& ids, const Tensor& input,
                            int64_t seq_len, int micro, int slot, Tensor* output, int chunk = 0);
  // The backward of slot `slot`'s micro-batch (ids: the same ids as its forward) given the
  // gradient of the stage's output; *input_grad (not on the first stage, which runs the
  // embedding backward): a view valid until the next pass. Backward hooks run as in
  // ForwardBackward.
  // Interleaved: of model chunk `chunk` (as ForwardStage's); *input_grad for every chunk but the
  // first stage's chunk 0.
  absl::Status BackwardStage(const Stream& stream, const Tensor& ids, const Tensor& output_grad,
                             int64_t seq_len, double aux_grad_scale, int slot, Tensor* input_grad,
                             int chunk = 0);
  int num_slots() const { return static_cast<int>(slot_layers_.size()); }
  // Forward only: the loss sum into slot `micro` (targets given) and/or the logits [B·S, V] f32
  // (when `logits` is non-empty). Does not disturb gradients. At TP > 1 the final-norm sequence
  // shards are all-gathered over TP, the loss is the vocabulary-parallel one (on TP rank 0, as in
  // ForwardBackward), and the logits (only when asked: generation / eval) are each rank's V/TP
  // columns all-gathered over TP, so every TP rank gets the same full logits of its (CP-local)
  // tokens in the order of `ids` (a [(TP+1)·t·V/TP] scratch is allocated on first use).
  // Pipeline (the trainer's forward-only schedule, Trainer::Evaluate): the pass of model chunk
  // `chunk` of this stage, `input` as in ForwardBackward (none where the chunk embeds); a chunk
  // without the LM head only runs its layers and sets *output (its output [B·S/TP, H], valid
  // until the next pass), the loss and logits are the head chunk's.
  absl::Status Forward(const Stream& stream, const Tensor& ids, const Tensor& targets,
                       int64_t seq_len, int micro, const Tensor& logits,
                       const Tensor& input = Tensor(), int chunk = 0, Tensor* output = nullptr);

  // Training (the default) or evaluation mode of every MoE layer's router for the passes that
  // follow (Megatron's model.train() / model.eval(); MoELayer::set_training): in evaluation no
  // input jitter, no aux/z-loss statistics (nor global_aux_loss running counts), no expert-bias
  // counts, sinkhorn routed by top-k. The trainer's Evaluate wraps its Forward passes in it, so a
  // training step after an evaluation is the one it would have been without it.
  void SetTraining(bool training);

  // Synchronises the stream and reads the statistics of slots [0, num_micro). In a distributed
  // model they are this rank's (its micro-batches' tokens); the trainer reduces them.
  absl::StatusOr<GptStepStats> ReadStepStats(const Stream& stream, int num_micro) const;
  // Once per global batch, after the optimizer step: aux-loss-free expert-bias update (when
  // enabled) and the global_aux_loss reset of every MoE layer.
  absl::Status EndGlobalBatch(const Stream& stream);

  // Counter of forward passes: selects fresh input-jitter noise per micro-batch. Part of the
  // training state a checkpoint saves (bit-identical resume).
  uint64_t forward_counter() const { return step_counter_; }
  void set_forward_counter(uint64_t n) { step_counter_ = n; }

  // Called during ForwardBackward's backward pass each time a set of gradients is final for this
  // micro-batch: with num_layers after the LM head and final norm (output.weight, final_norm),
  // with l after layer l's backward (every layers.{l}.* gradient), and with -1 after the
  // embedding (embedding.weight). The kernels are enqueued, not finished, when it is called (on
  // CUDA: record an event on the stream to wait for them). An error aborts the pass. Empty: none.
  void SetBackwardHook(std::function<absl::Status(int64_t layer)> hook) {
    backward_hook_ = std::move(hook);
  }
  // The hook index after which the gradient of `p` is final: see SetBackwardHook.
  int64_t GradReadyIndex(const ParamInfo& p) const;

  // The MoE layer of layer l (nullptr for a dense layer): for timers and routing inspection.
  MoELayer* moe_layer(int64_t l) const;

 private:
  struct Layer;
  GptModel() = default;
  absl::Status Build(int64_t max_micro_batch, int64_t max_micro_batches);
  absl::Status ForwardPass(const Stream& stream, const Tensor& ids, int64_t seq_len, int micro,
                           bool training, const Tensor& input = Tensor(), int chunk = 0);
  // Chunk v's layers are layers_[chunk_layer_[v], chunk_layer_[v + 1]); its input is
  // resid_[chunk_resid_[v]] and its output resid_[chunk_resid_[v] + its layer count].
  std::vector<int64_t> chunk_layer_, chunk_resid_;
  Tensor ChunkOutput(int chunk, int64_t rows) const;
  // Makes slot k's layers and residual stream the active ones (layers_, resid_).
  void SelectSlot(int k);
  absl::Status LayersBackward(const Stream& s, const Tensor& ids, int64_t seq_len,
                              double aux_grad_scale, Tensor* input_grad, int chunk = 0);
  absl::Status BackwardPass(const Stream& stream, const Tensor& ids, int64_t seq_len,
                            double aux_grad_scale);
  absl::Status LayerForward(const Stream& s, Layer& layer, int64_t seq_len, int micro,
                            bool training);
  absl::Status LayerBackward(const Stream& s, Layer& layer, int64_t seq_len, double aux_grad_scale);
  // Sequence-parallel collectives over groups_.tp (see "Tensor and sequence parallelism"):
  // local [t/TP, w] shard <-> whole [t, w] micro-batch of sequences of seq_len tokens.
  absl::Status GatherSeq(const Stream& s, const Tensor& local, const Tensor& whole,
                         int64_t seq_len);
  absl::Status ReduceScatterSeq(const Stream& s, const Tensor& whole, const Tensor& local,
                                int64_t seq_len);
  // Vocabulary-parallel LM head (tp_size > 1): this rank's slice and the TP all-reduce.
  kernels::VocabShard MakeVocabShard();
  // The loss sum of a micro-batch is the same on every TP rank: kept on TP rank 0, zeroed on the
  // others (the trainer sums the stats over TP).
  absl::Status KeepLossOnFirstTpRank(const Stream& s, const Tensor& loss);
  // Forward logits [t, V] f32 at TP > 1 from the gathered final norm [t, H]: local columns, TP
  // all-gather, interleave (logits_ws_).
  absl::Status GatherLogits(const Stream& s, const Tensor& normed, const Tensor& w_out,
                            const Tensor& logits);
  Tensor P(const std::string& name) const;  // parameter view (name must exist)
  Tensor G(const std::string& name) const;  // gradient view
  // Allocates a zeroed activation or scratch buffer owned by the model.
  absl::StatusOr<Tensor> Alloc(DType dtype, std::vector<int64_t> shape);

  GptConfig config_;
  GptParamLayout layout_;
  Device device_;
  int64_t max_tokens_ = 0, max_micro_ = 0, tokens_ = 0;
  uint64_t step_counter_ = 0;  // jitter offsets
  kernels::Buffer params_, grads_, expert_bias_, local_counts_;
  // ZeroGrads(kOverwrite): the layers (by index) whose next MoE Backward overwrites.
  std::vector<bool> overwrite_expert_grads_;
  std::vector<kernels::Buffer> buffers_;  // activations, scratch, stats
  // "moe_act" recompute: the MoE layers' SwiGLU scratch, routed and shared expert (MoEActScratch).
  std::unique_ptr<ScratchBuffer> moe_act_scratch_, shared_act_scratch_;
  // The MoE layers' backward-only buffers, one per role for the stage (MoEGradScratch).
  std::unique_ptr<MoEGradBuffers> moe_grad_scratch_;
  std::vector<Layer> layers_;  // the active slot's layers (this stage's, in order)
  // Pipeline: the inactive slots (slot_layers_[cur_slot_] is empty while active) and residual
  // streams; one slot without PP.
  std::vector<std::vector<Layer>> slot_layers_;
  std::vector<std::vector<Tensor>> slot_resid_;
  int cur_slot_ = 0;
  std::unique_ptr<kernels::FusedLinearCrossEntropy> ce_;
  GptParallelGroups groups_;
  std::function<absl::Status(int64_t)> backward_hook_;
  // Selective recompute (see "Selective recompute"): the norm scratch [t/TP, H] ("layernorm"),
  // the dense MLP scratch h [t, 2F/TP] and a [t, F/TP] ("mlp"; empty when the stage has no dense
  // layer). The MoE layers' SwiGLU scratch is declared before the layers (they borrow it).
  Tensor norm_scratch_, mlp_h_scratch_, mlp_a_scratch_;
  // Residual stream x_0 .. x_L, final norm output and its rstd, CE lse, scratch.
  std::vector<Tensor> resid_;
  Tensor final_n_, final_rstd_, ce_lse_, ce_num_valid_;
  Tensor g_, dn_, d_o_, dq_, dk_, dv_, delta_, dh_, da_, rms_ws_, emb_ws_;
  // TP only: the gathered [t, H] input of q/k/v, fc1 and the LM head (and gathered gradients),
  // the partial [t, H] sums before a reduce-scatter (also the embedding lookup's), the reordering
  // scratch for B > 1, the micro-batch's ids mapped to this rank's vocabulary rows [t].
  Tensor ag_, rs_, perm_, ids_loc_;
  kernels::Buffer logits_ws_;  // GatherLogits' scratch, allocated on first use
  // Context parallelism (cp_size > 1), shared by the layers: the CP-ordered all-gather [CP·T_loc,
  // Hkv, D], the whole-sequence K and V [B·S, Hkv, D] in natural order, their gradients, and one
  // chunk's dK/dV [S, Hkv, D] before it is added.
  Tensor cp_gather_, cp_k_, cp_v_, cp_dk_, cp_dv_, cp_dk_part_, cp_dv_part_;
  absl::Status CpGatherKv(const Stream& s, const Tensor& local, const Tensor& whole, int64_t b,
                          int64_t s_loc);
  absl::Status CpReduceScatterKv(const Stream& s, const Tensor& whole, const Tensor& local,
                                 int64_t b, int64_t s_loc);
  absl::Status CpAttentionForward(const Stream& s, Layer& L, int64_t b, int64_t s_loc);
  absl::Status CpAttentionBackward(const Stream& s, Layer& L, int64_t b, int64_t s_loc);
  // Stats slots: CE loss sums [max_micro], MoE losses [max_micro, L_moe, n+1],
  // tokens per expert [max_micro, L_moe, E] i32.
  Tensor stat_ce_, stat_moe_losses_, stat_counts_;
  int64_t num_moe_terms_ = 0;
};

}  // namespace switchyard::model

#endif  // SWITCHYARD_WORKER_MODEL_GPT_MODEL_H_
