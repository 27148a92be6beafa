// The single-process trainer: data, micro-batching, clipping, AdamW, checkpoints, logging.
#include "worker/train/trainer.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config/config.h"
#include "common/config/config_defaults.h"
#include "common/config/validate.h"
#include "common/logging.h"
#include "common/model/engine_support.h"
#include "common/model/pipeline_layout.h"
#include "common/status.h"
#include "data/bpe_tokenizer.h"
#include "data/corpus.h"
#include "data/indexed_dataset.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/rope.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/optim/adamw.h"
#include "kernels/optim/grad_norm.h"
#include "kernels/runtime/cuda_status.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/checkpoint/hf_convert.h"
#include "worker/checkpoint/sharded_checkpoint.h"
#include "worker/model/tensor_copy.h"
#include "worker/train/checkpoint_shards.h"
#include "worker/train/resume.h"

namespace switchyard::train {
namespace {

using model::CopyAsync;
using model::Slice;

using kernels::Buffer;
using model::GptConfig;
using model::GptModel;
using model::ParamInfo;

// Token j of mock sample i: a counter-based hash, the same on every run and device.
int32_t MockToken(uint64_t seed, int64_t i, int64_t j, int64_t vocab) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i) * 0x100000001b3ull +
               static_cast<uint64_t>(j);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<int32_t>(z % static_cast<uint64_t>(vocab));
}

std::string FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

std::string FormatCount(double v) {
  if (v >= 1e9) return absl::StrFormat("%.2fG", v / 1e9);
  if (v >= 1e6) return absl::StrFormat("%.2fM", v / 1e6);
  if (v >= 1e3) return absl::StrFormat("%.1fk", v / 1e3);
  return absl::StrFormat("%.0f", v);
}

}  // namespace

// An asynchronous save in flight (Trainer::Save with TrainerOptions::async_save): the host
// copies, the writer viewing them, and the thread writing this rank's file.
struct Trainer::AsyncSave {
  ShardedCheckpointWriter writer;
  std::vector<Buffer> keep;
  ShardedSave save;
  std::thread thread;
  std::atomic<bool> done{false};
  absl::Status own;  // WriteOwn's result; read after join
  ~AsyncSave() {
    if (thread.joinable()) thread.join();
  }
};

Trainer::~Trainer() {
  if (async_save_ != nullptr) {
    // A save still in flight: finishing it is collective, which a destructor cannot do; its
    // file is written (joined) and the step stays uncommitted (never loads).
    SY_LOG(WARNING) << "Trainer destroyed with an asynchronous save of step "
                    << async_save_->save.step << " unfinished (call WaitForSave); it is dropped";
    async_save_.reset();
  }
  // model_ is destroyed before own_stream_ (declared after it), the stream its work ran on.
}

namespace {

// The first `count` documents of `base`: the training share of data.split.
class FirstDocuments final : public TokenDocuments {
 public:
  FirstDocuments(std::shared_ptr<TokenDocuments> base, int64_t count)
      : base_(std::move(base)), count_(count) {}
  int64_t num_documents() const override { return count_; }
  int64_t DocumentLength(int64_t doc) const override { return base_->DocumentLength(doc); }
  absl::Status ReadTokens(int64_t doc, int64_t offset, absl::Span<int32_t> out) const override {
    return base_->ReadTokens(doc, offset, out);
  }

 private:
  std::shared_ptr<TokenDocuments> base_;
  int64_t count_;
};

}  // namespace

absl::StatusOr<int64_t> TrainDocuments(const std::string& split, int64_t num_documents) {
  // Megatron's _get_split_indices (data_split.h): training reads documents [0, split_indices[1]).
  SY_ASSIGN_OR_RETURN(const auto ranges, SplitDocuments(split, num_documents));
  if (ranges[0].size() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.split (\"", split, "\") leaves no training document of ", num_documents));
  }
  return ranges[0].size();
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(v1::JobSpec spec,
                                                         const TrainerOptions& options) {
  std::unique_ptr<Trainer> t(new Trainer());
  t->spec_ = std::move(spec);
  t->options_ = options;
  SY_RETURN_IF_ERROR(t->Init(options));
  return t;
}

