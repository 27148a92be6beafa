// File: worker/train/trainer.h
//
// Single-process training of a GptModel (worker/model/gpt_model.h) on one GPU, or on the CPU:
// data loading from a Megatron indexed dataset (or mock tokens), micro-batches with gradient
// accumulation, global gradient-norm clipping, AdamW with fp32 master weights over the flat
// parameter buffer (two launches: decay and no-decay groups), Megatron's LR schedule,
// aux-loss-free expert-bias updates, per-step statistics, and atomic checkpoints that resume
// bit-identically.
//
// One step (the global batch = global_batch_size sequences of seq_length tokens):
//   grads = 0
//   for each of the global_batch_size / micro_batch_size micro-batches (samples in order):
//     GptModel::ForwardBackward with ce_scale = 1 / (global batch tokens) and aux_grad_scale =
//     1 / (number of micro-batches)          (Megatron's per-micro-batch mean, averaged)
//   norm = ||grads||, clip coefficient on the device; read norm (the only host sync before the
//   update): a non-finite norm skips the update (counted, logged), else AdamW with lr =
//   LrAt(completed steps)
//   expert-bias update and global_aux_loss reset; statistics read back once.
//
// Data: sample i of the run is GptSamples::Sample(i) (deterministic by training.seed), step k
// reads samples [k·GBS, (k+1)·GBS) — so a resumed run reads exactly what the uninterrupted run
// would have read. data.data_path takes one dataset prefix; empty (and not mock_data) selects the
// default corpus of tools/prepare_corpus.sh (data/corpus.h).
//
// Checkpoints: sharded (worker/checkpoint/sharded_checkpoint.h; <save>/step_N/shard_<rank>.
// safetensors + manifest.json) under global tensor names: <name> (fp32 — or the CPU model's f64 —
// master weights under the GptModel tensor names), exp_avg.<name>, exp_avg_sq.<name>,
// expert_bias [moe layers, E]; metadata: step, consumed_samples, skipped_steps, forward_counter
// (the jitter RNG), seed, job_spec (JSON) and the saving mapping (tensor/context/expert/
// expert-tensor/data/pipeline parallel sizes, world_size). One process writes one shard file of
// whole tensors. Load reshards from any saved mapping, and reads the older single-file format
// (model.safetensors, optimizer.safetensors, router.safetensors: whole tensors, same names).
//
// Pipeline parallelism (PP > 1; PipelineMicroBatches, Megatron's non-interleaved 1F1B): each stage
// holds its layers only (GptModel "Pipeline parallelism"), runs its DP rank's micro-batches in
// order (warm-up forwards PP - stage - 1, steady 1F1B, cool-down backwards) and sends activations
// and their gradients with Send/Recv on ProcessGroups::pp, blocking (no overlap with compute).
// Loss and MoE statistics are summed over PP for the log line, the dense squared grad norm over
// PP too. Tied embeddings: the last stage holds a copy of the embedding as its LM head, and the
// two stages sum their embedding gradients after the schedule (Megatron's embedding group); the
// copy is counted once in the norm and saved once. global_aux_loss: one running count per layer
// over the stage's in-flight slots (GptModel). EvalLoss and Evaluate run Megatron's forward-only
// pipeline schedule (PipelineForwardOnly), the loss summed over PP so every rank gets it.
// Interleaved (VPP > 1; InterleavedMicroBatches): each stage holds VPP model chunks (chunk v of
// stage p = layer chunk v·PP + p of PP·VPP, pipeline_layout.h) and runs Megatron's interleaved
// order as pipeline_schedule.h's PipelineProgram: lock-step rounds, each round's messages in one
// global order (deadlock-free with blocking Send/Recv), received tensors held until their op.
//
// Distributed (TrainerOptions::groups; data, expert, tensor, context and pipeline parallelism in
// any combination): every rank holds the dense parameters (its TP shard of the TP-split
// ones: GptModel's "Tensor and sequence parallelism") and its EP rank's experts (megatron_moe.md
// §3.2, §5). The TP ranks of one DP rank run the same micro-batches, each on its sequence shard;
// under context parallelism the CP ranks of one DP rank run the same micro-batches, each with its
// two chunks of every sequence (gpt_model.h; with TP too, every TP rank gets the CP rank's
// chunks and the model keeps its shard of them). The gradients of the TP-replicated tensors are
// summed over TP in the last micro-batch's backward hook (AllReduceTpReplicatedGrads), and the
// TP-split region has an optimizer instance of its own whose squared norm is summed over TP (the
// replicated one counts once). With DP data-parallel ranks (the DP group, without TP and CP) and
// M = GBS / MBS micro-batches per global batch, rank d runs micro-batches j = m·DP + d
// (m < M / DP) — sample ranges as Megatron's pretraining sampler gives them — with the
// single-process scales (ce_scale = 1 / global batch tokens, aux_grad_scale = 1 / M) and the
// jitter counter of micro-batch j, so the SUM over ranks of the gradients is exactly the
// single-process gradient. Optimizer: two DistributedAdamW (ZeRO-1) instances with grad_scale 1
// (the sum): dense parameters over DP×CP, expert parameters over EDP, one global norm
// (distributed_optimizer.h, "Two instances"); with TP a third, the TP-split dense region, also
// over DP×CP. Loss, aux losses and expert counts are summed over TP×DP×CP for the log line (each
// TP or CP rank's are its share; aux terms then averaged over DP); expert-bias and
// global_aux_loss counts over TP×DP×CP inside the model. Gradient buckets are reduce-scattered
// during the backward pass of the last micro-batch (TrainerOptions::overlap_grad_reduce;
// worker/train/grad_reducer.h).
// Checkpoints are sharded: every rank writes, in parallel, only what its distributed-optimizer
// shards own (the fp32 master weights and Adam moments of its flat ranges, each recorded as a
// flat range of its TP/EP/ETP slice of the global tensor: checkpoint_shards.h; the TP-replicated
// region by TP rank 0 only, the expert bias by rank 0), and rank 0 writes the manifest after a
// barrier. Load reshards: each rank reads its model-parallel slice of the master weights (its
// parameters) and only its owned ranges of the moments, from the overlapping saved pieces, so a
// run resumes with any other DP, EP, ETP, TP or CP size, or as one process (and a checkpoint of
// one process resumes distributed). The model-dtype parameters are not saved: Load casts the
// master weights. The checkpoint directory must be visible to every rank (one machine, or a
// shared file system). TrainerOptions::async_save writes in a background thread (Save).
//
// data.split (Megatron's "969,30,1" train/valid/test weights, worker/train/data_split.h):
// training reads the first share of the documents, as Megatron's _get_split_indices cuts it (the
// same documents, hence the same samples, as before evaluation existed); evaluation reads the
// second; the third (test) is not read. An empty split is all documents for training (and, with
// training.eval_interval, defaults to "969,30,1": common/config/config_defaults.h).
//
// Validation (Evaluate, in evaluate.cc; Megatron's evaluate): training.eval_iters global batches
// of the valid split, sample i of the evaluation being GptSamples::Sample(i) of the valid
// documents' own index (same seed and seq_length, built for eval_iters × global_batch_size
// samples), read from its start at EVERY evaluation, each DP rank its micro-batches as in a
// step. Forward only, in evaluation mode (GptModel::SetTraining(false): no input jitter, no
// aux-loss statistics, no expert-bias counts; the jitter counter restored); no gradient, optimizer,
// data position or RNG change, so the training steps after it are exactly those of a run without
// it. The loss is the sum of the cross-entropy terms over all tokens, all-reduced over TP×DP×CP
// like the step loss, divided by eval_iters × global batch tokens. RunTrainingLoop calls it every
// training.eval_interval steps and after the last step (StepResult::validation_loss). At PP > 1
// (VPP too) Megatron's forward-only pipeline schedule runs the micro-batches (every op in
// warm-up, PipelineProgram rounds); the last stage's loss sum is all-reduced over PP as well, so
// every rank returns (and logs) the same validation loss. Deliberate difference from Megatron: its
// valid iterator continues across evaluations (consumed_valid_samples grows, each evaluation sees
// the next eval_iters batches); ours restarts, so every evaluation (and RunEvaluation on a
// checkpoint) scores the same tokens and the curve compares like with like. With
// data.mock_data the valid batches are mock samples of an index range of their own (from 2^48;
// Megatron builds a mock valid dataset likewise), so a mock-data job can evaluate too.
// data.tokenizer_model: the tokenizer.json the dataset was made with (data/bpe_tokenizer.h); its
// vocabulary is the default model.vocab_size, and a smaller explicit one is rejected.
// model.attention_backend and training.deterministic_mode select the CUDA attention settings
// (kernels/attention/attention.h); SWITCHYARD_ATTENTION_BACKEND / _DETERMINISTIC override them,
// with a WARNING log line per override. They are process-wide (one trainer per worker process).
//
// FLOPs, TFLOP/s and MFU: model FLOPs per token from GptTrainingFlopsPerToken (Megatron-style:
// active-parameter GEMMs, causal attention, LM head; fwd + bwd = 3 × fwd), divided by the step's
// wall time; MFU divides by the peak (default 989.4 TFLOP/s: H100/H200 dense bf16, as
// BASELINES.md; no MFU on the CPU).
#ifndef SWITCHYARD_WORKER_TRAIN_TRAINER_H_
#define SWITCHYARD_WORKER_TRAIN_TRAINER_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/pipeline_schedule.h"
#include "common/tensor.h"
#include "data/gpt_samples.h"
#include "kernels/attention/attention.h"
#include "kernels/runtime/buffer.h"
#include "kernels/runtime/stream.h"
#include "switchyard/v1/config.pb.h"
#include "worker/checkpoint/sharded_checkpoint.h"
#include "worker/model/gpt_model.h"
#include "worker/model/profiling.h"
#include "worker/train/data_split.h"
#include "worker/train/distributed_optimizer.h"
#include "worker/train/grad_reducer.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/process_groups.h"

