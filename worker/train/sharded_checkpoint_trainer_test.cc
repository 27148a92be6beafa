// File: worker/train/sharded_checkpoint_trainer_test.cc
//
// Sharded checkpoints of the trainer (worker/checkpoint/sharded_checkpoint.h) with real forked
// processes over Gloo (CPU, f32, the tiny MoE model of worker/train/testing/tiny_moe_spec.h):
//
//   Resharding matrix: save at step 5 at each of TP2·EP2 (world 4, DP2), EP4 (world 4, DP4 /
//   EDP1), CP2·EP2 (world 4, DP1 / DP×CP 2) and TP2 (world 2, DP1), each rank writing only its
//   distributed-optimizer shards, then resume at every other one and in one process: steps 6-10
//   must give the uninterrupted one-process run's loss and grad norm within 1e-6 relative and
//   its routing (tokens per expert, every MoE layer) exactly. Also TP2·EP2·ETP2 -> EP4, one
//   process, and EP4 -> TP2·EP2·ETP2 (expert slices of columns / rows). Two of the saves are
//   asynchronous (TrainerOptions::async_save). The saving runs' own steps 1-5 are checked the same
//   way. Torn save: EP4 saves step 3, then rank 2 is SIGKILLed after writing its shard file during
//   the save of step 5: every other rank's Save fails, step_5 never appears, `latest` names
//   step_3, and a TP2 job resumes from step 3 on the uninterrupted curve.
//   Export: RunStandalone on the CPU (the offline --export-hf path) loads a 4-rank sharded
//   checkpoint into one process and exports it; every HF tensor equals the saved one.
//   Compatibility: the older single-file checkpoint format loads in one process and at EP4.
//   Asynchronous save: a background write that fails is reported by WaitForSave (never lost)
//   and leaves the previous checkpoint the latest.
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "gtest/gtest.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/checkpoint/hf_convert.h"
#include "worker/checkpoint/sharded_checkpoint.h"
#include "worker/comm/testing/forked_ranks.h"
#include "worker/train/process_groups.h"
#include "worker/train/testing/curve.h"
#include "worker/train/testing/gloo_groups.h"
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
using test_groups::JoinGlooGroups;
using test_groups::LayoutDims;

constexpr int kSteps = 10;
constexpr int kSave = 5;
constexpr double kTolerance = 1e-6;

struct Layout {
  std::string name;
  int world = 1, tp = 1, ep = 1, cp = 1, etp = 1;
};
const Layout kOne{"one process", 1, 1, 1, 1};
const Layout kTp2Ep2{"TP2·EP2", 4, 2, 2, 1};
const Layout kEp4{"EP4", 4, 1, 4, 1};
const Layout kCp2Ep2{"CP2·EP2", 4, 1, 2, 2};
const Layout kTp2{"TP2", 2, 2, 1, 1};
const Layout kTp2Ep2Etp2{"TP2·EP2·ETP2", 4, 2, 2, 1, 2};

// `qwen`: the tiny model made expressible as a HF Qwen3-MoE (softmax routing, no shared expert,
// no expert bias, no z-loss), for the export test.
v1::JobSpec Spec(const Layout& layout, bool qwen = false) {
  auto spec = ParseJobSpecYaml(switchyard::test_specs::TinyMoeSpecYaml(kSteps, /*jitter=*/true));
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (qwen) {
    v1::ModelConfig* m = spec->mutable_model();
    m->clear_moe_shared_expert_intermediate_size();
    m->set_moe_router_score_function("softmax");
    m->set_moe_router_enable_expert_bias(false);
    m->set_moe_z_loss_coeff(0);
  }
  if (layout.world > 1) {
    v1::ParallelConfig* p = spec->mutable_parallel();
    p->set_world_size(layout.world);
    p->set_expert_model_parallel_size(layout.ep);
    if (layout.tp > 1) {
      p->set_tensor_model_parallel_size(layout.tp);
      p->set_sequence_parallel(true);  // required with MoE
      p->set_expert_tensor_parallel_size(layout.etp);
    }
    if (layout.cp > 1) p->set_context_parallel_size(layout.cp);
  }
  return *spec;
}

struct RunOptions {
  std::string load_root;  // load before training (latest step)
  int64_t last = kSteps;  // train until this step
  std::string save_root;  // save after training
  bool async = false;     // TrainerOptions::async_save (then WaitForSave)
  int kill_rank = -1;     // >= 0: that rank SIGKILLs itself mid-save; the others' Save must fail
  bool qwen = false;      // Spec(layout, qwen)
};