absl::Status Trainer::Init(const TrainerOptions& options) {
  timer_.set_max_depth(0);  // the step log's sections only; SetTimingDepth(-1) for a breakdown
  v1::JobSpec& spec = spec_;
  // Data first: the default corpus decides the vocabulary when the spec leaves it unset.
  const v1::DataConfig& data = spec.data();
  mock_ = data.mock_data();
  std::string prefix;
  // data.tokenizer_model: the tokenizer the dataset was made with decides the vocabulary when the
  // spec leaves it unset, and bounds it from below when it is set (token ids index the embedding).
  if (!data.tokenizer_model().empty()) {
    absl::StatusOr<BpeTokenizer> tokenizer = BpeTokenizer::Load(data.tokenizer_model());
    if (!tokenizer.ok()) {
      return absl::Status(tokenizer.status().code(),
                          absl::StrCat("data.tokenizer_model (\"", data.tokenizer_model(),
                                       "\"): ", tokenizer.status().message()));
    }
    const int64_t vocab = tokenizer->vocab_size();
    if (!spec.model().has_vocab_size()) {
      spec.mutable_model()->set_vocab_size(static_cast<int32_t>(vocab));
    } else if (spec.model().vocab_size() < vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.vocab_size (", spec.model().vocab_size(),
          ") must be at least the vocabulary of data.tokenizer_model (", vocab, " tokens)"));
    }
    tokenizer_vocab_ = vocab;
  }
  if (mock_ && !data.split().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.split (\"", data.split(),
                     "\") needs a dataset: data.mock_data has no documents to split"));
  }
  if (!mock_) {
    if (data.data_path_size() > 1) {
      return absl::UnimplementedError(
          "data.data_path: blending several datasets is not supported yet; give one prefix");
    }
    if (data.data_path_size() == 1) {
      prefix = data.data_path(0);
      data_description_ = prefix;
    } else {
      SY_ASSIGN_OR_RETURN(CorpusInfo corpus, FindDefaultCorpus());
      prefix = corpus.dataset_prefix;
      data_description_ = absl::StrCat("default corpus \"", corpus.name, "\" (",
                                       corpus.source_package, " ", corpus.package_version, ")");
      if (!spec.model().has_vocab_size()) spec.mutable_model()->set_vocab_size(corpus.vocab_size);
    }
  } else {
    data_description_ = "mock data (random tokens)";
  }
  groups_ = options.groups;
  const int world = groups_ ? groups_->layout.world_size() : 1;
  if (spec.parallel().has_world_size() && spec.parallel().world_size() != world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.world_size (", spec.parallel().world_size(), ") must be ", world,
        groups_ ? " (the number of ranks this job was launched with)"
                : " for a standalone worker (multi-worker jobs need --world-size or the "
                  "coordinator)"));
  }
  spec.mutable_parallel()->set_world_size(world);
  ApplyDefaults(&spec);
  SY_RETURN_IF_ERROR(ValidateJobSpec(spec));
  if (!spec.model().has_vocab_size()) {
    return absl::InvalidArgumentError(
        "model.vocab_size: required with mock data or a dataset prefix (no tokenizer to ask)");
  }
  const v1::ParallelConfig& par = spec.parallel();
  // The engine's one rule (common/model/engine_support.h; nothing the layout rules accept is
  // refused today).
  if (std::string why = UnsupportedJobSpec("", spec); !why.empty()) {
    return absl::UnimplementedError(why);
  }
  // Tensor parallelism: the launched layout's, or none for a standalone worker.
  const int64_t launched_tp = groups_ != nullptr ? groups_->layout.tp() : 1;
  if (par.tensor_model_parallel_size() != launched_tp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.tensor_model_parallel_size (", par.tensor_model_parallel_size(), ") must be ",
        launched_tp, groups_ ? " (the launched layout)" : " for a standalone worker"));
  }
  // Context parallelism: the launched layout's, or none for a standalone worker.
  const int64_t launched_cp = groups_ != nullptr ? groups_->layout.cp() : 1;
  if (par.has_context_parallel_size() && par.context_parallel_size() != launched_cp) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.context_parallel_size (", par.context_parallel_size(), ") must be ",
                     launched_cp, groups_ ? " (the launched layout)" : " for a standalone worker"));
  }
  // Pipeline parallelism: the launched layout's, or none for a standalone worker.
  const int64_t launched_pp = groups_ != nullptr ? groups_->layout.pp() : 1;
  if (par.pipeline_model_parallel_size() != launched_pp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.pipeline_model_parallel_size (", par.pipeline_model_parallel_size(), ") must be ",
        launched_pp, groups_ ? " (the launched layout)" : " for a standalone worker"));
  }
  // Expert parallelism: the launched layout's, or none for a standalone worker.
  const int64_t launched_ep = groups_ != nullptr ? groups_->layout.ep() : 1;
  if (par.has_expert_model_parallel_size() && par.expert_model_parallel_size() != launched_ep) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.expert_model_parallel_size (", par.expert_model_parallel_size(), ") must be ",
        launched_ep, groups_ ? " (the launched layout)" : " for a standalone worker"));
  }
  const int64_t launched_etp = groups_ != nullptr ? groups_->layout.etp() : 1;
  if (par.has_expert_tensor_parallel_size() && par.expert_tensor_parallel_size() != launched_etp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.expert_tensor_parallel_size (", par.expert_tensor_parallel_size(), ") must be ",
        launched_etp, groups_ ? " (the launched layout)" : " for a standalone worker"));
  }

  if (spec.parallel().num_distributed_optimizer_instances() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.num_distributed_optimizer_instances (",
        spec.parallel().num_distributed_optimizer_instances(),
        ") must be 1: the worker shards its optimizer over the whole data-parallel group"));
  }

  // Attention backend and determinism: the spec's, unless the environment overrides them.
  const Device device = options.device;
  if (device.is_cuda()) {
    kernels::AttentionSettings from_spec;
    SY_ASSIGN_OR_RETURN(from_spec.backend,
                        kernels::ParseAttentionBackend(spec.model().attention_backend().empty()
                                                           ? "auto"
                                                           : spec.model().attention_backend()));
    from_spec.deterministic = spec.training().deterministic_mode();
    std::vector<std::string> overrides;
    SY_ASSIGN_OR_RETURN(attention_, kernels::ResolveAttentionSettings(from_spec, &overrides));
    for (const std::string& line : overrides) SY_LOG(WARNING) << line;
    kernels::SetAttentionSettings(attention_);
  }

  // Dtype, stream.
  if (!device.is_cuda() && spec.training().has_bf16() && spec.training().bf16()) {
    return absl::InvalidArgumentError(
        "training.bf16 (true) needs a CUDA device: the CPU engine is the fp32 reference "
        "(DESIGN.md, Numerics); leave it unset or false on the CPU");
  }
  DType dtype = device.is_cuda() ? DType::kBF16 : DType::kF32;
  if (device.is_cuda() && spec.training().has_bf16() && !spec.training().bf16()) {
    dtype = DType::kF32;
  }
  if (options.force_dtype) dtype = options.dtype;
  // The CUDA grouped GEMM (kernels/gemm/grouped_gemm.h) takes bf16 inputs only: an MoE model in
  // fp32 on a GPU would fail at its first step; refuse it here, naming the field.
  if (device.is_cuda() && dtype != DType::kBF16 && spec.model().num_experts() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training.bf16 (false) on a CUDA device: the MoE layers' grouped GEMM runs in bf16 only "
        "on GPUs (the fp32 reference is the CPU engine); leave training.bf16 unset or true, got ",
        DTypeName(dtype)));
  }
  stream_ = Stream{device, nullptr};
  if (device.is_cuda() && options.cuda_stream != nullptr) {
    SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(device.index));
    stream_.cuda_stream = options.cuda_stream;
  } else if (device.is_cuda()) {
    if (groups_ != nullptr) {
      return absl::InvalidArgumentError(
          "TrainerOptions.cuda_stream: required on CUDA with process groups (the stream the "
          "NCCL communicators run on)");
    }
    SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(device.index));
    SY_ASSIGN_OR_RETURN(own_stream_, kernels::OwnedStream::Create(device));
    stream_ = own_stream_.view();
  }

  // Model.
  const v1::TrainingConfig& tr = spec.training();
  micro_batch_ = tr.micro_batch_size();
  const int64_t gbs = tr.global_batch_size();
  if (gbs % micro_batch_ != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.global_batch_size (", gbs,
                     ") must be divisible by training.micro_batch_size (", micro_batch_, ")"));
  }
  num_micro_global_ = gbs / micro_batch_;
  SY_ASSIGN_OR_RETURN(GptConfig config, GptConfig::FromProto(spec.model(), dtype));
  model::GptParallelGroups model_groups;
  if (groups_ != nullptr) {
    const ParallelLayout& pl = groups_->layout;
    // Samples are split over DP only: the CP ranks of one DP rank share its samples, each with
    // its own two chunks of every sequence (megatron_parallel.md §2.1).
    dp_ = pl.GroupSize(ParallelGroup::kData);
    dp_rank_ = pl.RankInGroup(ParallelGroup::kData, groups_->rank);
    cp_ = pl.cp();
    cp_rank_ = pl.RankInGroup(ParallelGroup::kContext, groups_->rank);
    if (gbs % (micro_batch_ * dp_) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "training.global_batch_size (", gbs, ") must be divisible by micro_batch_size (",
          micro_batch_, ") x data-parallel size (", dp_, ")"));
    }
    if (dtype == DType::kF64) {
      return absl::InvalidArgumentError(
          "distributed training keeps fp32 master weights: the model dtype must be f32 or bf16");
    }
    config.moe.ep_size = pl.ep();
    config.moe.ep_rank = pl.RankInGroup(ParallelGroup::kExpert, groups_->rank);
    // Expert tensor parallelism: this rank's slice of its experts' F (worker/model/moe_layer.h).
    config.moe.etp_size = pl.etp();
    config.moe.etp_rank = pl.RankInGroup(ParallelGroup::kExpertTensor, groups_->rank);
    config.expert_shard_multiple = pl.GroupSize(ParallelGroup::kExpertData);
    config.dense_shard_multiple = pl.GroupSize(ParallelGroup::kDataContext);
    config.tp_size = pl.tp();
    config.tp_rank = pl.RankInGroup(ParallelGroup::kTensor, groups_->rank);
    config.cp_size = cp_;
    config.cp_rank = cp_rank_;
    // Pipeline: stage pp_rank_'s layers, an equal share or the uneven layout of
    // parallel.decoder_first/last_pipeline_num_layers (rules checked by ValidateJobSpec).
    pp_ = pl.pp();
    pp_rank_ = pl.RankInGroup(ParallelGroup::kPipeline, groups_->rank);
    config.pp_size = pp_;
    config.pp_rank = pp_rank_;
    PipelineSplit split;
    split.num_layers = config.num_layers;
    split.pp = pp_;
    if (par.has_decoder_first_pipeline_num_layers()) {
      split.first_stage_layers = par.decoder_first_pipeline_num_layers();
    }
    if (par.has_decoder_last_pipeline_num_layers()) {
      split.last_stage_layers = par.decoder_last_pipeline_num_layers();
    }
    // Interleaved (VPP > 1): model chunk v of this stage is the v·PP + stage-th of the PP·VPP
    // layer chunks (pipeline_layout.h); the stage's layers are the chunks together.
    vpp_ = par.has_virtual_pipeline_model_parallel_size() && pp_ > 1
               ? std::max<int>(1, par.virtual_pipeline_model_parallel_size())
               : 1;
    split.vpp = vpp_;
    for (int v = 0; v < vpp_; ++v) {
      SY_ASSIGN_OR_RETURN(const LayerRange chunk, StageLayers(split, pp_rank_, v));
      if (vpp_ > 1) {
        config.chunk_begin.push_back(chunk.begin);
        config.chunk_end.push_back(chunk.begin + chunk.count);
      }
      if (v == 0) config.layer_begin = chunk.begin;
      config.layer_end = chunk.begin + chunk.count;
    }
    if (vpp_ > 1) {
      // The interleaved order keeps more micro-batches alive than 1F1B (and on the last stage
      // too): one activation slot for each (common/model/pipeline_schedule.h
      // PipelineAliveMicroBatches, the count the memory estimate uses).
      SY_ASSIGN_OR_RETURN(config.pipeline_slots,
                          PipelineAliveMicroBatches(pp_, pp_rank_, vpp_, num_micro_global_ / dp_));
    }
    model_groups = {groups_->expert, groups_->tdc, groups_->etp,
                    groups_->etp_ep, groups_->tp,  groups_->cp};
  }
  num_micro_ = num_micro_global_ / dp_;
  seq_ = config.seq_length;
  local_seq_ = seq_ / cp_;  // GptConfig::Validate checked seq_length % (2·CP) == 0
  SY_ASSIGN_OR_RETURN(model_,
                      GptModel::Create(config, device, micro_batch_, num_micro_, model_groups));
  shared_embedding_ =
      pp_ > 1 && !config.untie_embeddings && (config.first_stage() || config.last_stage());
  flops_per_token_ = model::GptTrainingFlopsPerToken(config);

  // Optimizer state: master (f32, or f64 for an f64 CPU model), exp_avg, exp_avg_sq.
  const int64_t n = model_->layout().total;
  const DType mdt = dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  if (!distributed()) {
    SY_ASSIGN_OR_RETURN(master_, Buffer::ForTensor(mdt, {n}, device));
    SY_ASSIGN_OR_RETURN(exp_avg_, Buffer::ForTensor(mdt, {n}, device));
    SY_ASSIGN_OR_RETURN(exp_avg_sq_, Buffer::ForTensor(mdt, {n}, device));
    SY_RETURN_IF_ERROR(kernels::FillBytes(exp_avg_.View(), 0));
    SY_RETURN_IF_ERROR(kernels::FillBytes(exp_avg_sq_.View(), 0));
  }
  SY_ASSIGN_OR_RETURN(norm_ws_,
                      Buffer::ForTensor(DType::kF64, {kernels::kGradNormWorkspace}, device));
  SY_ASSIGN_OR_RETURN(sum_sq_, Buffer::ForTensor(DType::kF32, {1}, device));
  SY_ASSIGN_OR_RETURN(norm_, Buffer::ForTensor(DType::kF32, {1}, device));
  SY_ASSIGN_OR_RETURN(coef_, Buffer::ForTensor(DType::kF32, {1}, device));
  const uint64_t seed = static_cast<uint64_t>(tr.seed());
  if (!distributed()) {
    SY_RETURN_IF_ERROR(model_->InitMaster(stream_, seed, master_.View()));
    SY_RETURN_IF_ERROR(CastMasterToParams(stream_));
  } else {
    // The distributed optimizers keep only their shards, initialised directly (issue 15, item 2):
    // no full fp32 master and Adam moments are ever held. The initial values are computed once
    // into the fp32 gradient buffer, which holds nothing before the first backward (so this costs
    // no memory), cast to the parameters, and each optimizer copies its shard from there; the
    // moments start at zero in the shards. Only a model whose gradients are not fp32 (none that
    // distributed training accepts today: f32 on the CPU, fp32 main grads on CUDA) would need a
    // temporary fp32 copy of the master, and only of the master.
    const Tensor grads = model_->grads();
    Buffer scratch;
    Tensor init;
    if (grads.dtype == mdt && grads.numel() >= n) {
      init = Tensor(mdt, {n}, grads.device, grads.data);
    } else {
      SY_ASSIGN_OR_RETURN(scratch, Buffer::ForTensor(mdt, {n}, device));
      init = scratch.View();
    }
    SY_RETURN_IF_ERROR(model_->InitMaster(stream_, seed, init));
    SY_RETURN_IF_ERROR(kernels::Cast(stream_, init, model_->params()));
    SY_RETURN_IF_ERROR(InitDistributedOptimizer(init));
    // The gradient buffer is zero again before the first step. On CUDA the shards were copied
    // with cudaMemcpy, which may return before a device-to-device copy is done and is not ordered
    // with stream_ (non-blocking): wait for the device before overwriting the values (after the
    // groups' bounded Synchronize, so that the device wait cannot hang on a collective).
    if (device.is_cuda()) {
      SY_RETURN_IF_ERROR(SynchronizeGroups());
      SY_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    }
    SY_RETURN_IF_ERROR(model_->ZeroGrads(stream_));
  }

  // LR schedule.
  LrScheduleConfig lc;
  lc.lr = tr.lr();
  lc.min_lr = tr.min_lr();
  lc.lr_warmup_iters = tr.lr_warmup_iters();
  lc.lr_decay_iters = tr.lr_decay_iters();
  SY_ASSIGN_OR_RETURN(lc.lr_decay_style, ParseLrDecayStyle(tr.lr_decay_style()));
  SY_ASSIGN_OR_RETURN(LrSchedule schedule, LrSchedule::Create(lc));
  lr_ = std::make_unique<LrSchedule>(schedule);

  // Samples.
  const int64_t total_samples = tr.train_iters() * gbs;
  mock_seed_ = seed ^ 0x5eed5eed5eedull;
  if (mock_ && tr.has_eval_interval()) {
    eval_iters_ = tr.has_eval_iters() ? tr.eval_iters() : kDefaultEvalIters;
    mock_eval_ = true;
  }
  if (!mock_) {
    SY_ASSIGN_OR_RETURN(IndexedDataset dataset, IndexedDataset::Open(prefix));
    const std::shared_ptr<TokenDocuments> all =
        std::make_shared<IndexedDatasetDocuments>(std::move(dataset));
    const int64_t num_docs = all->num_documents();
    std::shared_ptr<TokenDocuments> docs = all;
    std::optional<DocumentRange> valid;  // none without a split: every document trains
    if (!spec.data().split().empty()) {
      // SplitDocuments' train range is [0, n): the same FirstDocuments view (so the same sample
      // index and loss curve) as before the valid range was used.
      SY_ASSIGN_OR_RETURN(const auto ranges, SplitDocuments(spec.data().split(), num_docs));
      const int64_t train_docs = ranges[0].size();
      if (train_docs <= 0 && !options.evaluate_only) {
        return absl::InvalidArgumentError(absl::StrCat("data.split (\"", spec.data().split(),
                                                       "\") leaves no training document of ",
                                                       num_docs));
      }
      if (train_docs < num_docs) {
        docs = std::make_shared<FirstDocuments>(std::move(docs), train_docs);
      }
      valid = ranges[1];
      data_description_ +=
          absl::StrCat(", split \"", spec.data().split(), "\": ", train_docs,
                       " training documents, ", ranges[1].size(), " validation documents");
    }
    if (!options.evaluate_only) {
      GptSampleOptions so;
      so.seq_length = seq_;
      so.seed = seed;
      so.num_samples = total_samples;
      SY_ASSIGN_OR_RETURN(GptSamples samples, GptSamples::Build(docs, so));
      samples_ = std::make_shared<const GptSamples>(std::move(samples));
    }
    SY_RETURN_IF_ERROR(InitEvaluation(all, valid, num_docs));
  }
  if (pp_ > 1) {
    const int64_t tl = micro_batch_ * local_seq_ / model_->config().tp_size;
    const int64_t h = model_->config().hidden_size;
    SY_ASSIGN_OR_RETURN(pp_input_, Buffer::ForTensor(dtype, {tl, h}, device));
    SY_ASSIGN_OR_RETURN(pp_output_grad_, Buffer::ForTensor(dtype, {tl, h}, device));
    // The message-buffer pool, whole from the start: the one count the memory estimate uses too
    // (pipeline_schedule.h PipelinePoolBuffers: the training step's and evaluation's receives).
    SY_ASSIGN_OR_RETURN(pp_pool_size_, PipelinePoolBuffers(pp_, pp_rank_, vpp_, num_micro_));
    for (int64_t i = 0; i < pp_pool_size_; ++i) {
      SY_ASSIGN_OR_RETURN(Buffer b, Buffer::ForTensor(dtype, {tl, h}, device));
      pp_spare_.push_back(std::move(b));
    }
    if (shared_embedding_) {
      SY_ASSIGN_OR_RETURN(const Tensor g, model_->Grad("embedding.weight"));
      SY_ASSIGN_OR_RETURN(embedding_grad_peer_, Buffer::ForTensor(g.dtype, g.shape, device));
    }
  }
  // The host staging holds the micro-batch's whole samples (LoadMicroBatch slices them to this
  // CP rank's tokens in place); the device copies hold only this rank's tokens.
  const int64_t t = micro_batch_ * seq_, t_local = micro_batch_ * local_seq_;
  SY_ASSIGN_OR_RETURN(host_ids_, Buffer::ForTensor(DType::kI32, {t}, Device::Cpu()));
  SY_ASSIGN_OR_RETURN(host_targets_, Buffer::ForTensor(DType::kI32, {t}, Device::Cpu()));
  if (device.is_cuda()) {
    SY_ASSIGN_OR_RETURN(ids_, Buffer::ForTensor(DType::kI32, {t_local}, device));
    SY_ASSIGN_OR_RETURN(targets_, Buffer::ForTensor(DType::kI32, {t_local}, device));
  }
  return absl::OkStatus();
}