namespace switchyard::train {

struct TrainerOptions {
  Device device = Device::Cpu();
  // Parameter/activation dtype. kUnknown-like default: bf16 on CUDA (unless training.bf16 is
  // false: then f32), f32 on the CPU. Tests set f64 on the CPU.
  bool force_dtype = false;
  DType dtype = DType::kF32;
  double peak_tflops = 989.4;  // for MFU; <= 0: no MFU
  // Distributed run: this process is rank `groups->rank` of the job (see "Distributed" above).
  // Borrowed; outlives the trainer. nullptr: one process.
  ProcessGroups* groups = nullptr;
  // CUDA only: the compute stream (a cudaStream_t, borrowed). Required with NCCL groups (it must
  // be the stream their communicators run on); nullptr otherwise makes the trainer create its own.
  CUstream_st* cuda_stream = nullptr;
  // Distributed: reduce-scatter gradient buckets on a background thread during the last
  // micro-batch's backward pass (ProcessGroups::grad_* groups), as Megatron's
  // --overlap-grad-reduce. Buckets are cut at layer boundaries once they hold at least
  // grad_bucket_elements (Megatron's default bucket size: 40M); only when the data-parallel
  // sizes divide 64 (the layout's alignment), else one bucket per optimizer, reduced after the
  // backward pass.
  bool overlap_grad_reduce = true;
  int64_t grad_bucket_elements = 40'000'000;
  // Megatron's --async-save: Save copies the state to the host on the calling thread and writes
  // the files in a background thread; the next Save (or Load, PollSave, WaitForSave) waits for
  // it and reports its error.
  bool async_save = false;
  // Evaluation only (RunEvaluation, `switchyard-worker --eval`): no training samples are built
  // (a split may give training no document: "0,1,0" evaluates a whole dataset), Step() is
  // refused, the valid split is prepared even without training.eval_interval, and Load accepts
  // a checkpoint saved with another global batch size (no data position to resume).
  bool evaluate_only = false;
};

struct StepResult {
  int64_t step = 0;     // number of completed optimizer steps after this one
  double loss = 0;      // mean cross-entropy over the global batch (nats/token)
  double aux_loss = 0;  // load-balancing losses (coefficients included), mean over MoE layers
  double z_loss = 0;    // router z-loss (coefficient included), mean over MoE layers
  double lr = 0;
  double grad_norm = 0;  // before clipping
  bool skipped = false;  // non-finite gradient norm: no update
  // Step time: CUDA events on the trainer's stream from the start of the step to the end of its
  // statistics read-back (GPU), the host clock over the same span (CPU).
  double step_ms = 0;
  double tokens_per_s = 0;
  double tflops = 0;                     // model TFLOP/s
  double mfu = -1;                       // fraction of peak; < 0 when unknown (CPU)
  std::vector<double> expert_imbalance;  // per MoE layer: max / mean tokens per expert
  // Per MoE layer: tokens routed to each expert over the whole global batch (all ranks).
  std::vector<std::vector<int64_t>> expert_tokens;
  // Set by RunTrainingLoop on the steps where it evaluated (Trainer::Evaluate, after this step's
  // update): the validation loss (nats/token); perplexity = exp(validation_loss).
  std::optional<double> validation_loss;
};

class Trainer {
 public:
  // `spec` as loaded from a file: defaults are applied and the spec is validated here.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(v1::JobSpec spec,
                                                         const TrainerOptions& options);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  ~Trainer();

