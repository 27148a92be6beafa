// File: worker/train/evaluate_test.cc
//
// Validation loss (issue 18 item 1; trainer.h "Validation", evaluate.cc), on the CPU:
//   - Evaluate equals a loss computed independently in this file: the valid documents read from
//     the dataset by SplitDocuments' range, their sample index, the model's logits and a
//     log-softmax cross-entropy in double (so the samples, the tokens and the averaging are
//     checked, not only self-consistency);
//   - evaluating changes no training state: the same job with and without training.eval_interval
//     (input jitter, expert bias, aux + z losses; and seq_aux_loss + global_aux_loss, whose running
//     counts live in the router) gives bit-identical losses, gradient norms and routing on every
//     step; the validation loss appears on the eval_interval steps and the last step only, and
//     two evaluations in a row are bit-identical (the same batches each time);
//   - RunEvaluation (`switchyard-worker --eval`) on the checkpoint of a run (its latest step and an
//     earlier step_<N>) and on its HF export gives the run's in-training validation loss within
//     1e-5;
//   - at world 2 (DP2, EP2, CP2, TP2; forked processes over Gloo) the in-training validation losses
//     equal one process's within 1e-5 relative, and one process's RunEvaluation of the world-2
//     checkpoint equals the world-2 final validation loss within 1e-5;
//   - with pipeline parallelism (PP2, PP2·VPP2, PP2·EP2: the forward-only pipeline schedule)
//     every rank reports the same validation losses, equal to one process's within 1e-5
//     relative, and one process evaluates the pipeline checkpoint to the final one;
//   - a split that leaves the valid share empty on the real dataset is INVALID_ARGUMENT naming
//     data.split and the rule.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/config/config.h"
#include "data/gpt_samples.h"
#include "data/indexed_dataset.h"
#include "gtest/gtest.h"
#include "kernels/runtime/buffer.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/comm/testing/forked_ranks.h"
#include "worker/train/data_split.h"
#include "worker/train/process_groups.h"
#include "worker/train/testing/curve.h"
#include "worker/train/testing/gloo_groups.h"
#include "worker/train/testing/tiny_moe_spec.h"
#include "worker/train/trainer.h"