int64_t Trainer::tokens_per_step() const { return num_micro_global_ * micro_batch_ * seq_; }

absl::Status Trainer::CastMasterToParams(const Stream& stream) {
  return kernels::Cast(stream, master_.View(), model_->params());
}

absl::Status Trainer::LoadMicroBatch(int64_t first_sample, int64_t count, const GptSamples* from) {
  const GptSamples* samples = from != nullptr ? from : samples_.get();
  const int64_t vocab = model_->config().vocab_size;
  int32_t* ids = host_ids_.View().as<int32_t>();
  int32_t* targets = host_targets_.View().as<int32_t>();
  std::vector<int32_t> sample(seq_ + 1);
  for (int64_t b = 0; b < count; ++b) {
    const int64_t i = first_sample + b;
    if (mock_ && from == nullptr) {
      for (int64_t j = 0; j <= seq_; ++j) sample[j] = MockToken(mock_seed_, i, j, vocab);
    } else {
      SY_RETURN_IF_ERROR(samples->Sample(i, absl::MakeSpan(sample)));
    }
    for (int64_t j = 0; j < seq_; ++j) {
      if (sample[j] < 0 || sample[j] >= vocab || sample[j + 1] < 0 || sample[j + 1] >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data: sample ", i, " has token id ", std::max(sample[j], sample[j + 1]),
            " outside the vocabulary [0, ", vocab, ") (model.vocab_size too small for the data)"));
      }
      ids[b * seq_ + j] = sample[j];
      targets[b * seq_ + j] = sample[j + 1];
    }
  }
  if (cp_ > 1) {
    // Keep this rank's two chunks of every sequence (chunk cp_rank_, then 2·CP−1−cp_rank_), in
    // place: local token i of sequence b is token CpGlobalPosition(i) of the sample.
    std::vector<int32_t> whole_ids(ids, ids + count * seq_),
        whole_t(targets, targets + count * seq_);
    for (int64_t b = 0; b < count; ++b) {
      for (int64_t i = 0; i < local_seq_; ++i) {
        const int64_t g = kernels::CpGlobalPosition(i, local_seq_, cp_, cp_rank_);
        ids[b * local_seq_ + i] = whole_ids[b * seq_ + g];
        targets[b * local_seq_ + i] = whole_t[b * seq_ + g];
      }
    }
  }
  if (stream_.is_cuda()) {
    // The previous micro-batch's kernels may still read ids_/targets_: copies on the stream.
    cudaStream_t s = stream_.cuda_stream;
    SY_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(ids_.data(), ids, count * local_seq_ * 4, cudaMemcpyHostToDevice, s));
    SY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(targets_.data(), targets, count * local_seq_ * 4,
                                            cudaMemcpyHostToDevice, s));
    // The host staging buffers are reused by the next micro-batch: wait for the copies. The
    // stream also holds the previous micro-batch's collectives, which return before completing:
    // their groups' bounded Synchronize first, so that this wait is for local work only.
    SY_RETURN_IF_ERROR(SynchronizeGroups());
    SY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Trainer::Step() {
  const v1::TrainingConfig& tr = spec_.training();
  const int64_t gbs = num_micro_global_ * micro_batch_;
  if (options_.evaluate_only) {
    return absl::FailedPreconditionError(
        "Trainer::Step: this trainer was created with TrainerOptions.evaluate_only (no training "
        "samples)");
  }
  if (consumed_samples_ + gbs > tr.train_iters() * gbs) {
    return absl::OutOfRangeError(
        absl::StrCat("training finished: ", step_, " of ", tr.train_iters(), " steps done"));
  }
  const Stream& s = stream_;
  // The step's sections are NVTX ranges timed by CUDA events (host clock on the CPU); nothing
  // here waits for them: they are read after the statistics read-back synchronised the stream.
  SY_RETURN_IF_ERROR(timer_.BeginStep(s));
  absl::Cleanup end_step = [this, &s] {
    if (timer_.in_step()) timer_.EndStep(s).IgnoreError();  // error path: the error wins
  };
  {
    // The expert gradients are not zeroed: each MoE layer's first backward of the step writes
    // them (GptModel::ExpertGrads::kOverwrite), whatever the schedule.
    model::ScopedRange range(s, "zero_grads");
    SY_RETURN_IF_ERROR(model_->ZeroGrads(s, model::GptModel::ExpertGrads::kOverwrite));
  }
  const float ce_scale = static_cast<float>(1.0 / static_cast<double>(gbs * seq_));
  const double aux_scale = 1.0 / static_cast<double>(num_micro_global_);
  const uint64_t counter0 = model_->forward_counter();
  // The last micro-batch's backward launches each gradient bucket as soon as it is final.
  auto hook = [this](int64_t index) -> absl::Status {
    // TP-replicated gradients are summed over TP first (§1.9): each rank's are partial (its
    // sequence shard's, or the other ranks' heads' contribution to a norm).
    SY_RETURN_IF_ERROR(AllReduceTpReplicatedGrads(index));
    for (PlannedBucket& b : bucket_plan_) {
      if (b.launched || index > b.ready) continue;
      model::ScopedRange range(stream_, "grad_reduce_launch", b.index);
      SY_RETURN_IF_ERROR(reducer_->Launch(stream_, {b.optimizer, b.index, b.grads, b.group}));
      b.launched = true;
    }
    return absl::OkStatus();
  };
  if (pp_ > 1) {
    absl::Status st = vpp_ > 1 ? InterleavedMicroBatches(ce_scale, aux_scale, counter0, hook)
                               : PipelineMicroBatches(ce_scale, aux_scale, counter0, hook);
    if (reducer_ != nullptr) {
      model::ScopedRange range(s, "grad_reduce_wait");
      const absl::Status reduced = reducer_->Wait();
      for (PlannedBucket& pb : bucket_plan_) pb.launched = false;
      if (st.ok()) st = reduced;
    }
    SY_RETURN_IF_ERROR(st);
    SY_RETURN_IF_ERROR(SumSharedEmbeddingGrad());
  }
  for (int64_t m = 0; pp_ == 1 && m < num_micro_; ++m) {
    // Micro-batch j of the global batch (this rank's m-th; j = m with one process).
    const int64_t j = m * dp_ + dp_rank_;
    {
      model::ScopedRange range(s, "data", m);
      SY_RETURN_IF_ERROR(LoadMicroBatch(consumed_samples_ + j * micro_batch_, micro_batch_));
    }
    if (distributed()) model_->set_forward_counter(counter0 + static_cast<uint64_t>(j));
    // This rank's tokens: micro_batch_ × local_seq_ (the whole sequences without CP; with TP
    // every TP rank gets them all and the model keeps its sequence shard).
    const int64_t n = micro_batch_ * local_seq_;
    const Tensor ids = Slice(s.is_cuda() ? ids_.View() : host_ids_.View(), 0, {n});
    const Tensor targets = Slice(s.is_cuda() ? targets_.View() : host_targets_.View(), 0, {n});
    const bool tp = model_->config().tp_size > 1;
    if ((reducer_ != nullptr || tp) && m + 1 == num_micro_) model_->SetBackwardHook(hook);
    absl::Status st = model_->ForwardBackward(s, ids, targets, local_seq_, ce_scale, aux_scale,
                                              static_cast<int>(m));
    model_->SetBackwardHook(nullptr);
    if (reducer_ != nullptr && m + 1 == num_micro_) {
      // Every launched reduction must finish before anything touches the gradients again.
      model::ScopedRange range(s, "grad_reduce_wait");
      const absl::Status reduced = reducer_->Wait();
      for (PlannedBucket& pb : bucket_plan_) pb.launched = false;
      if (st.ok()) st = reduced;
    }
    SY_RETURN_IF_ERROR(st);
  }
  StepResult r;
  {
    // Distributed: gradient reduction (without overlap), global norm, AdamW, all-gather.
    model::ScopedRange range(s, "optimizer");
    if (distributed()) {
      model_->set_forward_counter(counter0 + static_cast<uint64_t>(num_micro_global_));
      SY_RETURN_IF_ERROR(DistributedUpdate(&r));
    } else {
      SY_RETURN_IF_ERROR(SingleProcessUpdate(&r));
    }
  }
  {
    model::ScopedRange range(s, "end_global_batch");
    SY_RETURN_IF_ERROR(model_->EndGlobalBatch(s));
  }
  model::GptStepStats stats;
  {
    model::ScopedRange range(s, "step_stats");
    // ReadStepStats synchronises the stream, which holds the step's collectives: wait for those
    // first, bounded (a stuck peer fails here, naming its group, instead of hanging).
    SY_RETURN_IF_ERROR(SynchronizeGroups());
    SY_ASSIGN_OR_RETURN(stats, model_->ReadStepStats(s, static_cast<int>(num_micro_)));
    if (distributed()) SY_RETURN_IF_ERROR(ReduceStats(&stats));
  }
  SY_RETURN_IF_ERROR(timer_.EndStep(s));
  // ReadStepStats (and ReduceStats) synchronised the stream: the events are complete.
  SY_RETURN_IF_ERROR(timer_.ResolveInto(&last_timing_));
  consumed_samples_ += gbs;
  ++step_;
  return FinishStepResult(r, stats, last_timing_.step_ms);
}

