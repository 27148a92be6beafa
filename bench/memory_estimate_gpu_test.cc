// The planner's memory estimate (coordinator/planner/cost_model.h; EstimateEngineMemory in
// common/model/model_math.h, CUDA bf16 engine, default runtime term) against a real training run on
// GPU 0: the benchmark model of bench/bench_model.h cut to 2 layers (seq 4096, micro-batch
// 2, global batch 16: ~9 GiB) and the benchmark's "small" model at seq 4096 (~4 GiB) train 2
// optimizer steps. Measured as the benchmark measures: cudaMemGetInfo used after the steps
// minus used before Trainer::Create (the CUDA context exists before), and the CUDA Buffer
// counter (kernels/runtime/buffer.h) for the engine's own buffers. |estimate / measured - 1| <=
// 0.15 for the device total, and for the buffers alone. Prints both. Skips without a GPU.
//
// Issue 13's folds (TP 2, CP 2, TP 2 x CP 2, ETP 2 x EP 2) of the small model at seq 4096: one
// forked rank per GPU over NCCL; each rank's CUDA Buffer counter after 2 steps must be within
// 5 % of the estimated buffers; the cudaMemGetInfo delta is printed against the estimated total,
// and the runtime (delta less the Buffer counter) against RuntimeBytes with the communicators it
// counts (common/model/model_math.h: per process, per communicator, per point-to-point peer,
// fitted to the TP 2 and CP 2 folds among others), but not asserted: the fit has six points.
// Skips below the GPUs a fold needs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/bench_model.h"
#include "common/config/config_defaults.h"
#include "common/model/model_math.h"
#include "coordinator/planner/cost_model.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"
#include "switchyard/v1/config.pb.h"
#include "worker/comm/testing/forked_ranks.h"
#include "worker/train/process_groups.h"
#include "worker/train/trainer.h"

namespace switchyard {
namespace {

constexpr double kTolerance = 0.15;
constexpr double kGiB = 1024.0 * 1024 * 1024;

struct Shape {
  const char* name;
  bench::BenchModel model;
};

v1::JobSpec Spec(const Shape& b) { return bench::MakeBenchSpec(b.name, b.model, 2); }

double MemUsed() {
  size_t free_b = 0, total_b = 0;
  EXPECT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  return static_cast<double>(total_b - free_b);
}

void CheckOnGpu(const Shape& shape) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);  // the context exists before the baseline
  const v1::JobSpec spec = Spec(shape);
  const double before = MemUsed();
  const int64_t buffers_before = kernels::BufferMemory(DeviceType::kCuda).current_bytes;
  double used = 0, buffers = 0;
  {
    train::TrainerOptions opt;
    opt.device = Device::Cuda(0);
    absl::StatusOr<std::unique_ptr<train::Trainer>> t = train::Trainer::Create(spec, opt);
    ASSERT_TRUE(t.ok()) << t.status();
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<train::StepResult> r = (*t)->Step();
      ASSERT_TRUE(r.ok()) << r.status();
      std::printf("%s\n", (*t)->FormatLogLine(*r).c_str());
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    used = MemUsed() - before;
    buffers = static_cast<double>(kernels::BufferMemory(DeviceType::kCuda).current_bytes -
                                  buffers_before);
  }

  v1::JobSpec defaulted = spec;
  ApplyDefaults(&defaulted);
  absl::StatusOr<ModelShape> model = ModelShape::FromProto(defaulted.model());
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<v1::Mapping> mapping = planner::MappingOfSpec(defaulted);
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  EngineMemory e;
  const v1::MemoryEstimate est = planner::EstimateMemory(*model, *mapping, nullptr, {}, &e);
  const double ratio = est.total() / used, buffer_ratio = e.buffers() / buffers;
  std::printf(
      "%s: estimate %.3f GiB (weights %.3f, grads %.3f, optimizer %.3f, layer activations %.3f, "
      "MoE %.3f, head %.3f, runtime %.3f) | measured cudaMemGetInfo delta %.3f GiB -> "
      "est/measured %.4f | Buffer counter %.3f GiB vs estimated buffers %.3f GiB -> %.4f "
      "(tolerance %.2f)\n",
      shape.name, est.total() / kGiB, e.weights / kGiB, e.gradients / kGiB,
      e.optimizer_states / kGiB, e.layer_activations / kGiB, e.moe_buffers / kGiB,
      e.head_buffers / kGiB, e.runtime / kGiB, used / kGiB, ratio, buffers / kGiB,
      e.buffers() / kGiB, buffer_ratio, kTolerance);
  EXPECT_LE(std::abs(ratio - 1), kTolerance) << shape.name;
  EXPECT_LE(std::abs(buffer_ratio - 1), kTolerance) << shape.name;
}

