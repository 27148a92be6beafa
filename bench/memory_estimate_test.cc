// The planner's memory estimate (coordinator/planner/cost_model.h, EstimateEngineMemory in
// common/model/model_math.h) against what the engine really allocates, on the CPU: real Trainers of
// small configurations (dense; MoE top-2 with a shared expert, at two micro-batch sizes and with
// pad-to-capacity; MoE top-4 with dense layers, input jitter and seq_aux_loss; the MoE model over
// forked Gloo ranks with EP = 2 and, issue 13's folds, TP = 2, CP = 2, TP = 2 x CP = 2 and
// ETP = 2 x EP = 2) run 2 optimizer steps, and the process-wide Buffer counters
// (kernels/runtime/buffer.h) give the bytes held after the steps (the steady state) and the peak.
// The estimate of the CPU engine (f32 parameters and activations, fp64 statistics, no runtime term)
// must be within 15 % of the steady state (5 % for the TP/CP/ETP folds, on every rank); the peak
// within the same tolerance of buffers + create_transient (Create holds no full-size copy).
// Pipelines (issue 14; PP2, PP2·EP2 tied, and interleaved PP2·VPP2, PP4·VPP2 and PP2·VPP2 with an
// uneven layout, tied): every rank's steady bytes equal its stage's estimate to the byte, with the
// micro-batches the interleaved schedule keeps alive (PipelineAliveMicroBatches).
// Prints both, per component. Selective recompute (moe_act, layernorm, mlp, all; PP2 with two
// slots in flight): the saving, the steady bytes without less with recompute, equals the
// estimate's saving to the byte; the benchmark model's estimated saving is printed.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "bench/bench_model.h"
#include "common/config/config.h"
#include "common/config/config_defaults.h"
#include "common/model/model_math.h"
#include "common/model/pipeline_schedule.h"
#include "common/status.h"
#include "coordinator/planner/cost_model.h"
#include "coordinator/planner/planner.h"
#include "gtest/gtest.h"
#include "kernels/runtime/buffer.h"
#include "worker/comm/testing/forked_ranks.h"
#include "worker/train/process_groups.h"
#include "worker/train/testing/curve.h"
#include "worker/train/testing/gloo_groups.h"
#include "worker/train/trainer.h"

