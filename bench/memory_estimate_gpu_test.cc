// The planner's memory estimate (coordinator/planner/cost_model.h; EstimateEngineMemory in
// common/model/model_math.h, CUDA bf16 engine, default runtime term) against a real training run on
// GPU 0: the benchmark model of bench/bench_model.h cut to 2 layers (seq 4096, micro-batch
// 2, global batch 16: ~9 GiB) and the benchmark's "small" model at seq 4096 (~4 GiB) train 2
// optimizer steps. Measured as the benchmark measures: cudaMemGetInfo used after the steps
// minus used before Trainer::Create (the CUDA context exists before), and the CUDA Buffer
// counter (kernels/buffer.h) for the engine's own buffers. |estimate / measured - 1| <= 0.15
// for the device total, and for the buffers alone. Prints both. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "bench/bench_model.h"
#include "common/config/config_defaults.h"
#include "common/model/model_math.h"
#include "coordinator/planner/cost_model.h"
#include "kernels/buffer.h"
#include "kernels/testing/gpu.h"
#include "switchyard/v1/config.pb.h"
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

TEST(MemoryEstimateGpuTest, BenchmarkModelTwoLayers) {
  SY_REQUIRE_GPU();
  bench::BenchModel m = *bench::BenchModelByName("benchmark");
  m.layers = 2;
  CheckOnGpu({"benchmark model, 2 layers", m});
}

TEST(MemoryEstimateGpuTest, SmallModelLongSequence) {
  SY_REQUIRE_GPU();
  bench::BenchModel m = *bench::BenchModelByName("small");
  m.seq = 4096;
  CheckOnGpu({"small model, seq 4096", m});
}

}  // namespace
}  // namespace switchyard
