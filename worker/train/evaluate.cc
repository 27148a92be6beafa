// File: worker/train/evaluate.cc
//
// Validation loss (issue 18 item 1): Trainer::Evaluate, the valid split's sample index, and
// RunEvaluation (`switchyard-worker --eval`). The semantics are in trainer.h, "Validation".
//
// WHY a file of its own: trainer.cc is edited by several people at once; evaluation only needs
// LoadMicroBatch, GptModel::Forward and the stats all-reduce, which it reaches as members.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/config/config_defaults.h"
#include "common/config/job_paths.h"
#include "common/status.h"
#include "worker/checkpoint/hf_convert.h"
#include "worker/train/trainer.h"

namespace switchyard::train {
namespace {

using kernels::Buffer;

// The first mock sample of the valid batches (data.mock_data with training.eval_interval): far
// past any training run's samples (train_iters x global batch), so the two never share tokens.
constexpr int64_t kMockValidFirstSample = int64_t{1} << 48;

// Documents [begin, end) of `base`, renumbered from 0: the valid share of data.split.
class DocumentRangeView final : public TokenDocuments {
 public:
  DocumentRangeView(std::shared_ptr<TokenDocuments> base, DocumentRange range)
      : base_(std::move(base)), range_(range) {}
  int64_t num_documents() const override { return range_.size(); }
  int64_t DocumentLength(int64_t doc) const override {
    return base_->DocumentLength(range_.begin + doc);
  }
  absl::Status ReadTokens(int64_t doc, int64_t offset, absl::Span<int32_t> out) const override {
    return base_->ReadTokens(range_.begin + doc, offset, out);
  }

 private:
  std::shared_ptr<TokenDocuments> base_;
  DocumentRange range_;
};

bool FileExists(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  std::fclose(f);
  return true;
}

}  // namespace

absl::Status Trainer::InitEvaluation(const std::shared_ptr<TokenDocuments>& all,
                                     const std::optional<DocumentRange>& valid,
                                     int64_t num_documents) {
  const v1::TrainingConfig& tr = spec_.training();
  if (!tr.has_eval_interval() && !options_.evaluate_only) return absl::OkStatus();
  const char* why = tr.has_eval_interval() ? "training.eval_interval is set" : "--eval";
  const std::string& split = spec_.data().split();
  if (!valid.has_value() || valid->size() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.split (\"", split, "\") leaves the valid split empty (",
        valid.has_value() ? valid->size() : 0, " of ", num_documents, " documents) but ", why,
        ": evaluation needs at least one valid document (e.g. \"969,30,1\")"));
  }
  eval_iters_ = tr.has_eval_iters() ? tr.eval_iters() : kDefaultEvalIters;
  GptSampleOptions so;
  so.seq_length = seq_;
  so.seed = static_cast<uint64_t>(tr.seed());
  // The same eval_iters global batches at every evaluation: an index of exactly that many
  // samples (more epochs of the valid documents when they hold fewer windows, as Megatron).
  so.num_samples = eval_iters_ * num_micro_global_ * micro_batch_;
  auto docs = std::make_shared<DocumentRangeView>(all, *valid);
  absl::StatusOr<GptSamples> samples = GptSamples::Build(docs, so);
  if (!samples.ok()) {
    return Annotate(samples.status(),
                    absl::StrCat("data.split (\"", split, "\"): the valid split (", valid->size(),
                                 " documents)"));
  }
  valid_samples_ = std::make_shared<const GptSamples>(*std::move(samples));
  return absl::OkStatus();
}

bool Trainer::EvaluationDue(int64_t step) const {
  const v1::TrainingConfig& tr = spec_.training();
  if (!evaluates() || !tr.has_eval_interval() || tr.eval_interval() <= 0) {
    return false;
  }
  return step % tr.eval_interval() == 0 || step == tr.train_iters();
}