  // Runs one optimizer step.
  absl::StatusOr<StepResult> Step();
  // Mean cross-entropy of the current parameters on the first global batch of the run (forward
  // only; nothing changes). For comparing the same weights across devices.
  absl::StatusOr<double> EvalLoss();
  // The validation loss of the current parameters (see "Validation" above; evaluate.cc):
  // collective when distributed. FAILED_PRECONDITION when the trainer has no valid split
  // (neither training.eval_interval nor TrainerOptions::evaluate_only).
  absl::StatusOr<double> Evaluate();
  // Writes the samples Evaluate scores (all ranks' share, evaluation order) to `path` as int32
  // [eval_iters x global batch, seq_length + 1]; one process only (FAILED_PRECONDITION when
  // distributed), a dataset's valid split only (not mock data).
  absl::Status WriteValidationTokens(const std::string& path) const;
  // training.eval_iters (its default when unset); 0 when this trainer does not evaluate.
  int64_t eval_iters() const { return evaluates() ? eval_iters_ : 0; }
  // Whether RunTrainingLoop evaluates after completed step `step` (training.eval_interval).
  bool EvaluationDue(int64_t step) const;
  // Completed optimizer steps.
  int64_t step() const { return step_; }
  int64_t train_iters() const { return spec_.training().train_iters(); }
  // The vocabulary of data.tokenizer_model (0 when the spec names none).
  int64_t tokenizer_vocab() const { return tokenizer_vocab_; }