absl::Status Trainer::PipelineMicroBatches(float ce_scale, double aux_scale, uint64_t counter0,
                                           const std::function<absl::Status(int64_t)>& hook) {
  // Megatron's forward_backward_pipelining_without_interleaving: warm-up forwards (PP - stage -
  // 1), then one forward and one backward each (1F1B), then the remaining backwards. Every stage
  // runs its micro-batches in order m = 0..M-1 (this DP rank's), so the jitter counter and the
  // stats slot of micro-batch m are one process's. The last stage computes the loss and the
  // backward in its forward step (ForwardBackward); its backward step only hands that gradient on.
  const Stream& s = stream_;
  comm::Communicator* pp = groups_->pp;
  const bool first = pp_rank_ == 0, last = pp_rank_ == pp_ - 1;
  const int64_t num = num_micro_;
  const int slots = last ? 1 : model_->num_slots();
  const bool tp = model_->config().tp_size > 1;
  const bool with_hook = reducer_ != nullptr || tp;
  const int64_t n = micro_batch_ * local_seq_;
  const Tensor ids = Slice(s.is_cuda() ? ids_.View() : host_ids_.View(), 0, {n});
  const Tensor targets = Slice(s.is_cuda() ? targets_.View() : host_targets_.View(), 0, {n});
  const Tensor input = pp_input_.View(), output_grad = pp_output_grad_.View();
  // Tags: activation of micro-batch m 2m, its gradient 2m + 1 (unique within a step).
  auto act_tag = [](int64_t m) { return static_cast<uint32_t>(2 * m); };
  auto grad_tag = [](int64_t m) { return static_cast<uint32_t>(2 * m + 1); };
  // One exchange in Megatron's blocking order (p2p_communication._p2p_ops): even stages send to
  // the next stage first, odd stages receive from the previous one first, so two neighbours never
  // both wait in a Send. A null tensor skips that operation (and the edges of the pipeline).
  struct Op {
    const Tensor* t = nullptr;
    int64_t micro = 0;
  };
  auto communicate = [&](Op send_next, Op recv_prev, Op send_prev, Op recv_next) -> absl::Status {
    model::ScopedRange range(s, "pipeline_p2p");
    auto sn = [&]() -> absl::Status {
      if (last || send_next.t == nullptr) return absl::OkStatus();
      return pp->Send(*send_next.t, pp_rank_ + 1, act_tag(send_next.micro));
    };
    auto rp = [&]() -> absl::Status {
      if (first || recv_prev.t == nullptr) return absl::OkStatus();
      return pp->Recv(*recv_prev.t, pp_rank_ - 1, act_tag(recv_prev.micro));
    };
    auto sp = [&]() -> absl::Status {
      if (first || send_prev.t == nullptr) return absl::OkStatus();
      return pp->Send(*send_prev.t, pp_rank_ - 1, grad_tag(send_prev.micro));
    };
    auto rn = [&]() -> absl::Status {
      if (last || recv_next.t == nullptr) return absl::OkStatus();
      return pp->Recv(*recv_next.t, pp_rank_ + 1, grad_tag(recv_next.micro));
    };
    if (pp_rank_ % 2 == 0) {
      SY_RETURN_IF_ERROR(sn());
      SY_RETURN_IF_ERROR(rp());
      SY_RETURN_IF_ERROR(sp());
      return rn();
    }
    SY_RETURN_IF_ERROR(rp());
    SY_RETURN_IF_ERROR(sn());
    SY_RETURN_IF_ERROR(rn());
    return sp();
  };
  auto load = [&](int64_t m) -> absl::Status {
    // Micro-batch j of the global batch (this rank's m-th), as without PP.
    const int64_t j = m * dp_ + dp_rank_;
    model::ScopedRange range(s, "data", m);
    SY_RETURN_IF_ERROR(LoadMicroBatch(consumed_samples_ + j * micro_batch_, micro_batch_));
    model_->set_forward_counter(counter0 + static_cast<uint64_t>(j));
    return absl::OkStatus();
  };
  Tensor last_input_grad;  // last stage: the gradient of its input from ForwardBackward
  auto forward_step = [&](int64_t m, Tensor* output) -> absl::Status {
    SY_RETURN_IF_ERROR(load(m));
    if (!last) {
      return model_->ForwardStage(s, ids, first ? Tensor() : input, local_seq_, static_cast<int>(m),
                                  static_cast<int>(m % slots), output);
    }
    if (with_hook && m + 1 == num) model_->SetBackwardHook(hook);
    absl::Status st = model_->ForwardBackward(s, ids, targets, local_seq_, ce_scale, aux_scale,
                                              static_cast<int>(m), first ? Tensor() : input,
                                              first ? nullptr : &last_input_grad);
    model_->SetBackwardHook(nullptr);
    return st;
  };
  auto backward_step = [&](int64_t m, Tensor* input_grad) -> absl::Status {
    if (last) {
      *input_grad = last_input_grad;
      return absl::OkStatus();
    }
    SY_RETURN_IF_ERROR(load(m));  // the ids again: the embedding backward (and TP shard) read them
    if (with_hook && m + 1 == num) model_->SetBackwardHook(hook);
    absl::Status st = model_->BackwardStage(s, ids, output_grad, local_seq_, aux_scale,
                                            static_cast<int>(m % slots), input_grad);
    model_->SetBackwardHook(nullptr);
    return st;
  };
  // The op order is pipeline_schedule.h's (one source of truth for the schedule arithmetic). The
  // exchanges around each op follow Megatron's 1F1B loop: a forward first receives its input
  // (unless the previous exchange already did), then sends its output, fused with the receive of
  // the gradient when a backward follows (send_forward_recv_backward); a backward first receives
  // its output gradient (unless already received), then sends its input gradient, fused with the
  // receive of the next forward's input when a forward follows (send_backward_recv_forward).
  SY_ASSIGN_OR_RETURN(const std::vector<PipelineOp> ops,
                      PipelineSchedule(pp_, pp_rank_, /*vpp=*/1, num));
  Tensor output, input_grad;
  bool have_input = false, have_output_grad = false;  // received by the previous exchange
  for (size_t i = 0; i < ops.size(); ++i) {
    const PipelineOp& op = ops[i];
    const PipelineOp* next = i + 1 < ops.size() ? &ops[i + 1] : nullptr;
    if (op.forward) {
      if (!have_input) SY_RETURN_IF_ERROR(communicate({}, {&input, op.micro}, {}, {}));
      SY_RETURN_IF_ERROR(forward_step(op.micro, &output));
      have_output_grad = next != nullptr && !next->forward;
      SY_RETURN_IF_ERROR(communicate({&output, op.micro}, {}, {},
                                     have_output_grad ? Op{&output_grad, next->micro} : Op{}));
      have_input = false;
    } else {
      if (!have_output_grad) {
        SY_RETURN_IF_ERROR(communicate({}, {}, {}, {&output_grad, op.micro}));
      }
      SY_RETURN_IF_ERROR(backward_step(op.micro, &input_grad));
      have_input = next != nullptr && next->forward;
      SY_RETURN_IF_ERROR(communicate({}, have_input ? Op{&input, next->micro} : Op{},
                                     {&input_grad, op.micro}, {}));
      have_output_grad = false;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Buffer> Trainer::TakePipelineBuffer() {
  if (pp_spare_.empty()) {
    // Never grows: the estimate counts exactly the pool (a schedule change that holds more
    // buffers must change PipelinePoolBuffers, or memory use would exceed the plan's).
    return absl::InternalError(absl::StrCat(
        "pipeline stage ", pp_rank_, ": all ", pp_pool_size_,
        " message buffers of the pool are taken (pipeline_schedule.h PipelinePoolBuffers "
        "undercounts this schedule: PP ",
        pp_, ", VPP ", vpp_, ", ", num_micro_, " micro-batches)"));
  }
  Buffer b = std::move(pp_spare_.back());
  pp_spare_.pop_back();
  return b;
}

absl::Status Trainer::InterleavedMicroBatches(float ce_scale, double aux_scale, uint64_t counter0,
                                              const std::function<absl::Status(int64_t)>& hook) {
  // Megatron's forward_backward_pipelining_with_interleaving, run as pipeline_schedule.h's
  // PipelineProgram: this stage's ops in Megatron's order, round by round, and after each round
  // the round's messages in the program's one global order (Send / Recv of those naming this
  // stage; see pipeline_schedule.h for why this is deadlock-free with blocking Send/Recv).
  // Micro-batch m keeps its activations in slot m % slots over all its chunks
  // (PipelineAliveMicroBatches sized them). The message buffers come from pp_spare_, the pool of
  // PipelinePoolBuffers allocated at Init (the memory estimate counts them, so a change to when a
  // buffer is taken or freed here must change PipelineReceiveBuffers too, and one in
  // PipelineForwardOnly PipelineForwardOnlyBuffers: PipelinePoolBuffers is their maximum). The last
  // chunk of the last stage computes the loss and its backward in its forward op (ForwardBackward,
  // as 1F1B's last stage); its backward op only sends that input gradient, which waits in a buffer
  // until then.
  const Stream& s = stream_;
  comm::Communicator* pp = groups_->pp;
  const int64_t num = num_micro_;
  const int slots = model_->num_slots();
  const GptConfig& c = model_->config();
  const bool tp = c.tp_size > 1;
  const bool with_hook = reducer_ != nullptr || tp;
  const int64_t n = micro_batch_ * local_seq_;
  const Tensor ids = Slice(s.is_cuda() ? ids_.View() : host_ids_.View(), 0, {n});
  const Tensor targets = Slice(s.is_cuda() ? targets_.View() : host_targets_.View(), 0, {n});
  const Tensor shape = pp_input_.View();  // [t/TP, H] in the model dtype
  // Buffers held between rounds: received activations (kind 0) and gradients (kind 1), and the
  // head chunk's input gradients (kind 2), by (kind, micro, chunk); spare ones are reused.
  std::map<std::tuple<int, int64_t, int64_t>, Buffer> held;
  // Back to the pool on every exit, an error's too: the pool never grows, so a lost buffer would
  // make a later step fail as if PipelinePoolBuffers undercounted.
  absl::Cleanup give_back = [&] {
    for (auto& [key, b] : held) pp_spare_.push_back(std::move(b));
  };
  auto take = [&](std::tuple<int, int64_t, int64_t> key) -> absl::StatusOr<Tensor> {
    SY_ASSIGN_OR_RETURN(Buffer b, TakePipelineBuffer());
    const Tensor view = b.View();
    if (!held.emplace(key, std::move(b)).second) {
      return absl::InternalError("interleaved pipeline: a buffer is received twice");
    }
    return view;
  };
  auto find = [&](std::tuple<int, int64_t, int64_t> key) -> absl::StatusOr<Tensor> {
    auto it = held.find(key);
    if (it == held.end()) {
      return absl::InternalError(absl::StrCat("interleaved pipeline: stage ", pp_rank_,
                                              " has no input for micro-batch ", std::get<1>(key),
                                              " chunk ", std::get<2>(key)));
    }
    return it->second.View();
  };
  auto release = [&](std::tuple<int, int64_t, int64_t> key) {
    auto it = held.find(key);
    if (it == held.end()) return;
    pp_spare_.push_back(std::move(it->second));
    held.erase(it);
  };
  SY_ASSIGN_OR_RETURN(const std::vector<PipelineRound> program, PipelineProgram(pp_, vpp_, num));
  for (const PipelineRound& round : program) {
    Tensor outgoing;  // what this stage's op of the round hands on (its message)
    std::tuple<int, int64_t, int64_t> sent_then_free{-1, 0, 0};
    if (round.has_op[pp_rank_]) {
      const PipelineOp& op = round.ops[pp_rank_];
      const int m = static_cast<int>(op.micro), chunk = static_cast<int>(op.chunk);
      const int slot = m % slots;
      const bool head = c.HeadIn(chunk);
      {
        // Micro-batch j of the global batch (this rank's m-th), as without PP; the ids again
        // for a backward (the embedding backward and the TP vocabulary shard read them).
        const int64_t j = m * dp_ + dp_rank_;
        model::ScopedRange range(s, "data", m);
        SY_RETURN_IF_ERROR(LoadMicroBatch(consumed_samples_ + j * micro_batch_, micro_batch_));
        model_->set_forward_counter(counter0 + static_cast<uint64_t>(j));
      }
      // The last micro-batch's backward of each chunk (all of the chunk's gradients are final
      // after it: the chunks' backwards run in micro-batch order) launches the buckets; the
      // chunks finish in decreasing layer order, as the hook indices require.
      const bool last_backward = m + 1 == num && (op.forward ? head : !head);
      if (with_hook && last_backward) model_->SetBackwardHook(hook);
      absl::Status st;
      if (op.forward) {
        Tensor input;
        if (!c.EmbedsIn(chunk)) {
          SY_ASSIGN_OR_RETURN(input, find({0, m, chunk}));
        }
        if (head) {
          Tensor input_grad;
          st = model_->ForwardBackward(s, ids, targets, local_seq_, ce_scale, aux_scale, m, input,
                                       &input_grad, slot);
          if (st.ok()) {
            SY_ASSIGN_OR_RETURN(const Tensor keep, take({2, m, chunk}));
            st = CopyAsync(s, input_grad, keep);
          }
        } else {
          st = model_->ForwardStage(s, ids, input, local_seq_, m, slot, &outgoing, chunk);
        }
        release({0, m, chunk});
      } else if (head) {
        SY_ASSIGN_OR_RETURN(outgoing, find({2, m, chunk}));
        sent_then_free = {2, m, chunk};
      } else {
        SY_ASSIGN_OR_RETURN(const Tensor output_grad, find({1, m, chunk}));
        st = model_->BackwardStage(s, ids, output_grad, local_seq_, aux_scale, slot, &outgoing,
                                   chunk);
        release({1, m, chunk});
      }
      model_->SetBackwardHook(nullptr);
      SY_RETURN_IF_ERROR(st);
    }
    if (!round.messages.empty()) {
      model::ScopedRange range(s, "pipeline_p2p");
      for (const PipelineMessage& msg : round.messages) {
        if (msg.from == pp_rank_) {
          SY_RETURN_IF_ERROR(pp->Send(outgoing, static_cast<int>(msg.to), msg.tag));
        } else if (msg.to == pp_rank_) {
          SY_ASSIGN_OR_RETURN(const Tensor into,
                              take({msg.activation ? 0 : 1, msg.micro, msg.chunk}));
          SY_RETURN_IF_ERROR(pp->Recv(into, static_cast<int>(msg.from), msg.tag));
        }
      }
    }
    if (std::get<0>(sent_then_free) >= 0) release(sent_then_free);
  }
  if (!held.empty()) {
    return absl::InternalError(absl::StrCat("interleaved pipeline: stage ", pp_rank_,
                                            " ended with ", held.size(), " unused buffers"));
  }
  return absl::OkStatus();
}

absl::Status Trainer::SingleProcessUpdate(StepResult* result) {
  const Stream& s = stream_;
  const v1::TrainingConfig& tr = spec_.training();
  StepResult& r = *result;
  // Clip and update.
  model::PhaseSequence phase(s);
  phase.Next("grad_norm");
  SY_RETURN_IF_ERROR(kernels::GradSquaredNorm(s, model_->grads(), norm_ws_.View(), sum_sq_.View()));
  SY_RETURN_IF_ERROR(kernels::ClipCoefficient(s, sum_sq_.View(), static_cast<float>(tr.clip_grad()),
                                              norm_.View(), coef_.View()));
  float norm = 0;
  if (s.is_cuda()) {
    cudaStream_t cs = s.cuda_stream;
    SY_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(&norm, norm_.data(), sizeof(float), cudaMemcpyDeviceToHost, cs));
    SY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cs));
  } else {
    norm = norm_.View().as<float>()[0];
  }
  r.lr = lr_->LrAt(step_);
  r.grad_norm = norm;
  r.skipped = !std::isfinite(norm);
  phase.Next("adamw");
  if (!r.skipped) {
    kernels::AdamWHyperParams hp;
    hp.lr = r.lr;
    hp.beta1 = tr.adam_beta1();
    hp.beta2 = tr.adam_beta2();
    hp.eps = tr.adam_eps();
    hp.step = step_ - skipped_steps_ + 1;
    const int64_t n = model_->layout().total, split = model_->layout().decay_end;
    const Tensor coef = coef_.View();
    for (int group = 0; group < 2; ++group) {
      const int64_t lo = group == 0 ? 0 : split, hi = group == 0 ? split : n;
      if (hi == lo) continue;
      hp.weight_decay = group == 0 ? tr.weight_decay() : 0.0;
      SY_RETURN_IF_ERROR(kernels::AdamW(
          s, hp, Slice(model_->grads(), lo, {hi - lo}), 1.0f, &coef,
          Slice(master_.View(), lo, {hi - lo}), Slice(exp_avg_.View(), lo, {hi - lo}),
          Slice(exp_avg_sq_.View(), lo, {hi - lo}), Slice(model_->params(), lo, {hi - lo})));
    }
  } else {
    ++skipped_steps_;
  }
  return absl::OkStatus();
}

