// CPU tests of the trainer: bit-identical resume, learning on the real corpus below its unigram
// entropy, and clear errors for bad specs and mismatched checkpoints.
#include "worker/train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "common/config/config.h"
#include "worker/train/resume.h"
#include "worker/train/testing/small_corpus.h"

namespace switchyard::train {
namespace {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

v1::JobSpec Spec(const std::string& yaml) {
  auto spec = ParseJobSpecYaml(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// A tiny MoE model on mock data, exercising expert bias, jitter, aux and z losses, a dense
// layer, QK-norm and micro-batching.
constexpr char kTinyMock[] = R"(
model:
  num_layers: 2
  hidden_size: 32
  num_attention_heads: 4
  num_query_groups: 2
  ffn_hidden_size: 48
  seq_length: 16
  vocab_size: 64
  qk_layernorm: true
  num_experts: 4
  moe_router_topk: 2
  moe_ffn_hidden_size: 24
  moe_router_score_function: sigmoid
  moe_router_enable_expert_bias: true
  moe_router_load_balancing_type: seq_aux_loss
  moe_aux_loss_coeff: 0.01
  moe_z_loss_coeff: 0.001
  moe_input_jitter_eps: 0.01
  moe_layer_freq: 2
training:
  micro_batch_size: 2
  global_batch_size: 4
  train_iters: 8
  lr: 0.003
  lr_warmup_iters: 2
  seed: 7
data:
  mock_data: true
)";

TEST(TrainerTest, ResumeIsBitIdentical) {
  TrainerOptions opt;
  const v1::JobSpec spec = Spec(kTinyMock);
  auto full = Trainer::Create(spec, opt);
  ASSERT_TRUE(full.ok()) << full.status();
  std::vector<double> losses, norms;
  for (int i = 0; i < 8; ++i) {
    auto r = (*full)->Step();
    ASSERT_TRUE(r.ok()) << r.status();
    losses.push_back(r->loss);
    norms.push_back(r->grad_norm);
  }
  const std::string root = TempDir("resume");
  auto first = Trainer::Create(spec, opt);
  ASSERT_TRUE(first.ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*first)->Step().ok());
  auto dir = (*first)->Save(root);
  ASSERT_TRUE(dir.ok()) << dir.status();
  first->reset();  // the process "dies"
  auto second = Trainer::Create(spec, opt);
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE((*second)->Load(root).ok());
  EXPECT_EQ((*second)->step(), 5);
  for (int i = 5; i < 8; ++i) {
    auto r = (*second)->Step();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->loss, losses[i]) << "step " << i + 1;
    EXPECT_EQ(r->grad_norm, norms[i]) << "step " << i + 1;
  }
  // Final weights are bit-identical too.
  for (const auto& p : (*full)->model().layout().params) {
    auto a = (*full)->MasterToHost(p.name);
    auto b = (*second)->MasterToHost(p.name);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(std::memcmp(a->data(), b->data(), a->bytes()), 0) << p.name;
  }
  std::printf("resume after step 5 of 8: losses %.6f %.6f %.6f bit-identical\n", losses[5],
              losses[6], losses[7]);
  EXPECT_EQ((*second)->Step().status().code(), absl::StatusCode::kOutOfRange);
}

// The one resume rule (resume.h), shared by standalone runs and the agent: the run's own
// training.save wins over training.load; else training.load must load; else from scratch.
TEST(TrainerTest, ResumeRule) {
  TrainerOptions opt;
  const std::string load_root = TempDir("rule_load"), save_root = TempDir("rule_save");
  {
    auto t = Trainer::Create(Spec(kTinyMock), opt);
    ASSERT_TRUE(t.ok()) << t.status();
    for (int i = 0; i < 2; ++i) ASSERT_TRUE((*t)->Step().ok());
    ASSERT_TRUE((*t)->Save(load_root).ok());
  }
  v1::JobSpec spec = Spec(kTinyMock);
  spec.mutable_training()->set_load(load_root);
  spec.mutable_training()->set_save(save_root);
  auto fresh = [&]() {
    auto t = Trainer::Create(spec, opt);
    EXPECT_TRUE(t.ok()) << t.status();
    return std::move(*t);
  };
  // Nothing of its own yet: training.load.
  auto t = fresh();
  auto line = ResumeTraining(t.get(), spec.training());
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(*line, "loaded " + load_root + " at step 2");
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(t->Step().ok());
  ASSERT_TRUE(t->Save(save_root).ok());
  // Its own checkpoint (step 5) wins over training.load (step 2): a restarted run continues.
  t = fresh();
  line = ResumeTraining(t.get(), spec.training());
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(*line, "resumed from " + save_root + " at step 5");
  EXPECT_EQ(t->step(), 5);
  // A first generation must not find one (an earlier job's with the same id).
  t = fresh();
  ResumeOptions first;
  first.own_must_be_empty = true;
  line = ResumeTraining(t.get(), spec.training(), first);
  EXPECT_EQ(line.status().code(), absl::StatusCode::kFailedPrecondition) << line.status();
  EXPECT_NE(line.status().message().find("already holds a checkpoint (step 5)"), std::string::npos)
      << line.status();
  EXPECT_EQ(t->step(), 0) << "nothing loaded";
  // training.load naming a missing directory is an error, never a silent start from scratch.
  v1::JobSpec missing = Spec(kTinyMock);
  missing.mutable_training()->set_load(load_root + "_missing");
  t = fresh();
  line = ResumeTraining(t.get(), missing.training());
  EXPECT_EQ(line.status().code(), absl::StatusCode::kFailedPrecondition) << line.status();
  EXPECT_NE(line.status().message().find("training.load"), std::string::npos) << line.status();
  // training.load = <root>/step_2 loads that step even when `latest` is newer.
  {
    auto t2 = Trainer::Create(Spec(kTinyMock), opt);
    ASSERT_TRUE(t2.ok());
    for (int i = 0; i < 4; ++i) ASSERT_TRUE((*t2)->Step().ok());
    ASSERT_TRUE((*t2)->Save(load_root).ok());
  }
  v1::JobSpec pinned = Spec(kTinyMock);
  pinned.mutable_training()->set_load(load_root + "/step_2");
  t = fresh();
  line = ResumeTraining(t.get(), pinned.training());
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(t->step(), 2);
  // Nothing at all: from scratch.
  t = fresh();
  line = ResumeTraining(t.get(), Spec(kTinyMock).training());
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(*line, "");
  EXPECT_EQ(t->step(), 0);
}

TEST(TrainerTest, MismatchedCheckpointIsRejectedAndChangesNothing) {
  TrainerOptions opt;
  auto a = Trainer::Create(Spec(kTinyMock), opt);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->Step().ok());
  const std::string root = TempDir("mismatch");
  ASSERT_TRUE((*a)->Save(root).ok());
  v1::JobSpec other = Spec(kTinyMock);
  other.mutable_model()->set_hidden_size(64);
  auto b = Trainer::Create(other, opt);
  ASSERT_TRUE(b.ok()) << b.status();
  auto before = (*b)->MasterToHost("embedding.weight");
  absl::Status st = (*b)->Load(root);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  // The first tensor whose shape differs is named (the expert weights come first in the layout).
  EXPECT_NE(st.message().find("tensor \"layers.0.moe.experts.fc1\" is f32[4,32,48]"),
            std::string::npos)
      << st;
  EXPECT_EQ((*b)->step(), 0);
  auto after = (*b)->MasterToHost("embedding.weight");
  EXPECT_EQ(std::memcmp(before->data(), after->data(), before->bytes()), 0);
}

