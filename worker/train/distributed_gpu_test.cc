// File: worker/train/distributed_gpu_test.cc
//
// Distributed training on real GPUs: one forked process per GPU (W = 2, and W = 4 when at least 4
// GPUs are visible), each on CUDA device `rank` with its own non-blocking stream, NCCL process
// groups (CreateNcclProcessGroups, rendezvous through a FileKvStore in TEST_TMPDIR) made on THAT
// stream and the same stream handed to the Trainer (TrainerOptions.cuda_stream: the
// communicators' stream contract), bf16 parameters and activations. Every (EP, EDP) layout trains
// the tiny MoE model of distributed_trainer_test.cc (mock data, 20 steps) and is compared with the
// single-GPU bf16 run of the same spec on the same global batch; one run saves a distributed
// checkpoint at step 10 and another layout resumes from it. Expert tensor parallelism (ETP2 and
// ETP2·EP2, each dispatcher), tensor parallelism (TP2, TP2·EP2) and context parallelism (CP2,
// CP2·EP2, TP2·CP2) are compared the same way. Pipeline parallelism (PP2, 1F1B with NCCL
// Send/Recv) trains a 4-layer untied variant of the model, and a tied one (the embedding group's
// gradient exchange), each compared with its own single-GPU run (the tied case not yet run on
// GPUs).
//
// The parent never initialises CUDA (a process that forks after CUDA is initialised cannot use
// CUDA in the child): the GPU count comes from a probe child, the single-GPU reference runs in a
// forked child too and writes its curve to a file, and the test skips (GTEST_SKIP) below 2 GPUs.
//
// Tolerance (trainer_gpu_test.cc's bf16 numbers, applied more strictly here):
// - step 1 (identical initial weights, same batch: the same function): relative difference of
//   the loss AND of the gradient norm < 1e-2, the tolerance trainer_gpu_test uses for the same
//   weights evaluated on two devices (DESIGN.md's bf16 tolerance). This is the sharp check: the
//   norm is that of the gradient summed over ranks, so lost or doubled micro-batches, a wrong
//   scale or a wrong expert shard show here. The same check compares the first step of two runs
//   resumed from one checkpoint (distributed vs one GPU);
// - every step's |loss - reference loss| < 0.25 nats, trainer_gpu_test's loss-curve tolerance
//   (which it applies to 25-step window averages; here to each step, no averaging). It is loose
//   for 20 steps (the curve falls ~0.2 nats in them): it catches divergence, not subtle errors.
// Routing (tokens per expert of each MoE layer) may differ in bf16: the gradients are summed in
// another order (NCCL reduce-scatter over ranks instead of accumulation over micro-batches), so
// the weights drift apart by bf16 roundings and a token near a top-k tie can flip. The test
// prints, per step, the loss difference and how many tokens changed expert (half the L1 distance
// of the count vectors, summed over layers), and does not require routing equality. On the CPU
// (distributed_trainer_test) routing is required to be identical.
// Children report through their exit code and print the failing call on stderr.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config/config.h"
#include "gtest/gtest.h"
#include "kernels/testing/gpu.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/testing/forked_ranks.h"
#include "worker/train/process_groups.h"
#include "worker/train/testing/tiny_moe_spec.h"
#include "worker/train/trainer.h"