namespace switchyard::train {
namespace {

namespace ct = ::switchyard::comm::testing;
using curves::CpuF32;
using test_groups::JoinGlooGroups;
using test_groups::LayoutDims;

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string Fresh(const std::string& name) {
  static int counter = 0;
  return absl::StrCat(TempDir(), "/", name, "_", getpid(), "_", counter++);
}

// 60 documents of 20..78 tokens below 64, with a learnable pattern (each document counts up from
// its own start with its own stride) so that a few steps move the loss.
const std::string& DatasetPrefix() {
  static const std::string* prefix = [] {
    IndexedDatasetWriter writer(IndexedDType::kUInt16);
    for (int d = 0; d < 60; ++d) {
      std::vector<int64_t> tokens;
      const int len = 20 + (d * 37) % 59, stride = 1 + d % 5;
      for (int i = 0; i < len; ++i) tokens.push_back((d * 3 + i * stride) % 63);
      tokens.push_back(63);  // end of document
      EXPECT_TRUE(writer.Add(tokens).ok());
      writer.EndDocument();
    }
    auto* p = new std::string(TempDir() + "/eval_docs");
    EXPECT_TRUE(writer.Finalize(*p).ok());
    return p;
  }();
  return *prefix;
}

// The tiny MoE job (tiny_moe_spec.h: jitter, expert bias, aux and z losses) on the dataset above,
// split 80/20: 48 training and 12 validation documents.
v1::JobSpec Spec(int64_t train_iters, int64_t eval_interval, int64_t eval_iters,
                 bool seq_global_aux = false, bool qwen = false) {
  auto spec = ParseJobSpecYaml(switchyard::test_specs::TinyMoeSpecYaml(train_iters, true));
  EXPECT_TRUE(spec.ok()) << spec.status();
  v1::DataConfig* d = spec->mutable_data();
  d->set_mock_data(false);
  d->add_data_path(DatasetPrefix());
  d->set_split("80,20,0");
  if (eval_interval > 0) spec->mutable_training()->set_eval_interval(eval_interval);
  if (eval_iters > 0) spec->mutable_training()->set_eval_iters(eval_iters);
  v1::ModelConfig* m = spec->mutable_model();
  if (seq_global_aux) {
    m->clear_moe_router_load_balancing_type();
    m->clear_moe_aux_loss_coeff();
    for (const char* type : {"seq_aux_loss", "global_aux_loss"}) {
      m->add_moe_router_load_balancing_type(type);
      m->add_moe_aux_loss_coeff(0.01);
    }
  }
  if (qwen) {  // what Qwen3-MoE can express (hf_convert.h): softmax, no shared expert or bias
    m->clear_moe_shared_expert_intermediate_size();
    m->set_moe_router_score_function("softmax");
    m->set_moe_router_enable_expert_bias(false);
    m->set_moe_z_loss_coeff(0);
  }
  return *spec;
}

std::vector<StepResult> Train(Trainer* t) {
  std::vector<StepResult> steps;
  TrainingLoopHooks hooks;
  hooks.on_step = [&](const StepResult& r) { steps.push_back(r); };
  absl::StatusOr<TrainingLoopResult> r = RunTrainingLoop(t, hooks);
  EXPECT_TRUE(r.ok()) << r.status();
  return steps;
}

// The validation loss computed here from first principles: the valid documents [begin, end) of
// the dataset (SplitDocuments), their sample index (GptSamples with the trainer's seed and
// sequence length, eval_iters × global batch samples), each sample's logits from
// GptModel::Forward in evaluation mode and CE = logsumexp(logits) − logits[target] in double,
// averaged over every token of every sample.
// The valid windows Evaluate scores, built here from the valid documents' tokens.
std::vector<std::vector<int32_t>> IndependentValidSamples(Trainer* t) {
  const v1::JobSpec& spec = t->spec();
  auto ds = IndexedDataset::Open(spec.data().data_path(0));
  EXPECT_TRUE(ds.ok()) << ds.status();
  auto ranges = SplitDocuments(spec.data().split(), ds->num_sequences());
  EXPECT_TRUE(ranges.ok()) << ranges.status();
  const DocumentRange valid = (*ranges)[1];
  EXPECT_EQ(valid.size(), 12);
  std::vector<std::vector<int32_t>> docs;
  for (int64_t d = valid.begin; d < valid.end; ++d) {
    std::vector<int32_t> tokens(ds->SequenceLength(d));
    EXPECT_TRUE(ds->ReadTokens(d, 0, absl::MakeSpan(tokens)).ok());
    docs.push_back(tokens);
  }
  const int64_t seq = spec.model().seq_length();
  const int64_t n = spec.training().eval_iters() * spec.training().global_batch_size();
  GptSampleOptions so;
  so.seq_length = seq;
  so.seed = static_cast<uint64_t>(spec.training().seed());
  so.num_samples = n;
  auto samples = GptSamples::Build(std::make_shared<InMemoryDocuments>(docs), so);
  EXPECT_TRUE(samples.ok()) << samples.status();
  std::vector<std::vector<int32_t>> out(n, std::vector<int32_t>(seq + 1));
  for (int64_t i = 0; i < n; ++i) EXPECT_TRUE(samples->Sample(i, absl::MakeSpan(out[i])).ok());
  return out;
}

double IndependentValidationLoss(Trainer* t) {
  const v1::JobSpec& spec = t->spec();
  const int64_t seq = spec.model().seq_length(), vocab = spec.model().vocab_size();
  const std::vector<std::vector<int32_t>> samples = IndependentValidSamples(t);
  const int64_t n = static_cast<int64_t>(samples.size());
  auto ids = kernels::Buffer::ForTensor(DType::kI32, {seq}, Device::Cpu());
  auto logits = kernels::Buffer::ForTensor(DType::kF32, {seq, vocab}, Device::Cpu());
  EXPECT_TRUE(ids.ok() && logits.ok());
  double sum = 0;
  // Megatron's model.eval(): no input jitter (this spec jitters in training), no aux statistics.
  t->model().SetTraining(false);
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int32_t>& sample = samples[i];
    for (int64_t j = 0; j < seq; ++j) ids->View().as<int32_t>()[j] = sample[j];
    EXPECT_TRUE(
        t->model().Forward(Stream::Cpu(), ids->View(), Tensor(), seq, 0, logits->View()).ok());
    const float* z = logits->View().as<float>();
    for (int64_t j = 0; j < seq; ++j) {
      double mx = -1e300, se = 0;
      for (int64_t v = 0; v < vocab; ++v) mx = std::max(mx, static_cast<double>(z[j * vocab + v]));
      for (int64_t v = 0; v < vocab; ++v) se += std::exp(z[j * vocab + v] - mx);
      sum += mx + std::log(se) - z[j * vocab + sample[j + 1]];
    }
  }
  t->model().SetTraining(true);
  return sum / static_cast<double>(n * seq);
}

TEST(EvaluateTest, EqualsAnIndependentComputationOnTheValidDocuments) {
  auto t = Trainer::Create(Spec(4, 2, 2), CpuF32());
  ASSERT_TRUE(t.ok()) << t.status();
  std::printf("%s\n", (*t)->Describe().c_str());
  EXPECT_TRUE(absl::StrContains((*t)->Describe(), "48 training documents, 12 validation"));
  EXPECT_EQ((*t)->eval_iters(), 2);
  for (int s = 0; s < 2; ++s) ASSERT_TRUE((*t)->Step().ok());
  auto got = (*t)->Evaluate();
  ASSERT_TRUE(got.ok()) << got.status();
  const double want = IndependentValidationLoss(t->get());
  std::printf("Evaluate %.9f, independent %.9f, |diff| %.3g\n", *got, want, std::abs(*got - want));
  EXPECT_NEAR(*got, want, 1e-5);
  // Not the training data's loss: the first training batch scores differently.
  auto train_batch = (*t)->EvalLoss();
  ASSERT_TRUE(train_batch.ok());
  std::printf("first training batch %.9f\n", *train_batch);
  EXPECT_GT(std::abs(*train_batch - *got), 1e-4);
  // --eval_tokens_out: the file holds exactly those windows, in order.
  const std::string path = TempDir() + "/valid_tokens.i32";
  ASSERT_TRUE((*t)->WriteValidationTokens(path).ok());
  const std::vector<std::vector<int32_t>> want_samples = IndependentValidSamples(t->get());
  std::ifstream f(path, std::ios::binary);
  std::vector<int32_t> row(want_samples[0].size());
  for (const std::vector<int32_t>& w : want_samples) {
    ASSERT_TRUE(f.read(reinterpret_cast<char*>(row.data()), row.size() * sizeof(int32_t)));
    EXPECT_EQ(row, w);
  }
  EXPECT_EQ(f.peek(), std::char_traits<char>::eof()) << "more than the scored windows";
}

// Mock data (data.mock_data) evaluates on mock valid batches of their own: the training steps
// are bit-identical to a run without evaluation, the valid batches are not the training ones,
// and every evaluation scores the same tokens.
TEST(EvaluateTest, MockDataEvaluatesOnItsOwnMockBatches) {
  auto mock = [](int64_t eval_interval) {
    auto spec = ParseJobSpecYaml(switchyard::test_specs::TinyMoeSpecYaml(4, true));
    EXPECT_TRUE(spec.ok()) << spec.status();
    spec->mutable_data()->set_mock_data(true);
    if (eval_interval > 0) {
      spec->mutable_training()->set_eval_interval(eval_interval);
      spec->mutable_training()->set_eval_iters(2);
    }
    return *spec;
  };
  auto plain = Trainer::Create(mock(0), CpuF32());
  auto evaluating = Trainer::Create(mock(2), CpuF32());
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(evaluating.ok()) << evaluating.status();
  EXPECT_EQ((*evaluating)->eval_iters(), 2);
  const std::vector<StepResult> a = Train(plain->get());
  const std::vector<StepResult> b = Train(evaluating->get());
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t s = 0; s < a.size(); ++s) {
    EXPECT_EQ(a[s].loss, b[s].loss) << "step " << s + 1;  // bitwise
    EXPECT_EQ(b[s].validation_loss.has_value(), (s + 1) % 2 == 0) << "step " << s + 1;
  }
  auto again = (*evaluating)->Evaluate();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *b[3].validation_loss);
  auto train_batch = (*evaluating)->EvalLoss();  // the first training batch
  ASSERT_TRUE(train_batch.ok());
  std::printf("mock: validation loss %.9f (step 2) %.9f (step 4), first training batch %.9f\n",
              *b[1].validation_loss, *b[3].validation_loss, *train_batch);
  EXPECT_GT(std::abs(*train_batch - *again), 1e-6);
  EXPECT_NE(*b[1].validation_loss, *b[3].validation_loss);
}