absl::StatusOr<double> Trainer::Evaluate() {
  if (!evaluates()) {
    return absl::FailedPreconditionError(
        "Trainer::Evaluate: this trainer has no valid split (set training.eval_interval, or use "
        "TrainerOptions.evaluate_only)");
  }
  const Stream& s = stream_;
  model::ScopedRange range(s, "evaluate", step_);
  // Evaluation mode (GptModel::SetTraining) and the jitter counter (each Forward pass advances
  // it; it is checkpointed training state) restored on every path out, errors included.
  const uint64_t counter = model_->forward_counter();
  model_->SetTraining(false);
  absl::Cleanup restore = [this, counter] {
    model_->SetTraining(true);
    model_->set_forward_counter(counter);
  };
  const int64_t gbs = num_micro_global_ * micro_batch_;
  // This rank's share of the loss sum, in f64 over the batches (each batch's micro-batch sums
  // come from the CE kernel's f32 slots, read once per batch by ReadStepStats).
  double local = 0;
  const int64_t n = micro_batch_ * local_seq_;
  const Tensor ids =
      Tensor(DType::kI32, {n}, s.device, s.is_cuda() ? ids_.View().data : host_ids_.View().data);
  const Tensor targets = Tensor(DType::kI32, {n}, s.device,
                                s.is_cuda() ? targets_.View().data : host_targets_.View().data);
  // PP > 1: Megatron's forward-only pipeline (every op in warm-up: the forwards of this stage's
  // chunks in the schedule's order), run as PipelineProgram rounds like a training step.
  std::vector<PipelineRound> program;
  if (pp_ > 1) {
    SY_ASSIGN_OR_RETURN(program, PipelineProgram(pp_, vpp_, num_micro_, /*forward_only=*/true));
  }
  for (int64_t k = 0; k < eval_iters_; ++k) {
    auto load = [&](int64_t m) -> absl::Status {
      // Micro-batch j of evaluation batch k, as Step's micro-batch j of a training batch.
      const int64_t j = m * dp_ + dp_rank_;
      // Mock data: LoadMicroBatch's mock tokens of an index range no training run reaches.
      const int64_t first = (mock_eval_ ? kMockValidFirstSample : 0) + k * gbs + j * micro_batch_;
      return LoadMicroBatch(first, micro_batch_, valid_samples_.get());
    };
    if (pp_ > 1) {
      SY_RETURN_IF_ERROR(PipelineForwardOnly(program, ids, targets, load));
    } else {
      for (int64_t m = 0; m < num_micro_; ++m) {
        SY_RETURN_IF_ERROR(load(m));
        SY_RETURN_IF_ERROR(
            model_->Forward(s, ids, targets, local_seq_, static_cast<int>(m), Tensor()));
      }
    }
    // The forward's collectives return before completing: their groups' bounded Synchronize
    // before ReadStepStats synchronises the stream.
    SY_RETURN_IF_ERROR(SynchronizeGroups());
    SY_ASSIGN_OR_RETURN(model::GptStepStats stats,
                        model_->ReadStepStats(s, static_cast<int>(num_micro_)));
    // Only the last stage computes a loss (its head chunk); the others' slots are never written.
    if (pp_ == 1 || pp_rank_ == pp_ - 1) local += stats.loss_sum;
  }
  // The step loss's fold (ReduceStats): each rank's loss sum is its share of its DP rank's
  // tokens (CP: its chunks; TP: the vocabulary-parallel loss, reported by TP rank 0, 0 on the
  // others), so the sum over TP×DP×CP is the whole loss sum; then over PP (the last stage's
  // value, 0 from the others), so every rank of every stage returns the same validation loss.
  std::vector<double> v = {local};
  if (distributed()) SY_RETURN_IF_ERROR(AllReduceDoubles(groups_->tdc, &v));
  if (pp_ > 1) SY_RETURN_IF_ERROR(AllReduceDoubles(groups_->pp, &v));
  return v[0] / static_cast<double>(eval_iters_ * gbs * seq_);
}

absl::Status Trainer::PipelineForwardOnly(const std::vector<PipelineRound>& program,
                                          const Tensor& ids, const Tensor& targets,
                                          const std::function<absl::Status(int64_t)>& load) {
  // InterleavedMicroBatches' round loop without backwards: after its op of a round, every stage
  // walks the round's messages (activations only) in the program's global order; a received
  // activation waits in a spare buffer until its chunk's forward.
  const Stream& s = stream_;
  comm::Communicator* pp = groups_->pp;
  const model::GptConfig& c = model_->config();
  const Tensor shape = pp_input_.View();               // [t/TP, H] in the model dtype
  std::map<std::pair<int64_t, int64_t>, Buffer> held;  // (micro, chunk) -> its input
  absl::Cleanup give_back = [&] {  // back to the pool on every exit (it never grows)
    for (auto& [key, b] : held) pp_spare_.push_back(std::move(b));
  };
  for (const PipelineRound& round : program) {
    Tensor outgoing;
    if (round.has_op[pp_rank_]) {
      const PipelineOp& op = round.ops[pp_rank_];
      const int m = static_cast<int>(op.micro), chunk = static_cast<int>(op.chunk);
      SY_RETURN_IF_ERROR(load(m));
      Tensor input;
      auto it = held.find({m, chunk});
      if (!c.EmbedsIn(chunk)) {
        if (it == held.end()) {
          return absl::InternalError(absl::StrCat("forward-only pipeline: stage ", pp_rank_,
                                                  " has no input for micro-batch ", m, " chunk ",
                                                  chunk));
        }
        input = it->second.View();
      }
      SY_RETURN_IF_ERROR(model_->Forward(s, ids, targets, local_seq_, m, Tensor(), input, chunk,
                                         c.HeadIn(chunk) ? nullptr : &outgoing));
      if (it != held.end()) {
        pp_spare_.push_back(std::move(it->second));
        held.erase(it);
      }
    }
    for (const PipelineMessage& msg : round.messages) {
      if (msg.from == pp_rank_) {
        SY_RETURN_IF_ERROR(pp->Send(outgoing, static_cast<int>(msg.to), msg.tag));
      } else if (msg.to == pp_rank_) {
        SY_ASSIGN_OR_RETURN(Buffer b, TakePipelineBuffer());
        SY_RETURN_IF_ERROR(pp->Recv(b.View(), static_cast<int>(msg.from), msg.tag));
        held.emplace(std::make_pair(msg.micro, msg.chunk), std::move(b));
      }
    }
  }
  if (!held.empty()) {
    return absl::InternalError(absl::StrCat("forward-only pipeline: stage ", pp_rank_,
                                            " ended with ", held.size(), " unused inputs"));
  }
  return absl::OkStatus();
}