int RankBody(int rank, const Layout& layout, const RunOptions& o, const std::string& store_dir,
             const std::string& out) {
  TrainerOptions opt;
  opt.force_dtype = true;
  opt.dtype = DType::kF32;
  opt.async_save = o.async;
  opt.grad_bucket_elements = 1;  // one bucket per layer: several owned runs per optimizer shard
  std::unique_ptr<ProcessGroups> groups;
  if (layout.world > 1) {
    auto g = JoinGlooGroups(store_dir, rank,
                            LayoutDims(layout.world, layout.tp, layout.ep, layout.cp, layout.etp));
    SY_CHILD_OK(g.status());
    groups = std::move(*g);
    opt.groups = groups.get();
  }
  auto t = Trainer::Create(Spec(layout, o.qwen), opt);
  SY_CHILD_OK(t.status());
  if (!o.load_root.empty()) SY_CHILD_OK((*t)->Load(o.load_root));
  std::ofstream f;
  if (rank == 0) f.open(out, std::ios::app);
  while ((*t)->step() < o.last) {
    auto r = (*t)->Step();
    SY_CHILD_OK(r.status());
    if (rank == 0) f << CurveLine(*r) << std::flush;
  }
  if (o.save_root.empty()) return 0;
  if (o.kill_rank >= 0) {
    const int victim = o.kill_rank;
    SetShardedSaveHookForTest([victim](int r) {
      if (r == victim) raise(SIGKILL);  // after its shard file, before its index and the barrier
    });
  }
  absl::StatusOr<std::string> dir = (*t)->Save(o.save_root);
  absl::Status st = dir.status();
  if (st.ok()) st = (*t)->WaitForSave();
  if (o.kill_rank >= 0) {
    SY_CHILD_CHECK(!st.ok());  // a survivor: the torn save must fail here, not commit
    std::fprintf(stderr, "rank %d: torn save failed as it must: %s\n", rank,
                 std::string(st.message()).c_str());
    return 0;
  }
  SY_CHILD_OK(st);
  return 0;
}

// Runs `layout` per `o` and returns rank 0's curve (the steps it trained).
Curve RunJob(const Layout& layout, const RunOptions& o, std::vector<int>* codes_out = nullptr) {
  const std::string store = ct::UniqueStoreDir("dckpt_store");
  const std::string out = OutFile("dckpt_curve");
  const absl::Time start = absl::Now();
  const std::vector<int> codes = ct::RunProcesses(layout.world, absl::Minutes(5), [&](int rank) {
    return RankBody(rank, layout, o, store, out);
  });
  if (codes_out != nullptr) {
    *codes_out = codes;
  } else {
    for (int r = 0; r < layout.world; ++r) EXPECT_EQ(codes[r], 0) << layout.name << " rank " << r;
  }
  std::printf("%s%s%s: %.1f s\n", layout.name.c_str(), o.load_root.empty() ? "" : " (resumed)",
              o.save_root.empty() ? "" : " (saving)", absl::ToDoubleSeconds(absl::Now() - start));
  return ReadCurve(out);
}

std::string FreshRoot(const std::string& name) {
  const std::string root = ct::UniqueStoreDir(name);
  std::filesystem::remove_all(root);
  return root;
}

TEST(ShardedCheckpointMatrixTest, EveryMappingResumesAtEveryOtherAndInOneProcess) {
  const Curve ref = RunJob(kOne, RunOptions{});
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps));
  const std::vector<std::pair<Layout, bool>> saves = {
      {kTp2Ep2, true}, {kEp4, false}, {kCp2Ep2, true}, {kTp2, false}};
  const std::vector<Layout> all = {kTp2Ep2, kEp4, kCp2Ep2, kTp2, kOne};
  int resumed = 0;
  for (const auto& [saver, async] : saves) {
    RunOptions save;
    save.last = kSave;
    save.save_root = FreshRoot("dckpt_matrix");
    save.async = async;
    const Curve first = RunJob(saver, save);
    ASSERT_EQ(first.loss.size(), static_cast<size_t>(kSave)) << saver.name;
    ExpectSameCurve(ref, first, 0, saver.name + " steps 1-5", kTolerance);
    // Every rank wrote its own file; the manifest lists them all.
    auto ckpt = LoadCheckpoint(save.save_root);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    EXPECT_EQ(ckpt->step(), kSave);
    EXPECT_EQ(ckpt->Files().size(), static_cast<size_t>(saver.world)) << saver.name;
    for (const Layout& target : all) {
      if (target.name == saver.name) continue;
      RunOptions resume;
      resume.load_root = save.save_root;
      const Curve got = RunJob(target, resume);
      ASSERT_EQ(got.loss.size(), static_cast<size_t>(kSteps - kSave))
          << saver.name << " -> " << target.name;
      ExpectSameCurve(ref, got, kSave, "saved at " + saver.name + ", resumed at " + target.name,
                      kTolerance);
      ++resumed;
    }
  }
  EXPECT_EQ(resumed, 16);
}

