// File: worker/train/interleaved_pipeline_trainer_test.cc
//
// The interleaved pipeline schedule (parallel.virtual_pipeline_model_parallel_size = 2, Megatron's
// forward_backward_pipelining_with_interleaving) over Gloo between real forked processes (CPU):
// the 4-layer variant of the tiny MoE model (MoE, dense, MoE, MoE) cut into PP·VPP = 4 chunks of
// one layer, stage 0 holding layers 0 and 2, stage 1 layers 1 and 3 (megatron_parallel.md §3.4),
// so every micro-batch goes stage 0 -> 1 -> 0 -> 1 and its gradient back the same way. PP2·VPP2,
// PP2·VPP2·EP2, PP2·VPP2·TP2 and PP2·VPP2 with tied embeddings (the LM head's copy on stage 1's
// last chunk) train for 20 steps and must give one process's routing (tokens per expert of
// every MoE layer, every step) and loss / grad-norm curve within 1e-5 relative (curve.h); so do
// PP2·VPP2·CP2, PP2·VPP2 with global_aux_loss, PP4·VPP2 (8 layers), PP3·VPP2 (6 layers) and
// PP2·VPP2 with an uneven layout. A
// PP2·VPP2·EP2 checkpoint resumes in one process and at PP2 without VPP, and a one-process
// checkpoint at PP2·VPP2·EP2; a micro-batch count that is not a multiple of PP is rejected on
// every rank with INVALID_ARGUMENT naming the fields and the rule.
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "gtest/gtest.h"
#include "worker/comm/testing/forked_ranks.h"
#include "worker/train/process_groups.h"
#include "worker/train/testing/curve.h"
#include "worker/train/testing/gloo_groups.h"
#include "worker/train/testing/tiny_moe_spec.h"
#include "worker/train/trainer.h"