StepResult Trainer::FinishStepResult(StepResult r, const model::GptStepStats& stats,
                                     double step_ms) const {
  const Stream& s = stream_;
  const int64_t gbs = num_micro_global_ * micro_batch_;
  const double seconds = step_ms / 1e3;
  const double tokens = static_cast<double>(gbs * seq_);
  r.step = step_;
  r.loss = stats.loss_sum / tokens;
  const int64_t n_moe = static_cast<int64_t>(stats.moe_losses.size());
  for (const auto& layer : stats.moe_losses) {
    for (size_t j = 0; j + 1 < layer.size(); ++j) r.aux_loss += layer[j] / n_moe;
    r.z_loss += layer.back() / n_moe;
  }
  r.expert_tokens = stats.expert_tokens;
  for (const auto& counts : stats.expert_tokens) {
    double sum = 0, mx = 0;
    for (int64_t c : counts) {
      sum += static_cast<double>(c);
      mx = std::max(mx, static_cast<double>(c));
    }
    const double mean = sum / static_cast<double>(counts.size());
    r.expert_imbalance.push_back(mean > 0 ? mx / mean : 0.0);
  }
  r.step_ms = step_ms;
  r.tokens_per_s = tokens / seconds;
  // Per GPU (per rank) in a distributed run, as BASELINES.md reports it.
  const double ranks = groups_ ? static_cast<double>(groups_->layout.world_size()) : 1.0;
  r.tflops = flops_per_token_ * tokens / seconds / 1e12 / ranks;
  if (s.is_cuda() && options_.peak_tflops > 0) r.mfu = r.tflops / options_.peak_tflops;
  return r;
}

// ---------------------------------------------------------------------------------------------
// Distributed

namespace {
Tensor Region(const Tensor& flat, int64_t begin, int64_t end) {
  return Slice(flat, begin, {end - begin});
}
}  // namespace

absl::Status Trainer::InitDistributedOptimizer(const Tensor& master_init) {
  const v1::TrainingConfig& tr = spec_.training();
  const model::GptParamLayout& lay = model_->layout();
  kernels::AdamWHyperParams hp;
  hp.beta1 = tr.adam_beta1();
  hp.beta2 = tr.adam_beta2();
  hp.eps = tr.adam_eps();
  hp.weight_decay = tr.weight_decay();
  const Device device = options_.device;
  // grad_scale 1: ce_scale and aux_grad_scale already divide by the global batch, so the SUM over
  // the group is the gradient (see the file comment).
  // Dense parameters: the TP-replicated region [replicated_begin, total) (the whole dense region
  // without TP) and, with TP, the TP-sharded region [expert_end, replicated_begin) on an instance
  // of its own, so that the global norm counts each once (DistributedUpdate).
  const int64_t rb = lay.replicated_begin;
  std::vector<int64_t> dense_ends, dense_ready, expert_ends, expert_ready, shard_ends, shard_ready;
  PlanBuckets(rb, lay.total - rb, groups_->data->size(), &dense_ends, &dense_ready);
  SY_ASSIGN_OR_RETURN(dense_opt_, DistributedAdamW::Create(
                                      groups_->data, device, lay.total - rb, lay.decay_end - rb,
                                      Region(master_init, rb, lay.total), hp, 1.0f, dense_ends));
  if (rb > lay.expert_end) {
    PlanBuckets(lay.expert_end, rb - lay.expert_end, groups_->data->size(), &shard_ends,
                &shard_ready);
    SY_ASSIGN_OR_RETURN(
        tp_shard_opt_,
        DistributedAdamW::Create(groups_->data, device, rb - lay.expert_end, rb - lay.expert_end,
                                 Region(master_init, lay.expert_end, rb), hp, 1.0f, shard_ends));
  }
  if (lay.expert_end > 0) {
    PlanBuckets(0, lay.expert_end, groups_->expert_data->size(), &expert_ends, &expert_ready);
    SY_ASSIGN_OR_RETURN(
        expert_opt_,
        DistributedAdamW::Create(groups_->expert_data, device, lay.expert_end, lay.expert_end,
                                 Region(master_init, 0, lay.expert_end), hp, 1.0f, expert_ends));
  }
  if (options_.overlap_grad_reduce) {
    const Tensor grads = model_->grads();
    for (int b = 0; b < dense_opt_->num_buckets(); ++b) {
      bucket_plan_.push_back(
          {dense_opt_.get(), b, dense_ready[b], Region(grads, rb, lay.total), groups_->grad_data});
    }
    for (int b = 0; tp_shard_opt_ && b < tp_shard_opt_->num_buckets(); ++b) {
      bucket_plan_.push_back({tp_shard_opt_.get(), b, shard_ready[b],
                              Region(grads, lay.expert_end, rb), groups_->grad_data});
    }
    for (int b = 0; expert_opt_ && b < expert_opt_->num_buckets(); ++b) {
      bucket_plan_.push_back({expert_opt_.get(), b, expert_ready[b],
                              Region(grads, 0, lay.expert_end), groups_->grad_expert_data});
    }
    SY_ASSIGN_OR_RETURN(reducer_, GradReducer::Create(device, groups_->grad_stream.view()));
  }
  return absl::OkStatus();
}

void Trainer::PlanBuckets(int64_t begin, int64_t size, int dp, std::vector<int64_t>* ends,
                          std::vector<int64_t>* ready) const {
  std::vector<const ParamInfo*> in;
  for (const ParamInfo& p : model_->layout().params) {
    if (p.offset >= begin && p.offset < begin + size) in.push_back(&p);
  }
  std::sort(in.begin(), in.end(),
            [](const ParamInfo* a, const ParamInfo* b) { return a->offset < b->offset; });
  ends->clear();
  ready->clear();
  // Cuts only at tensor starts (64-element aligned), so every bucket is a multiple of dp long
  // when dp divides 64; otherwise one bucket.
  const bool can_cut = options_.overlap_grad_reduce && 64 % dp == 0;
  int64_t start = 0, min_ready = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < in.size(); ++i) {
    const int64_t r = ReadyIndex(*in[i]);
    min_ready = std::min(min_ready, r);
    if (!can_cut || i + 1 == in.size()) continue;
    const int64_t next = in[i + 1]->offset - begin;
    if (ReadyIndex(*in[i + 1]) != r && next - start >= options_.grad_bucket_elements) {
      ends->push_back(next);
      ready->push_back(min_ready);
      start = next;
      min_ready = std::numeric_limits<int64_t>::max();
    }
  }
  ends->push_back(size);
  ready->push_back(min_ready);
}

absl::StatusOr<double> Trainer::SharedEmbeddingSquaredNorm() {
  // The embedding's part of this rank's reduced shard (between PrepareStep and FinishStep) of the
  // optimizer that holds it, summed as DistributedUpdate sums that optimizer's squares: over its
  // group, and for the TP-sharded region (a vocabulary-parallel embedding) over TP too.
  const model::GptParamLayout& lay = model_->layout();
  const ParamInfo* e = lay.Find("embedding.weight");
  if (e == nullptr) return absl::InternalError("shared embedding: embedding.weight not in layout");
  const bool sharded = e->tp_sharded() && tp_shard_opt_ != nullptr;
  const DistributedAdamW* opt = sharded ? tp_shard_opt_.get() : dense_opt_.get();
  const int64_t region = sharded ? lay.expert_end : lay.replicated_begin;
  const int64_t lo_e = e->offset - region, hi_e = lo_e + e->numel;
  const Tensor shard = opt->grad_shard();
  bool any = false;
  for (const DistributedAdamW::OwnedRun& run : opt->OwnedRuns()) {
    const int64_t lo = std::max(run.begin, lo_e), hi = std::min(run.begin + run.length, hi_e);
    if (lo >= hi) continue;
    SY_RETURN_IF_ERROR(kernels::GradSquaredNorm(
        stream_, Slice(shard, run.shard_offset + lo - run.begin, {hi - lo}), norm_ws_.View(),
        sum_sq_.View(), /*accumulate=*/any));
    any = true;
  }
  std::vector<double> sq = {0.0};
  if (any) {
    float host = 0;
    if (stream_.is_cuda()) {
      cudaStream_t cs = stream_.cuda_stream;
      // The copy to pageable memory blocks the host until the stream reaches it: wait for the
      // stream's collectives first, bounded.
      SY_RETURN_IF_ERROR(SynchronizeGroups());
      SY_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(&host, sum_sq_.data(), sizeof(float), cudaMemcpyDeviceToHost, cs));
      SY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cs));
    } else {
      host = sum_sq_.View().as<float>()[0];
    }
    sq[0] = host;
  }
  SY_RETURN_IF_ERROR(AllReduceDoubles(groups_->data, &sq));
  if (sharded) SY_RETURN_IF_ERROR(AllReduceDoubles(groups_->tp, &sq));
  return sq[0];
}

int64_t Trainer::ReadyIndex(const ParamInfo& p) const {
  if (shared_embedding_ && p.name == "embedding.weight") return kReadyAfterSchedule;
  return model_->GradReadyIndex(p);
}

absl::Status Trainer::SumSharedEmbeddingGrad() {
  if (!shared_embedding_) return absl::OkStatus();
  model::ScopedRange range(stream_, "embedding_grad_sum");
  SY_ASSIGN_OR_RETURN(const Tensor g, model_->Grad("embedding.weight"));
  // TP: a vocabulary-parallel embedding (TP-sharded: this rank's V/TP rows) has its rows' whole
  // gradient here; one whole on every TP rank would hold its sequence shard's part, and as no
  // backward hook has its ready index, its TP sum (AllReduceTpReplicatedGrads') is done here.
  const ParamInfo* e = model_->layout().Find("embedding.weight");
  if (model_->config().tp_size > 1 && e != nullptr && !e->tp_sharded()) {
    SY_RETURN_IF_ERROR(groups_->tp->AllReduce(g, g, comm::ReduceOp::kSum));
  }
  // Megatron's _allreduce_word_embedding_grads over {first stage, last stage}, as one exchange on
  // the pipeline group (first sends first, the last receives first: Gloo's Send blocks until the
  // peer receives); the two ranks share their TP / CP / DP coordinates, so they hold the same
  // vocabulary rows. Both add own + peer: fp32 addition commutes, so the copies stay equal.
  constexpr uint32_t kTag = 0x7fff0000u;  // above every activation / gradient tag of a step
  const bool first = pp_rank_ == 0;
  const int peer = first ? pp_ - 1 : 0;
  const Tensor other = embedding_grad_peer_.View();
  if (first) {
    SY_RETURN_IF_ERROR(groups_->pp->Send(g, peer, kTag));
    SY_RETURN_IF_ERROR(groups_->pp->Recv(other, peer, kTag));
  } else {
    SY_RETURN_IF_ERROR(groups_->pp->Recv(other, peer, kTag));
    SY_RETURN_IF_ERROR(groups_->pp->Send(g, peer, kTag));
  }
  return kernels::Axpby(stream_, 1.0f, g, 1.0f, other, g);
}

absl::Status Trainer::AllReduceTpReplicatedGrads(int64_t index) {
  if (model_->config().tp_size == 1) return absl::OkStatus();
  for (const ParamInfo& p : model_->layout().params) {
    if (p.expert || p.tp_sharded() || ReadyIndex(p) != index) continue;
    SY_ASSIGN_OR_RETURN(Tensor g, model_->Grad(p.name));
    SY_RETURN_IF_ERROR(groups_->tp->AllReduce(g, g, comm::ReduceOp::kSum));
  }
  return absl::OkStatus();
}