  // Saves the training state as sharded checkpoint step() under `root` (collective when
  // distributed: every rank writes its own shards; worker/checkpoint/sharded_checkpoint.h) and
  // returns its directory. With TrainerOptions::async_save the state is copied to the host here
  // and written by a background thread: the directory is committed later (PollSave /
  // WaitForSave / the next Save or Load, which first wait for it and return its error).
  absl::StatusOr<std::string> Save(const std::string& root);
  // Asynchronous save: when every rank's background write is done, commits the manifest
  // (collective: call on every rank, e.g. after each step; one small all-reduce while a save is
  // in flight, nothing otherwise). Returns the failed save's error, never dropping it.
  absl::Status PollSave();
  // Waits for the asynchronous save in flight (if any) and commits it (collective); its error.
  absl::Status WaitForSave();
  // Restores the state from `root` (latest verified step, or `step` when >= 0), resharding a
  // checkpoint saved by any mapping (or the single-file format) to this trainer's. The
  // checkpoint's global tensor shapes must equal this trainer's.
  absl::Status Load(const std::string& root, int64_t step = -1);
  // Overwrites the parameters (and fp32 master weights) with HF-converted tensors and resets the
  // optimizer; used to fine-tune an imported model. `get` returns f32/f64 CPU tensors by name.
  absl::Status SetParameters(const std::function<absl::StatusOr<Tensor>(const std::string&)>& get);
  // The master weights of `name` as a CPU tensor (f32 or f64), e.g. for export.
  absl::StatusOr<kernels::Buffer> MasterToHost(const std::string& name) const;

