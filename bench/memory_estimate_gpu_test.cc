// The planner's memory estimate (coordinator/planner/cost_model.h; EstimateEngineMemory in
// common/model_math.h, CUDA bf16 engine, default runtime term) against a real training run on
// GPU 0: the benchmark model of bench/train_benchmark.cc cut to 2 layers (seq 4096, micro-batch
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

#include "common/config_defaults.h"
#include "common/model_math.h"
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
  int layers, hidden, heads, groups, experts, topk, moe_ffn, seq, micro, global;
};

// bench/train_benchmark.cc MakeSpec: Qwen3-MoE-like, head dim 128, qk_layernorm, untied,
// softmax top-k with aux loss, vocab 32768, bf16, mock data.
v1::JobSpec Spec(const Shape& b) {
  v1::JobSpec spec;
  v1::ModelConfig* m = spec.mutable_model();
  m->set_num_layers(b.layers);
  m->set_hidden_size(b.hidden);
  m->set_num_attention_heads(b.heads);
  m->set_kv_channels(128);
  m->set_num_query_groups(b.groups);
  m->set_ffn_hidden_size(4 * b.hidden);
  m->set_seq_length(b.seq);
  m->set_max_position_embeddings(b.seq);
  m->set_vocab_size(32768);
  m->set_normalization("RMSNorm");
  m->set_norm_epsilon(1e-6);
  m->set_rotary_base(1e6);
  m->set_qk_layernorm(true);
  m->set_untie_embeddings_and_output_weights(true);
  m->set_num_experts(b.experts);
  m->set_moe_router_topk(b.topk);
  m->set_moe_ffn_hidden_size(b.moe_ffn);
  m->set_moe_router_score_function("softmax");
  m->add_moe_router_load_balancing_type("aux_loss");
  m->add_moe_aux_loss_coeff(1e-3);
  m->set_moe_grouped_gemm(true);
  v1::TrainingConfig* t = spec.mutable_training();
  t->set_micro_batch_size(b.micro);
  t->set_global_batch_size(b.global);
  t->set_train_iters(2);
  t->set_lr(1e-4);
  t->set_lr_warmup_iters(0);
  t->set_lr_decay_style("constant");
  t->set_clip_grad(1.0);
  t->set_seed(1234);
  t->set_bf16(true);
  spec.mutable_data()->set_mock_data(true);
  return spec;
}

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
  CheckOnGpu({"benchmark model, 2 layers", 2, 1536, 12, 4, 64, 8, 384, 4096, 2, 16});
}

TEST(MemoryEstimateGpuTest, SmallModelLongSequence) {
  SY_REQUIRE_GPU();
  CheckOnGpu({"small model, seq 4096", 4, 768, 6, 2, 32, 4, 192, 4096, 2, 8});
}

}  // namespace
}  // namespace switchyard