// Evaluation between steps must leave the training bit-identical: jitter counter, expert-bias
// counts, aux-loss statistics (global_aux_loss's running counts), data position.
class EvaluateStateTest : public ::testing::TestWithParam<bool> {};

TEST_P(EvaluateStateTest, ChangesNoTrainingState) {
  const bool seq_global_aux = GetParam();
  constexpr int64_t kSteps = 7;
  auto plain = Trainer::Create(Spec(kSteps, 0, 0, seq_global_aux), CpuF32());
  auto evaluating = Trainer::Create(Spec(kSteps, 3, 2, seq_global_aux), CpuF32());
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(evaluating.ok()) << evaluating.status();
  EXPECT_EQ((*plain)->eval_iters(), 0);
  const std::vector<StepResult> a = Train(plain->get());
  const std::vector<StepResult> b = Train(evaluating->get());
  ASSERT_EQ(a.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(b.size(), static_cast<size_t>(kSteps));
  for (int64_t s = 0; s < kSteps; ++s) {
    SCOPED_TRACE(absl::StrCat("step ", s + 1));
    EXPECT_EQ(a[s].loss, b[s].loss);  // bitwise
    EXPECT_EQ(a[s].aux_loss, b[s].aux_loss);
    EXPECT_EQ(a[s].grad_norm, b[s].grad_norm);
    EXPECT_EQ(a[s].expert_tokens, b[s].expert_tokens);
    EXPECT_FALSE(a[s].validation_loss.has_value());
    const bool due = (s + 1) % 3 == 0 || s + 1 == kSteps;  // steps 3, 6 and the last, 7
    ASSERT_EQ(b[s].validation_loss.has_value(), due);
    if (due) {
      std::printf("%s\n", (*evaluating)->FormatLogLine(b[s]).c_str());
      EXPECT_TRUE(absl::StrContains(
          (*evaluating)->FormatLogLine(b[s]),
          absl::StrFormat("| validation loss %.6f | validation ppl %.4f", *b[s].validation_loss,
                          std::exp(*b[s].validation_loss))));
    }
  }
  EXPECT_NE(*b[2].validation_loss, *b[5].validation_loss);  // the weights moved
  // The same batches at every evaluation: twice in a row, bit for bit, and the last step's.
  auto again = (*evaluating)->Evaluate();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *b[6].validation_loss);
}