absl::Status Trainer::AllReduceDoubles(comm::Communicator* group, std::vector<double>* v) {
  const int64_t n = static_cast<int64_t>(v->size());
  if (n == 0 || group->size() == 1) return absl::OkStatus();
  Tensor host(DType::kF64, {n}, Device::Cpu(), v->data());
  if (!stream_.is_cuda()) return group->AllReduce(host, host, comm::ReduceOp::kSum);
  // (A default Buffer views as a u8 scalar: test the memory, not numel.)
  if (scalar_ws_.data() == nullptr || scalar_ws_.View().numel() < n) {
    SY_ASSIGN_OR_RETURN(scalar_ws_, Buffer::ForTensor(DType::kF64, {n}, options_.device));
  }
  const Tensor dev = Slice(scalar_ws_.View(), 0, {n});
  // Copies on stream_, the group's stream, so that they are ordered with the collective (the
  // synchronous CopyTensor runs on the legacy default stream, which the non-blocking stream_
  // does not wait for). Copies between pageable memory and the device may block the host until
  // the stream reaches them, so nothing unbounded may be pending before either: the groups'
  // Synchronize first (callers come after a host read, so usually nothing is pending), and the
  // all-reduce's own before the device-to-host copy.
  SY_RETURN_IF_ERROR(SynchronizeGroups());
  cudaStream_t cs = stream_.cuda_stream;
  SY_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dev.data, host.data, host.bytes(), cudaMemcpyHostToDevice, cs));
  SY_RETURN_IF_ERROR(group->AllReduce(dev, dev, comm::ReduceOp::kSum));
  SY_RETURN_IF_ERROR(group->Synchronize());
  SY_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host.data, dev.data, host.bytes(), cudaMemcpyDeviceToHost, cs));
  SY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cs));
  return absl::OkStatus();
}

absl::Status Trainer::SynchronizeGroups() {
  return groups_ != nullptr ? groups_->Synchronize() : absl::OkStatus();
}

absl::Status Trainer::DistributedUpdate(StepResult* result) {
  const Stream& s = stream_;
  const v1::TrainingConfig& tr = spec_.training();
  const model::GptParamLayout& lay = model_->layout();
  const Tensor grads = model_->grads(), params = model_->params();
  // Squared norms: dense over DP×CP (every dense element once), expert over EDP, then the
  // distinct experts of the EP ranks added over ETP×EP×PP.
  model::PhaseSequence phase(s);
  phase.Next("reduce_scatter_norm");  // the reduce-scatters not overlapped with the backward
  const int64_t rb = lay.replicated_begin;
  SY_ASSIGN_OR_RETURN(float sq_dense, dense_opt_->PrepareStep(s, Region(grads, rb, lay.total)));
  // TP-sharded dense tensors: each TP rank holds different elements, so their squares are added
  // over TP (the replicated ones above are equal on every TP rank and counted once).
  std::vector<double> sq_shard = {0.0};
  if (tp_shard_opt_ != nullptr) {
    SY_ASSIGN_OR_RETURN(float sq, tp_shard_opt_->PrepareStep(s, Region(grads, lay.expert_end, rb)));
    sq_shard[0] = sq;
    SY_RETURN_IF_ERROR(AllReduceDoubles(groups_->tp, &sq_shard));
  }
  std::vector<double> sq_expert = {0.0};
  if (expert_opt_ != nullptr) {
    SY_ASSIGN_OR_RETURN(float sq, expert_opt_->PrepareStep(s, Region(grads, 0, lay.expert_end)));
    sq_expert[0] = sq;
  }
  // A pipeline stage without MoE layers still joins the ETP×EP×PP sum (its share is 0): the
  // group spans the stages, and a missing member would pair this all-reduce with another.
  if (expert_opt_ != nullptr || pp_ > 1) {
    SY_RETURN_IF_ERROR(AllReduceDoubles(groups_->expert_model, &sq_expert));
  }
  // Pipeline: every stage holds different dense tensors; their squares are added over PP (the
  // expert part is already summed over ETP×EP×PP). A tied embedding is held by the first and the
  // last stage with the same (summed) gradient: the last stage's copy is left out, as Megatron's
  // norm skips parameters marked shared.
  std::vector<double> sq_stage = {static_cast<double>(sq_dense) + sq_shard[0]};
  if (shared_embedding_ && pp_rank_ != 0) {
    SY_ASSIGN_OR_RETURN(const double copy, SharedEmbeddingSquaredNorm());
    sq_stage[0] -= copy;
  }
  if (pp_ > 1) SY_RETURN_IF_ERROR(AllReduceDoubles(groups_->pp, &sq_stage));
  const float total = static_cast<float>(sq_stage[0]) + static_cast<float>(sq_expert[0]);
  StepResult& r = *result;
  r.lr = lr_->LrAt(step_);
  const int64_t adam_step = step_ - skipped_steps_ + 1;
  const float clip = static_cast<float>(tr.clip_grad());
  phase.Next("adamw_allgather");
  SY_ASSIGN_OR_RETURN(
      OptimizerStepResult dense,
      dense_opt_->FinishStep(s, Region(params, rb, lay.total), total, r.lr, adam_step, clip));
  if (tp_shard_opt_ != nullptr) {
    SY_RETURN_IF_ERROR(
        tp_shard_opt_
            ->FinishStep(s, Region(params, lay.expert_end, rb), total, r.lr, adam_step, clip)
            .status());
  }
  if (expert_opt_ != nullptr) {
    SY_RETURN_IF_ERROR(
        expert_opt_->FinishStep(s, Region(params, 0, lay.expert_end), total, r.lr, adam_step, clip)
            .status());
  }
  r.grad_norm = dense.grad_norm;
  r.skipped = dense.skipped;
  if (r.skipped) ++skipped_steps_;
  return absl::OkStatus();
}

