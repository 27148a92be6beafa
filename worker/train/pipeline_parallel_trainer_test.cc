// File: worker/train/pipeline_parallel_trainer_test.cc
//
// Pipeline parallelism (Megatron's non-interleaved 1F1B schedule) over Gloo between real forked
// processes (CPU): PP2, PP4, PP2·EP2, PP2·TP2, DP·PP2·EP2 (world 8), PP2·CP2, PP2·TP2·EP2
// (world 8) and three uneven layouts
// (parallel.decoder_first/last_pipeline_num_layers) train a 4-layer variant of
// the tiny MoE model of worker/train/testing/tiny_moe_spec.h (MoE, dense, MoE, MoE; untied
// embedding and LM head) for 20 steps and must give one process's routing (tokens per expert of
// every MoE layer, every step) and loss / grad-norm curve within 1e-5 relative. With 8
// micro-batches per step and PP2 / PP4, the first stage has 1 / 3 micro-batches in flight
// between their forward and backward: wrong per-micro-batch activation or dispatcher state would
// corrupt the gradients and the curve. Too few micro-batches for the pipeline is rejected on every
// rank with INVALID_ARGUMENT naming the fields and the rule. A PP2·EP2 checkpoint resumes in one
// process, and a one-process checkpoint at PP2·EP2.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "gtest/gtest.h"
#include "worker/comm/testing/forked_ranks.h"
#include "worker/train/process_groups.h"
#include "worker/train/testing/curve.h"
#include "worker/train/testing/tiny_moe_spec.h"
#include "worker/train/trainer.h"