  // "step 12/300 | loss 5.4321 | aux ... | MFU 31.5% | imbalance 1.23 1.31"
  std::string FormatLogLine(const StepResult& r) const;
  // One line describing the run (model size, data, batch, dtype, device).
  std::string Describe() const;

  // Timing of the last step (worker/model/profiling.h): its step time and its ranges. By default
  // only the top-level sections are timed (zero_grads, data[m], forward_backward[m],
  // grad_reduce_wait, optimizer, end_global_batch, step_stats: a few CUDA events per step);
  // SetTimingDepth(-1) times every nested range (layers, MoE and dispatcher phases) for a
  // breakdown, at the cost of two events per range.
  const model::StepTiming& last_timing() const { return last_timing_; }
  void SetTimingDepth(int depth) { timer_.set_max_depth(depth); }

  model::GptModel& model() { return *model_; }
  const v1::JobSpec& spec() const { return spec_; }
  const model::GptConfig& model_config() const { return model_->config(); }
  int64_t tokens_per_step() const;
  // Gradient buckets reduced during the backward pass (0 without overlap or with one process).
  int num_overlapped_buckets() const { return static_cast<int>(bucket_plan_.size()); }

 private:
  Trainer() = default;
  absl::Status Init(const TrainerOptions& options);
  // Samples [first_sample, first_sample + count) of `from` (default: the training samples).
  absl::Status LoadMicroBatch(int64_t first_sample, int64_t count,
                              const GptSamples* from = nullptr);
  // The valid split's sample index (evaluate.cc), when this trainer evaluates: `all` the
  // dataset's documents, `valid` the valid range of data.split (none when the split is empty).
  absl::Status InitEvaluation(const std::shared_ptr<TokenDocuments>& all,
                              const std::optional<DocumentRange>& valid, int64_t num_documents);
  absl::Status CastMasterToParams(const Stream& stream);
  bool distributed() const { return groups_ != nullptr; }
  // One process: norm, clip and two AdamW launches over the whole flat buffer.
  absl::Status SingleProcessUpdate(StepResult* r);
  // Fills the statistics, timing and throughput fields of a finished step.
  StepResult FinishStepResult(StepResult r, const model::GptStepStats& stats, double step_ms) const;
  absl::Status InitDistributedOptimizer(const Tensor& master_init);
  // Distributed: gradient reduction, global norm, AdamW on the shards, parameter all-gather.
  absl::Status DistributedUpdate(StepResult* r);
  // TP > 1: sums the gradients of the TP-replicated dense tensors that are final after backward
  // hook `index` (GptModel::SetBackwardHook) over the TP group; in the last micro-batch.
  absl::Status AllReduceTpReplicatedGrads(int64_t index);
  // Sums `v` over `group` (staged through the device on CUDA).
  absl::Status AllReduceDoubles(comm::Communicator* group, std::vector<double>* v);
  // groups_->Synchronize() when distributed (OK otherwise): the bounded wait for every
  // collective the compute thread enqueued, due before the host reads a result or waits on
  // stream_ (NCCL collectives return before completing; communicator.h "Completion").
  absl::Status SynchronizeGroups();
  // Distributed stats: sums over the data-parallel group (loss, counts; aux losses averaged).
  absl::Status ReduceStats(model::GptStepStats* stats);
  // Distributed: master, exp_avg, exp_avg_sq of the full LOCAL layout, gathered from the shards.
  // The world group as the sharded checkpoint's collective (one process: rank 0 of 1).
  CheckpointGroup CheckpointGroupOf();
  struct AsyncSave;
  std::unique_ptr<AsyncSave> async_save_;  // the asynchronous save in flight, if any