namespace switchyard::train {
namespace {

namespace ct = ::switchyard::comm::testing;

#define CHILD_CUDA(expr)                                                                           \
  do {                                                                                             \
    const cudaError_t e_ = (expr);                                                                 \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "rank %d: %s:%d: %s: %s\n", ct::ChildRank(), __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(e_));                                                        \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

// distributed_trainer_test.cc's spec (see its comment for init_method_std 0.2): two MoE layers
// and a dense one, sigmoid routing with expert bias, aux and z losses, input jitter, a shared
// expert; 8 experts (EP = 4 holds 2 per rank), 8 micro-batches per global batch (DP = 4 runs 2
// per rank).
const std::string kSpec =
    switchyard::test_specs::TinyMoeSpecYaml(20, /*jitter=*/true, /*kv_channels=*/64);
constexpr int kSteps = 20;
constexpr double kFirstStepRelTol = 1e-2;  // same weights, same batch (trainer_gpu_test)
constexpr double kCurveTolNats = 0.25;     // loss-curve tolerance (trainer_gpu_test)

struct Curve {
  std::vector<double> loss, norm;
  std::vector<std::vector<int64_t>> counts;  // per step: every MoE layer's counts, concatenated
};

std::string CountsText(const StepResult& r) {
  std::string s;
  for (const auto& layer : r.expert_tokens) {
    for (int64_t c : layer) absl::StrAppend(&s, c, ",");
    s += ";";
  }
  return s;
}

// `etp`: parallel.expert_tensor_parallel_size; `dispatcher`: model.moe_token_dispatcher_type
// (the spec's default when empty); tp > 1: tensor parallelism with sequence parallelism; cp > 1:
// context parallelism (parallel.context_parallel_size). pp > 0: the pipeline variant (4 layers
// MoE, dense, MoE, MoE with untied embeddings, or tied with `tied`: the last stage's LM head is
// then a copy of the embedding whose gradient the two stages sum) at PP = pp (pp = 1: its
// single-GPU reference).
v1::JobSpec Spec(int world, int ep, int etp = 1, const std::string& dispatcher = "", int tp = 1,
                 int cp = 1, int pp = 0, bool tied = false, int vpp = 1) {
  auto spec = ParseJobSpecYaml(kSpec);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (pp > 0) {
    v1::ModelConfig* m = spec->mutable_model();
    m->set_num_layers(4);
    m->clear_moe_layer_pattern();
    for (int x : {1, 0, 1, 1}) m->add_moe_layer_pattern(x);
    m->set_untie_embeddings_and_output_weights(!tied);
    if (pp > 1) spec->mutable_parallel()->set_pipeline_model_parallel_size(pp);
    if (vpp > 1) spec->mutable_parallel()->set_virtual_pipeline_model_parallel_size(vpp);
  }
  if (world > 1) {
    spec->mutable_parallel()->set_world_size(world);
    spec->mutable_parallel()->set_expert_model_parallel_size(ep);
    spec->mutable_parallel()->set_expert_tensor_parallel_size(etp);
  }
  if (!dispatcher.empty()) spec->mutable_model()->set_moe_token_dispatcher_type(dispatcher);
  if (tp > 1) {
    spec->mutable_parallel()->set_tensor_model_parallel_size(tp);
    spec->mutable_parallel()->set_sequence_parallel(true);
    spec->mutable_parallel()->set_expert_tensor_parallel_size(etp);
  }
  if (cp > 1) spec->mutable_parallel()->set_context_parallel_size(cp);
  return *spec;
}

TrainerOptions CudaBf16(int device) {
  TrainerOptions opt;
  opt.device = Device::Cuda(device);
  opt.force_dtype = true;
  opt.dtype = DType::kBF16;
  return opt;
}

// Trains `t` up to step `last`, appending "loss norm counts" lines to `out` when it is open.
absl::Status TrainTo(Trainer& t, int64_t last, std::ofstream* out) {
  while (t.step() < last) {
    absl::StatusOr<StepResult> r = t.Step();
    if (!r.ok()) return r.status();
    if (out->is_open()) {
      char line[128];
      std::snprintf(line, sizeof(line), "%.17g %.17g ", r->loss, r->grad_norm);
      *out << line << CountsText(*r) << "\n";
      out->flush();
    }
  }
  return absl::OkStatus();
}

// The single-GPU reference (forked child, device 0): optionally loads `load_root`, trains to
// `last` and writes its curve to `out`.
int SingleGpuBody(const std::string& out, int64_t last, const std::string& load_root,
                  bool pipeline_variant = false, bool tied = false) {
  CHILD_CUDA(cudaSetDevice(0));
  {
    // The trainer creates and owns its stream (no process groups).
    auto t = Trainer::Create(Spec(1, 1, 1, "", 1, 1, pipeline_variant ? 1 : 0, tied), CudaBf16(0));
    SY_CHILD_OK(t.status());
    std::fprintf(stderr, "single GPU: %s\n", (*t)->Describe().c_str());
    if (!load_root.empty()) SY_CHILD_OK((*t)->Load(load_root));
    std::ofstream f(out, std::ios::app);
    SY_CHILD_CHECK(f.good());
    SY_CHILD_OK(TrainTo(**t, last, &f));
  }
  CHILD_CUDA(cudaDeviceSynchronize());
  return 0;
}

// One rank: device `rank`, a non-blocking stream shared by the NCCL groups and the trainer, then
// as SingleGpuBody (rank 0 writes the curve); saves to `save_root` at the end if given.
int RankBody(int rank, int world, int ep, const std::string& store_dir, const std::string& out,
             int64_t last, const std::string& load_root, const std::string& save_root, int etp = 1,
             const std::string& dispatcher = "", int tp = 1, int cp = 1, int pp = 0,
             bool tied = false, int vpp = 1) {
  CHILD_CUDA(cudaSetDevice(rank));
  cudaStream_t cs = nullptr;
  CHILD_CUDA(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  {
    std::shared_ptr<comm::KvStore> store = ct::OpenFileStore(store_dir);
    SY_CHILD_CHECK(store != nullptr);
    ParallelDims dims;
    dims.world_size = world;
    dims.expert_model_parallel_size = ep;
    dims.tensor_model_parallel_size = tp;
    dims.expert_tensor_parallel_size = etp;
    dims.context_parallel_size = cp;
    dims.pipeline_model_parallel_size = std::max(pp, 1);
    comm::NcclOptions nopt;
    nopt.timeout = absl::Seconds(120);
    auto groups = CreateNcclProcessGroups(store, rank, dims, rank, cs, nopt);
    SY_CHILD_OK(groups.status());
    TrainerOptions opt = CudaBf16(rank);
    opt.groups = groups->get();
    opt.cuda_stream = cs;
    {
      auto t = Trainer::Create(Spec(world, ep, etp, dispatcher, tp, cp, pp, tied, vpp), opt);
      SY_CHILD_OK(t.status());
      SY_CHILD_CHECK((*t)->model_config().cp_size == cp);
      if (rank == 0) std::fprintf(stderr, "rank 0: %s\n", (*t)->Describe().c_str());
      if (!load_root.empty()) SY_CHILD_OK((*t)->Load(load_root));
      std::ofstream f;
      if (rank == 0) {
        f.open(out, std::ios::app);
        SY_CHILD_CHECK(f.good());
      }
      SY_CHILD_OK(TrainTo(**t, last, &f));
      if (!save_root.empty()) SY_CHILD_OK((*t)->Save(save_root).status());
    }  // the trainer, then the communicators, go before the stream
    CHILD_CUDA(cudaStreamSynchronize(cs));
  }
  CHILD_CUDA(cudaStreamDestroy(cs));
  return 0;
}

Curve ReadCurve(const std::string& path) {
  Curve c;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    if (parts.size() < 3) continue;
    c.loss.push_back(std::stod(parts[0]));
    c.norm.push_back(std::stod(parts[1]));
    std::vector<int64_t> counts;
    for (absl::string_view v : absl::StrSplit(parts[2], absl::ByAnyChar(",;"), absl::SkipEmpty())) {
      int64_t n = 0;
      EXPECT_TRUE(absl::SimpleAtoi(v, &n)) << path << ": bad count '" << v << "'";
      counts.push_back(n);
    }
    c.counts.push_back(std::move(counts));
  }
  return c;
}

std::string OutFile(const std::string& name) {
  const std::string path = ct::UniqueStoreDir(name) + ".txt";
  std::remove(path.c_str());
  return path;
}

// GPU count from a probe child, so the parent itself never initialises CUDA.
int ProbeGpuCount(std::string* why) {
  std::vector<int> codes = ct::RunProcesses(1, absl::Seconds(60), [](int) {
    std::string reason;
    const int n = ::switchyard::testing::CudaDeviceCount(&reason);
    if (n == 0) std::fprintf(stderr, "probe: %s\n", reason.c_str());
    return std::min(n, 100);
  });
  *why = codes[0] > 100 ? absl::StrCat(" (probe child ended with ", codes[0], ")") : "";
  return codes[0] > 100 ? 0 : codes[0];
}

// The single-GPU curve of steps [1, kSteps], computed once per test binary (in a child).
const Curve& Reference() {
  static const Curve* ref = [] {
    const std::string out = OutFile("single_gpu_curve");
    const absl::Time start = absl::Now();
    const std::vector<int> codes =
        ct::RunProcesses(1, absl::Minutes(5), [&](int) { return SingleGpuBody(out, kSteps, ""); });
    EXPECT_EQ(codes[0], 0) << "single-GPU reference child";
    auto* c = new Curve(ReadCurve(out));
    std::printf("single-GPU bf16 reference: %zu steps in %.1f s\n", c->loss.size(),
                absl::ToDoubleSeconds(absl::Now() - start));
    return c;
  }();
  return *ref;
}

// Two runs' first step from the SAME weights on the same batch: the loss and the gradient norm
// (the norm of the gradient summed over ranks, before clipping: a rank's micro-batches missing or
// counted twice, or a wrong scale, shows here even though AdamW would hide it in the loss curve)
// agree within kFirstStepRelTol.
void ExpectSameStart(double ref_loss, double ref_norm, double loss, double norm,
                     const std::string& what) {
  const double loss_rel = std::abs(loss - ref_loss) / std::abs(ref_loss);
  const double norm_rel = std::abs(norm - ref_norm) / std::abs(ref_norm);
  std::printf(
      "%s (same weights, same batch): loss %.6f vs %.6f rel diff %.2e, grad norm %.6f vs %.6f "
      "rel diff %.2e (tolerance %.0e)\n",
      what.c_str(), loss, ref_loss, loss_rel, norm, ref_norm, norm_rel, kFirstStepRelTol);
  EXPECT_LT(loss_rel, kFirstStepRelTol) << what << ": loss";
  EXPECT_LT(norm_rel, kFirstStepRelTol) << what << ": grad norm";
}

// Compares `got` (steps [first + 1, first + got.size()]) with the reference; prints per-step
// evidence. `same_start`: step first + 1 starts from the same weights as the reference's (step 1
// of a fresh run), so it gets the same-function tolerance too.
void ExpectCloseCurve(const Curve& ref, const Curve& got, size_t first, const std::string& what,
                      bool same_start) {
  ASSERT_FALSE(got.loss.empty()) << what;
  ASSERT_LE(first + got.loss.size(), ref.loss.size()) << what;
  double worst = 0;
  int64_t moved_total = 0;
  int steps_with_routing_diff = 0;
  std::printf(
      "%s\n  step   reference    distributed    |diff| nats   rel diff  grad_norm ref/got"
      "   tokens moved\n",
      what.c_str());
  for (size_t i = 0; i < got.loss.size(); ++i) {
    const size_t s = first + i;
    const double diff = std::abs(got.loss[i] - ref.loss[s]);
    worst = std::max(worst, diff);
    int64_t moved = 0;
    if (got.counts[i].size() != ref.counts[s].size()) {
      ADD_FAILURE() << what << " step " << s + 1 << ": " << got.counts[i].size()
                    << " expert counts, reference has " << ref.counts[s].size();
    } else {
      for (size_t e = 0; e < got.counts[i].size(); ++e) {
        moved += std::abs(got.counts[i][e] - ref.counts[s][e]);
      }
      moved /= 2;
    }
    moved_total += moved;
    if (moved > 0) ++steps_with_routing_diff;
    std::printf("  %4zu  %10.6f  %13.6f  %12.2e  %9.2e  %8.4f/%-8.4f  %6lld\n", s + 1, ref.loss[s],
                got.loss[i], diff, diff / std::abs(ref.loss[s]), ref.norm[s], got.norm[i],
                static_cast<long long>(moved));
    EXPECT_TRUE(std::isfinite(got.loss[i])) << what << " step " << s + 1;
    EXPECT_LT(diff, kCurveTolNats) << what << " step " << s + 1;
  }
  std::printf(
      "%s: steps %zu-%zu, loss %.4f -> %.4f; max |loss diff| %.3e nats (tolerance %.2f per "
      "step); routing: %d of %zu steps differ, %lld token-expert assignments moved in total "
      "(reported, not required equal in bf16)\n",
      what.c_str(), first + 1, first + got.loss.size(), got.loss.front(), got.loss.back(), worst,
      kCurveTolNats, steps_with_routing_diff, got.loss.size(), static_cast<long long>(moved_total));
  if (same_start) {
    ExpectSameStart(ref.loss[first], ref.norm[first], got.loss[0], got.norm[0],
                    absl::StrCat(what, ", step ", first + 1));
  }
}

#define REQUIRE_GPUS(n)                                                        \
  std::string why;                                                             \
  const int gpus = ProbeGpuCount(&why);                                        \
  if (gpus < (n))                                                              \
  GTEST_SKIP() << "needs >= " << (n) << " CUDA devices, found " << gpus << why \
               << ": distributed GPU training test skipped"

std::vector<int> RunRanks(int world, const std::function<int(int)>& body) {
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // NVLink SHARP is off on the GPU hosts
  return ct::RunProcesses(world, absl::Minutes(5), body);
}

class DistributedGpuTest : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(DistributedGpuTest, TracksSingleGpu) {
  const auto [ep, edp] = GetParam();
  const int world = ep * edp;
  REQUIRE_GPUS(world);
  const Curve& ref = Reference();
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps)) << "single-GPU reference failed";
  const std::string store = ct::UniqueStoreDir("gpu_dist_store");
  const std::string out = OutFile("gpu_dist_curve");
  const absl::Time start = absl::Now();
  const std::vector<int> codes = RunRanks(
      world, [&](int rank) { return RankBody(rank, world, ep, store, out, kSteps, "", ""); });
  for (int r = 0; r < world; ++r) ASSERT_EQ(codes[r], 0) << "rank " << r;
  const std::string what = absl::StrCat("EP=", ep, " EDP=", edp, " (", world, " GPUs, NCCL, bf16)");
  std::printf("%s: %d steps in %.1f s\n", what.c_str(), kSteps,
              absl::ToDoubleSeconds(absl::Now() - start));
  const Curve got = ReadCurve(out);
  ASSERT_EQ(got.loss.size(), static_cast<size_t>(kSteps)) << what;
  ExpectCloseCurve(ref, got, 0, what, /*same_start=*/true);
}