INSTANTIATE_TEST_SUITE_P(LoadBalancing, EvaluateStateTest, ::testing::Bool(), [](const auto& info) {
  return info.param ? "SeqAndGlobalAux" : "AuxExpertBiasJitter";
});

// "validation loss X" values printed by the standalone loop, in order.
std::vector<double> PrintedValidationLosses(const std::string& log_path) {
  std::ifstream f(log_path);
  std::vector<double> out;
  std::string line;
  while (std::getline(f, line)) {
    const size_t at = line.find("| validation loss ");
    if (at == std::string::npos) continue;
    std::vector<std::string> words = absl::StrSplit(line.substr(at), ' ');
    double v = 0;
    EXPECT_TRUE(absl::SimpleAtod(words[3], &v)) << line;
    out.push_back(v);
  }
  return out;
}

// `switchyard-worker --eval` (RunEvaluation) on the checkpoints of a standalone run and on its
// HF export reproduces the run's validation losses.
TEST(RunEvaluationTest, CheckpointAndHfExportGiveTheInTrainingLoss) {
  const std::string save = Fresh("eval_run");
  v1::JobSpec spec = Spec(6, 3, 3, false, /*qwen=*/true);
  spec.mutable_training()->set_save(save);
  spec.mutable_training()->set_save_interval(3);
  StandaloneOptions standalone;
  standalone.progress_bar = false;
  standalone.export_hf = Fresh("eval_hf");
  const std::string log = Fresh("eval_run_log");
  std::FILE* out = std::fopen(log.c_str(), "w");
  ASSERT_NE(out, nullptr);
  // Captured from the loop itself (full precision) as well as from the printed lines.
  absl::Status st = RunStandalone(spec, CpuF32(), standalone, out);
  std::fclose(out);
  ASSERT_TRUE(st.ok()) << st;
  const std::vector<double> printed = PrintedValidationLosses(log);
  ASSERT_EQ(printed.size(), 2u);  // steps 3 and 6 (the last)
  ASSERT_TRUE(HasCommittedStep(save, 3));
  ASSERT_TRUE(HasCommittedStep(save, 6));

  struct Case {
    std::string load;
    double want;
  } cases[] = {{save, printed[1]},
               {CheckpointStepDir(save, 3), printed[0]},
               {standalone.export_hf, printed[1]}};
  for (const Case& c : cases) {
    v1::JobSpec eval_spec = spec;
    eval_spec.mutable_training()->clear_save();  // --eval writes nothing
    eval_spec.mutable_training()->clear_save_interval();
    const std::string eval_log = Fresh("eval_log");
    std::FILE* eo = std::fopen(eval_log.c_str(), "w");
    ASSERT_NE(eo, nullptr);
    absl::StatusOr<double> got = RunEvaluation(eval_spec, CpuF32(), {c.load}, eo);
    std::fclose(eo);
    ASSERT_TRUE(got.ok()) << c.load << ": " << got.status();
    std::ifstream text(eval_log);
    std::string all((std::istreambuf_iterator<char>(text)), std::istreambuf_iterator<char>());
    std::printf("--eval --load %s:\n%s", c.load.c_str(), all.c_str());
    EXPECT_TRUE(absl::StrContains(all, absl::StrFormat("validation loss %.6f", *got))) << all;
    // The printed in-training value has 6 decimals: equal within 1e-5 (rounding 5e-7).
    EXPECT_NEAR(*got, c.want, 1e-5) << c.load;
  }
}