absl::Status Trainer::ReduceStats(model::GptStepStats* stats) {
  // One all-reduce: [loss_sum, aux/z terms..., expert counts...] over TP×DP×CP: with TP every
  // rank's values are its sequence shard's share (the aux and z terms too: their sum over TP is
  // the micro-batch's value), so they are summed over TP×CP and averaged over DP.
  std::vector<double> v = {stats->loss_sum, static_cast<double>(stats->tokens)};
  for (const auto& layer : stats->moe_losses) v.insert(v.end(), layer.begin(), layer.end());
  for (const auto& counts : stats->expert_tokens) {
    for (int64_t c : counts) v.push_back(static_cast<double>(c));
  }
  SY_RETURN_IF_ERROR(AllReduceDoubles(groups_->tdc, &v));
  // Pipeline: the loss is the last stage's, each MoE layer's statistics its stage's (zero on the
  // others), so the sum over PP puts them together.
  if (pp_ > 1) SY_RETURN_IF_ERROR(AllReduceDoubles(groups_->pp, &v));
  size_t i = 0;
  stats->loss_sum = v[i++];
  stats->tokens = static_cast<int64_t>(v[i++]);
  for (auto& layer : stats->moe_losses) {
    // Summed over CP (each CP rank's share is its chunks' part of the whole sequence's loss),
    // averaged over DP (the replicas' micro-batch means).
    for (double& x : layer) x = v[i++] / dp_;
  }
  for (auto& counts : stats->expert_tokens) {
    for (int64_t& c : counts) c = static_cast<int64_t>(v[i++]);
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Trainer::EvalLoss() {
  const Stream& s = stream_;
  if (pp_ > 1) {
    // The forward-only pipeline schedule (Evaluate's), over the first global batch.
    SY_ASSIGN_OR_RETURN(const std::vector<PipelineRound> program,
                        PipelineProgram(pp_, vpp_, num_micro_, /*forward_only=*/true));
    const int64_t n = micro_batch_ * local_seq_;
    const Tensor ids = Slice(s.is_cuda() ? ids_.View() : host_ids_.View(), 0, {n});
    const Tensor targets = Slice(s.is_cuda() ? targets_.View() : host_targets_.View(), 0, {n});
    SY_RETURN_IF_ERROR(PipelineForwardOnly(program, ids, targets, [&](int64_t m) {
      return LoadMicroBatch((m * dp_ + dp_rank_) * micro_batch_, micro_batch_);
    }));
  }
  for (int64_t m = 0; pp_ == 1 && m < num_micro_; ++m) {
    SY_RETURN_IF_ERROR(LoadMicroBatch((m * dp_ + dp_rank_) * micro_batch_, micro_batch_));
    // This rank's tokens: micro_batch_ × local_seq_ (the whole sequences without CP).
    const int64_t n = micro_batch_ * local_seq_;
    const Tensor ids = Slice(s.is_cuda() ? ids_.View() : host_ids_.View(), 0, {n});
    const Tensor targets = Slice(s.is_cuda() ? targets_.View() : host_targets_.View(), 0, {n});
    SY_RETURN_IF_ERROR(model_->Forward(s, ids, targets, local_seq_, static_cast<int>(m), Tensor()));
  }
  SY_RETURN_IF_ERROR(SynchronizeGroups());  // before ReadStepStats' stream synchronisation
  SY_ASSIGN_OR_RETURN(model::GptStepStats stats,
                      model_->ReadStepStats(s, static_cast<int>(num_micro_)));
  if (distributed()) SY_RETURN_IF_ERROR(ReduceStats(&stats));
  return stats.loss_sum / static_cast<double>(num_micro_global_ * micro_batch_ * seq_);
}

std::string Trainer::FormatLogLine(const StepResult& r) const {
  std::string line = absl::StrFormat(
      "step %d/%d | loss %.4f | aux %.4g | z %.4g | lr %.3e | grad_norm %.3f | %.1f ms | %s tok/s "
      "| %.1f TFLOP/s | MFU %s",
      r.step, train_iters(), r.loss, r.aux_loss, r.z_loss, r.lr, r.grad_norm, r.step_ms,
      FormatCount(r.tokens_per_s), r.tflops,
      r.mfu >= 0 ? absl::StrFormat("%.1f%%", 100 * r.mfu) : std::string("-"));
  if (!r.expert_imbalance.empty()) {
    absl::StrAppend(&line, " | imbalance");
    for (double v : r.expert_imbalance) absl::StrAppend(&line, absl::StrFormat(" %.2f", v));
  }
  if (r.validation_loss.has_value()) {
    absl::StrAppend(&line, absl::StrFormat(" | validation loss %.6f | validation ppl %.4f",
                                           *r.validation_loss, std::exp(*r.validation_loss)));
  }
  if (r.skipped) absl::StrAppend(&line, " | SKIPPED (non-finite grad norm)");
  return line;
}

std::string Trainer::Describe() const {
  const GptConfig& c = model_->config();
  // Whether the MoE layers run the permutation fused into the experts (moe_permute_fusion).
  std::string moe_permutation;
  for (int64_t l = 0; l < c.num_layers && c.num_moe_layers() > 0; ++l) {
    if (const model::MoELayer* m = model_->moe_layer(l)) {
      moe_permutation =
          absl::StrCat("; MoE permutation: ",
                       m->permute_fused()     ? "fused into the experts (gathered grouped GEMMs)"
                       : c.moe.permute_fusion ? "unfused (moe_permute_fusion does not apply here)"
                                              : "unfused");
      break;
    }
  }
  return absl::StrFormat(
             "model: %d layers (%d MoE), hidden %d, heads %d/%d x %d, vocab %d, seq %d; %s "
             "parameters "
             "(%s active); %s on %s; global batch %d = %d micro-batches of %d; %.3g GFLOP/token; "
             "data: %s",
             c.num_layers, c.num_moe_layers(), c.hidden_size, c.num_heads, c.num_kv_heads,
             c.head_dim, c.vocab_size, c.seq_length,
             FormatCount(static_cast<double>(model::GptTotalParams(c))),
             FormatCount(static_cast<double>(model::GptActiveParams(c))), DTypeName(c.dtype),
             options_.device.ToString(), num_micro_global_ * micro_batch_, num_micro_global_,
             micro_batch_, flops_per_token_ / 1e9, data_description_) +
         (options_.device.is_cuda()
              ? absl::StrCat("; attention: ", kernels::DescribeAttentionBackend())
              : std::string()) +
         moe_permutation;
}

// ---------------------------------------------------------------------------------------------
// Checkpoints

absl::StatusOr<Buffer> Trainer::MasterToHost(const std::string& name) const {
  if (distributed()) {
    return absl::UnimplementedError(
        "MasterToHost: not available in a distributed run (the master weights are sharded); "
        "export from a checkpoint with a standalone worker");
  }
  const ParamInfo* p = model_->layout().Find(name);
  if (p == nullptr) return absl::NotFoundError(absl::StrCat("no parameter \"", name, "\""));
  SY_ASSIGN_OR_RETURN(Buffer b, Buffer::ForTensor(master_.View().dtype, p->shape, Device::Cpu()));
  SY_RETURN_IF_ERROR(kernels::CopyTensor(Slice(master_.View(), p->offset, p->shape), b.View()));
  return b;
}

absl::Status Trainer::SetParameters(
    const std::function<absl::StatusOr<Tensor>(const std::string&)>& get) {
  if (distributed()) {
    return absl::UnimplementedError(
        "SetParameters (--init-from-hf): not available in a distributed run yet; convert with a "
        "standalone worker, save a checkpoint, and load that");
  }
  for (const ParamInfo& p : model_->layout().params) {
    SY_ASSIGN_OR_RETURN(Tensor t, get(p.name));
    if (t.shape != p.shape) {
      return absl::InvalidArgumentError(absl::StrCat("parameter \"", p.name, "\" is ",
                                                     t.DebugString(), ", the model needs [",
                                                     absl::StrJoin(p.shape, ","), "]"));
    }
  }
  for (const ParamInfo& p : model_->layout().params) {
    SY_ASSIGN_OR_RETURN(Tensor t, get(p.name));
    SY_ASSIGN_OR_RETURN(Buffer host,
                        Buffer::ForTensor(master_.View().dtype, p.shape, Device::Cpu()));
    SY_RETURN_IF_ERROR(kernels::Cast(Stream::Cpu(), t, host.View()));
    SY_RETURN_IF_ERROR(kernels::CopyTensor(host.View(), Slice(master_.View(), p.offset, p.shape)));
  }
  SY_RETURN_IF_ERROR(kernels::FillBytes(exp_avg_.View(), 0));
  SY_RETURN_IF_ERROR(kernels::FillBytes(exp_avg_sq_.View(), 0));
  return CastMasterToParams(stream_);
}

namespace {

// Checkpoint tensor names: the master weights under the GptModel names, the Adam moments with a
// prefix (the names of the single-file format, so its checkpoints still load).
constexpr const char* kStatePrefix[3] = {"", "exp_avg.", "exp_avg_sq."};

}  // namespace

CheckpointGroup Trainer::CheckpointGroupOf() {
  CheckpointGroup g;
  if (!distributed()) return g;
  g.rank = groups_->rank;
  g.size = groups_->world->size();
  g.all_reduce_sum = [this](std::vector<double>* v) { return AllReduceDoubles(groups_->world, v); };
  return g;
}

absl::StatusOr<std::string> Trainer::Save(const std::string& root) {
  model::ScopedRange range(stream_, "checkpoint_save", step_);
  // The previous asynchronous save first: the next save waits for it, and its error (if any)
  // is this call's.
  SY_RETURN_IF_ERROR(WaitForSave());
  if (stream_.is_cuda()) {
    // After the groups' bounded Synchronize (their collectives return before completing).
    SY_RETURN_IF_ERROR(SynchronizeGroups());
    SY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.cuda_stream));
  }
  auto save = std::make_unique<AsyncSave>();
  ShardedCheckpointWriter& w = save->writer;
  // Device -> host copy of `device_view` (a flat range), kept alive until the write is done.
  auto add = [&](const std::string& name, ShardSlice slice,
                 const Tensor& device_view) -> absl::Status {
    SY_ASSIGN_OR_RETURN(Buffer b,
                        Buffer::ForTensor(device_view.dtype, {device_view.numel()}, Device::Cpu()));
    SY_RETURN_IF_ERROR(kernels::CopyTensor(
        Tensor(device_view.dtype, {device_view.numel()}, device_view.device, device_view.data),
        b.View()));
    w.AddShard(name, std::move(slice), b.View());
    save->keep.push_back(std::move(b));
    return absl::OkStatus();
  };
  const model::GptParamLayout& lay = model_->layout();
  const GptConfig& c = model_->config();
  if (!distributed()) {
    // One process: every tensor whole (master weights in the master dtype: f32, or the CPU f64).
    const Tensor state[3] = {master_.View(), exp_avg_.View(), exp_avg_sq_.View()};
    for (const ParamInfo& p : lay.params) {
      for (int which = 0; which < 3; ++which) {
        SY_RETURN_IF_ERROR(add(kStatePrefix[which] + p.name, ShardSlice::Whole(p.global_shape),
                               Slice(state[which], p.offset, {p.numel})));
      }
    }
  } else {
    // Every rank saves what its distributed-optimizer shards own (fp32 master and moments), each
    // piece as the flat range of its model-parallel slice; the model-dtype parameters are a cast
    // of the master weights and are not saved (Load casts again). The TP-replicated dense region
    // is identical on every TP rank: TP rank 0 saves it. Pipeline parallelism (the `pp` work):
    // a stage's layout holds its own layers under their GLOBAL names, so each stage simply
    // saves a subset of the names and Load reads its subset; a tensor two stages both hold
    // (the tied embedding of the first and last stage) must be saved by one of them only (the
    // first: see below), or
    // the commit's element count check refuses the checkpoint.
    struct Part {
      const DistributedAdamW* opt;
      int64_t region_begin;
      bool save;
    };
    const Part parts[3] = {{dense_opt_.get(), lay.replicated_begin, c.tp_rank == 0},
                           {tp_shard_opt_.get(), lay.expert_end, true},
                           {expert_opt_.get(), 0, true}};
    for (const Part& part : parts) {
      if (part.opt == nullptr || !part.save) continue;
      const Tensor shards[3] = {part.opt->master_shard(), part.opt->exp_avg_shard(),
                                part.opt->exp_avg_sq_shard()};
      for (const DistributedAdamW::OwnedRun& run : part.opt->OwnedRuns()) {
        const int64_t begin = part.region_begin + run.begin, end = begin + run.length;
        for (const ParamInfo& p : lay.params) {
          // The last stage's copy of a tied embedding: the first stage saves it (Megatron's
          // replica_id (1, 0, dp) copy, never a main replica).
          if (shared_embedding_ && !c.first_stage() && p.name == "embedding.weight") continue;
          const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
          if (lo >= hi) continue;  // not in this run (or padding)
          ShardSlice slice = ModelParallelSlice(p, c);
          slice.flat_begin = lo - p.offset;
          slice.flat_end = hi - p.offset;
          for (int which = 0; which < 3; ++which) {
            SY_RETURN_IF_ERROR(add(kStatePrefix[which] + p.name, slice,
                                   Slice(shards[which], run.shard_offset + lo - begin, {hi - lo})));
          }
        }
      }
    }
  }
  if (c.num_moe_layers() > 0 && pp_ > 1) {
    // Pipeline: each stage's first rank saves the rows of its own MoE layers (the other rows of
    // its expert_bias are not its layers'); a stage without MoE layers saves none.
    // Interleaved: one piece per model chunk (the chunks' rows are not contiguous).
    const int64_t stage_ranks = groups_->layout.world_size() / pp_;
    for (int64_t v = 0; v < c.num_chunks(); ++v) {
      int64_t moe_begin = 0, moe_end = 0;
      for (int64_t l = 0; l < c.ChunkEnd(v); ++l) {
        if (!c.moe_layers[l]) continue;
        if (l < c.ChunkBegin(v)) ++moe_begin;
        ++moe_end;
      }
      if (groups_->rank % stage_ranks != 0 || moe_end == moe_begin) continue;
      const Tensor bias = model_->expert_bias();
      ShardSlice rows;
      rows.global_shape = bias.shape;
      rows.runs = {{{moe_begin, moe_end - moe_begin}}, {{0, bias.shape[1]}}};
      const int64_t e = bias.shape[1];
      SY_RETURN_IF_ERROR(
          add("expert_bias", rows, Slice(bias, moe_begin * e, {moe_end - moe_begin, e})));
    }
  } else if (c.num_moe_layers() > 0 && (!distributed() || groups_->rank == 0)) {
    const Tensor bias = model_->expert_bias();
    SY_RETURN_IF_ERROR(add("expert_bias", ShardSlice::Whole(bias.shape), bias));
  }
  w.SetMetadata("step", step_);
  w.SetMetadata("consumed_samples", consumed_samples_);
  w.SetMetadata("skipped_steps", skipped_steps_);
  w.SetMetadata("forward_counter", absl::StrCat(model_->forward_counter()));  // the jitter RNG
  w.SetMetadata("seed", static_cast<int64_t>(spec_.training().seed()));
  w.SetMetadata("job_spec", JobSpecToJson(spec_));
  // The mapping that wrote it (for the record: loading reshards to any mapping).
  w.SetMetadata("tensor_model_parallel_size", c.tp_size);
  w.SetMetadata("context_parallel_size", static_cast<int64_t>(cp_));
  w.SetMetadata("expert_model_parallel_size", static_cast<int64_t>(c.moe.ep_size));
  w.SetMetadata("expert_tensor_parallel_size", static_cast<int64_t>(c.moe.etp_size));
  w.SetMetadata("data_parallel_size", static_cast<int64_t>(dp_));
  w.SetMetadata("pipeline_model_parallel_size", static_cast<int64_t>(pp_));
  w.SetMetadata("virtual_pipeline_model_parallel_size", static_cast<int64_t>(vpp_));
  const CheckpointGroup group = CheckpointGroupOf();
  if (!options_.async_save) return w.Commit(root, step_, group);

  // Asynchronous: the temp directory now (collective), this rank's file on a thread, the
  // manifest when every rank's write is done (PollSave after a step, or WaitForSave).
  SY_ASSIGN_OR_RETURN(save->save, w.Begin(root, step_, group));
  AsyncSave* s = save.get();
  save->thread = std::thread([s, group] {
    s->own = s->writer.WriteOwn(s->save, group);  // never calls group.all_reduce_sum
    s->done.store(true, std::memory_order_release);
  });
  async_save_ = std::move(save);
  return CheckpointStepDir(root, step_);
}

absl::Status Trainer::PollSave() {
  if (async_save_ == nullptr) return absl::OkStatus();
  // Every rank must see every rank's write done before the collective Finish.
  std::vector<double> pending = {async_save_->done.load(std::memory_order_acquire) ? 0.0 : 1.0};
  if (distributed()) SY_RETURN_IF_ERROR(AllReduceDoubles(groups_->world, &pending));
  if (pending[0] != 0) return absl::OkStatus();
  return WaitForSave();
}

absl::Status Trainer::WaitForSave() {
  if (async_save_ == nullptr) return absl::OkStatus();
  std::unique_ptr<AsyncSave> s = std::move(async_save_);
  s->thread.join();
  absl::StatusOr<std::string> dir = s->writer.Finish(s->save, s->own, CheckpointGroupOf());
  if (!dir.ok()) {
    return absl::Status(dir.status().code(),
                        absl::StrCat("asynchronous save of step ", s->save.step, " to ",
                                     s->save.root, ": ", dir.status().message()));
  }
  return absl::OkStatus();
}