INSTANTIATE_TEST_SUITE_P(Layouts, DistributedGpuTest,
                         ::testing::Values(std::make_pair(1, 2), std::make_pair(2, 1),
                                           std::make_pair(1, 4), std::make_pair(2, 2),
                                           std::make_pair(4, 1)),
                         [](const auto& info) {
                           return absl::StrCat("EP", info.param.first, "_EDP", info.param.second);
                         });

// Expert tensor parallelism over NCCL: ETP2 (2 GPUs, attention DP2) and ETP2·EP2 (4 GPUs) with
// each dispatcher track the single-GPU curve as the EP × EDP layouts do (bf16 tolerance).
class DistributedGpuEtpTest : public ::testing::TestWithParam<std::tuple<int, int, std::string>> {};

TEST_P(DistributedGpuEtpTest, TracksSingleGpu) {
  const auto& [etp, ep, dispatcher] = GetParam();
  const int world = etp * ep;
  REQUIRE_GPUS(world);
  const Curve& ref = Reference();
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps)) << "single-GPU reference failed";
  const std::string store = ct::UniqueStoreDir("gpu_etp_store");
  const std::string out = OutFile("gpu_etp_curve");
  const std::vector<int> codes = RunRanks(world, [&](int rank) {
    return RankBody(rank, world, ep, store, out, kSteps, "", "", etp, dispatcher);
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(codes[r], 0) << "rank " << r;
  const std::string what =
      absl::StrCat("ETP=", etp, " EP=", ep, " ", dispatcher, " (", world, " GPUs, NCCL, bf16)");
  const Curve got = ReadCurve(out);
  ASSERT_EQ(got.loss.size(), static_cast<size_t>(kSteps)) << what;
  ExpectCloseCurve(ref, got, 0, what, /*same_start=*/true);
}

// Tensor parallelism with sequence parallelism on NCCL: TP = 2 (2 GPUs) and TP = 2 × EP = 2
// (4 GPUs, DP = 2) track the single-GPU curve with the same tolerances (not yet run on GPUs).
class TensorParallelGpuTest : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(TensorParallelGpuTest, TracksSingleGpu) {
  const auto [world, ep] = GetParam();
  constexpr int kTp = 2;
  REQUIRE_GPUS(world);
  const Curve& ref = Reference();
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps)) << "single-GPU reference failed";
  const std::string store = ct::UniqueStoreDir("gpu_tp_store");
  const std::string out = OutFile("gpu_tp_curve");
  const absl::Time start = absl::Now();
  const std::vector<int> codes = RunRanks(world, [&](int rank) {
    return RankBody(rank, world, ep, store, out, kSteps, "", "", 1, "", kTp);
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(codes[r], 0) << "rank " << r;
  const std::string what = absl::StrCat("TP=", kTp, " EP=", ep, " (", world, " GPUs, NCCL, bf16)");
  std::printf("%s: %d steps in %.1f s\n", what.c_str(), kSteps,
              absl::ToDoubleSeconds(absl::Now() - start));
  const Curve got = ReadCurve(out);
  ASSERT_EQ(got.loss.size(), static_cast<size_t>(kSteps)) << what;
  ExpectCloseCurve(ref, got, 0, what, /*same_start=*/true);
}

// Context parallelism on NCCL (worker/model/gpt_model.h, "Context parallelism"): each rank holds
// chunks r and 2·CP−1−r of every sequence, K/V are all-gathered over the CP communicator on
// device and every local chunk attends to its K/V prefix with the bottom-right causal mask (cuDNN
// or the native kernels, per the attention backend); RoPE rotates by global positions on device.
// CP2 (2 GPUs), CP2·EP2 (4 GPUs, DP2: EP spans DP×CP) and TP2·CP2 (4 GPUs) track the single-GPU
// curve with the tolerances above (not yet run on GPUs). The tiny spec's seq_length 16 gives
// chunks of 4 tokens at CP2 and 2 per TP rank at TP2·CP2 (16 % (2·CP·TP) == 0).
struct CpGpuLayout {
  int world, cp, ep, tp;
};
class ContextParallelGpuTest : public ::testing::TestWithParam<CpGpuLayout> {};

TEST_P(ContextParallelGpuTest, TracksSingleGpu) {
  const CpGpuLayout l = GetParam();
  REQUIRE_GPUS(l.world);
  const Curve& ref = Reference();
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps)) << "single-GPU reference failed";
  const std::string store = ct::UniqueStoreDir("gpu_cp_store");
  const std::string out = OutFile("gpu_cp_curve");
  const absl::Time start = absl::Now();
  const std::vector<int> codes = RunRanks(l.world, [&](int rank) {
    return RankBody(rank, l.world, l.ep, store, out, kSteps, "", "", 1, "", l.tp, l.cp);
  });
  for (int r = 0; r < l.world; ++r) ASSERT_EQ(codes[r], 0) << "rank " << r;
  const std::string what =
      absl::StrCat("CP=", l.cp, " TP=", l.tp, " EP=", l.ep, " (", l.world, " GPUs, NCCL, bf16)");
  std::printf("%s: %d steps in %.1f s\n", what.c_str(), kSteps,
              absl::ToDoubleSeconds(absl::Now() - start));
  const Curve got = ReadCurve(out);
  ASSERT_EQ(got.loss.size(), static_cast<size_t>(kSteps)) << what;
  ExpectCloseCurve(ref, got, 0, what, /*same_start=*/true);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ContextParallelGpuTest,
                         ::testing::Values(CpGpuLayout{2, 2, 1, 1}, CpGpuLayout{4, 2, 2, 1},
                                           CpGpuLayout{4, 2, 1, 2}),
                         [](const auto& info) {
                           const CpGpuLayout& l = info.param;
                           return absl::StrCat(l.tp > 1 ? absl::StrCat("TP", l.tp, "_") : "", "CP",
                                               l.cp, "_EP", l.ep, "_W", l.world);
                         });