// --eval may use another global batch size than the run (no data position is resumed): the
// loss is then over other batches of the valid split, but the checkpoint loads.
TEST(RunEvaluationTest, AnotherGlobalBatchSizeLoads) {
  const std::string save = Fresh("eval_gbs");
  v1::JobSpec spec = Spec(4, 2, 1);
  spec.mutable_training()->set_save(save);
  auto t = Trainer::Create(spec, CpuF32());
  ASSERT_TRUE(t.ok()) << t.status();
  Train(t->get());
  ASSERT_TRUE(HasCommittedStep(save, 4));
  v1::JobSpec eval_spec = Spec(4, 0, 2);
  eval_spec.mutable_training()->set_global_batch_size(4);
  absl::StatusOr<double> got = RunEvaluation(eval_spec, CpuF32(), {save}, stdout);
  ASSERT_TRUE(got.ok()) << got.status();
  // The same 8 samples as the run's one evaluation batch of 8 (eval_iters 2 x 4): the same loss.
  auto run_eval = (*t)->Evaluate();
  ASSERT_TRUE(run_eval.ok());
  std::printf("global batch 4 x 2: %.9f, the run's 8 x 1: %.9f\n", *got, *run_eval);
  EXPECT_NEAR(*got, *run_eval, 1e-6);
}