absl::Status Trainer::Load(const std::string& root, int64_t step) {
  SY_RETURN_IF_ERROR(WaitForSave());
  SY_ASSIGN_OR_RETURN(
      ShardedCheckpointReader rd,
      ShardedCheckpointReader::Load(root, step >= 0 ? std::optional<int64_t>(step) : std::nullopt));
  const Checkpoint& ckpt = rd.checkpoint();
  SY_ASSIGN_OR_RETURN(int64_t ck_step, ckpt.GetInt("step"));
  SY_ASSIGN_OR_RETURN(int64_t consumed, ckpt.GetInt("consumed_samples"));
  SY_ASSIGN_OR_RETURN(int64_t skipped, ckpt.GetInt("skipped_steps"));
  SY_ASSIGN_OR_RETURN(std::string counter, ckpt.GetString("forward_counter"));
  const int64_t gbs = num_micro_global_ * micro_batch_;
  // An evaluate-only trainer (--eval) never resumes the data position, so it may score a
  // checkpoint with another global batch size.
  if (consumed != ck_step * gbs && !options_.evaluate_only) {
    return absl::FailedPreconditionError(
        absl::StrCat(ckpt.dir(), ": consumed_samples (", consumed, ") != step (", ck_step,
                     ") x training.global_batch_size (", gbs, "): the global batch size changed"));
  }
  const model::GptParamLayout& lay = model_->layout();
  const GptConfig& c = model_->config();
  // Check every tensor before writing any, so a mismatched checkpoint changes nothing.
  auto check = [&](const std::string& name, const std::vector<int64_t>& shape) -> absl::Status {
    SY_ASSIGN_OR_RETURN(std::vector<int64_t> saved, rd.GlobalShape(name));
    if (saved != shape) {
      SY_ASSIGN_OR_RETURN(const DType dtype, rd.StoredDType(name));
      return absl::FailedPreconditionError(
          absl::StrCat(ckpt.dir(), ": tensor \"", name, "\" is ", DTypeName(dtype), "[",
                       absl::StrJoin(saved, ","), "], the model needs [", absl::StrJoin(shape, ","),
                       "] (was the checkpoint written for another model?)"));
    }
    return absl::OkStatus();
  };
  for (const ParamInfo& p : lay.params) {
    for (int which = 0; which < 3; ++which) {
      SY_RETURN_IF_ERROR(check(kStatePrefix[which] + p.name, p.global_shape));
    }
  }
  if (c.num_moe_layers() > 0) SY_RETURN_IF_ERROR(check("expert_bias", model_->expert_bias().shape));

  // Reads `name`'s elements of `slice` (this rank's target) into device range `dst`.
  auto read = [&](const std::string& name, const ShardSlice& slice,
                  const Tensor& dst) -> absl::Status {
    SY_ASSIGN_OR_RETURN(Buffer host, Buffer::ForTensor(dst.dtype, {dst.numel()}, Device::Cpu()));
    SY_RETURN_IF_ERROR(rd.Read(name, slice, host.View()));
    return kernels::CopyTensor(host.View(), Tensor(dst.dtype, {dst.numel()}, dst.device, dst.data));
  };
  if (!distributed()) {
    const Tensor state[3] = {master_.View(), exp_avg_.View(), exp_avg_sq_.View()};
    for (const ParamInfo& p : lay.params) {
      for (int which = 0; which < 3; ++which) {
        SY_RETURN_IF_ERROR(read(kStatePrefix[which] + p.name, ShardSlice::Whole(p.global_shape),
                                Slice(state[which], p.offset, {p.numel})));
      }
    }
    SY_RETURN_IF_ERROR(CastMasterToParams(stream_));
  } else {
    // Master weights: this rank's model-parallel slice of every tensor (what its parameters
    // hold anyway), cast into the parameters and scattered into its optimizer shards.
    SY_ASSIGN_OR_RETURN(Buffer full, Buffer::ForTensor(DType::kF32, {lay.total}, Device::Cpu()));
    SY_RETURN_IF_ERROR(kernels::FillBytes(full.View(), 0));
    for (const ParamInfo& p : lay.params) {
      SY_RETURN_IF_ERROR(
          rd.Read(p.name, ModelParallelSlice(p, c), Slice(full.View(), p.offset, {p.numel})));
    }
    SY_RETURN_IF_ERROR(dense_opt_->ScatterFull(Region(full.View(), lay.replicated_begin, lay.total),
                                               dense_opt_->master_shard()));
    if (tp_shard_opt_ != nullptr) {
      SY_RETURN_IF_ERROR(
          tp_shard_opt_->ScatterFull(Region(full.View(), lay.expert_end, lay.replicated_begin),
                                     tp_shard_opt_->master_shard()));
    }
    if (expert_opt_ != nullptr) {
      SY_RETURN_IF_ERROR(expert_opt_->ScatterFull(Region(full.View(), 0, lay.expert_end),
                                                  expert_opt_->master_shard()));
    }
    SY_ASSIGN_OR_RETURN(Buffer dev, Buffer::ForTensor(DType::kF32, {lay.total}, options_.device));
    SY_RETURN_IF_ERROR(kernels::CopyTensor(full.View(), dev.View()));
    SY_RETURN_IF_ERROR(kernels::Cast(stream_, dev.View(), model_->params()));
    // Adam moments: only the flat ranges this rank's optimizer shards own (any DP size saved
    // them), read from the overlapping saved pieces.
    const std::pair<const DistributedAdamW*, int64_t> parts[3] = {
        {dense_opt_.get(), lay.replicated_begin},
        {tp_shard_opt_.get(), lay.expert_end},
        {expert_opt_.get(), 0}};
    for (const auto& [opt, region_begin] : parts) {
      if (opt == nullptr) continue;
      const Tensor shards[2] = {opt->exp_avg_shard(), opt->exp_avg_sq_shard()};
      for (const Tensor& sh : shards) SY_RETURN_IF_ERROR(kernels::FillBytes(sh, 0));  // padding
      for (const DistributedAdamW::OwnedRun& run : opt->OwnedRuns()) {
        const int64_t begin = region_begin + run.begin, end = begin + run.length;
        for (const ParamInfo& p : lay.params) {
          const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
          if (lo >= hi) continue;
          ShardSlice slice = ModelParallelSlice(p, c);
          slice.flat_begin = lo - p.offset;
          slice.flat_end = hi - p.offset;
          for (int which = 1; which < 3; ++which) {
            SY_RETURN_IF_ERROR(
                read(kStatePrefix[which] + p.name, slice,
                     Slice(shards[which - 1], run.shard_offset + lo - begin, {hi - lo})));
          }
        }
      }
    }
  }
  if (c.num_moe_layers() > 0) {
    const Tensor bias = model_->expert_bias();
    SY_RETURN_IF_ERROR(read("expert_bias", ShardSlice::Whole(bias.shape), bias));
  }
  if (stream_.is_cuda()) {
    // After the groups' bounded Synchronize (their collectives return before completing).
    SY_RETURN_IF_ERROR(SynchronizeGroups());
    SY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.cuda_stream));
  }
  step_ = ck_step;
  consumed_samples_ = consumed;
  skipped_steps_ = skipped;
  model_->set_forward_counter(std::stoull(counter));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// The training loop

absl::StatusOr<TrainingLoopResult> RunTrainingLoop(Trainer* trainer,
                                                   const TrainingLoopHooks& hooks) {
  const v1::TrainingConfig& tr = trainer->spec().training();
  TrainingLoopResult result;
  int64_t last_saved = -1;
  auto save = [&](int64_t step, bool requested, absl::string_view what) -> absl::Status {
    absl::StatusOr<std::string> dir = trainer->Save(tr.save());
    if (!dir.ok()) return Annotate(dir.status(), absl::StrCat(what, " ", step));
    last_saved = step;
    // An on-demand save (the coordinator's CheckpointNow, agreed over the ranks) is reported
    // only once committed: the coordinator stops a preempted job on that report, so it must name
    // a checkpoint that loads. With async_save that means finishing this save now (collective:
    // every rank took the same decision); interval saves stay in the background.
    if (requested) {
      absl::Status st = trainer->WaitForSave();
      if (!st.ok()) return Annotate(st, absl::StrCat(what, " ", step));
    }
    if (hooks.on_saved) hooks.on_saved(*dir, requested);
    return absl::OkStatus();
  };
  while (trainer->step() < trainer->train_iters() &&
         (hooks.max_steps <= 0 || result.steps < hooks.max_steps)) {
    if (hooks.stop_requested && hooks.stop_requested()) {
      SY_RETURN_IF_ERROR(trainer->WaitForSave());
      result.stopped = true;
      return result;
    }
    absl::StatusOr<StepResult> r = trainer->Step();
    if (!r.ok()) return Annotate(r.status(), absl::StrCat("step ", trainer->step() + 1));
    ++result.steps;
    // Evaluation (every rank: it is collective) after the update, before the step is reported
    // and saved, as Megatron's train loop: the step's report carries its validation loss.
    if (trainer->EvaluationDue(r->step)) {
      absl::StatusOr<double> v = trainer->Evaluate();
      if (!v.ok()) return Annotate(v.status(), absl::StrCat("evaluating after step ", r->step));
      r->validation_loss = *v;
    }
    if (hooks.on_step) hooks.on_step(*r);
    // An asynchronous save commits once every rank's background write is done; its error ends
    // the loop here (the next step), not silently.
    if (absl::Status st = trainer->PollSave(); !st.ok()) {
      return Annotate(st, absl::StrCat("after step ", r->step));
    }
    const bool interval = tr.save_interval() > 0 && r->step % tr.save_interval() == 0;
    bool requested = false;
    if (hooks.checkpoint_requested) {
      SY_ASSIGN_OR_RETURN(requested, hooks.checkpoint_requested(*r));
    }
    if ((interval || requested) && !tr.save().empty()) {
      SY_RETURN_IF_ERROR(save(r->step, requested, "saving step"));
    } else if (requested && hooks.on_request_ignored) {
      hooks.on_request_ignored();
    }
  }
  SY_RETURN_IF_ERROR(trainer->WaitForSave());
  if (hooks.stop_requested && hooks.stop_requested()) {
    result.stopped = true;
    return result;
  }
  if (!tr.save().empty() && last_saved != trainer->step() &&
      !HasCommittedStep(tr.save(), trainer->step())) {
    SY_RETURN_IF_ERROR(save(trainer->step(), false, "saving the final checkpoint at step"));
    SY_RETURN_IF_ERROR(trainer->WaitForSave());
  }
  return result;
}

// ---------------------------------------------------------------------------------------------
// The standalone loop

absl::Status RunStandalone(v1::JobSpec spec, const TrainerOptions& options,
                           const StandaloneOptions& standalone, std::FILE* out) {
  std::optional<model::HfCheckpoint> hf;
  std::string architecture =
      standalone.hf_architecture.empty() ? model::kHfQwen3Moe : standalone.hf_architecture;
  if (!standalone.init_from_hf.empty()) {
    SY_ASSIGN_OR_RETURN(model::HfCheckpoint imported,
                        model::ImportHfModel(standalone.init_from_hf));
    const v1::ModelConfig user = spec.model();
    *spec.mutable_model() = imported.config;
    if (user.has_seq_length()) spec.mutable_model()->set_seq_length(user.seq_length());
    architecture = imported.architecture;
    hf = std::move(imported);
  }
  SY_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(spec, options));
  const v1::TrainingConfig& tr = trainer->spec().training();
  std::fprintf(out, "%s\n", trainer->Describe().c_str());
  if (hf.has_value()) {
    SY_RETURN_IF_ERROR(
        trainer->SetParameters([&](const std::string& name) { return hf->Get(name); }));
    std::fprintf(out, "initialised from %s (%s)\n", standalone.init_from_hf.c_str(),
                 architecture.c_str());
  }
  SY_ASSIGN_OR_RETURN(const std::string resumed, ResumeTraining(trainer.get(), tr));
  if (!resumed.empty()) std::fprintf(out, "%s\n", resumed.c_str());
  const bool bar = standalone.progress_bar && isatty(fileno(stderr)) != 0;
  const int64_t log_interval = std::max<int64_t>(1, tr.log_interval());
  const auto start = std::chrono::steady_clock::now();
  const int64_t first = trainer->step();
  TrainingLoopHooks hooks;
  hooks.max_steps = standalone.max_steps;
  hooks.on_step = [&](const StepResult& r) {
    if (bar) std::fputs("\r\033[K", stderr);
    if (r.step % log_interval == 0 || r.step == trainer->train_iters() || r.skipped ||
        r.validation_loss.has_value()) {
      std::fprintf(out, "%s\n", trainer->FormatLogLine(r).c_str());
      std::fflush(out);
    }
    if (!bar) return;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const int64_t total = trainer->train_iters(), now = trainer->step();
    const double eta =
        elapsed / static_cast<double>(now - first) * static_cast<double>(total - now);
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * now / std::max<int64_t>(total, 1));
    std::fprintf(stderr, "[%s%s] %lld/%lld ETA %s", std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, '.').c_str(), static_cast<long long>(now),
                 static_cast<long long>(total), FormatDuration(eta).c_str());
    std::fflush(stderr);
  };
  hooks.on_saved = [&](const std::string& dir, bool /*requested*/) {
    if (bar) std::fputs("\r\033[K", stderr);  // the next step redraws the bar
    std::fprintf(out, "saved checkpoint %s\n", dir.c_str());
  };
  SY_RETURN_IF_ERROR(RunTrainingLoop(trainer.get(), hooks).status());
  if (bar) std::fputs("\r\033[K", stderr);
  if (!standalone.export_hf.empty()) {
    std::map<std::string, Buffer> cache;
    auto source = [&](const std::string& name) -> absl::StatusOr<Tensor> {
      auto it = cache.find(name);
      if (it == cache.end()) {
        SY_ASSIGN_OR_RETURN(Buffer b, trainer->MasterToHost(name));
        it = cache.emplace(name, std::move(b)).first;
      }
      return it->second.View();
    };
    SY_RETURN_IF_ERROR(model::ExportHfModel(trainer->spec().model(), architecture, source,
                                            standalone.export_hf, DType::kF32));
    std::fprintf(out, "exported %s model to %s\n", architecture.c_str(),
                 standalone.export_hf.c_str());
  }
  return absl::OkStatus();
}

}  // namespace switchyard::train