INSTANTIATE_TEST_SUITE_P(Layouts, DistributedGpuEtpTest,
                         ::testing::Values(std::make_tuple(2, 1, std::string("allgather")),
                                           std::make_tuple(2, 1, std::string("alltoall")),
                                           std::make_tuple(2, 2, std::string("allgather")),
                                           std::make_tuple(2, 2, std::string("alltoall"))),
                         [](const auto& info) {
                           return absl::StrCat("ETP", std::get<0>(info.param), "_EP",
                                               std::get<1>(info.param), "_",
                                               std::get<2>(info.param));
                         });

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelGpuTest,
                         ::testing::Values(std::make_pair(2, 1), std::make_pair(4, 2)),
                         [](const auto& info) {
                           return absl::StrCat("TP2_EP", info.param.second, "_W", info.param.first);
                         });

// PP2 (2 GPUs: one stage each, 1F1B with NCCL Send/Recv of the bf16 activations) tracks the
// single-GPU run of the same 4-layer untied model with the same tolerances (not yet run on GPUs).
TEST(PipelineParallelGpuTest, TracksSingleGpu) {
  REQUIRE_GPUS(2);
  const std::string ref_out = OutFile("single_gpu_pp_curve");
  const std::vector<int> ref_codes = ct::RunProcesses(1, absl::Minutes(5), [&](int) {
    return SingleGpuBody(ref_out, kSteps, "", /*pipeline_variant=*/true);
  });
  ASSERT_EQ(ref_codes[0], 0) << "single-GPU reference child";
  const Curve ref = ReadCurve(ref_out);
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps)) << "single-GPU reference failed";
  const std::string store = ct::UniqueStoreDir("gpu_pp_store");
  const std::string out = OutFile("gpu_pp_curve");
  const absl::Time start = absl::Now();
  const std::vector<int> codes = RunRanks(2, [&](int rank) {
    return RankBody(rank, 2, 1, store, out, kSteps, "", "", 1, "", 1, /*cp=*/1, /*pp=*/2);
  });
  for (int r = 0; r < 2; ++r) ASSERT_EQ(codes[r], 0) << "rank " << r;
  const std::string what = "PP=2 (2 GPUs, NCCL, bf16)";
  std::printf("%s: %d steps in %.1f s\n", what.c_str(), kSteps,
              absl::ToDoubleSeconds(absl::Now() - start));
  const Curve got = ReadCurve(out);
  ASSERT_EQ(got.loss.size(), static_cast<size_t>(kSteps)) << what;
  ExpectCloseCurve(ref, got, 0, what, /*same_start=*/true);
}