TEST(RunEvaluationTest, RefusesWhatItCannotEvaluate) {
  v1::JobSpec spec = Spec(4, 0, 1);
  auto no_load = RunEvaluation(spec, CpuF32(), {""}, stdout);
  EXPECT_EQ(no_load.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(no_load.status().message(), "--load")) << no_load.status();
  const std::string nowhere = Fresh("no_such_checkpoint");
  auto missing = RunEvaluation(spec, CpuF32(), {nowhere}, stdout);
  EXPECT_FALSE(missing.ok());
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "--load " + nowhere))
      << missing.status();
  std::printf("missing checkpoint: %s\n", missing.status().ToString().c_str());

  // A positive valid weight that rounds to no document of this 60-document dataset.
  v1::JobSpec tiny_valid = Spec(4, 1, 1);
  tiny_valid.mutable_data()->set_split("1000,1,0");
  auto t = Trainer::Create(tiny_valid, CpuF32());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(t.status().message(),
                                "data.split (\"1000,1,0\") leaves the valid split empty (0 of 60 "
                                "documents) but training.eval_interval is set"))
      << t.status();
  // The same split without evaluation trains as before.
  tiny_valid.mutable_training()->clear_eval_interval();
  EXPECT_TRUE(Trainer::Create(tiny_valid, CpuF32()).ok());
}

// World 2 over Gloo: DP2, EP2, CP2 and TP2 (with sequence parallelism) evaluate as one process.
struct Layout {
  const char* name;
  int tp, ep, cp;
};

v1::JobSpec WorldTwoSpec(const Layout& l) {
  v1::JobSpec spec = Spec(6, 3, 2);
  v1::ParallelConfig* p = spec.mutable_parallel();
  p->set_world_size(2);
  p->set_expert_model_parallel_size(l.ep);
  p->set_context_parallel_size(l.cp);
  if (l.tp > 1) {
    p->set_tensor_model_parallel_size(l.tp);
    p->set_sequence_parallel(true);  // required with MoE
    p->set_expert_tensor_parallel_size(1);
  }
  return spec;
}

int RankBody(int rank, const Layout& l, const std::string& store_dir, const std::string& out,
             const std::string& save) {
  auto groups = JoinGlooGroups(store_dir, rank, LayoutDims(2, l.tp, l.ep, l.cp, /*etp=*/1));
  SY_CHILD_OK(groups.status());
  TrainerOptions opt = CpuF32();
  opt.groups = groups->get();
  v1::JobSpec spec = WorldTwoSpec(l);
  spec.mutable_training()->set_save(save);
  auto t = Trainer::Create(spec, opt);
  SY_CHILD_OK(t.status());
  std::ofstream f;
  if (rank == 0) f.open(out);
  TrainingLoopHooks hooks;
  hooks.on_step = [&](const StepResult& r) {
    if (rank == 0 && r.validation_loss.has_value()) {
      f << absl::StrFormat("%d %.17g\n", r.step, *r.validation_loss);
    }
  };
  SY_CHILD_OK(RunTrainingLoop(t->get(), hooks).status());
  return 0;
}