namespace ct = ::switchyard::comm::testing;

constexpr double kFoldTolerance = 0.05;

struct Fold {
  const char* name;
  int world, tp, cp, ep, etp;
};

// GPU count from a probe child, so the parent never initialises CUDA before it forks.
int ProbeGpuCount() {
  std::vector<int> codes = ct::RunProcesses(1, absl::Seconds(60), [](int) {
    std::string why;
    return std::min(::switchyard::testing::CudaDeviceCount(&why), 100);
  });
  return codes[0] > 100 ? 0 : codes[0];
}

// The single-GPU cases run in a forked child as well: the parent never initialises CUDA, so
// the fold cases below can still fork ranks that use it (a CUDA context does not survive a
// fork; with these cases in the parent, every fold rank failed cudaSetDevice, exit code 2).
void CheckOnGpuInChild(const Shape& shape) {
  if (ProbeGpuCount() < 1) GTEST_SKIP() << "no CUDA device";
  const std::vector<int> codes = ct::RunProcesses(1, absl::Minutes(5), [&](int) {
    CheckOnGpu(shape);
    return ::testing::Test::HasFailure() ? 1 : 0;
  });
  ASSERT_EQ(codes[0], 0) << shape.name << ": the child failed (its output is above)";
}

TEST(MemoryEstimateGpuTest, BenchmarkModelTwoLayers) {
  bench::BenchModel m = *bench::BenchModelByName("benchmark");
  m.layers = 2;
  CheckOnGpuInChild({"benchmark model, 2 layers", m});
}

TEST(MemoryEstimateGpuTest, SmallModelLongSequence) {
  bench::BenchModel m = *bench::BenchModelByName("small");
  m.seq = 4096;
  CheckOnGpuInChild({"small model, seq 4096", m});
}