// PP2 with a tied embedding and LM head (2 GPUs): the last stage's LM head is a copy of the
// embedding; after the schedule the two stages sum its gradient over NCCL Send/Recv, and the
// copy's part of the norm (a slice of the reduced shard) is subtracted on the GPU. Tracks the
// single-GPU run of the tied 4-layer model with the same tolerances (not yet run on GPUs: the CPU
// pipeline_parallel_trainer_test checks the same to 1e-5 over Gloo).
TEST(PipelineParallelGpuTest, TiedEmbeddingTracksSingleGpu) {
  REQUIRE_GPUS(2);
  const std::string ref_out = OutFile("single_gpu_pp_tied_curve");
  const std::vector<int> ref_codes = ct::RunProcesses(1, absl::Minutes(5), [&](int) {
    return SingleGpuBody(ref_out, kSteps, "", /*pipeline_variant=*/true, /*tied=*/true);
  });
  ASSERT_EQ(ref_codes[0], 0) << "single-GPU reference child";
  const Curve ref = ReadCurve(ref_out);
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps)) << "single-GPU reference failed";
  const std::string store = ct::UniqueStoreDir("gpu_pp_tied_store");
  const std::string out = OutFile("gpu_pp_tied_curve");
  const absl::Time start = absl::Now();
  const std::vector<int> codes = RunRanks(2, [&](int rank) {
    return RankBody(rank, 2, 1, store, out, kSteps, "", "", 1, "", 1, /*cp=*/1, /*pp=*/2,
                    /*tied=*/true);
  });
  for (int r = 0; r < 2; ++r) ASSERT_EQ(codes[r], 0) << "rank " << r;
  const std::string what = "PP=2 tied embedding (2 GPUs, NCCL, bf16)";
  std::printf("%s: %d steps in %.1f s\n", what.c_str(), kSteps,
              absl::ToDoubleSeconds(absl::Now() - start));
  const Curve got = ReadCurve(out);
  ASSERT_EQ(got.loss.size(), static_cast<size_t>(kSteps)) << what;
  ExpectCloseCurve(ref, got, 0, what, /*same_start=*/true);
}