TEST(DistributedEvaluateTest, WorldTwoEqualsOneProcess) {
  auto one = Trainer::Create(Spec(6, 3, 2), CpuF32());
  ASSERT_TRUE(one.ok()) << one.status();
  const std::vector<StepResult> ref = Train(one->get());
  std::map<int64_t, double> want;
  for (const StepResult& r : ref) {
    if (r.validation_loss.has_value()) want[r.step] = *r.validation_loss;
  }
  ASSERT_EQ(want.size(), 2u);
  const Layout layouts[] = {{"DP2", 1, 1, 1}, {"EP2", 1, 2, 1}, {"CP2", 1, 1, 2}, {"TP2", 2, 1, 1}};
  for (const Layout& l : layouts) {
    const std::string what = l.name;
    const std::string store = ct::UniqueStoreDir(absl::StrCat("eval_store_", what));
    const std::string out = Fresh(absl::StrCat("eval_dist_", what));
    const std::string save = Fresh(absl::StrCat("eval_dist_ckpt_", what));
    const std::vector<int> codes = ct::RunProcesses(
        2, absl::Minutes(5), [&](int rank) { return RankBody(rank, l, store, out, save); });
    for (int r = 0; r < 2; ++r) ASSERT_EQ(codes[r], 0) << what << " rank " << r;
    std::ifstream f(out);
    std::map<int64_t, double> got;
    int64_t step = 0;
    double v = 0;
    while (f >> step >> v) got[step] = v;
    ASSERT_EQ(got.size(), want.size()) << what;
    for (const auto& [s, w] : want) {
      const double rel = std::abs(got[s] - w) / std::abs(w);
      std::printf("%s step %lld: validation loss %.9f, one process %.9f, rel diff %.3g\n",
                  what.c_str(), static_cast<long long>(s), got[s], w, rel);
      EXPECT_LT(rel, 1e-5) << what << " step " << s;
    }
    // One process evaluates the world-2 checkpoint (resharded) to the same number.
    absl::StatusOr<double> single = RunEvaluation(Spec(6, 3, 2), CpuF32(), {save}, stdout);
    ASSERT_TRUE(single.ok()) << single.status();
    std::printf("%s checkpoint evaluated by one process: %.9f (world 2: %.9f)\n", what.c_str(),
                *single, got[6]);
    EXPECT_NEAR(*single, got[6], 1e-5) << what;
  }
}

// PP > 1: Megatron's forward-only pipeline schedule. The 4-layer variant (MoE, dense, MoE, MoE;
// untied head) at PP2 (2 stages of 2 layers), PP2·VPP2 (chunks of one layer: stage 0 holds
// layers 0 and 2, stage 1 layers 1 and 3) and PP2·EP2 (world 4, DP2) trains 6 steps evaluating
// at steps 3 and 6: EVERY rank (each stage, each DP rank) reports the same validation losses,
// equal to one process's within 1e-5 relative; one process evaluates the final PP checkpoint
// (resharded) to the same number.
struct PipeLayout {
  const char* name;
  int world, pp, vpp, ep;
};

v1::JobSpec PipeSpec(const PipeLayout* l) {
  v1::JobSpec spec = Spec(6, 3, 2);
  v1::ModelConfig* m = spec.mutable_model();
  m->set_num_layers(4);
  m->clear_moe_layer_pattern();
  for (int x : {1, 0, 1, 1}) m->add_moe_layer_pattern(x);
  m->set_untie_embeddings_and_output_weights(true);
  if (l != nullptr) {
    v1::ParallelConfig* p = spec.mutable_parallel();
    p->set_world_size(l->world);
    p->set_pipeline_model_parallel_size(l->pp);
    if (l->vpp > 1) p->set_virtual_pipeline_model_parallel_size(l->vpp);
    p->set_expert_model_parallel_size(l->ep);
  }
  return spec;
}