absl::Status Trainer::WriteValidationTokens(const std::string& path) const {
  if (distributed()) {
    return absl::FailedPreconditionError("--eval_tokens_out: one process only (no --rank)");
  }
  if (valid_samples_ == nullptr) {
    return absl::FailedPreconditionError(
        "--eval_tokens_out: this trainer has no valid split of a dataset to write");
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eval_tokens_out: cannot create ", path, ": ", std::strerror(errno)));
  }
  absl::Cleanup close = [f] { std::fclose(f); };
  std::vector<int32_t> sample(seq_ + 1);
  // Evaluate's order: batch k, micro-batch j (over all DP ranks), row b.
  const int64_t samples = eval_iters_ * num_micro_global_ * micro_batch_;
  for (int64_t i = 0; i < samples; ++i) {
    SY_RETURN_IF_ERROR(valid_samples_->Sample(i, absl::MakeSpan(sample)));
    if (std::fwrite(sample.data(), sizeof(int32_t), sample.size(), f) != sample.size()) {
      return absl::DataLossError(absl::StrCat("--eval_tokens_out: short write to ", path));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> RunEvaluation(v1::JobSpec spec, TrainerOptions options,
                                     const EvaluationOptions& evaluation, std::FILE* out) {
  if (evaluation.load.empty()) {
    return absl::InvalidArgumentError(
        "--load: required with --eval (a checkpoint directory, one of its step_<N> directories, "
        "or a Hugging Face model directory)");
  }
  if (spec.data().mock_data()) {
    return absl::InvalidArgumentError(
        "data.mock_data: --eval needs a dataset (data.data_path, or the default corpus when "
        "empty) to take the valid split from");
  }
  // An HF directory holds config.json; our checkpoints never do (manifest.json per step).
  std::optional<model::HfCheckpoint> hf;
  if (FileExists(evaluation.load + "/config.json")) {
    SY_ASSIGN_OR_RETURN(model::HfCheckpoint imported, model::ImportHfModel(evaluation.load));
    const v1::ModelConfig user = spec.model();
    *spec.mutable_model() = imported.config;
    if (user.has_seq_length()) spec.mutable_model()->set_seq_length(user.seq_length());
    hf = std::move(imported);
  }
  // The held-out share even when the spec never asked for evaluation: Megatron's default split
  // and eval_iters (config_defaults.h), as a training run with eval_interval would have them.
  if (spec.data().split().empty()) {
    spec.mutable_data()->set_split(kDefaultEvalSplit);
  }
  if (!spec.training().has_eval_iters()) {
    spec.mutable_training()->set_eval_iters(kDefaultEvalIters);
  }
  options.evaluate_only = true;
  SY_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(spec, options));
  std::fprintf(out, "%s\n", trainer->Describe().c_str());
  if (hf.has_value()) {
    SY_RETURN_IF_ERROR(
        Annotate(trainer->SetParameters([&](const std::string& name) { return hf->Get(name); }),
                 absl::StrCat("--load ", evaluation.load, " (", hf->architecture, ")")));
    std::fprintf(out, "loaded %s (%s)\n", evaluation.load.c_str(), hf->architecture.c_str());
  } else {
    std::string root = evaluation.load;
    int64_t step = -1;
    if (auto split = SplitStepDirectory(evaluation.load); split.has_value()) {
      root = split->first;
      step = split->second;
    }
    SY_RETURN_IF_ERROR(
        Annotate(trainer->Load(root, step), absl::StrCat("--load ", evaluation.load)));
    std::fprintf(out, "loaded %s at step %lld\n", evaluation.load.c_str(),
                 static_cast<long long>(trainer->step()));
  }
  SY_ASSIGN_OR_RETURN(const double loss, trainer->Evaluate());
  if (!evaluation.tokens_out.empty()) {
    SY_RETURN_IF_ERROR(trainer->WriteValidationTokens(evaluation.tokens_out));
    std::fprintf(out, "wrote the scored token windows to %s (int32 [%lld, %lld])\n",
                 evaluation.tokens_out.c_str(),
                 static_cast<long long>(trainer->eval_iters() * trainer->tokens_per_step() /
                                        trainer->spec().model().seq_length()),
                 static_cast<long long>(trainer->spec().model().seq_length() + 1));
  }
  const int64_t tokens = trainer->eval_iters() * trainer->tokens_per_step();
  std::fprintf(out,
               "validation loss %.6f | validation ppl %.4f | %lld global batches, %lld tokens of "
               "the valid split of data.split \"%s\"\n",
               loss, std::exp(loss), static_cast<long long>(trainer->eval_iters()),
               static_cast<long long>(tokens), trainer->spec().data().split().c_str());
  std::fflush(out);
  return loss;
}

}  // namespace switchyard::train