namespace switchyard::train {
namespace {

namespace ct = ::switchyard::comm::testing;
using curves::CpuF32;
using curves::Curve;
using curves::ExpectSameCurve;
using curves::OutFile;
using curves::ReadCurve;
using curves::StepUntil;

constexpr int kSteps = 20;

struct Layout {
  int world = 1, pp = 1, vpp = 1, ep = 1, tp = 1;
  bool tied = false;
  int cp = 1;
  bool global_aux = false;  // moe_router_load_balancing_type global_aux_loss (not aux_loss)
  // The model's layers (MoE, dense, MoE, MoE repeated) and the uneven layout
  // (parallel.decoder_first/last_pipeline_num_layers, 0: unset) with the [begin, end) of every
  // stage's chunks worked out by hand (empty: the even split, chunk v of stage p = layer chunk
  // v·PP + p).
  int layers = 4;
  int first = 0, last = 0;
  std::vector<std::vector<std::pair<int, int>>> chunks;
  int global_batch = 0;  // training.global_batch_size (0: the tiny spec's 8)
  std::string Name() const {
    return absl::StrCat("PP=", pp, " VPP=", vpp, " EP=", ep, tp > 1 ? absl::StrCat(" TP=", tp) : "",
                        cp > 1 ? absl::StrCat(" CP=", cp) : "", tied ? " tied" : "",
                        global_aux ? " global_aux_loss" : "", " layers=", layers,
                        first > 0 ? absl::StrCat(" first=", first) : "",
                        last > 0 ? absl::StrCat(" last=", last) : "",
                        global_batch > 0 ? absl::StrCat(" GBS=", global_batch) : "", " (world ",
                        world, ", DP ", world / (pp * tp * cp), ")");
  }
};

v1::JobSpec Spec(const Layout& layout) {
  auto spec = ParseJobSpecYaml(switchyard::test_specs::TinyMoeSpecYaml(kSteps, /*jitter=*/true));
  EXPECT_TRUE(spec.ok()) << spec.status();
  v1::ModelConfig* m = spec->mutable_model();
  m->set_num_layers(layout.layers);
  m->clear_moe_layer_pattern();
  for (int l = 0; l < layout.layers; ++l) m->add_moe_layer_pattern(l % 4 == 1 ? 0 : 1);
  m->set_untie_embeddings_and_output_weights(!layout.tied);
  if (layout.global_batch > 0) spec->mutable_training()->set_global_batch_size(layout.global_batch);
  if (layout.global_aux) {
    m->clear_moe_router_load_balancing_type();
    m->add_moe_router_load_balancing_type("global_aux_loss");
  }
  if (layout.world > 1) {
    v1::ParallelConfig* p = spec->mutable_parallel();
    p->set_world_size(layout.world);
    p->set_pipeline_model_parallel_size(layout.pp);
    if (layout.vpp > 1) p->set_virtual_pipeline_model_parallel_size(layout.vpp);
    p->set_expert_model_parallel_size(layout.ep);
    if (layout.cp > 1) p->set_context_parallel_size(layout.cp);
    if (layout.first > 0) p->set_decoder_first_pipeline_num_layers(layout.first);
    if (layout.last > 0) p->set_decoder_last_pipeline_num_layers(layout.last);
    if (layout.tp > 1) {
      p->set_tensor_model_parallel_size(layout.tp);
      p->set_sequence_parallel(true);  // required with MoE (validate_moe.cc)
      p->set_expert_tensor_parallel_size(1);
    }
  }
  return *spec;
}

// One process of `model`'s model (its parallel fields ignored).
Curve SingleProcess(int64_t last, const std::string& load_root = "",
                    const std::string& save_root = "", const Layout& model = Layout{}) {
  Curve c;
  Layout one;
  one.tied = model.tied;
  one.global_aux = model.global_aux;
  one.layers = model.layers;
  one.global_batch = model.global_batch;
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

// Rank `rank`'s Gloo groups for `layout` (ETP 1), through the store in `store_dir`.
absl::StatusOr<std::unique_ptr<ProcessGroups>> JoinLayout(const std::string& store_dir, int rank,
                                                          const Layout& layout) {
  return test_groups::JoinGlooGroups(
      store_dir, rank,
      test_groups::LayoutDims(layout.world, layout.tp, layout.ep, layout.cp, /*etp=*/1, layout.pp));
}

// One rank: trains up to step `last`; rank 0 appends the curve lines to `out`.
int RankBody(int rank, const Layout& layout, const std::string& store_dir, const std::string& out,
             int64_t last, const std::string& load_root, const std::string& save_root) {
  auto groups = JoinLayout(store_dir, rank, layout);
  SY_CHILD_OK(groups.status());
  TrainerOptions opt = CpuF32();
  opt.groups = groups->get();
  opt.grad_bucket_elements = 1;  // one bucket per layer, reduced during the last backwards
  auto t = Trainer::Create(Spec(layout), opt);
  SY_CHILD_OK(t.status());
  const model::GptConfig& mc = (*t)->model_config();
  SY_CHILD_CHECK(mc.pp_size == layout.pp && mc.num_chunks() == layout.vpp);
  // Even split: chunk v of stage p is layer chunk v·PP + p of L / (PP·VPP) layers (with 4 layers
  // at PP2·VPP2: stage 0 holds layers 0 and 2); the stage's layers are not contiguous, and no
  // other layer is in its layout. Uneven: the hand-written chunks.
  std::vector<std::pair<int, int>> want;
  if (layout.chunks.empty()) {
    const int per = layout.layers / (layout.pp * layout.vpp);
    for (int v = 0; v < layout.vpp; ++v) {
      want.push_back({(v * layout.pp + mc.pp_rank) * per, (v * layout.pp + mc.pp_rank + 1) * per});
    }
  } else {
    want = layout.chunks[mc.pp_rank];
  }
  const model::GptParamLayout& lay = (*t)->model().layout();
  for (int l = 0; l < layout.layers; ++l) {
    const bool held = lay.Find(absl::StrCat("layers.", l, ".input_norm.weight")) != nullptr;
    bool in_chunk = false;
    for (const auto& [b, e] : want) in_chunk = in_chunk || (l >= b && l < e);
    SY_CHILD_CHECK(held == in_chunk);
  }
  for (int v = 0; v < layout.vpp; ++v) {
    SY_CHILD_CHECK(mc.ChunkBegin(v) == want[v].first && mc.ChunkEnd(v) == want[v].second);
  }
  const bool holds_embedding = mc.first_stage() || (layout.tied && mc.last_stage());
  SY_CHILD_CHECK((lay.Find("embedding.weight") != nullptr) == holds_embedding);
  SY_CHILD_CHECK((lay.Find("output.weight") != nullptr) == (mc.last_stage() && !layout.tied));
  return curves::TrainRank(t->get(), rank, out, last, load_root, save_root);
}

Curve RunLayout(const Layout& layout, int64_t last, const std::string& load_root = "",
                const std::string& save_root = "") {
  const std::string store = ct::UniqueStoreDir("vpp_store");
  const std::string out = OutFile("vpp_curve");
  const absl::Time start = absl::Now();
  const std::vector<int> codes = ct::RunProcesses(layout.world, absl::Minutes(10), [&](int rank) {
    return RankBody(rank, layout, store, out, last, load_root, save_root);
  });
  for (int r = 0; r < layout.world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  std::printf("%s: %.1f s\n", layout.Name().c_str(), absl::ToDoubleSeconds(absl::Now() - start));
  return ReadCurve(out);
}

class InterleavedPipelineTrainerTest : public ::testing::TestWithParam<Layout> {};

TEST_P(InterleavedPipelineTrainerTest, MatchesSingleProcess) {
  const Layout layout = GetParam();
  const Curve ref = SingleProcess(kSteps, "", "", layout);
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps));
  const Curve got = RunLayout(layout, kSteps);
  ASSERT_EQ(got.loss.size(), static_cast<size_t>(kSteps));
  ExpectSameCurve(ref, got, 0, layout.Name());
  EXPECT_LT(got.loss.back(), got.loss.front());  // it trains
}

// PP2·VPP2 (8 micro-batches: stage 0 keeps 4 alive, 3 on stage 1), PP2·VPP2·EP2 (DP2: 4
// micro-batches per DP rank, experts split), PP2·VPP2·TP2 (sequence-parallel shards sent between
// the virtual stages, the TP-replicated gradients summed in each chunk's last backward) and
// PP2·VPP2 tied (the embedding group: stage 0's chunk 0 and stage 1's chunk 1), PP2·VPP2·CP2
// (each CP rank sends its two chunks of every sequence between the virtual stages) and
// PP2·VPP2 with global_aux_loss (the running counts of each layer shared by its slots,
// accumulated in micro-batch order; DP 1, as pipeline_parallel_trainer_test explains). PP4·VPP2
// with 8 layers (world 4: a ring of four stages, chunks of one layer, 4 micro-batches alive on
// stage 0) and PP2·VPP2 with the uneven layout first = 2, last = 4 of 6 layers (per chunk: stage
// 0 holds 1 layer, stage 1 holds 2; Megatron's offsets: stage 0 layers 0 and 3, stage 1 layers
// 1-2 and 4-5). PP3·VPP2 (6 layers, 6 micro-batches: an odd ring, stage 2's chunk 0 feeding
// stage 0's chunk 1).
INSTANTIATE_TEST_SUITE_P(
    Layouts, InterleavedPipelineTrainerTest,
    ::testing::Values(
        Layout{2, 2, 2, 1, 1}, Layout{4, 2, 2, 2, 1}, Layout{4, 2, 2, 1, 2},
        Layout{2, 2, 2, 1, 1, true}, Layout{4, 2, 2, 1, 1, false, 2},
        Layout{2, 2, 2, 1, 1, false, 1, true}, Layout{4, 4, 2, 1, 1, false, 1, false, 8},
        Layout{2, 2, 2, 1, 1, false, 1, false, 6, 2, 4, {{{0, 1}, {3, 4}}, {{1, 3}, {4, 6}}}},
        Layout{3, 3, 2, 1, 1, false, 1, false, 6, 0, 0, {}, 6}),
    [](const auto& info) {
      const Layout& l = info.param;
      return absl::StrCat(
          "PP", l.pp, "_VPP", l.vpp, "_EP", l.ep, l.tp > 1 ? absl::StrCat("_TP", l.tp) : "",
          l.cp > 1 ? absl::StrCat("_CP", l.cp) : "", l.tied ? "_Tied" : "",
          l.global_aux ? "_GlobalAux" : "", l.layers != 4 ? absl::StrCat("_L", l.layers) : "",

          l.first > 0 ? absl::StrCat("_First", l.first) : "", "_W", l.world);
    });

// Layer names are global, so a PP2·VPP2·EP2 checkpoint (each stage's chunks, the expert-bias rows
// of each chunk's MoE layers) resumes in one process and at PP2 without VPP (other layers per
// stage), and a one-process checkpoint resumes at PP2·VPP2·EP2; every resumed curve continues the
// uninterrupted one.
TEST(InterleavedPipelineCheckpointTest, ResumesAcrossPipelineLayouts) {
  const Curve ref = SingleProcess(kSteps);
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps));
  const Layout vpp{4, 2, 2, 2, 1};
  const std::string root = ct::UniqueStoreDir("vpp_ckpt_root");
  const Curve saved = RunLayout(vpp, kSteps / 2, "", root);
  ExpectSameCurve(ref, saved, 0, "PP=2 VPP=2 EP=2 steps 1-10, saved");
  const Curve resumed = SingleProcess(kSteps, root);
  ExpectSameCurve(ref, resumed, kSteps / 2, "PP=2 VPP=2 EP=2 checkpoint resumed as one process");
  const Curve resumed_pp = RunLayout(Layout{4, 2, 1, 2, 1}, kSteps, root);
  ExpectSameCurve(ref, resumed_pp, kSteps / 2, "PP=2 VPP=2 EP=2 checkpoint resumed at PP=2 EP=2");