void CheckFold(const Fold& fold) {
  const int gpus = ProbeGpuCount();
  if (gpus < fold.world) {
    GTEST_SKIP() << fold.name << " needs " << fold.world << " CUDA devices, found " << gpus;
  }
  bench::BenchModel b = *bench::BenchModelByName("small");
  b.seq = 4096;
  v1::JobSpec spec = bench::MakeBenchSpec("small", b, 2);
  v1::ParallelConfig* p = spec.mutable_parallel();
  p->set_world_size(fold.world);
  p->set_tensor_model_parallel_size(fold.tp);
  p->set_sequence_parallel(fold.tp > 1);
  p->set_context_parallel_size(fold.cp);
  p->set_expert_model_parallel_size(fold.ep);
  p->set_expert_tensor_parallel_size(fold.etp);
  const std::string store = ct::UniqueStoreDir("memest_gpu_store");
  const std::string out = ct::UniqueStoreDir("memest_gpu_out");
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // NVLink SHARP is off on the GPU hosts
  const std::vector<int> codes = ct::RunProcesses(fold.world, absl::Minutes(5), [&](int rank) {
    if (cudaSetDevice(rank) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) return 2;
    cudaStream_t cs = nullptr;
    if (cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking) != cudaSuccess) return 3;
    double used = 0, buffers = 0;
    {
      std::shared_ptr<comm::KvStore> kv = ct::OpenFileStore(store);
      SY_CHILD_CHECK(kv != nullptr);
      ParallelDims dims;
      dims.world_size = fold.world;
      dims.tensor_model_parallel_size = fold.tp;
      dims.context_parallel_size = fold.cp;
      dims.expert_model_parallel_size = fold.ep;
      dims.expert_tensor_parallel_size = fold.etp;
      comm::NcclOptions nopt;
      nopt.timeout = absl::Seconds(120);
      // Measured from before the communicators, as the estimate's runtime term counts them.
      const double before = MemUsed();
      const int64_t buffers_before = kernels::BufferMemory(DeviceType::kCuda).current_bytes;
      auto groups = train::CreateNcclProcessGroups(kv, rank, dims, rank, cs, nopt);
      SY_CHILD_OK(groups.status());
      train::TrainerOptions opt;
      opt.device = Device::Cuda(rank);
      opt.groups = groups->get();
      opt.cuda_stream = cs;
      auto t = train::Trainer::Create(spec, opt);
      SY_CHILD_OK(t.status());
      for (int i = 0; i < 2; ++i) SY_CHILD_OK((*t)->Step().status());
      if (cudaDeviceSynchronize() != cudaSuccess) return 4;
      used = MemUsed() - before;
      buffers = static_cast<double>(kernels::BufferMemory(DeviceType::kCuda).current_bytes -
                                    buffers_before);
    }  // the trainer, then the communicators, go before the stream
    cudaStreamDestroy(cs);
    std::ofstream f(absl::StrCat(out, "_rank", rank, ".txt"));
    f << used << " " << buffers << "\n";
    return f.good() ? 0 : 1;
  });
  for (int r = 0; r < fold.world; ++r) ASSERT_EQ(codes[r], 0) << fold.name << " rank " << r;

  v1::JobSpec defaulted = spec;
  ApplyDefaults(&defaulted);
  absl::StatusOr<ModelShape> model = ModelShape::FromProto(defaulted.model());
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<v1::Mapping> mapping = planner::MappingOfSpec(defaulted);
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  EngineMemory e;
  const v1::MemoryEstimate est = planner::EstimateMemory(*model, *mapping, nullptr, {}, &e);
  const EngineCommunicatorSet comms = EngineCommunicators(*model, *mapping);
  for (int r = 0; r < fold.world; ++r) {
    std::ifstream f(absl::StrCat(out, "_rank", r, ".txt"));
    double used = 0, buffers = 0;
    f >> used >> buffers;
    ASSERT_TRUE(f) << fold.name << " rank " << r << " wrote no counters";
    const double buffer_ratio = e.buffers() / buffers;
    std::printf(
        "%s, rank %d: estimate %.3f GiB (buffers %.3f, runtime %.3f) | cudaMemGetInfo delta "
        "%.3f GiB -> est/measured %.4f (not asserted) | runtime: measured (delta - Buffer "
        "counter) %.3f GiB vs estimated %.3f GiB (%lld communicators of > 1 rank, %lld "
        "point-to-point peers) -> %.4f (not asserted) | Buffer counter %.3f GiB vs estimated "
        "buffers %.3f GiB -> %.4f (tolerance %.2f)\n",
        fold.name, r, est.total() / kGiB, e.buffers() / kGiB, e.runtime / kGiB, used / kGiB,
        est.total() / used, (used - buffers) / kGiB, e.runtime / kGiB,
        static_cast<long long>(comms.communicators), static_cast<long long>(comms.p2p_peers),
        e.runtime / (used - buffers), buffers / kGiB, e.buffers() / kGiB, buffer_ratio,
        kFoldTolerance);
    EXPECT_LE(std::abs(buffer_ratio - 1), kFoldTolerance) << fold.name << " rank " << r;
  }
}

TEST(MemoryEstimateGpuTest, FoldTensorParallelTwo) { CheckFold({"small TP2", 2, 2, 1, 1, 1}); }

TEST(MemoryEstimateGpuTest, FoldContextParallelTwo) { CheckFold({"small CP2", 2, 1, 2, 1, 1}); }

TEST(MemoryEstimateGpuTest, FoldTensorTwoContextTwo) {
  CheckFold({"small TP2 CP2", 4, 2, 2, 1, 1});
}

TEST(MemoryEstimateGpuTest, FoldExpertTensorTwoExpertTwo) {
  CheckFold({"small ETP2 EP2", 4, 1, 1, 2, 2});
}

}  // namespace
}  // namespace switchyard
