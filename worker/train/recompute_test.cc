// File: worker/train/recompute_test.cc
//
// Selective activation recompute (model.recompute_modules, config.proto; worker/model/gpt_model.h
// "Selective recompute") changes memory, never results: training with recompute on must give
// the BIT-IDENTICAL losses, gradient norms, aux / z losses, routing, parameters and gradients of
// training with it off, because the backward recomputes each dropped activation with the
// forward's own deterministic kernels from the same inputs.
//   - One process, fp64 CPU engine (PP1): the tiny MoE model of worker/train/testing/
//     tiny_moe_spec.h with 4 layers (MoE, dense, MoE, dense), a GATED shared expert and no input
//     jitter (so the router, the shared expert and its gate all read the recomputed norm output)
//     trains kSteps steps with each honoured module alone ("moe_act", "layernorm", "mlp",
//     "core_attn") and all together, against no recompute. Each run's Buffer bytes after Create
//     must also shrink by exactly what EstimateEngineMemory says (recompute really on;
//     "core_attn", the documented no-op, by nothing).
//   - Distributed over Gloo between forked ranks (f32): PP2·EP2 with the alltoall dispatcher (the
//     first stage keeps 2 micro-batches in flight between forward and backward, so one scratch
//     serves both slots, and the alltoall's expert rows follow the counts) and TP2 with sequence
//     parallelism (the recomputed norms are all-gathered again), all modules against none: every
//     rank's curve and the hashes of its parameters and gradients must be equal.
// If a recompute were skipped (stale scratch) or wrong, the gradients of the first step already
// differ (checked by hand: see the report of the change).
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/config/config.h"
#include "common/config/config_defaults.h"
#include "common/model/model_math.h"
#include "gtest/gtest.h"
#include "kernels/runtime/buffer.h"
#include "worker/comm/testing/forked_ranks.h"
#include "worker/train/testing/curve.h"
#include "worker/train/testing/gloo_groups.h"
#include "worker/train/testing/tiny_moe_spec.h"
#include "worker/train/trainer.h"