  const std::string root1 = ct::UniqueStoreDir("vpp_ckpt_root1");
  const Curve first = SingleProcess(kSteps / 2, "", root1);
  ASSERT_EQ(first.loss.size(), static_cast<size_t>(kSteps / 2));
  const Curve resumed2 = RunLayout(vpp, kSteps, root1);
  ExpectSameCurve(ref, resumed2, kSteps / 2, "one-process checkpoint resumed at PP=2 VPP=2 EP=2");
}

// 3 micro-batches at PP2·VPP2: the interleaved schedule runs them in groups of PP, so the count
// must be a multiple of PP; rejected on every rank, naming the fields and the rule.
TEST(InterleavedPipelineTrainerTest, RejectsMicroBatchCountNotAMultipleOfPp) {
  const Layout layout{2, 2, 2, 1, 1};
  const std::string store = ct::UniqueStoreDir("vpp_bad_store");
  const std::vector<int> codes = ct::RunProcesses(layout.world, absl::Minutes(2), [&](int rank) {
    auto groups = JoinLayout(store, rank, layout);
    SY_CHILD_OK(groups.status());
    TrainerOptions opt = CpuF32();
    opt.groups = groups->get();
    v1::JobSpec spec = Spec(layout);
    spec.mutable_training()->set_global_batch_size(3);  // 3 micro-batches, PP 2
    auto t = Trainer::Create(spec, opt);
    if (rank == 0) std::printf("rejected: %s\n", t.status().ToString().c_str());
    SY_CHILD_CHECK(t.status().code() == absl::StatusCode::kInvalidArgument);
    SY_CHILD_CHECK(absl::StrContains(t.status().message(), "training.global_batch_size"));
    SY_CHILD_CHECK(absl::StrContains(
        t.status().message(), "must be a multiple of parallel.pipeline_model_parallel_size (2)"));
    SY_CHILD_CHECK(
        absl::StrContains(t.status().message(), "parallel.virtual_pipeline_model_parallel_size"));
    return 0;
  });
  for (int r = 0; r < layout.world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace switchyard::train