namespace switchyard {
namespace {

namespace ct = ::switchyard::comm::testing;
using train::curves::CpuF32;

constexpr double kTolerance = 0.15;

// Bytes held by CPU Buffers: after the steps (steady) and the most at once (peak), both less
// what was held before Trainer::Create.
struct Measured {
  double steady = 0, peak = 0;
};

v1::JobSpec Spec(const std::string& yaml) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

const char kDense[] =
    "model:\n"
    "  num_layers: 2\n"
    "  hidden_size: 64\n"
    "  num_attention_heads: 4\n"
    "  ffn_hidden_size: 256\n"
    "  seq_length: 128\n"
    "  vocab_size: 512\n"
    "training:\n"
    "  micro_batch_size: 2\n"
    "  global_batch_size: 4\n"
    "  train_iters: 2\n"
    "data:\n"
    "  mock_data: true\n";

// MoE top-2: GQA, qk_layernorm, shared expert with gate, aux and z losses, untied output.
std::string MoeTop2(int world, int ep, int tp = 1, int cp = 1, int etp = 1) {
  std::string s =
      "model:\n"
      "  num_layers: 2\n"
      "  hidden_size: 64\n"
      "  num_attention_heads: 4\n"
      "  num_query_groups: 2\n"
      "  ffn_hidden_size: 128\n"
      "  seq_length: 128\n"
      "  vocab_size: 256\n"
      "  qk_layernorm: true\n"
      "  untie_embeddings_and_output_weights: true\n"
      "  num_experts: 8\n"
      "  moe_router_topk: 2\n"
      "  moe_ffn_hidden_size: 64\n"
      "  moe_shared_expert_intermediate_size: 32\n"
      "  moe_shared_expert_gate: true\n"
      "  moe_router_load_balancing_type: aux_loss\n"
      "  moe_aux_loss_coeff: 0.01\n"
      "  moe_z_loss_coeff: 0.001\n"
      "training:\n"
      "  micro_batch_size: 2\n"
      "  global_batch_size: 8\n"
      "  train_iters: 2\n"
      "data:\n"
      "  mock_data: true\n";
  if (world > 1) {
    absl::StrAppend(&s, "parallel:\n  world_size: ", world, "\n  expert_model_parallel_size: ", ep,
                    "\n");
  }
  if (tp > 1) {
    absl::StrAppend(&s, "  tensor_model_parallel_size: ", tp, "\n  sequence_parallel: true\n");
  }
  if (cp > 1) absl::StrAppend(&s, "  context_parallel_size: ", cp, "\n");
  if (tp > 1 || etp > 1) absl::StrAppend(&s, "  expert_tensor_parallel_size: ", etp, "\n");
  return s;
}

// MoE top-4 on layers 0 and 2, a dense layer between; input jitter, seq_aux_loss, 4 sequences
// per micro-batch.
const char kMoeTop4Mixed[] =
    "model:\n"
    "  num_layers: 3\n"
    "  hidden_size: 48\n"
    "  num_attention_heads: 4\n"
    "  ffn_hidden_size: 96\n"
    "  seq_length: 64\n"
    "  vocab_size: 300\n"
    "  num_experts: 16\n"
    "  moe_router_topk: 4\n"
    "  moe_ffn_hidden_size: 32\n"
    "  moe_layer_pattern: [1, 0, 1]\n"
    "  moe_input_jitter_eps: 0.01\n"
    "  moe_router_load_balancing_type: seq_aux_loss\n"
    "  moe_aux_loss_coeff: 0.01\n"
    "training:\n"
    "  micro_batch_size: 4\n"
    "  global_batch_size: 8\n"
    "  train_iters: 2\n"
    "data:\n"
    "  mock_data: true\n";

// `yaml` with model.recompute_granularity "selective" and `modules` (a YAML list) added.
std::string WithRecompute(std::string yaml, const std::string& modules) {
  const std::string at = "model:\n";
  yaml.replace(yaml.find(at), at.size(),
               at + "  recompute_granularity: selective\n  recompute_modules: " + modules + "\n");
  return yaml;
}

// Creates the trainer, runs 2 steps; the Buffer counters before, after and at the peak.
absl::StatusOr<Measured> TrainAndMeasure(const v1::JobSpec& spec, train::TrainerOptions opt) {
  const int64_t before = kernels::BufferMemory(DeviceType::kCpu).current_bytes;
  kernels::ResetBufferPeak(DeviceType::kCpu);
  Measured m;
  {
    SY_ASSIGN_OR_RETURN(std::unique_ptr<train::Trainer> t, train::Trainer::Create(spec, opt));
    for (int i = 0; i < 2; ++i) SY_RETURN_IF_ERROR(t->Step().status());
    m.steady = static_cast<double>(kernels::BufferMemory(DeviceType::kCpu).current_bytes - before);
  }
  m.peak = static_cast<double>(kernels::BufferMemory(DeviceType::kCpu).peak_bytes - before);
  return m;
}

// The planner's estimate of the CPU f32 engine for `spec` (the model shape the planner plans
// with: its pipeline layout and virtual stages included).
EngineMemory Estimate(const v1::JobSpec& raw, v1::MemoryEstimate* proto) {
  v1::JobSpec spec = raw;
  ApplyDefaults(&spec);
  absl::StatusOr<ModelShape> shape = planner::PlannedModelShape(spec);
  EXPECT_TRUE(shape.ok()) << shape.status();
  absl::StatusOr<v1::Mapping> mapping = planner::MappingOfSpec(spec);
  EXPECT_TRUE(mapping.ok()) << mapping.status();
  EngineMemory detail;
  if (!shape.ok() || !mapping.ok()) return detail;
  EngineMemoryOptions cpu;
  cpu.cuda = false;
  cpu.param_bytes = 4;
  *proto = planner::EstimateMemory(*shape, *mapping, nullptr, cpu, &detail);
  return detail;
}

void Report(const std::string& name, const EngineMemory& e, const v1::MemoryEstimate& proto,
            const Measured& m, double tolerance = kTolerance) {
  const double ratio = proto.total() / m.steady;
  std::printf(
      "%-34s estimate %10.0f B (weights %.0f, grads %.0f, optimizer %.0f, layer activations "
      "%.0f, MoE %.0f, head %.0f, runtime %.0f) | measured steady %10.0f B -> est/measured "
      "%.4f (tolerance %.2f); peak %10.0f B vs buffers + create transient %10.0f B\n",
      name.c_str(), proto.total(), e.weights, e.gradients, e.optimizer_states, e.layer_activations,
      e.moe_buffers, e.head_buffers, e.runtime, m.steady, ratio, tolerance, m.peak,
      e.buffers() + e.create_transient);
  EXPECT_NEAR(proto.total(), e.total(), 1e-6 * e.total()) << name;
  EXPECT_LE(std::abs(ratio - 1), tolerance) << name;
  EXPECT_LE(std::abs((e.buffers() + e.create_transient) / m.peak - 1), tolerance) << name;
}

void CheckSingleProcess(const std::string& name, const std::string& yaml) {
  const v1::JobSpec spec = Spec(yaml);
  absl::StatusOr<Measured> m = TrainAndMeasure(spec, CpuF32());
  ASSERT_TRUE(m.ok()) << m.status();
  v1::MemoryEstimate proto;
  const EngineMemory e = Estimate(spec, &proto);
  Report(name, e, proto, *m);
}

TEST(MemoryEstimateTest, DenseModel) { CheckSingleProcess("dense L2 H64 mbs2 S128", kDense); }

TEST(MemoryEstimateTest, MoeTop2SharedExpert) {
  CheckSingleProcess("MoE E8 top-2 + shared, L2 H64", MoeTop2(1, 1));
}

TEST(MemoryEstimateTest, MoeTop4MixedLayersJitterSeqAux) {
  CheckSingleProcess("MoE E16 top-4 mixed, L3 H48 mbs4", kMoeTop4Mixed);
}

// The estimate follows the model: doubling the micro-batch moves both the measurement and the
// estimate, and they stay within the tolerance (a formula that ignores tokens would not).
TEST(MemoryEstimateTest, MoeTop2LargerMicroBatch) {
  std::string yaml = MoeTop2(1, 1);
  const std::string from = "  micro_batch_size: 2\n";
  yaml.replace(yaml.find(from), from.size(), "  micro_batch_size: 8\n");
  CheckSingleProcess("MoE E8 top-2 + shared, mbs 8", yaml);
}

// Token dropping with pad-to-capacity: the expert rows are E * C (C = ceil(T*k/E * 1.5)), not
// T * k.
TEST(MemoryEstimateTest, MoeTop2PadToCapacity) {
  std::string yaml = MoeTop2(1, 1);
  const std::string at = "  moe_z_loss_coeff: 0.001\n";
  yaml.replace(
      yaml.find(at), at.size(),
      at + "  moe_expert_capacity_factor: 1.5\n  moe_pad_expert_input_to_capacity: true\n");
  CheckSingleProcess("MoE E8 top-2, capacity 1.5, padded", yaml);
}

// Selective recompute (model.recompute_modules): with the modules on, the estimate stays within
// the tolerance of the engine, and the SAVING, the steady bytes without recompute less those with
// it, is the estimate's saving to the byte (the dropped per-layer buffers less the one shared
// scratch, EstimateEngineMemory).
void CheckRecomputeSaving(const std::string& name, const std::string& yaml,
                          const std::string& modules) {
  const v1::JobSpec off = Spec(yaml), on = Spec(WithRecompute(yaml, modules));
  absl::StatusOr<Measured> m_off = TrainAndMeasure(off, CpuF32());
  ASSERT_TRUE(m_off.ok()) << m_off.status();
  absl::StatusOr<Measured> m_on = TrainAndMeasure(on, CpuF32());
  ASSERT_TRUE(m_on.ok()) << m_on.status();
  v1::MemoryEstimate p_off, p_on;
  const EngineMemory e_off = Estimate(off, &p_off), e_on = Estimate(on, &p_on);
  Report(absl::StrCat(name, " recompute ", modules), e_on, p_on, *m_on);
  const double saved = m_off->steady - m_on->steady, estimated = e_off.total() - e_on.total();
  std::printf("%-34s recompute %s: saves %.0f B measured, %.0f B estimated\n", name.c_str(),
              modules.c_str(), saved, estimated);
  EXPECT_GT(saved, 0) << modules;
  EXPECT_NEAR(saved, estimated, 0.5) << name << " recompute " << modules;
}

TEST(MemoryEstimateTest, RecomputeMoeActSharedExpert) {
  CheckRecomputeSaving("MoE E8 top-2 + shared, L2 H64", MoeTop2(1, 1), "[moe_act]");
}

TEST(MemoryEstimateTest, RecomputeLayernorm) {
  CheckRecomputeSaving("MoE E8 top-2 + shared, L2 H64", MoeTop2(1, 1), "[layernorm]");
}

// Two dense layers (the MLP scratch replaces two layers' h and a), with input jitter and
// seq_aux_loss; then every honoured module together.
TEST(MemoryEstimateTest, RecomputeMlpAndAllModules) {
  std::string yaml = kMoeTop4Mixed;
  for (auto [from, to] :
       {std::pair<std::string, std::string>{"  num_layers: 3\n", "  num_layers: 4\n"},
        {"  moe_layer_pattern: [1, 0, 1]\n", "  moe_layer_pattern: [1, 0, 1, 0]\n"}}) {
    yaml.replace(yaml.find(from), from.size(), to);
  }
  CheckRecomputeSaving("MoE E16 top-4, 2 dense, L4 H48 mbs4", yaml, "[mlp]");
  CheckRecomputeSaving("MoE E16 top-4, 2 dense, L4 H48 mbs4", yaml,
                       "[core_attn, moe_act, layernorm, mlp]");
}

// The MoE layers' backward-only buffers (MoEGradScratch, worker/model/moe_layer.h) are held once
// per stage, whatever the number of MoE layers: two more MoE layers add exactly the per-layer
// terms, in the engine and in the estimate (to the byte; one that still counted da, dh and the
// dispatcher's gradients per layer would estimate 2 sets more), and both totals are the
// engine's to the byte.
TEST(MemoryEstimateTest, MoeBackwardScratchHeldOncePerStage) {
  std::string four = MoeTop2(1, 1);
  const std::string from = "  num_layers: 2\n";
  four.replace(four.find(from), from.size(), "  num_layers: 4\n");
  const v1::JobSpec two_layers = Spec(MoeTop2(1, 1)), four_layers = Spec(four);
  absl::StatusOr<Measured> m2 = TrainAndMeasure(two_layers, CpuF32());
  ASSERT_TRUE(m2.ok()) << m2.status();
  absl::StatusOr<Measured> m4 = TrainAndMeasure(four_layers, CpuF32());
  ASSERT_TRUE(m4.ok()) << m4.status();
  v1::MemoryEstimate p2, p4;
  const EngineMemory e2 = Estimate(two_layers, &p2), e4 = Estimate(four_layers, &p4);
  Report("MoE E8 top-2 + shared, L2 H64", e2, p2, *m2);
  Report("MoE E8 top-2 + shared, L4 H64", e4, p4, *m4);
  const double measured = m4->steady - m2->steady, estimated = e4.total() - e2.total();
  std::printf("2 more MoE layers: %.0f B measured, %.0f B estimated\n", measured, estimated);
  EXPECT_NEAR(measured, estimated, 0.5);
  EXPECT_NEAR(m2->steady, e2.total(), 0.5);
  EXPECT_NEAR(m4->steady, e4.total(), 0.5);
}

// The benchmark model (bench/bench_model.h, one GPU: bf16 CUDA engine) as the planner estimates
// it, with each module on: the saving in bytes, printed (the "larger micro-batches fit").
// It has no dense layer, so "mlp" is not a module it can take.
TEST(MemoryEstimateTest, RecomputeSavingOfTheBenchmarkModel) {
  absl::StatusOr<bench::BenchModel> b = bench::BenchModelByName("benchmark");
  ASSERT_TRUE(b.ok()) << b.status();
  auto estimate = [&](const std::vector<std::string>& modules) {
    v1::JobSpec spec = bench::MakeBenchSpec("benchmark", *b, 10);
    if (!modules.empty()) spec.mutable_model()->set_recompute_granularity("selective");
    for (const std::string& module : modules) spec.mutable_model()->add_recompute_modules(module);
    ApplyDefaults(&spec);
    absl::StatusOr<ModelShape> shape = ModelShape::FromProto(spec.model());
    EXPECT_TRUE(shape.ok()) << shape.status();
    absl::StatusOr<v1::Mapping> mapping = planner::MappingOfSpec(spec);
    EXPECT_TRUE(mapping.ok()) << mapping.status();
    if (!shape.ok() || !mapping.ok()) return EngineMemory{};
    return EstimateEngineMemory(*shape, *mapping, 0, EngineMemoryOptions{});
  };
  const EngineMemory off = estimate({});
  std::printf(
      "benchmark model, 1 GPU, mbs %d x S %d: %.3f GiB without recompute (activations %.3f GiB)\n",
      b->micro, b->seq, off.total() / (1 << 30), off.activations() / (1 << 30));
  for (const std::vector<std::string>& modules : std::vector<std::vector<std::string>>{
           {"core_attn"}, {"moe_act"}, {"layernorm"}, {"core_attn", "moe_act", "layernorm"}}) {
    const EngineMemory on = estimate(modules);
    const double saved = off.total() - on.total();
    std::printf("  recompute %-32s saves %12.0f B (%.3f GiB)\n",
                absl::StrJoin(modules, "+").c_str(), saved, saved / (1 << 30));
    if (modules.size() == 1 && modules[0] == "core_attn") {
      EXPECT_EQ(saved, 0);
    } else {
      EXPECT_GT(saved, 0);
    }
  }
}

// `world` forked ranks over Gloo: each rank writes its counters to a file; every rank's are
// compared with the estimate.
// The folds of issue 13 (TP, CP, ETP) are held to 5 % (kFoldTolerance), the other cases to
// kTolerance.
constexpr double kFoldTolerance = 0.05;

struct Fold {
  int tp = 1, cp = 1, etp = 1;
  int pp = 1;         // pipeline stages (the outermost axis: rank r is stage r / (world / pp))
  bool tied = false;  // a tied embedding / LM head (the last stage holds a copy)
  // model.recompute_modules under selective granularity, as YAML ("[moe_act, layernorm]");
  // empty: no recompute.
  std::string recompute;
  // Interleaved 1F1B (parallel.virtual_pipeline_model_parallel_size; 1: plain 1F1B), the model's
  // layers (0: MoeTop2's 2), parallel.decoder_first_pipeline_num_layers (0: unset) and
  // training.global_batch_size (0: MoeTop2's 8).
  int vpp = 1, layers = 0, first = 0, global_batch = 0;
};

// The estimate of pipeline stage `stage` alone (EstimateMemory reports the largest stage).
EngineMemory EstimateStage(const v1::JobSpec& raw, int64_t stage, v1::MemoryEstimate* proto) {
  v1::JobSpec spec = raw;
  ApplyDefaults(&spec);
  absl::StatusOr<ModelShape> shape = planner::PlannedModelShape(spec);
  EXPECT_TRUE(shape.ok()) << shape.status();
  absl::StatusOr<v1::Mapping> mapping = planner::MappingOfSpec(spec);
  EXPECT_TRUE(mapping.ok()) << mapping.status();
  if (!shape.ok() || !mapping.ok()) return EngineMemory{};
  EngineMemoryOptions cpu;
  cpu.cuda = false;
  cpu.param_bytes = 4;
  const EngineMemory e = EstimateEngineMemory(*shape, *mapping, stage, cpu);
  proto->set_total(e.total());
  return e;
}

// The MoeTop2 spec of `world` ranks with EP `ep`, TP `tp`, the dispatcher (empty: the default)
// and the fold's other sizes and options.
std::string FoldYaml(int world, int ep, int tp, const std::string& dispatcher, const Fold& fold) {
  std::string yaml = MoeTop2(world, ep, tp, fold.cp, fold.etp);
  if (!fold.recompute.empty()) yaml = WithRecompute(yaml, fold.recompute);
  if (!dispatcher.empty()) {
    const std::string at = "  moe_z_loss_coeff: 0.001\n";
    yaml.replace(yaml.find(at), at.size(),
                 at + "  moe_token_dispatcher_type: " + dispatcher + "\n");
  }
  if (fold.pp > 1) absl::StrAppend(&yaml, "  pipeline_model_parallel_size: ", fold.pp, "\n");
  if (fold.vpp > 1) {
    absl::StrAppend(&yaml, "  virtual_pipeline_model_parallel_size: ", fold.vpp, "\n");
  }
  if (fold.first > 0) {
    absl::StrAppend(&yaml, "  decoder_first_pipeline_num_layers: ", fold.first, "\n");
  }
  for (auto [key, value] : {std::pair<std::string, int>{"  num_layers: ", fold.layers},
                            {"  global_batch_size: ", fold.global_batch}}) {
    if (value == 0) continue;
    const size_t at = yaml.find(key);
    yaml.replace(at, yaml.find('\n', at) - at, absl::StrCat(key, value));
  }
  if (fold.tied) {
    const std::string untied = "  untie_embeddings_and_output_weights: true\n";
    yaml.replace(yaml.find(untied), untied.size(), "");
  }
  return yaml;
}

// `measured` (optional): every rank's counters.
void CheckRanks(const std::string& name, int world, int ep, int tp,
                const std::string& dispatcher = "", Fold fold = {}, double tolerance = kTolerance,
                std::vector<Measured>* measured = nullptr) {
  fold.tp = tp;
  const v1::JobSpec spec = Spec(FoldYaml(world, ep, tp, dispatcher, fold));
  const std::string store = ct::UniqueStoreDir("memest_store");
  const std::string out = ct::UniqueStoreDir("memest_out");
  const std::vector<int> codes = ct::RunProcesses(world, absl::Minutes(5), [&](int rank) {
    // The process groups exist before the measurement starts, as in the benchmark.
    auto groups = train::test_groups::JoinGlooGroups(
        store, rank, train::test_groups::LayoutDims(world, tp, ep, fold.cp, fold.etp, fold.pp));
    SY_CHILD_OK(groups.status());
    train::TrainerOptions opt = CpuF32();
    opt.groups = groups->get();
    absl::StatusOr<Measured> m = TrainAndMeasure(spec, opt);
    SY_CHILD_OK(m.status());
    // The communicators of more than one rank this rank holds, for EngineCommunicators.
    int communicators = 0;
    for (const auto& c : (*groups)->owned) communicators += c->size() > 1 ? 1 : 0;
    std::ofstream f(absl::StrCat(out, "_rank", rank, ".txt"));
    // Whole bytes (the default 6 significant digits would round the counters to 100 B).
    f << static_cast<int64_t>(m->steady) << " " << static_cast<int64_t>(m->peak) << " "
      << communicators << "\n";
    return f.good() ? 0 : 1;
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(codes[r], 0) << "rank " << r;
  v1::MemoryEstimate proto;
  EngineMemory e = Estimate(spec, &proto);
  // The GPU runtime term counts the communicators worker/train/process_groups.cc makes
  // (EngineCommunicators); the Gloo groups are the same but for NCCL's grad_world.
  v1::JobSpec defaulted = spec;
  ApplyDefaults(&defaulted);
  absl::StatusOr<ModelShape> shape = planner::PlannedModelShape(defaulted);
  ASSERT_TRUE(shape.ok()) << shape.status();
  absl::StatusOr<v1::Mapping> mapping = planner::MappingOfSpec(defaulted);
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  const EngineCommunicatorSet expected = EngineCommunicators(*shape, *mapping);
  for (int r = 0; r < world; ++r) {
    std::ifstream f(absl::StrCat(out, "_rank", r, ".txt"));
    Measured m;
    int communicators = -1;
    f >> m.steady >> m.peak >> communicators;
    ASSERT_TRUE(f) << "rank " << r << " wrote no counters";
    std::printf(
        "%s, rank %d: %d Gloo communicators of > 1 rank; EngineCommunicators %lld "
        "(grad_world included), %lld point-to-point peers\n",
        name.c_str(), r, communicators, static_cast<long long>(expected.communicators),
        static_cast<long long>(expected.p2p_peers));
    EXPECT_EQ(communicators, expected.communicators - 1) << name << " rank " << r;
    // Pipeline: each rank against its own stage's estimate.
    if (fold.pp > 1) e = EstimateStage(spec, r / (world / fold.pp), &proto);
    Report(absl::StrCat(name, ", rank ", r), e, proto, m, tolerance);
    if (measured != nullptr) measured->push_back(m);
  }
}

// 2 forked ranks over Gloo, EP = 2 (DP 2, EDP 1).
TEST(MemoryEstimateTest, MoeTop2ExpertParallelTwoRanks) {
  CheckRanks("MoE top-2 EP=2 over Gloo", 2, 2, 1);
}

// The same with the alltoall dispatcher, the one the estimate's EP > 1 terms describe (the
// default allgather dispatcher above is not modelled separately): its receive side is sized by
// the counts (issue 15), estimated at its initial size, the balanced receipt plus a quarter.
TEST(MemoryEstimateTest, MoeTop2ExpertParallelAllToAllTwoRanks) {
  CheckRanks("MoE top-2 EP=2 alltoall over Gloo", 2, 2, 1, "alltoall");
}

// Issue 13's folds, each within 5 % on every rank. The estimate follows the engine's layout:
// the vocabulary-parallel embedding and LM head (V/TP rows, the fused cross-entropy over the
// whole micro-batch), the shared expert split over TP, the SP scratch, the CP K/V gather
// buffers, and the EP/ETP dispatcher at ETP > 1 (EstimateEngineMemory).
// 2 forked ranks over Gloo, TP = 2 with sequence parallelism (DP 1, EDP 2): the TP-split
// attention, dense and shared-expert weights, the vocabulary-parallel embedding / LM head, the
// sequence-sharded activations and the SP scratch.
TEST(MemoryEstimateTest, MoeTop2TensorParallelTwoRanks) {
  CheckRanks("MoE top-2 TP=2 over Gloo", 2, 1, 2, "", Fold{}, kFoldTolerance);
}

TEST(MemoryEstimateTest, FoldContextParallelTwo) {
  CheckRanks("MoE top-2 CP=2 over Gloo", 2, 1, 1, "", Fold{1, 2, 1}, kFoldTolerance);
}

TEST(MemoryEstimateTest, FoldTensorTwoContextTwo) {
  CheckRanks("MoE top-2 TP=2 CP=2 over Gloo", 4, 1, 2, "", Fold{2, 2, 1}, kFoldTolerance);
}

TEST(MemoryEstimateTest, FoldExpertTensorTwoExpertTwo) {
  CheckRanks("MoE top-2 ETP=2 EP=2 over Gloo", 4, 2, 1, "", Fold{1, 1, 2}, kFoldTolerance);
}

// Pipeline stages: each rank's steady bytes must be its stage's estimate to the byte (besides the
// 5 % of CheckRanks): the stage's layers, one slot of activations and MoE layers per micro-batch
// alive at once (PipelineAliveMicroBatches, the count the trainer sizes its slots by: 1F1B
// min(PP − s, m); interleaved more, on the last stage too), each chunk's residual stream, the
// embedding on the first stage and the LM head on the last, the receive buffers and the
// message-buffer pool (PipelinePoolBuffers: the interleaved step's receives, and evaluation's,
// 1 on every later stage even at VPP 1; the trainer allocates the pool at Init). One slot of
// these models is hundreds of KB and one message buffer 32 KB.
void CheckPipelineStages(const std::string& name, int world, int ep, const Fold& fold) {
  std::vector<Measured> measured;
  CheckRanks(name, world, ep, 1, "", fold, kFoldTolerance, &measured);
  ASSERT_EQ(measured.size(), static_cast<size_t>(world));
  const v1::JobSpec spec = Spec(FoldYaml(world, ep, 1, "", fold));
  v1::JobSpec defaulted = spec;
  ApplyDefaults(&defaulted);
  absl::StatusOr<v1::Mapping> mapping = planner::MappingOfSpec(defaulted);
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  const int64_t m = mapping->num_micro_batches();
  for (int r = 0; r < world; ++r) {
    const int64_t stage = r / (world / fold.pp);
    v1::MemoryEstimate proto;
    const double estimate = EstimateStage(spec, stage, &proto).total();
    const int64_t slots = *PipelineAliveMicroBatches(fold.pp, stage, fold.vpp, m);
    const int64_t messages = *PipelinePoolBuffers(fold.pp, stage, fold.vpp, m);
    std::printf(
        "%s, rank %d (stage %lld): %lld micro-batches alive (1F1B's rule: %lld), %lld message "
        "buffers; measured %.0f B, estimated %.0f B (%+.0f B)\n",
        name.c_str(), r, static_cast<long long>(stage), static_cast<long long>(slots),
        static_cast<long long>(std::min<int64_t>(fold.pp - stage, m)),
        static_cast<long long>(messages), measured[r].steady, estimate,
        estimate - measured[r].steady);
    EXPECT_NEAR(measured[r].steady, estimate, 0.5) << name << " rank " << r;
  }
}

// Pipeline stages (1F1B): stage 0 keeps 2 micro-batches alive, stage 1 one; tied: the last
// stage's embedding copy and both ends' peer-gradient buffer.
TEST(MemoryEstimateTest, FoldPipelineTwo) {
  CheckPipelineStages("MoE top-2 PP=2 over Gloo", 2, 1, Fold{1, 1, 1, 2});
}

TEST(MemoryEstimateTest, FoldPipelineTwoTiedExpertTwo) {
  CheckPipelineStages("MoE top-2 PP=2 EP=2 tied over Gloo", 4, 2, Fold{1, 1, 1, 2, true});
}

// PP2 with every honoured module: the first stage keeps 2 micro-batches in flight, so the shared
// scratch replaces 2 slots' buffers per layer; each rank's saving is its stage estimate's to the
// byte. (It used to be held to 64 B: the ranks wrote their counters with 6 significant digits,
// which rounded them to 10 B and looked like run-to-run noise; they write whole bytes now.)
TEST(MemoryEstimateTest, FoldPipelineTwoRecompute) {
  Fold plain{1, 1, 1, 2}, recompute = plain;
  recompute.recompute = "[core_attn, moe_act, layernorm]";
  std::vector<Measured> off, on;
  CheckRanks("MoE top-2 PP=2 over Gloo", 2, 1, 1, "", plain, kFoldTolerance, &off);
  CheckRanks("MoE top-2 PP=2 recompute over Gloo", 2, 1, 1, "", recompute, kFoldTolerance, &on);
  ASSERT_EQ(off.size(), 2u);
  ASSERT_EQ(on.size(), 2u);
  const v1::JobSpec spec_off = Spec(MoeTop2(2, 1) + "  pipeline_model_parallel_size: 2\n");
  const v1::JobSpec spec_on = Spec(WithRecompute(MoeTop2(2, 1), recompute.recompute) +
                                   "  pipeline_model_parallel_size: 2\n");
  for (int r = 0; r < 2; ++r) {
    v1::MemoryEstimate p;
    const double estimated =
        EstimateStage(spec_off, r, &p).total() - EstimateStage(spec_on, r, &p).total();
    const double saved = off[r].steady - on[r].steady;
    std::printf("PP=2 stage %d recompute %s: saves %.0f B measured, %.0f B estimated\n", r,
                recompute.recompute.c_str(), saved, estimated);
    EXPECT_GT(saved, 0) << "stage " << r;
    EXPECT_NEAR(saved, estimated, 0.5) << "stage " << r;
  }
}

// Interleaved 1F1B (issue 14): the estimate with the interleaved counts, to the byte on every
// stage; the 1F1B count min(PP − s, m) the estimate used before would leave out one or more
// slots on every stage (printed as "1F1B's rule").
// PP2·VPP2, 4 MoE layers (stage 0 holds layers 0 and 2, stage 1 layers 1 and 3 with the LM
// head), m = 4: stage 0 keeps 4 micro-batches alive (1F1B: 2), stage 1 keeps 3 (1F1B: 1); stage 1
// holds 4 message buffers, stage 0 one.
TEST(MemoryEstimateTest, FoldPipelineTwoInterleaved) {
  Fold fold{1, 1, 1, 2};
  fold.vpp = 2;
  fold.layers = 4;
  CheckPipelineStages("MoE top-2 PP=2 VPP=2 over Gloo", 2, 1, fold);
}

// PP4·VPP2, 8 MoE layers (one per chunk), global batch 16: m = 8, alive 8, 8, 7, 5 (1F1B: 4, 3,
// 2, 1); message buffers 2, 2, 2, 5.
TEST(MemoryEstimateTest, FoldPipelineFourInterleaved) {
  Fold fold{1, 1, 1, 4};
  fold.vpp = 2;
  fold.layers = 8;
  fold.global_batch = 16;
  CheckPipelineStages("MoE top-2 PP=4 VPP=2 over Gloo", 4, 1, fold);
}

// An uneven layout with virtual stages and a tied embedding: 6 layers,
// decoder_first_pipeline_num_layers 4: stage 0 holds two chunks of 2 layers (0-1, 3-4), stage 1
// two of one (2, 5) with the LM head and the embedding's copy.
TEST(MemoryEstimateTest, FoldPipelineTwoInterleavedUnevenTied) {
  Fold fold{1, 1, 1, 2, true};
  fold.vpp = 2;
  fold.layers = 6;
  fold.first = 4;
  CheckPipelineStages("MoE top-2 PP=2 VPP=2 first 4 tied over Gloo", 2, 1, fold);
}

TEST(MemoryEstimateTest, FoldExpertTensorTwoExpertTwoAllToAll) {
  CheckRanks("MoE top-2 ETP=2 EP=2 alltoall over Gloo", 4, 2, 1, "alltoall", Fold{1, 1, 2},
             kFoldTolerance);
}

}  // namespace
}  // namespace switchyard