  v1::JobSpec spec_;
  TrainerOptions options_;
  ProcessGroups* groups_ = nullptr;
  int dp_ = 1, dp_rank_ = 0;  // size(DP) and this rank's position in it (micro-batch owner)
  int cp_ = 1, cp_rank_ = 0;  // context parallelism: this rank holds chunks cp_rank_ and
                              // 2·cp_−1−cp_rank_ of each sequence of its DP rank's samples
  int pp_ = 1, pp_rank_ = 0;  // pipeline: this rank is stage pp_rank_ of pp_
  int vpp_ = 1;               // model chunks per stage (interleaved schedule when > 1)
  // PP > 1: the pool of [t/TP, H] message buffers, PipelinePoolBuffers of them allocated at Init
  // (the interleaved step's received activations and gradients, evaluation's forward-only
  // receives at any VPP); taken and returned over the rounds and steps, never grown.
  std::vector<kernels::Buffer> pp_spare_;  // the free ones of the pool, PipelinePoolBuffers
  int64_t pp_pool_size_ = 0;
  // A pipeline message buffer shaped like pp_input_ from the pool (pp_spare_); an internal error
  // when all are taken (the pool never grows past the count the memory estimate uses).
  absl::StatusOr<kernels::Buffer> TakePipelineBuffer();
  // Pipeline: receive buffers of one micro-batch's stage input and output gradient [t/TP, H].
  kernels::Buffer pp_input_, pp_output_grad_;
  // Tied embeddings at PP > 1 (Megatron's embedding group, megatron_parallel.md §3.7): the first
  // and the last stage each hold embedding.weight (the last as its LM head); after the schedule
  // their gradients are summed between the two (SumSharedEmbeddingGrad), so both copies take the
  // same update. The last stage's copy is left out of the norm and of checkpoints.
  bool shared_embedding_ = false;
  kernels::Buffer embedding_grad_peer_;  // the other stage's embedding gradient [V, H]
  absl::Status SumSharedEmbeddingGrad();
  // The last stage's part of the global squared norm that is its embedding copy (see
  // DistributedUpdate); collective over the dense optimizer's group.
  absl::StatusOr<double> SharedEmbeddingSquaredNorm();
  // GptModel::GradReadyIndex, except the shared embedding: kReadyAfterSchedule (no backward hook
  // has it: its gradient is complete only after SumSharedEmbeddingGrad, so its bucket is reduced
  // with the optimizer step, and its TP sum is SumSharedEmbeddingGrad's too).
  static constexpr int64_t kReadyAfterSchedule = -2;
  int64_t ReadyIndex(const model::ParamInfo& p) const;
  // Pipeline: the 1F1B schedule of one step (Step), Megatron's non-interleaved order.
  absl::Status PipelineMicroBatches(float ce_scale, double aux_scale, uint64_t counter0,
                                    const std::function<absl::Status(int64_t)>& hook);
  // Evaluation at PP > 1 (evaluate.cc): one batch's forward-only PipelineProgram; `load(m)`
  // loads this rank's micro-batch m into ids / targets.
  absl::Status PipelineForwardOnly(const std::vector<PipelineRound>& program, const Tensor& ids,
                                   const Tensor& targets,
                                   const std::function<absl::Status(int64_t)>& load);
  // Pipeline with VPP > 1: Megatron's interleaved 1F1B as pipeline_schedule.h's PipelineProgram.
  absl::Status InterleavedMicroBatches(float ce_scale, double aux_scale, uint64_t counter0,
                                       const std::function<absl::Status(int64_t)>& hook);
  int64_t num_micro_global_ = 1;  // micro-batches per global batch over all DP ranks
  // dense_opt_: the TP-replicated dense region (all of it without TP); tp_shard_opt_: the
  // TP-sharded dense region (null without TP); expert_opt_: the experts.
  std::unique_ptr<DistributedAdamW> dense_opt_, tp_shard_opt_, expert_opt_;
  kernels::AttentionSettings attention_;  // CUDA: the job's (spec, then environment overrides)
  int64_t tokenizer_vocab_ = 0;           // data.tokenizer_model's vocabulary (0: none given)
  // Overlapped gradient reduction: the buckets of both optimizers with the backward-hook index
  // after which each is final (GptModel::GradReadyIndex).
  struct PlannedBucket {
    DistributedAdamW* optimizer = nullptr;
    int index = 0;
    int64_t ready = 0;
    Tensor grads;
    comm::Communicator* group = nullptr;
    bool launched = false;
  };
  std::vector<PlannedBucket> bucket_plan_;
  std::unique_ptr<GradReducer> reducer_;
  // Bucket ends of the region [begin, begin + size) and the ready index of each bucket.
  void PlanBuckets(int64_t begin, int64_t size, int dp, std::vector<int64_t>* ends,
                   std::vector<int64_t>* ready) const;
  kernels::Buffer scalar_ws_;  // device f64 staging for AllReduceDoubles
  Stream stream_;
  kernels::OwnedStream own_stream_;  // the compute stream when the options gave none (CUDA)
  std::unique_ptr<model::GptModel> model_;
  model::PhaseTimer timer_;  // the step's sections; events pooled across steps
  model::StepTiming last_timing_;
  std::unique_ptr<LrSchedule> lr_;
  std::shared_ptr<const GptSamples> samples_;
  std::shared_ptr<const GptSamples> valid_samples_;  // evaluation only; null: no evaluation
  // Mock data (data.mock_data) with training.eval_interval: the valid batches are mock samples
  // of their own index range (kMockValidFirstSample on), as Megatron builds a mock valid dataset.
  bool mock_eval_ = false;
  bool evaluates() const { return valid_samples_ != nullptr || mock_eval_; }
  int64_t eval_iters_ = 0;
  std::string data_description_;
  int64_t step_ = 0, consumed_samples_ = 0, skipped_steps_ = 0;
  int64_t micro_batch_ = 1, num_micro_ = 1, seq_ = 0;  // seq_: the whole sequence (S)
  int64_t local_seq_ = 0;                              // S / CP tokens per sequence on this rank
  uint64_t mock_seed_ = 0;
  bool mock_ = false;
  double flops_per_token_ = 0;
  // Optimizer state over the flat layout, and scalars.
  kernels::Buffer master_, exp_avg_, exp_avg_sq_;
  kernels::Buffer norm_ws_, sum_sq_, norm_, coef_;
  // Host staging and device copies of one micro-batch.
  kernels::Buffer host_ids_, host_targets_, ids_, targets_;
};