TEST(TrainerTest, BadSpecsNameTheField) {
  TrainerOptions opt;
  v1::JobSpec spec = Spec(kTinyMock);
  spec.mutable_parallel()->set_world_size(2);
  auto t = Trainer::Create(spec, opt);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("parallel.world_size"), std::string::npos) << t.status();
  spec = Spec(kTinyMock);
  spec.mutable_training()->set_global_batch_size(5);
  t = Trainer::Create(spec, opt);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("global_batch_size"), std::string::npos) << t.status();
  spec = Spec(kTinyMock);
  spec.mutable_model()->clear_vocab_size();
  t = Trainer::Create(spec, opt);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("model.vocab_size"), std::string::npos) << t.status();
}

// The quickstart's corpus (tools/prepare_corpus.sh, run by tools/setup.sh), re-tokenized by the
// test with a 512-token byte-level BPE so that a CPU-sized model sees enough of it in a few hundred
// steps (the corpus's own 4096-token vocabulary makes the LM head dominate a CPU step).
TEST(TrainerTest, LearnsTheCorpusBelowItsUnigramEntropy) {
  auto corpus = train::testing::MakeSmallCorpus(TempDir("kjv512"), 512);
  ASSERT_TRUE(corpus.ok()) << corpus.status() << " (tools/setup.sh prepares the corpus)";
  const double unigram = corpus->unigram_entropy;
  v1::JobSpec spec = Spec(R"(
model:
  num_layers: 2
  hidden_size: 64
  num_attention_heads: 4
  ffn_hidden_size: 128
  seq_length: 64
  vocab_size: 512
  num_experts: 4
  moe_router_topk: 2
  moe_ffn_hidden_size: 64
  moe_router_load_balancing_type: aux_loss
  moe_aux_loss_coeff: 0.01
training:
  micro_batch_size: 4
  global_batch_size: 8
  train_iters: 300
  lr: 0.01
  min_lr: 0.001
  lr_warmup_iters: 20
  weight_decay: 0.01
  seed: 1234
)");
  spec.mutable_data()->add_data_path(corpus->prefix);
  TrainerOptions opt;
  auto t = Trainer::Create(spec, opt);
  ASSERT_TRUE(t.ok()) << t.status();
  std::printf("%s\n", (*t)->Describe().c_str());
  double first = 0, last = 0;
  int last_n = 0;
  while ((*t)->step() < (*t)->train_iters()) {
    auto r = (*t)->Step();
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(std::isfinite(r->loss));
    if (r->step == 1) first = r->loss;
    if (r->step > (*t)->train_iters() - 20) {
      last += r->loss;
      ++last_n;
    }
    if (r->step % 50 == 0 || r->step == 1) std::printf("%s\n", (*t)->FormatLogLine(*r).c_str());
  }
  last /= last_n;
  std::printf(
      "corpus %s (%zu tokens at vocab 512): unigram entropy %.4f nats/token; loss %.4f at "
      "step 1, %.4f mean of the last 20 steps\n",
      corpus->name.c_str(), static_cast<size_t>(corpus->tokens), unigram, first, last);
  EXPECT_GT(first, unigram);  // starts near ln(V)
  EXPECT_LT(last, unigram - 0.75) << "the model did not learn beyond token frequencies";
}

}  // namespace
}  // namespace switchyard::train