// PP2·VPP2 (2 GPUs, the interleaved 1F1B: stage 0 holds layers 0 and 2, stage 1 layers 1 and 3;
// NCCL Send/Recv between the chunks in PipelineProgram's rounds) tracks the single-GPU run of the
// same 4-layer untied model with the same tolerances (not yet run on GPUs: the CPU
// interleaved_pipeline_trainer_test checks the same to 1e-5 over Gloo).
TEST(PipelineParallelGpuTest, InterleavedTracksSingleGpu) {
  REQUIRE_GPUS(2);
  const std::string ref_out = OutFile("single_gpu_vpp_curve");
  const std::vector<int> ref_codes = ct::RunProcesses(1, absl::Minutes(5), [&](int) {
    return SingleGpuBody(ref_out, kSteps, "", /*pipeline_variant=*/true);
  });
  ASSERT_EQ(ref_codes[0], 0) << "single-GPU reference child";
  const Curve ref = ReadCurve(ref_out);
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps)) << "single-GPU reference failed";
  const std::string store = ct::UniqueStoreDir("gpu_vpp_store");
  const std::string out = OutFile("gpu_vpp_curve");
  const absl::Time start = absl::Now();
  const std::vector<int> codes = RunRanks(2, [&](int rank) {
    return RankBody(rank, 2, 1, store, out, kSteps, "", "", 1, "", 1, /*cp=*/1, /*pp=*/2,
                    /*tied=*/false, /*vpp=*/2);
  });
  for (int r = 0; r < 2; ++r) ASSERT_EQ(codes[r], 0) << "rank " << r;
  const std::string what = "PP=2 VPP=2 (2 GPUs, NCCL, bf16)";
  std::printf("%s: %d steps in %.1f s\n", what.c_str(), kSteps,
              absl::ToDoubleSeconds(absl::Now() - start));
  const Curve got = ReadCurve(out);
  ASSERT_EQ(got.loss.size(), static_cast<size_t>(kSteps)) << what;
  ExpectCloseCurve(ref, got, 0, what, /*same_start=*/true);
}