// The one training loop, shared by standalone runs (RunStandalone) and the agent's generations
// (worker/agent/generation.cc): steps until training.train_iters, `max_steps` steps of this call
// or a stop request; saves every training.save_interval steps (and when a checkpoint is
// requested) when training.save is set, and, unless stopped, once more at the end when the last
// step has no checkpoint yet. Errors are annotated with the step ("step 12: ...") or the save.
struct TrainingLoopHooks {
  int64_t max_steps = 0;                           // > 0: at most that many steps in this call
  std::function<bool()> stop_requested;            // checked before every step; null: never
  std::function<void(const StepResult&)> on_step;  // after every step (log line, report)
  // After every step's interval decision: whether a checkpoint was requested besides the
  // interval (the agent's CheckpointNow, agreed over the ranks). Null: never.
  std::function<absl::StatusOr<bool>(const StepResult&)> checkpoint_requested;
  // A checkpoint was written to `dir` (`requested`: checkpoint_requested asked for this one).
  // With TrainerOptions::async_save: an interval save was started; it commits after a later
  // step (PollSave) or at the end of the loop, whose error then ends the loop. A requested save
  // is committed (WaitForSave) before this is called.
  std::function<void(const std::string& dir, bool requested)> on_saved;
  // A checkpoint was requested but training.save is empty.
  std::function<void()> on_request_ignored;
};
struct TrainingLoopResult {
  int64_t steps = 0;     // steps run by this call
  bool stopped = false;  // ended by stop_requested (no final checkpoint then)
};
absl::StatusOr<TrainingLoopResult> RunTrainingLoop(Trainer* trainer,
                                                   const TrainingLoopHooks& hooks);