namespace switchyard::train {
namespace {

namespace ct = ::switchyard::comm::testing;
using curves::Curve;
using curves::CurveLine;
using curves::ExpectSameCurve;
using curves::OutFile;
using curves::ReadCurve;
using curves::StepUntil;

constexpr int kSteps = 20;

struct Layout {
  int world = 1, pp = 1, ep = 1, tp = 1;
  // Uneven layouts: parallel.decoder_first/last_pipeline_num_layers (0: unset) and the first
  // layer of every stage they give (worked out by hand; empty: the even split).
  int first = 0, last = 0;
  std::vector<int> begins;
  int cp = 1;
  bool tied = false;        // tied embedding and LM head (the last stage holds a copy)
  bool global_aux = false;  // moe_router_load_balancing_type global_aux_loss (not aux_loss)
  std::string Name() const {
    return absl::StrCat("PP=", pp, " EP=", ep, tp > 1 ? absl::StrCat(" TP=", tp) : "",
                        cp > 1 ? absl::StrCat(" CP=", cp) : "", tied ? " tied" : "",
                        global_aux ? " global_aux_loss" : "",
                        first > 0 ? absl::StrCat(" first=", first) : "",
                        last > 0 ? absl::StrCat(" last=", last) : "", " (world ", world, ", DP ",
                        world / (pp * tp * cp), ")");
  }
};

// The tiny MoE job with 4 layers (PP4 gets one per stage) and untied embeddings (tied with
// layout.tied) at `layout`.
v1::JobSpec Spec(const Layout& layout) {
  auto spec = ParseJobSpecYaml(switchyard::test_specs::TinyMoeSpecYaml(kSteps, /*jitter=*/true));
  EXPECT_TRUE(spec.ok()) << spec.status();
  v1::ModelConfig* m = spec->mutable_model();
  m->set_num_layers(4);
  m->clear_moe_layer_pattern();
  for (int x : {1, 0, 1, 1}) m->add_moe_layer_pattern(x);
  m->set_untie_embeddings_and_output_weights(!layout.tied);
  if (layout.global_aux) {
    m->clear_moe_router_load_balancing_type();
    m->add_moe_router_load_balancing_type("global_aux_loss");
  }
  if (layout.world > 1) {
    v1::ParallelConfig* p = spec->mutable_parallel();
    p->set_world_size(layout.world);
    p->set_pipeline_model_parallel_size(layout.pp);
    p->set_expert_model_parallel_size(layout.ep);
    if (layout.first > 0) p->set_decoder_first_pipeline_num_layers(layout.first);
    if (layout.last > 0) p->set_decoder_last_pipeline_num_layers(layout.last);
    if (layout.cp > 1) p->set_context_parallel_size(layout.cp);
    if (layout.tp > 1) {
      p->set_tensor_model_parallel_size(layout.tp);
      p->set_sequence_parallel(true);  // required with MoE (validate_moe.cc)
      p->set_expert_tensor_parallel_size(1);
    }
  }
  return *spec;
}

TrainerOptions CpuF32() {
  TrainerOptions opt;
  opt.force_dtype = true;
  opt.dtype = DType::kF32;
  return opt;
}

// One process: steps up to `last` after loading `load_root` (if given); saves to `save_root`.
Curve SingleProcess(int64_t last, const std::string& load_root = "",
                    const std::string& save_root = "", bool tied = false, bool global_aux = false) {
  Curve c;
  Layout one;
  one.tied = tied;
  one.global_aux = global_aux;
  auto t = Trainer::Create(Spec(one), CpuF32());
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return c;
  if (!load_root.empty()) {
    absl::Status st = (*t)->Load(load_root);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return c;
  }
  c = StepUntil(t->get(), last);
  if (!save_root.empty()) {
    EXPECT_TRUE((*t)->Save(save_root).ok());
  }
  return c;
}

std::unique_ptr<ProcessGroups> JoinGroups(int rank, const Layout& layout,
                                          const std::string& store_dir) {
  std::shared_ptr<comm::KvStore> store = ct::OpenFileStore(store_dir);
  if (store == nullptr) return nullptr;
  ParallelDims dims;
  dims.world_size = layout.world;
  dims.pipeline_model_parallel_size = layout.pp;
  dims.expert_model_parallel_size = layout.ep;
  dims.tensor_model_parallel_size = layout.tp;
  dims.context_parallel_size = layout.cp;
  dims.expert_tensor_parallel_size = 1;
  comm::GlooOptions gopt;
  gopt.timeout = absl::Seconds(60);
  auto groups = CreateGlooProcessGroups(store, rank, dims, gopt);
  if (!groups.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, groups.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*groups);
}

// One rank: trains up to step `last`; rank 0 (the first stage: PP is the outermost axis)
// appends "loss norm counts" lines to `out` (the loss and the MoE statistics are summed over
// the stages, the norm over all of them).
int RankBody(int rank, const Layout& layout, const std::string& store_dir, const std::string& out,
             int64_t last, const std::string& load_root, const std::string& save_root) {
  std::unique_ptr<ProcessGroups> groups = JoinGroups(rank, layout, store_dir);
  SY_CHILD_CHECK(groups != nullptr);
  SY_CHILD_CHECK(groups->pp != nullptr && groups->pp->size() == layout.pp);
  TrainerOptions opt = CpuF32();
  opt.groups = groups.get();
  opt.grad_bucket_elements = 1;  // one bucket per layer, reduced during the last backward
  auto t = Trainer::Create(Spec(layout), opt);
  SY_CHILD_OK(t.status());
  const model::GptConfig& mc = (*t)->model_config();
  SY_CHILD_CHECK(mc.pp_size == layout.pp);
  // Each stage holds only its layers: a tensor of another stage is not in its layout.
  const int64_t begin =
      layout.begins.empty() ? mc.pp_rank * (4 / layout.pp) : layout.begins[mc.pp_rank];
  const int64_t end = mc.last_stage()         ? 4
                      : layout.begins.empty() ? begin + 4 / layout.pp
                                              : layout.begins[mc.pp_rank + 1];
  SY_CHILD_CHECK(mc.layer_begin == begin && mc.stage_layer_end() == end);
  const model::GptParamLayout& lay = (*t)->model().layout();
  // A tied embedding: the last stage's LM head is its copy of embedding.weight.
  const bool holds_embedding = mc.first_stage() || (layout.tied && mc.last_stage());
  SY_CHILD_CHECK((lay.Find("embedding.weight") != nullptr) == holds_embedding);
  SY_CHILD_CHECK((lay.Find("output.weight") != nullptr) == (mc.last_stage() && !layout.tied));
  for (int l = 0; l < 4; ++l) {
    const bool held = lay.Find(absl::StrCat("layers.", l, ".input_norm.weight")) != nullptr;
    SY_CHILD_CHECK(held == (l >= begin && l < end));
  }
  if (!load_root.empty()) SY_CHILD_OK((*t)->Load(load_root));
  std::ofstream f;
  if (rank == 0) f.open(out, std::ios::app);
  while ((*t)->step() < last) {
    auto r = (*t)->Step();
    SY_CHILD_OK(r.status());
    if (rank == 0) f << CurveLine(*r);
  }
  if (!save_root.empty()) SY_CHILD_OK((*t)->Save(save_root).status());
  return 0;
}

Curve RunLayout(const Layout& layout, int64_t last, const std::string& load_root = "",
                const std::string& save_root = "") {
  const std::string store = ct::UniqueStoreDir("pp_store");
  const std::string out = OutFile("pp_curve");
  const absl::Time start = absl::Now();
  const std::vector<int> codes = ct::RunProcesses(layout.world, absl::Minutes(10), [&](int rank) {
    return RankBody(rank, layout, store, out, last, load_root, save_root);
  });
  for (int r = 0; r < layout.world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  std::printf("%s: %.1f s\n", layout.Name().c_str(), absl::ToDoubleSeconds(absl::Now() - start));
  return ReadCurve(out);
}

class PipelineParallelTrainerTest : public ::testing::TestWithParam<Layout> {};

TEST_P(PipelineParallelTrainerTest, MatchesSingleProcess) {
  const Layout layout = GetParam();
  const Curve ref = SingleProcess(kSteps, "", "", layout.tied, layout.global_aux);
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps));
  const Curve got = RunLayout(layout, kSteps);
  ASSERT_EQ(got.loss.size(), static_cast<size_t>(kSteps));
  ExpectSameCurve(ref, got, 0, layout.Name());
  EXPECT_LT(got.loss.back(), got.loss.front());  // it trains
}

// PP2 (2 stages of 2 layers), PP4 (one layer per stage: the middle stages only receive and
// send), PP2·EP2 (DP2 per stage, experts split), PP2·TP2 (sequence-parallel shards sent between
// stages), DP4·PP2·EP2 (world 8), PP2·CP2 (each CP rank sends its two chunks of every sequence;
// EP1), PP2·TP2·EP2 (world 8: DP2, the sequence-parallel shards of each CP-less TP pair sent
// between stages, experts split over EP2 × EDP2 on each stage).
// Tied embeddings (Megatron's embedding group: the last stage's LM head is a copy of the
// embedding, its gradient summed with the first stage's after the schedule, counted once in the
// norm): PP2, PP4 (the first and last stage are not neighbours), PP2·EP2 (DP2: the copy's part of
// the norm is taken from every DP shard), PP2·TP2 (the copy's gradient summed over TP first).
// global_aux_loss (its running counts over the global batch's micro-batches: one per layer for
// all in-flight slots of a stage): PP2, PP4 (4 slots on the first stage), PP2·TP2·EP2 and
// PP2·CP2 (the counts summed over TP×DP×CP per micro-batch), all at DP = 1: at DP > 1 the running
// mean is taken per DP rank's micro-batches and differs from one process's by design (spec §2.3,
// as distributed_trainer_test notes).
// Uneven: PP2 with one layer on the first stage (1 | 3), PP3 with two on the first (2 | 1 | 1: an
// odd stage count, the middle stage odd in the send order) and PP2·EP2 with one on the last
// (3 | 1).
INSTANTIATE_TEST_SUITE_P(
    Layouts, PipelineParallelTrainerTest,
    ::testing::Values(
        Layout{2, 2, 1, 1}, Layout{4, 4, 1, 1}, Layout{4, 2, 2, 1}, Layout{4, 2, 1, 2},
        Layout{8, 2, 2, 1}, Layout{2, 2, 1, 1, 1, 0, {0, 1}}, Layout{3, 3, 1, 1, 2, 0, {0, 2, 3}},
        Layout{4, 2, 2, 1, 0, 1, {0, 3}}, Layout{4, 2, 1, 1, 0, 0, {}, 2}, Layout{8, 2, 2, 2},
        Layout{2, 2, 1, 1, 0, 0, {}, 1, true}, Layout{4, 4, 1, 1, 0, 0, {}, 1, true},
        Layout{4, 2, 2, 1, 0, 0, {}, 1, true}, Layout{4, 2, 1, 2, 0, 0, {}, 1, true},
        Layout{2, 2, 1, 1, 0, 0, {}, 1, false, true}, Layout{4, 4, 1, 1, 0, 0, {}, 1, false, true},
        Layout{4, 2, 2, 2, 0, 0, {}, 1, false, true}, Layout{4, 2, 1, 1, 0, 0, {}, 2, false, true}),
    [](const auto& info) {
      const Layout& l = info.param;
      return absl::StrCat("PP", l.pp, "_EP", l.ep, l.tp > 1 ? absl::StrCat("_TP", l.tp) : "",
                          l.cp > 1 ? absl::StrCat("_CP", l.cp) : "", l.tied ? "_Tied" : "",
                          l.global_aux ? "_GlobalAux" : "",
                          l.first > 0 ? absl::StrCat("_First", l.first) : "",
                          l.last > 0 ? absl::StrCat("_Last", l.last) : "", "_W", l.world);
    });

// A PP2·EP2 checkpoint (each stage's tensors under their global names, the expert bias rows of
// each stage's MoE layers from its first rank) resumes in one process and continues the curve; a
// one-process checkpoint resumes at PP2·EP2 and continues it too.
TEST(PipelineParallelCheckpointTest, ResumesAcrossPipelineSizes) {
  const Curve ref = SingleProcess(kSteps);
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps));
  const Layout pp2{4, 2, 2, 1};
  const std::string root = ct::UniqueStoreDir("pp_ckpt_root");
  const Curve saved = RunLayout(pp2, kSteps / 2, "", root);
  ExpectSameCurve(ref, saved, 0, "PP=2 EP=2 steps 1-10, saved");
  const Curve resumed = SingleProcess(kSteps, root);
  ExpectSameCurve(ref, resumed, kSteps / 2, "PP=2 EP=2 checkpoint resumed as one process");

  const std::string root1 = ct::UniqueStoreDir("pp_ckpt_root1");
  const Curve first = SingleProcess(kSteps / 2, "", root1);
  ASSERT_EQ(first.loss.size(), static_cast<size_t>(kSteps / 2));
  const Curve resumed2 = RunLayout(pp2, kSteps, root1);
  ExpectSameCurve(ref, resumed2, kSteps / 2, "one-process checkpoint resumed at PP=2 EP=2");
}