// Save at step 10 with EP = 2 on 2 GPUs, resume with EP = 1 × EDP = 2 (resharded experts) and,
// in a forked child, on one GPU: both continue close to the uninterrupted single-GPU curve.
TEST(DistributedGpuCheckpointTest, ResumesWithAnotherLayout) {
  REQUIRE_GPUS(2);
  const Curve& ref = Reference();
  ASSERT_EQ(ref.loss.size(), static_cast<size_t>(kSteps)) << "single-GPU reference failed";
  const std::string root = ct::UniqueStoreDir("gpu_ckpt_root");

  const std::string store = ct::UniqueStoreDir("gpu_ckpt_store");
  const std::string out = OutFile("gpu_ckpt_curve");
  std::vector<int> codes =
      RunRanks(2, [&](int rank) { return RankBody(rank, 2, 2, store, out, kSteps / 2, "", root); });
  for (int r = 0; r < 2; ++r) ASSERT_EQ(codes[r], 0) << "save run, rank " << r;
  const Curve saved = ReadCurve(out);
  ASSERT_EQ(saved.loss.size(), static_cast<size_t>(kSteps / 2));
  ExpectCloseCurve(ref, saved, 0, "EP=2 EDP=1 steps 1-10, saved at step 10", true);

  const std::string store2 = ct::UniqueStoreDir("gpu_ckpt_store2");
  const std::string out2 = OutFile("gpu_ckpt_curve2");
  codes =
      RunRanks(2, [&](int rank) { return RankBody(rank, 2, 1, store2, out2, kSteps, root, ""); });
  for (int r = 0; r < 2; ++r) ASSERT_EQ(codes[r], 0) << "resume run, rank " << r;
  const Curve resumed = ReadCurve(out2);
  ASSERT_EQ(resumed.loss.size(), static_cast<size_t>(kSteps - kSteps / 2));
  ExpectCloseCurve(ref, resumed, kSteps / 2, "resumed as EP=1 EDP=2 (2 GPUs)", false);

  const std::string out3 = OutFile("gpu_ckpt_curve3");
  codes =
      ct::RunProcesses(1, absl::Minutes(5), [&](int) { return SingleGpuBody(out3, kSteps, root); });
  ASSERT_EQ(codes[0], 0) << "single-GPU resume child";
  const Curve single = ReadCurve(out3);
  ASSERT_EQ(single.loss.size(), static_cast<size_t>(kSteps - kSteps / 2));
  ExpectCloseCurve(ref, single, kSteps / 2, "resumed as one GPU", false);
  // Both resumed runs start from the same checkpoint: their step 11 is a same-weights comparison
  // of the resharded load (the reference's step 11 came from its own, uncheckpointed weights).
  ExpectSameStart(single.loss[0], single.norm[0], resumed.loss[0], resumed.norm[0],
                  "step 11 after the resume: EP=1 EDP=2 vs one GPU, same checkpoint");
}

}  // namespace
}  // namespace switchyard::train