// Options of the standalone loop beyond the job spec.
struct StandaloneOptions {
  int64_t max_steps = 0;        // > 0: stop after that many steps of this invocation
  std::string init_from_hf;     // HF Mixtral/Qwen3-MoE directory: its config.json replaces
                                // spec.model (seq_length kept) and its weights initialise the model
  std::string export_hf;        // write the trained model as an HF directory at the end
  bool progress_bar = true;     // on stderr when it is a terminal (off for ranks other than 0)
  std::string hf_architecture;  // for export_hf without init_from_hf: MixtralForCausalLM or
                                // Qwen3MoeForCausalLM (default: Qwen3MoeForCausalLM)
};

// The standalone loop: trains until training.train_iters, printing one log line per
// training.log_interval steps to `out` and a progress bar with ETA on stderr when it is a
// terminal; saves every training.save_interval steps and at the end when training.save is set;
// resumes per worker/train/resume.h (training.save when it holds a checkpoint, else training.load).
absl::Status RunStandalone(v1::JobSpec spec, const TrainerOptions& options,
                           const StandaloneOptions& standalone, std::FILE* out);

// Evaluating a checkpoint (RunEvaluation; `switchyard-worker --eval --load DIR`).
struct EvaluationOptions {
  // Our checkpoint: a training.save directory (its latest committed step) or one of its
  // step_<N> directories; or a Hugging Face directory (it holds config.json: ImportHfModel, whose
  // config replaces spec.model, seq_length kept; one process only).
  std::string load;
  // Non-empty (one process only): the token windows scored, written here as int32 [samples,
  // seq_length + 1] in evaluation order (inputs [:, :-1], targets [:, 1:]).
  std::string tokens_out;
};
// Loads `evaluation.load` into an evaluate-only trainer of `spec` and returns Evaluate(): the
// loss over training.eval_iters (default 100) global batches of data.split's valid share
// (default "969,30,1" when the spec has no split) of the spec's dataset, the same number the
// training run printed for those weights. Prints the run description, what was loaded and
// "validation loss X | validation ppl Y ..." to `out`. Collective when options.groups is set.
absl::StatusOr<double> RunEvaluation(v1::JobSpec spec, TrainerOptions options,
                                     const EvaluationOptions& evaluation, std::FILE* out);

// The number of documents (of `num_documents`) that training reads under data.split `split`:
// Megatron's first split share (e.g. "969,30,1" of 1000 documents: 969), SplitDocuments' train
// range. INVALID_ARGUMENT naming data.split when it is malformed or leaves training no document.
absl::StatusOr<int64_t> TrainDocuments(const std::string& split, int64_t num_documents);

}  // namespace switchyard::train

#endif  // SWITCHYARD_WORKER_TRAIN_TRAINER_H_