// Expert tensor parallelism too: experts saved as ETP column / row slices resume as whole
// experts at EP4 and in one process, and an EP4 checkpoint resumes at ETP2.
TEST(ShardedCheckpointMatrixTest, ExpertTensorParallelSlicesReshard) {
  const Curve ref = RunJob(kOne, RunOptions{});
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps));
  for (const auto& [saver, targets] : std::vector<std::pair<Layout, std::vector<Layout>>>{
           {kTp2Ep2Etp2, {kEp4, kOne}}, {kEp4, {kTp2Ep2Etp2}}}) {
    RunOptions save;
    save.last = kSave;
    save.save_root = FreshRoot("dckpt_etp");
    const Curve first = RunJob(saver, save);
    ExpectSameCurve(ref, first, 0, saver.name + " steps 1-5", kTolerance);
    for (const Layout& target : targets) {
      RunOptions resume;
      resume.load_root = save.save_root;
      const Curve got = RunJob(target, resume);
      ASSERT_EQ(got.loss.size(), static_cast<size_t>(kSteps - kSave));
      ExpectSameCurve(ref, got, kSave, "saved at " + saver.name + ", resumed at " + target.name,
                      kTolerance);
    }
  }
}

TEST(ShardedCheckpointTornSaveTest, KilledRankNeverLoadsAndThePreviousStepDoes) {
  const Curve ref = RunJob(kOne, RunOptions{});
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps));
  const std::string root = FreshRoot("dckpt_torn");
  RunOptions first;
  first.last = 3;
  first.save_root = root;
  RunJob(kEp4, first);
  ASSERT_TRUE(HasCommittedStep(root, 3));

  RunOptions torn;
  torn.load_root = root;
  torn.last = 5;
  torn.save_root = root;
  torn.kill_rank = 2;
  std::vector<int> codes;
  RunJob(kEp4, torn, &codes);
  ASSERT_EQ(codes.size(), 4u);
  EXPECT_EQ(codes[2], 128 + SIGKILL) << "rank 2 was to die mid-save";
  for (int r : {0, 1, 3}) EXPECT_EQ(codes[r], 0) << "rank " << r << " (its Save must fail)";
  EXPECT_FALSE(std::filesystem::exists(CheckpointStepDir(root, 5)));
  auto latest = LatestCommittedStep(root);
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_TRUE(latest->has_value());
  EXPECT_EQ(**latest, 3);

  // The job comes back (at another mapping) from step 3, on the uninterrupted curve.
  RunOptions resume;
  resume.load_root = root;
  resume.last = 8;
  const Curve got = RunJob(kTp2, resume);
  ASSERT_EQ(got.loss.size(), 5u);
  ExpectSameCurve(ref, got, 3, "torn save at step 5, resumed from step 3 at TP2", kTolerance);
}

TEST(AsyncSaveTest, AFailedBackgroundWriteIsReportedAndThePreviousStepStays) {
  const std::string root = FreshRoot("dckpt_async");
  TrainerOptions opt;
  opt.force_dtype = true;
  opt.dtype = DType::kF32;
  opt.async_save = true;
  auto t = Trainer::Create(Spec(kOne), opt);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->Step().ok());
  ASSERT_TRUE((*t)->Save(root).ok());
  ASSERT_TRUE((*t)->WaitForSave().ok());
  ASSERT_TRUE(HasCommittedStep(root, 1));
  // The background write of step 2 loses its temp directory after writing its shard file.
  SetShardedSaveHookForTest([root](int) {
    for (const auto& e : std::filesystem::directory_iterator(root)) {
      if (e.path().filename().string().rfind(".tmp_step_2_", 0) == 0) {
        std::filesystem::remove_all(e.path());
      }
    }
  });
  ASSERT_TRUE((*t)->Step().ok());
  ASSERT_TRUE((*t)->Save(root).ok());  // returns once the host copy is taken
  ASSERT_TRUE((*t)->Step().ok());      // training goes on meanwhile
  const absl::Status st = (*t)->WaitForSave();
  SetShardedSaveHookForTest(nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("asynchronous save of step 2"), std::string::npos) << st;
  EXPECT_TRUE((*t)->WaitForSave().ok());  // reported once, then nothing is pending
  auto latest = LatestCommittedStep(root);
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ(**latest, 1);
  // The next save works.
  ASSERT_TRUE((*t)->Save(root).ok());
  ASSERT_TRUE((*t)->WaitForSave().ok());
  EXPECT_TRUE(HasCommittedStep(root, 3));
}