// A tied embedding is saved once (by the first stage): a PP2·EP2 checkpoint of the tied model
// resumes in one process (which reads embedding.weight as its LM head too) and a one-process
// checkpoint resumes at PP2·EP2 (the last stage loads its copy from embedding.weight).
TEST(PipelineParallelCheckpointTest, TiedEmbeddingResumesAcrossPipelineSizes) {
  const Curve ref = SingleProcess(kSteps, "", "", /*tied=*/true);
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps));
  const Layout pp2{4, 2, 2, 1, 0, 0, {}, 1, true};
  const std::string root = ct::UniqueStoreDir("pp_tied_ckpt_root");
  const Curve saved = RunLayout(pp2, kSteps / 2, "", root);
  ExpectSameCurve(ref, saved, 0, "tied PP=2 EP=2 steps 1-10, saved");
  const Curve resumed = SingleProcess(kSteps, root, "", /*tied=*/true);
  ExpectSameCurve(ref, resumed, kSteps / 2, "tied PP=2 EP=2 checkpoint resumed as one process");

  const std::string root1 = ct::UniqueStoreDir("pp_tied_ckpt_root1");
  const Curve first = SingleProcess(kSteps / 2, "", root1, /*tied=*/true);
  ASSERT_EQ(first.loss.size(), static_cast<size_t>(kSteps / 2));
  const Curve resumed2 = RunLayout(pp2, kSteps, root1);
  ExpectSameCurve(ref, resumed2, kSteps / 2, "tied one-process checkpoint resumed at PP=2 EP=2");
}