namespace switchyard::train {
namespace {

namespace ct = ::switchyard::comm::testing;
using Modules = std::vector<std::string>;

constexpr int kSteps = 8;

// The tiny MoE job with a gated shared expert and 4 layers (MoE, dense, MoE, dense: two of each,
// so that every module's shared scratch replaces more than one layer's buffers); `modules` under
// selective granularity (none: no recompute).
v1::JobSpec Spec(const Modules& modules, int64_t steps = kSteps) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpecYaml(switchyard::test_specs::TinyMoeSpecYaml(steps, /*jitter=*/false));
  EXPECT_TRUE(spec.ok()) << spec.status();
  v1::ModelConfig* m = spec->mutable_model();
  m->set_moe_shared_expert_gate(true);
  m->set_num_layers(4);
  m->clear_moe_layer_pattern();
  for (int x : {1, 0, 1, 0}) m->add_moe_layer_pattern(x);
  if (!modules.empty()) {
    m->set_recompute_granularity("selective");
    for (const std::string& module : modules) m->add_recompute_modules(module);
  }
  return *spec;
}

// EstimateEngineMemory's buffers for the one-process fp64 CPU engine of `spec`.
double EstimatedBuffers(v1::JobSpec spec) {
  ApplyDefaults(&spec);
  absl::StatusOr<ModelShape> shape = ModelShape::FromProto(spec.model());
  EXPECT_TRUE(shape.ok()) << shape.status();
  if (!shape.ok()) return 0;
  v1::Mapping mapping;  // every size 1
  mapping.set_micro_batch_size(spec.training().micro_batch_size());
  mapping.set_num_micro_batches(spec.training().global_batch_size() /
                                spec.training().micro_batch_size());
  EngineMemoryOptions cpu;
  cpu.cuda = false;
  cpu.param_bytes = 8;
  return EstimateEngineMemory(*shape, mapping, 0, cpu).buffers();
}

std::string Name(const Modules& modules) {
  return modules.empty() ? "none" : absl::StrJoin(modules, "+");
}

struct Trained {
  std::vector<StepResult> steps;
  std::vector<char> params, grads;
  int64_t buffer_bytes = 0;  // CPU Buffers the trainer holds after Create
};

Trained TrainOneProcess(const v1::JobSpec& spec) {
  Trained run;
  TrainerOptions opt;
  opt.force_dtype = true;
  opt.dtype = DType::kF64;
  const int64_t before = kernels::BufferMemory(DeviceType::kCpu).current_bytes;
  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(spec, opt);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return run;
  run.buffer_bytes = kernels::BufferMemory(DeviceType::kCpu).current_bytes - before;
  for (int i = 0; i < kSteps; ++i) {
    absl::StatusOr<StepResult> r = (*t)->Step();
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return run;
    run.steps.push_back(*r);
  }
  const Tensor p = (*t)->model().params(), g = (*t)->model().grads();
  run.params.assign(static_cast<const char*>(p.data), static_cast<const char*>(p.data) + p.bytes());
  run.grads.assign(static_cast<const char*>(g.data), static_cast<const char*>(g.data) + g.bytes());
  return run;
}

// Doubles compared by their bits.
bool Same(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

// f64 elements of two byte images that differ.
int64_t DifferentDoubles(const std::vector<char>& a, const std::vector<char>& b) {
  if (a.size() != b.size()) return -1;
  int64_t n = 0;
  for (size_t i = 0; i + sizeof(double) <= a.size(); i += sizeof(double)) {
    n += std::memcmp(a.data() + i, b.data() + i, sizeof(double)) != 0;
  }
  return n;
}

void ExpectBitIdentical(const Trained& ref, const Trained& got, const std::string& what) {
  ASSERT_EQ(got.steps.size(), ref.steps.size()) << what;
  int step_diffs = 0;
  for (size_t s = 0; s < ref.steps.size(); ++s) {
    const StepResult &a = ref.steps[s], &b = got.steps[s];
    const bool same = Same(a.loss, b.loss) && Same(a.grad_norm, b.grad_norm) &&
                      Same(a.aux_loss, b.aux_loss) && Same(a.z_loss, b.z_loss) &&
                      a.expert_tokens == b.expert_tokens;
    if (!same) {
      ++step_diffs;
      ADD_FAILURE() << what << " step " << s + 1 << ": loss " << b.loss << " vs " << a.loss
                    << ", grad norm " << b.grad_norm << " vs " << a.grad_norm << ", aux "
                    << b.aux_loss << " vs " << a.aux_loss;
    }
  }
  const int64_t param_diffs = DifferentDoubles(ref.params, got.params);
  const int64_t grad_diffs = DifferentDoubles(ref.grads, got.grads);
  std::printf(
      "%-40s %d steps, loss %.10f -> %.10f: %d steps differ; %zu parameters, %lld differ; "
      "gradients %lld differ (bitwise); Buffers %lld B (off: %lld B, saved %lld B)\n",
      what.c_str(), kSteps, got.steps.front().loss, got.steps.back().loss, step_diffs,
      ref.params.size() / sizeof(double), static_cast<long long>(param_diffs),
      static_cast<long long>(grad_diffs), static_cast<long long>(got.buffer_bytes),
      static_cast<long long>(ref.buffer_bytes),
      static_cast<long long>(ref.buffer_bytes - got.buffer_bytes));
  EXPECT_EQ(param_diffs, 0) << what;
  EXPECT_EQ(grad_diffs, 0) << what;
}

TEST(RecomputeTest, EveryModuleIsBitIdenticalToNoRecompute) {
  const Trained off = TrainOneProcess(Spec({}));
  ASSERT_EQ(off.steps.size(), static_cast<size_t>(kSteps));
  const double estimated_off = EstimatedBuffers(Spec({}));
  for (const Modules& modules :
       std::vector<Modules>{{"moe_act"},
                            {"layernorm"},
                            {"mlp"},
                            {"core_attn"},
                            {"core_attn", "moe_act", "layernorm", "mlp"}}) {
    const Trained on = TrainOneProcess(Spec(modules));
    ExpectBitIdentical(off, on, absl::StrCat("fp64 PP1 recompute ", Name(modules)));
    // Recompute really is on: the Buffers shrink by what the estimate says (nothing for the
    // core_attn no-op).
    const double saved = static_cast<double>(off.buffer_bytes - on.buffer_bytes);
    const double estimated = estimated_off - EstimatedBuffers(Spec(modules));
    std::printf("  %s: %.0f B saved, estimate %.0f B\n", Name(modules).c_str(), saved, estimated);
    EXPECT_EQ(saved, estimated) << Name(modules);
    if (modules.size() == 1 && modules[0] == "core_attn") {
      EXPECT_EQ(saved, 0) << "core_attn is a no-op";
    } else {
      EXPECT_GT(saved, 0) << Name(modules) << " must drop buffers";
    }
  }
}

// --- distributed -------------------------------------------------------------------------------

struct Layout {
  int world = 2, tp = 1, ep = 1, pp = 1;
  std::string Name() const {
    return absl::StrCat("TP", tp, " EP", ep, " PP", pp, " (world ", world, ")");
  }
};

constexpr int kDistSteps = 6;

// The spec of `layout`: the 4 layers split 2 + 2 by PP2 (each stage a MoE and a dense layer),
// the alltoall dispatcher, ETP 1.
v1::JobSpec DistSpec(const Layout& layout, const Modules& modules) {
  v1::JobSpec spec = Spec(modules, kDistSteps);
  spec.mutable_model()->set_moe_token_dispatcher_type("alltoall");
  v1::ParallelConfig* p = spec.mutable_parallel();
  p->set_world_size(layout.world);
  p->set_tensor_model_parallel_size(layout.tp);
  p->set_sequence_parallel(layout.tp > 1);
  p->set_expert_model_parallel_size(layout.ep);
  p->set_expert_tensor_parallel_size(1);
  p->set_pipeline_model_parallel_size(layout.pp);
  return spec;
}

// FNV-1a of a tensor's bytes, in hex.
std::string Hash(const Tensor& t) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char* p = static_cast<const unsigned char*>(t.data);
  for (size_t i = 0; i < t.bytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return absl::StrCat(absl::Hex(h, absl::kZeroPad16));
}

// Every rank: train, then write its curve and the hashes of its parameters and gradients to
// `<out>_rank<r>.txt`.
int RankBody(int rank, const Layout& layout, const Modules& modules, const std::string& store,
             const std::string& out) {
  auto groups = test_groups::JoinGlooGroups(
      store, rank,
      test_groups::LayoutDims(layout.world, layout.tp, layout.ep, /*cp=*/1, /*etp=*/1, layout.pp));
  SY_CHILD_OK(groups.status());
  TrainerOptions opt = curves::CpuF32();
  opt.groups = groups->get();
  auto t = Trainer::Create(DistSpec(layout, modules), opt);
  SY_CHILD_OK(t.status());
  std::ostringstream text;
  for (int i = 0; i < kDistSteps; ++i) {
    absl::StatusOr<StepResult> r = (*t)->Step();
    SY_CHILD_OK(r.status());
    text << curves::CurveLine(*r);
  }
  text << "params " << Hash((*t)->model().params()) << " grads " << Hash((*t)->model().grads())
       << "\n";
  std::ofstream f(absl::StrCat(out, "_rank", rank, ".txt"));
  f << text.str();
  return f.good() ? 0 : 1;
}

std::vector<std::string> RunLayout(const Layout& layout, const Modules& modules) {
  const std::string tag = absl::StrCat("recompute_", layout.tp, layout.ep, layout.pp, "_",
                                       modules.empty() ? "off" : "on");
  const std::string store = ct::UniqueStoreDir(tag + "_store");
  const std::string out = curves::OutFile(tag);
  const std::vector<int> codes = ct::RunProcesses(layout.world, absl::Minutes(8), [&](int rank) {
    return RankBody(rank, layout, modules, store, out);
  });
  std::vector<std::string> files;
  for (int r = 0; r < layout.world; ++r) {
    EXPECT_EQ(codes[r], 0) << layout.Name() << " rank " << r;
    std::ifstream f(absl::StrCat(out, "_rank", r, ".txt"));
    std::stringstream s;
    s << f.rdbuf();
    files.push_back(s.str());
  }
  return files;
}

class RecomputeDistributedTest : public ::testing::TestWithParam<Layout> {};

TEST_P(RecomputeDistributedTest, AllModulesAreBitIdenticalToNoRecompute) {
  const Layout layout = GetParam();
  const Modules all = {"core_attn", "moe_act", "layernorm", "mlp"};
  const std::vector<std::string> off = RunLayout(layout, {});
  const std::vector<std::string> on = RunLayout(layout, all);
  ASSERT_EQ(off.size(), on.size());
  for (size_t r = 0; r < off.size(); ++r) {
    ASSERT_FALSE(off[r].empty()) << "rank " << r << " wrote nothing";
    EXPECT_EQ(on[r], off[r]) << layout.Name() << " rank " << r
                             << ": recompute on (first block) differs from off";
    std::printf("%s rank %zu, recompute %s vs none, %d steps: %s\n", layout.Name().c_str(), r,
                Name(all).c_str(), kDistSteps, on[r] == off[r] ? "identical" : "DIFFERENT");
  }
  std::printf("rank 0 (recompute on):\n%s", on[0].c_str());
}

INSTANTIATE_TEST_SUITE_P(Layouts, RecomputeDistributedTest,
                         ::testing::Values(Layout{4, 1, 2, 2}, Layout{2, 2, 1, 1}),
                         [](const auto& info) {
                           return absl::StrCat("TP", info.param.tp, "_EP", info.param.ep, "_PP",
                                               info.param.pp);
                         });

}  // namespace
}  // namespace switchyard::train