// The offline export (--standalone --device cpu with training.load and --export-hf, i.e.
// RunStandalone) from a checkpoint that four ranks wrote in shards: every exported HF tensor
// (imported back under our names) equals the checkpoint's whole tensor, read from its shards.
TEST(ShardedCheckpointExportTest, ExportHfFromAShardedCheckpointOnTheCpu) {
  const std::string root = FreshRoot("dckpt_export");
  RunOptions save;
  save.last = 3;
  save.save_root = root;
  save.qwen = true;
  RunJob(kEp4, save);
  ASSERT_TRUE(HasCommittedStep(root, 3));

  v1::JobSpec spec = Spec(kOne, /*qwen=*/true);
  spec.mutable_training()->set_train_iters(3);  // nothing left to train: load, then export
  spec.mutable_training()->set_load(root);
  StandaloneOptions standalone;
  standalone.export_hf = FreshRoot("dckpt_export_hf");
  standalone.progress_bar = false;
  TrainerOptions opt;  // the CPU
  opt.force_dtype = true;
  opt.dtype = DType::kF32;
  const std::string log = OutFile("dckpt_export_log");
  std::FILE* out = std::fopen(log.c_str(), "w");
  ASSERT_NE(out, nullptr);
  const absl::Status st = RunStandalone(spec, opt, standalone, out);
  std::fclose(out);
  ASSERT_TRUE(st.ok()) << st;

  auto hf = model::ImportHfModel(standalone.export_hf);
  ASSERT_TRUE(hf.ok()) << hf.status();
  auto rd = ShardedCheckpointReader::Load(root);
  ASSERT_TRUE(rd.ok()) << rd.status();
  int compared = 0;
  for (const auto& [name, buffer] : hf->tensors) {
    const Tensor exported = buffer.View();
    ASSERT_TRUE(rd->Has(name)) << name;
    std::vector<float> saved(exported.numel(), -1e30f);  // poisoned
    ASSERT_TRUE(rd->Read(name, ShardSlice::Whole(exported.shape),
                         Tensor(DType::kF32, {exported.numel()}, Device::Cpu(), saved.data()))
                    .ok())
        << name;
    for (int64_t i = 0; i < exported.numel(); ++i) {
      ASSERT_EQ(exported.as<float>()[i], saved[i]) << name << " element " << i;
    }
    ++compared;
  }
  EXPECT_GT(compared, 10);
  std::printf("exported %d tensors from a 4-rank sharded checkpoint\n", compared);
}

// The older single-file format (CheckpointWriter: model.safetensors, optimizer.safetensors,
// router.safetensors with whole tensors) still loads, in one process and at EP4 (resharded).
TEST(ShardedCheckpointCompatTest, TheSingleFileFormatStillLoads) {
  const std::string root = FreshRoot("dckpt_legacy");
  TrainerOptions opt;
  opt.force_dtype = true;
  opt.dtype = DType::kF32;
  auto a = Trainer::Create(Spec(kOne), opt);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE((*a)->Step().ok());
  ASSERT_TRUE((*a)->Step().ok());
  // Written by hand as the old Trainer::Save wrote it (moments zero: not reachable from outside).
  CheckpointWriter w;
  std::vector<kernels::Buffer> keep;
  std::vector<std::vector<float>> zeros;
  for (const model::ParamInfo& p : (*a)->model().layout().params) {
    auto m = (*a)->MasterToHost(p.name);
    ASSERT_TRUE(m.ok()) << m.status();
    w.AddTensor("model.safetensors", p.name, m->View());
    keep.push_back(std::move(*m));
    zeros.emplace_back(p.numel, 0.0f);
    const Tensor z(DType::kF32, p.shape, Device::Cpu(), zeros.back().data());
    w.AddTensor("optimizer.safetensors", "exp_avg." + p.name, z);
    w.AddTensor("optimizer.safetensors", "exp_avg_sq." + p.name, z);
  }
  w.AddTensor("router.safetensors", "expert_bias", (*a)->model().expert_bias());
  w.SetMetadata("step", int64_t{2});
  w.SetMetadata("consumed_samples", int64_t{16});
  w.SetMetadata("skipped_steps", int64_t{0});
  w.SetMetadata("forward_counter", absl::StrCat((*a)->model().forward_counter()));
  ASSERT_TRUE(w.Commit(root, 2).ok());

  auto b = Trainer::Create(Spec(kOne), opt);
  ASSERT_TRUE(b.ok()) << b.status();
  const absl::Status st = (*b)->Load(root);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ((*b)->step(), 2);
  for (const model::ParamInfo& p : (*a)->model().layout().params) {
    auto x = (*a)->MasterToHost(p.name);
    auto y = (*b)->MasterToHost(p.name);
    ASSERT_TRUE(x.ok() && y.ok());
    ASSERT_EQ(std::memcmp(x->data(), y->data(), x->bytes()), 0) << p.name;
  }
  // And distributed: EP4 reshards the whole tensors and trains on from step 2.
  RunOptions resume;
  resume.load_root = root;
  resume.last = 4;
  EXPECT_EQ(RunJob(kEp4, resume).loss.size(), 2u);
}

}  // namespace
}  // namespace switchyard::train