// Fewer micro-batches than stages: rejected on every rank, naming the fields and the rule.
TEST(PipelineParallelTrainerTest, RejectsTooFewMicroBatches) {
  const Layout layout{4, 4, 1, 1};
  const std::string store = ct::UniqueStoreDir("pp_bad_store");
  const std::vector<int> codes = ct::RunProcesses(layout.world, absl::Minutes(2), [&](int rank) {
    std::unique_ptr<ProcessGroups> groups = JoinGroups(rank, layout, store);
    SY_CHILD_CHECK(groups != nullptr);
    TrainerOptions opt = CpuF32();
    opt.groups = groups.get();
    v1::JobSpec spec = Spec(layout);
    spec.mutable_training()->set_global_batch_size(2);  // 2 micro-batches < PP 4
    auto t = Trainer::Create(spec, opt);
    if (rank == 0) std::printf("rejected: %s\n", t.status().ToString().c_str());
    SY_CHILD_CHECK(t.status().code() == absl::StatusCode::kInvalidArgument);
    SY_CHILD_CHECK(absl::StrContains(t.status().message(), "global_batch_size"));
    SY_CHILD_CHECK(absl::StrContains(t.status().message(), "pipeline_model_parallel_size (4)"));
    return 0;
  });
  for (int r = 0; r < layout.world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace switchyard::train