TEST(DistributedEvaluateTest, PipelineEqualsOneProcess) {
  auto one = Trainer::Create(PipeSpec(nullptr), CpuF32());
  ASSERT_TRUE(one.ok()) << one.status();
  const std::vector<StepResult> ref = Train(one->get());
  std::map<int64_t, double> want;
  for (const StepResult& r : ref) {
    if (r.validation_loss.has_value()) want[r.step] = *r.validation_loss;
  }
  ASSERT_EQ(want.size(), 2u);
  const PipeLayout layouts[] = {
      {"PP2", 2, 2, 1, 1}, {"PP2_VPP2", 2, 2, 2, 1}, {"PP2_EP2", 4, 2, 1, 2}};
  for (const PipeLayout& l : layouts) {
    const std::string what = l.name;
    const std::string store = ct::UniqueStoreDir(absl::StrCat("eval_store_", what));
    const std::string out = Fresh(absl::StrCat("eval_pipe_", what));
    const std::string save = Fresh(absl::StrCat("eval_pipe_ckpt_", what));
    const std::vector<int> codes = ct::RunProcesses(l.world, absl::Minutes(5), [&](int rank) {
      std::shared_ptr<comm::KvStore> kv = ct::OpenFileStore(store);
      SY_CHILD_CHECK(kv != nullptr);
      ParallelDims dims;
      dims.world_size = l.world;
      dims.pipeline_model_parallel_size = l.pp;
      dims.expert_model_parallel_size = l.ep;
      dims.expert_tensor_parallel_size = 1;
      comm::GlooOptions gopt;
      gopt.timeout = absl::Seconds(60);
      auto groups = CreateGlooProcessGroups(kv, rank, dims, gopt);
      SY_CHILD_OK(groups.status());
      TrainerOptions opt = CpuF32();
      opt.groups = groups->get();
      v1::JobSpec spec = PipeSpec(&l);
      spec.mutable_training()->set_save(save);
      auto t = Trainer::Create(spec, opt);
      SY_CHILD_OK(t.status());
      // Every rank writes its own validation losses: all stages must report the same value.
      std::ofstream f(absl::StrCat(out, ".", rank));
      TrainingLoopHooks hooks;
      hooks.on_step = [&](const StepResult& r) {
        if (r.validation_loss.has_value()) {
          f << absl::StrFormat("%d %.17g\n", r.step, *r.validation_loss);
        }
      };
      SY_CHILD_OK(RunTrainingLoop(t->get(), hooks).status());
      return 0;
    });
    for (int r = 0; r < l.world; ++r) ASSERT_EQ(codes[r], 0) << what << " rank " << r;
    std::map<int64_t, double> rank0;
    for (int r = 0; r < l.world; ++r) {
      std::ifstream f(absl::StrCat(out, ".", r));
      std::map<int64_t, double> got;
      int64_t step = 0;
      double v = 0;
      while (f >> step >> v) got[step] = v;
      ASSERT_EQ(got.size(), want.size()) << what << " rank " << r;
      if (r == 0) rank0 = got;
      for (const auto& [st, w] : want) {
        const double rel = std::abs(got[st] - w) / std::abs(w);
        std::printf("%s rank %d step %lld: validation loss %.9f, one process %.9f, rel diff %.3g\n",
                    what.c_str(), r, static_cast<long long>(st), got[st], w, rel);
        EXPECT_LT(rel, 1e-5) << what << " rank " << r << " step " << st;
        EXPECT_EQ(got[st], rank0[st]) << what << ": rank " << r << " differs from rank 0";
      }
    }
    absl::StatusOr<double> single = RunEvaluation(PipeSpec(nullptr), CpuF32(), {save}, stdout);
    ASSERT_TRUE(single.ok()) << single.status();
    std::printf("%s checkpoint evaluated by one process: %.9f (pipeline: %.9f)\n", what.c_str(),
                *single, rank0[6]);
    EXPECT_NEAR(*single, rank0[6], 1e-5) << what;
  }
}

}  // namespace
}  // namespace switchyard::train
