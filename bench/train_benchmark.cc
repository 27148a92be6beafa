// End-to-end training benchmark on one GPU: worker/train's Trainer runs optimizer steps of the
// BENCHMARK MODEL on mock data (forward + backward of every micro-batch, gradient clipping,
// AdamW with fp32 master weights), and the benchmark reports the median step time, tokens/s,
// model TFLOP/s (model::GptTrainingFlopsPerToken: Megatron-style, causal attention counted half,
// fwd + bwd = 3 × fwd) and MFU against --peak_tflops (989.4: H100/H200 dense bf16, BASELINES.md).
// With --torch_json (bench/torch_train_baseline.py --json, the same model and step in plain
// PyTorch, run in the same command) it also prints PyTorch's numbers and the speedup.
//
// BENCHMARK MODEL (--model benchmark; bench/README.md; torch_train_baseline.py mirrors it):
//   Qwen3-MoE-like fine-grained MoE, ~1.5 B total / ~0.35 B active parameters
//   num_layers 12 (all MoE), hidden 1536, 12 attention heads × kv_channels 128,
//   num_query_groups 4 (GQA), qk_layernorm, RMSNorm eps 1e-6, RoPE base 1e6 (rotate_half),
//   vocab 32768, untied embeddings / output, SwiGLU experts: 64 experts top-8
//   (softmax, renormalised top-k), moe_ffn_hidden_size 384, no shared expert,
//   moe_router_load_balancing_type aux_loss with coefficient 1e-3, seq_length 4096,
//   micro_batch 2, global_batch 16 (8 micro-batches, 65536 tokens per step), mock data, bf16
//   parameters/activations with fp32 gradients and fp32 master weights, AdamW lr 1e-4
//   (constant: warm-up 0), weight decay 0.01, clip_grad 1.0, init std 0.02.
// --model small: the same architecture at ~100 M parameters for a quick run: 4 layers,
//   hidden 768, 6 heads × 128, 2 query groups, 32 experts top-4, moe_ffn_hidden_size 192,
//   seq_length 1024, micro_batch 2, global_batch 8.
//
//   train_benchmark [--model benchmark|small] [--steps 5] [--warmup 2] [--micro_batch N]
//                   [--global_batch N] [--seq_length N] [--layers N] [--torch_json PATH]
//                   [--peak_tflops 989.4] [--world 1] [--ep 1] [--cp 1] [--dry_run]
//                   [--breakdown] [--delay_wgrad_compute] [--moe_permute_fusion]
//                   [--checkpoint_dir DIR]
//                   [--plan_batch [--device_gib 80 (--dry_run only)] [--plan_headroom 0.1]]
//
// Prints Describe(), one log line per step (warm-up steps marked), a final table and one line
// "RESULT_JSON {...}" for scripts. Without a CUDA device it prints a message and exits 0.
// Memory: the measured footprint (cudaMemGetInfo used after the steps minus before
// Trainer::Create; per rank, the largest) next to the planner's per-rank estimate for the same
// model, mapping, micro-batch and world (coordinator/planner/cost_model.h EstimateMemory; CUDA
// bf16 engine): table columns "est GiB" and "est/meas", RESULT_JSON "mem_est_gib" and
// "mem_ratio" (estimate / measured), and a line with the estimate's components. --dry_run
// prints the estimate too.
//
// PLANNED BATCH (--plan_batch, one GPU; issue 16): the micro-batch is the planner's choice, not
// the model's: coordinator/planner/batch_plan.h PlanMicroBatch keeps the global batch (the
// model's 16, or --global_batch) and picks, among its divisors and the selective-recompute
// variants none / moe_act / moe_act + layernorm, the most estimated tokens/s (cost_model.h step
// time) whose memory estimate fits (1 - --plan_headroom) of the device's memory (cudaMemGetInfo
// total on a GPU; --device_gib for --dry_run). Prints the candidates (micro, recompute, est. GiB,
// est. step ms, est. tokens/s, fits) and the choice, then runs the choice; RESULT_JSON (PLAN_JSON
// under --dry_run) gets "plan_batch". Not with --micro_batch (the plan chooses it) or --world > 1.
//
// MULTI-GPU (--world N --ep E, N > 1; one host, one GPU per rank): the parent forks N rank
// processes (it never initialises CUDA itself; the GPU count comes from a probe child); rank r
// drives CUDA device r with a non-blocking stream that its NCCL process groups
// (train::CreateNcclProcessGroups, rendezvous through a FileKvStore in a fresh /tmp directory)
// and its Trainer (TrainerOptions.cuda_stream) share. Layout DP = N (TP = PP = 1; CP = 1 unless
// --cp, below), EP = E, EDP = N / E (worker/train/trainer.h, "Distributed"). The global batch is
// the model's (or
// --global_batch) times N, so every GPU runs the single-GPU benchmark's micro-batches and tokens
// per step. Each rank runs the same warm-up and timed steps and writes its per-step times (the
// trainer's step_ms: CUDA events over the step, which ends with a host sync) to a file; the
// parent reports, per timed step, the slowest rank's time, and over steps the median: step ms,
// total tokens/s, per-GPU TFLOP/s (FLOPs of all tokens / step time / N), MFU per GPU, the
// largest per-rank memory footprint; table + "RESULT_JSON {...}". Rank 0 prints the per-step log
// lines.
// CONTEXT PARALLEL (--cp C, C > 1; a multi-GPU run even at --world C): layout CP = C, DP = N / C
// (EP = E over DP x CP); every sequence of --seq_length tokens is split over the C ranks of its
// DP rank (worker/model/gpt_model.h, "Context parallelism"), and the global batch is the model's
// (or --global_batch) times DP, so a GPU holds seq_length / C tokens of each of its sequences.
// For the long-sequence check (bench/README.md, to be measured): --world 4 --cp 4
// --seq_length 32768 --micro_batch 1 --global_batch 1 against the same at --world 1 --cp 1.
// --torch_json and --breakdown are single-GPU only. --dry_run --world N --ep E validates the
// arguments, the distributed JobSpec and the parallel layout and prints the plan, without a GPU.
#include <cuda_runtime.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_model.h"
#include "bench/bench_util.h"
#include "common/command_line.h"
#include "common/config/config_defaults.h"
#include "common/config/validate.h"
#include "common/model/model_math.h"
#include "common/model/parallel_state.h"
#include "common/status.h"
#include "common/tensor.h"
#include "coordinator/planner/batch_plan.h"
#include "coordinator/planner/cost_model.h"
#include "kernels/runtime/buffer.h"
#include "kernels/runtime/cuda_status.h"
#include "switchyard/v1/config.pb.h"
#include "worker/comm/kv_store.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/model/gpt_model.h"
#include "worker/model/profiling.h"
#include "worker/train/process_groups.h"
#include "worker/train/trainer.h"

ABSL_FLAG(std::string, model, "benchmark", "benchmark (~1.5B Qwen3-MoE-like) or small (~100M)");
ABSL_FLAG(int, steps, 5, "timed optimizer steps (median reported)");
ABSL_FLAG(int, warmup, 2, "untimed warm-up optimizer steps");
ABSL_FLAG(int, micro_batch, 0, "micro-batch size override (0: the model's)");
ABSL_FLAG(int, global_batch, 0, "global batch size override (0: the model's)");
ABSL_FLAG(int, seq_length, 0, "sequence length override (0: the model's)");
ABSL_FLAG(int, layers, 0, "number of layers override (0: the model's)");
ABSL_FLAG(std::string, torch_json, "", "results of torch_train_baseline.py --json, for the ratio");
ABSL_FLAG(bool, dry_run, false,
          "validate the model's JobSpec and print its parameter and FLOP counts; no GPU needed");
ABSL_FLAG(bool, delay_wgrad_compute, false,
          "model.delay_wgrad_compute: the experts' fc1 wgrad on a side stream, overlapping the "
          "dispatch-backward all-to-all");
ABSL_FLAG(bool, moe_permute_fusion, false,
          "model.moe_permute_fusion: the routed experts read the tokens and the output gradient "
          "through the permutation's row index (gathered grouped GEMMs) instead of permuted "
          "copies");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "--world N > 1: after the timed steps, time sharded checkpoints under this directory "
          "(an asynchronous save with one training step during its write, a save waited for at "
          "once, and a load of it); empty: none");
ABSL_FLAG(bool, breakdown, false,
          "after the timed steps, run one more step with per-phase CUDA-event timing and print "
          "where the step's time goes (the timing itself synchronises once per micro-batch)");
ABSL_FLAG(double, peak_tflops, 989.4, "peak bf16 TFLOP/s for MFU (BASELINES.md: 989.4)");
ABSL_FLAG(int, world, 1,
          "GPUs (ranks, one forked process per GPU of this host); > 1: data x expert parallel, "
          "global batch scaled by the world so tokens per GPU stay the single-GPU benchmark's");
ABSL_FLAG(int, ep, 1, "expert-parallel size (divides --world and the model's num_experts)");
ABSL_FLAG(int, cp, 1,
          "context-parallel size (divides --world; 2 * cp divides the sequence length): the "
          "cp ranks of a DP rank share its sequences, each holding 2 of their 2 * cp chunks");
ABSL_FLAG(int, tp, 1,
          "tensor-parallel size, with sequence parallelism (divides --world): the tp ranks of a "
          "DP rank share its sequences, each holding the 1/tp column/row shards of the dense "
          "layers, the attention heads and the vocabulary");
ABSL_FLAG(int, etp, 0, "expert-tensor-parallel size (0: Megatron's default, = --tp)");
ABSL_FLAG(int, rank_timeout_s, 1200, "--world > 1: ranks still running after this are killed");
ABSL_FLAG(bool, plan_batch, false,
          "one GPU: the micro-batch and the selective-recompute modules are the planner's choice "
          "(coordinator/planner/batch_plan.h) for the global batch; prints the candidates");
ABSL_FLAG(double, device_gib, 0,
          "--plan_batch --dry_run: the device memory the plan must fit, GiB (0: 80); a GPU run "
          "uses cudaMemGetInfo's total and rejects this flag");
ABSL_FLAG(double, plan_headroom, switchyard::planner::kDefaultBatchHeadroom,
          "--plan_batch: the fraction of the device memory the plan keeps free");

namespace switchyard::bench {
namespace {

absl::StatusOr<BenchModel> SelectModel(const std::string& name) {
  SY_ASSIGN_OR_RETURN(BenchModel m, BenchModelByName(name));
  if (absl::GetFlag(FLAGS_layers) > 0) m.layers = absl::GetFlag(FLAGS_layers);
  if (absl::GetFlag(FLAGS_seq_length) > 0) m.seq = absl::GetFlag(FLAGS_seq_length);
  if (absl::GetFlag(FLAGS_micro_batch) > 0) m.micro = absl::GetFlag(FLAGS_micro_batch);
  if (absl::GetFlag(FLAGS_global_batch) > 0) m.global = absl::GetFlag(FLAGS_global_batch);
  if (m.global % m.micro != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--global_batch (", m.global, ") must be a multiple of --micro_batch (", m.micro, ")"));
  }
  return m;
}

// `recompute`: model.recompute_modules under selective granularity (empty: none).
v1::JobSpec MakeSpec(const std::string& name, const BenchModel& b, int64_t iters,
                     const std::vector<std::string>& recompute = {}) {
  v1::JobSpec spec = MakeBenchSpec(name, b, iters);
  spec.mutable_model()->set_delay_wgrad_compute(absl::GetFlag(FLAGS_delay_wgrad_compute));
  spec.mutable_model()->set_moe_permute_fusion(absl::GetFlag(FLAGS_moe_permute_fusion));
  if (!recompute.empty()) spec.mutable_model()->set_recompute_granularity("selective");
  for (const std::string& module : recompute) spec.mutable_model()->add_recompute_modules(module);
  return spec;
}

// Device memory in use (total - free), in bytes.
absl::StatusOr<size_t> MemUsed() {
  size_t free_b = 0, total_b = 0;
  const cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
  if (e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaMemGetInfo: ", cudaGetErrorString(e)));
  }
  return total_b - free_b;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string Human(double n) {
  char buf[32];
  if (n >= 1e9) {
    std::snprintf(buf, sizeof(buf), "%.2f B", n / 1e9);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f M", n / 1e6);
  }
  return buf;
}

constexpr double kGiB = 1024.0 * 1024 * 1024;

// The planner's per-rank memory estimate of `spec` as this benchmark runs it (the largest
// pipeline stage; the CUDA bf16 engine with the default runtime term).
absl::StatusOr<EngineMemory> PlannerEstimate(v1::JobSpec spec) {
  ApplyDefaults(&spec);
  SY_ASSIGN_OR_RETURN(const ModelShape shape, ModelShape::FromProto(spec.model()));
  SY_ASSIGN_OR_RETURN(const v1::Mapping mapping, planner::MappingOfSpec(spec));
  EngineMemory e;
  planner::EstimateMemory(shape, mapping, nullptr, EngineMemoryOptions{}, &e);
  return e;
}

void PrintEstimate(const EngineMemory& e) {
  std::printf(
      "planner memory estimate per GPU: %.2f GiB = weights %.2f + gradients %.2f + optimizer "
      "%.2f + layer activations %.2f + MoE buffers %.2f + head %.2f + runtime %.2f GiB%s\n",
      e.total() / kGiB, e.weights / kGiB, e.gradients / kGiB, e.optimizer_states / kGiB,
      e.layer_activations / kGiB, e.moe_buffers / kGiB, e.head_buffers / kGiB, e.runtime / kGiB,
      e.create_transient > 0 ? absl::StrFormat(" (peak during Trainer::Create %.2f GiB)",
                                               (e.total() + e.create_transient) / kGiB)
                                   .c_str()
                             : "");
}

// --plan_batch: the planner's micro-batch and recompute modules for `b`'s global batch on one GPU
// of `device_bytes` (coordinator/planner/batch_plan.h), with the candidates printed as a table.
absl::StatusOr<planner::BatchPlan> PlanBatch(const std::string& name, const BenchModel& b,
                                             double device_bytes) {
  v1::PlanRequest req;
  *req.mutable_spec() = MakeSpec(name, b, 1);
  req.mutable_spec()->mutable_parallel()->set_world_size(1);
  v1::Cluster* c = req.mutable_cluster();
  c->set_num_gpus(1);
  c->set_gpus_per_node(1);
  c->set_gpu_memory_bytes(device_bytes);
  c->set_peak_flops(absl::GetFlag(FLAGS_peak_tflops) * 1e12);
  // One GPU runs no collective: the bandwidths are not used (the planner wants them positive).
  c->set_intra_node_bandwidth_bytes_per_second(1);
  c->set_inter_node_bandwidth_bytes_per_second(1);
  planner::BatchPlanOptions options;
  options.headroom = absl::GetFlag(FLAGS_plan_headroom);
  std::printf(
      "planner batch plan (coordinator/planner/batch_plan.h): model %s, global batch %d x seq %d "
      "on one GPU of %.2f GiB, fit within %.2f GiB (headroom %.2f), peak %.1f TFLOP/s\n",
      name.c_str(), b.global, b.seq, device_bytes / kGiB,
      (1 - options.headroom) * device_bytes / kGiB, options.headroom,
      absl::GetFlag(FLAGS_peak_tflops));
  SY_ASSIGN_OR_RETURN(planner::BatchPlan plan, planner::PlanMicroBatch(req, options));
  std::printf("  %5s  %-20s %9s %12s %13s  %s\n", "micro", "recompute", "est GiB", "est step ms",
              "est tokens/s", "fits");
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    const planner::BatchCandidate& k = plan.candidates[i];
    const std::string modules =
        k.recompute_modules.empty() ? "none" : absl::StrJoin(k.recompute_modules, "+");
    if (!k.rule_violations.empty()) {
      std::printf("  %5lld  %-20s rejected: %s\n", static_cast<long long>(k.micro_batch_size),
                  modules.c_str(), k.rule_violations.c_str());
      continue;
    }
    std::printf("  %5lld  %-20s %9.2f %12.1f %13.0f  %s%s\n",
                static_cast<long long>(k.micro_batch_size), modules.c_str(),
                k.memory.total() / kGiB, k.time.total() * 1e3, k.tokens_per_second,
                k.fits ? "yes" : "no", i == plan.best ? "  <- chosen" : "");
  }
  const planner::BatchCandidate& best = plan.candidates[plan.best];
  std::printf(
      "planner's choice: micro_batch %lld x %lld micro-batches, recompute %s (est. %.2f GiB, "
      "%.1f ms/step, %.0f tokens/s)\n",
      static_cast<long long>(best.micro_batch_size),
      static_cast<long long>(best.mapping.num_micro_batches()),
      best.recompute_modules.empty() ? "none" : absl::StrJoin(best.recompute_modules, "+").c_str(),
      best.memory.total() / kGiB, best.time.total() * 1e3, best.tokens_per_second);
  return plan;
}

// The plan's choice as RESULT_JSON / PLAN_JSON carry it ("plan_batch").
nlohmann::json PlanBatchJson(const planner::BatchPlan& plan, double device_bytes) {
  const planner::BatchCandidate& best = plan.candidates[plan.best];
  return {{"micro_batch", best.micro_batch_size},
          {"num_micro_batches", best.mapping.num_micro_batches()},
          {"recompute", best.recompute_modules},
          {"est_gib", best.memory.total() / kGiB},
          {"est_step_ms", best.time.total() * 1e3},
          {"est_tokens_per_s", best.tokens_per_second},
          {"device_gib", device_bytes / kGiB},
          {"memory_limit_gib", plan.memory_limit / kGiB},
          {"headroom", absl::GetFlag(FLAGS_plan_headroom)},
          {"candidates", plan.candidates.size()}};
}

// --dry_run: the spec the trainer would get, defaulted and validated, and its counts. With
// --plan_batch, the planner's batch for --device_gib first (and a PLAN_JSON line).
int DryRun(const std::string& name, BenchModel b) {
  std::vector<std::string> recompute;
  nlohmann::json plan_json = nullptr;
  if (absl::GetFlag(FLAGS_plan_batch)) {
    const double gib = absl::GetFlag(FLAGS_device_gib);
    const double device_bytes = (gib > 0 ? gib : 80.0) * kGiB;
    absl::StatusOr<planner::BatchPlan> plan = PlanBatch(name, b, device_bytes);
    if (!plan.ok()) {
      std::fprintf(stderr, "train_benchmark --plan_batch: %s\n", plan.status().ToString().c_str());
      return 1;
    }
    const planner::BatchCandidate& best = plan->candidates[plan->best];
    b.micro = static_cast<int>(best.micro_batch_size);
    recompute = best.recompute_modules;
    plan_json = PlanBatchJson(*plan, device_bytes);
  }
  v1::JobSpec spec = MakeSpec(name, b, 1, recompute);
  spec.mutable_parallel()->set_world_size(1);
  ApplyDefaults(&spec);
  if (absl::Status st = ValidateJobSpec(spec); !st.ok()) {
    std::fprintf(stderr, "invalid spec: %s\n", st.ToString().c_str());
    return 1;
  }
  absl::StatusOr<model::GptConfig> cfg = model::GptConfig::FromProto(spec.model(), DType::kBF16);
  if (!cfg.ok()) {
    std::fprintf(stderr, "GptConfig: %s\n", cfg.status().ToString().c_str());
    return 1;
  }
  std::printf("model %s: %s total / %s active parameters, %.4f GFLOP/token, %lld tokens/step\n",
              name.c_str(), Human(model::GptTotalParams(*cfg)).c_str(),
              Human(model::GptActiveParams(*cfg)).c_str(),
              model::GptTrainingFlopsPerToken(*cfg) / 1e9,
              static_cast<long long>(b.global) * b.seq);
  absl::StatusOr<EngineMemory> est = PlannerEstimate(spec);
  if (!est.ok()) {
    std::fprintf(stderr, "memory estimate: %s\n", est.status().ToString().c_str());
    return 1;
  }
  PrintEstimate(*est);
  if (!plan_json.is_null()) {
    const nlohmann::json out = {
        {"bench", "train"},       {"dry_run", true},          {"model", name},
        {"micro_batch", b.micro}, {"global_batch", b.global}, {"mem_est_gib", est->total() / kGiB},
        {"plan_batch", plan_json}};
    std::printf("PLAN_JSON %s\n", out.dump().c_str());
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Multi-GPU (--world > 1)

// The distributed run's arguments, validated without CUDA.
struct DistPlan {
  std::string name;
  BenchModel per_gpu;  // the single-GPU benchmark's batch (tokens per GPU)
  BenchModel global;   // global_batch = per_gpu.global * DP (DP = world / (tp * cp))
  int world = 1, ep = 1, edp = 1, cp = 1, dp = 1, tp = 1, etp = 1;
  int steps = 1, warmup = 0;
  double peak = 0;
  v1::JobSpec
      spec;  // defaulted and validated, parallel.world_size / expert_model_parallel_size set
  ParallelDims dims;
  double flops_per_token = 0;
  int64_t params_total = 0, params_active = 0, tokens_per_step = 0;
  EngineMemory mem_est;  // the planner's per-rank estimate
};

// The plan's fields that both PLAN_JSON and RESULT_JSON carry (the model, the layout, the batch
// and the model's size), under the same keys. nlohmann::json objects keep their keys sorted, so
// adding the other fields to it prints what one literal would.
nlohmann::json PlanFields(const DistPlan& p) {
  return {{"model", p.name},
          {"world", p.world},
          {"ep", p.ep},
          {"edp", p.edp},
          {"cp", p.cp},
          {"tp", p.tp},
          {"etp", p.etp},
          {"global_batch", p.global.global},
          {"tokens_per_step", p.tokens_per_step},
          {"flops_per_token", p.flops_per_token},
          {"params_total", p.params_total},
          {"params_active", p.params_active}};
}

// INVALID_ARGUMENT naming the flag and the rule; the spec's own validation for the rest.
absl::StatusOr<DistPlan> MakeDistPlan() {
  DistPlan p;
  p.name = absl::GetFlag(FLAGS_model);
  p.world = absl::GetFlag(FLAGS_world);
  p.ep = absl::GetFlag(FLAGS_ep);
  if (p.world < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--world (", p.world, ") must be >= 1"));
  }
  if (p.ep < 1) return absl::InvalidArgumentError(absl::StrCat("--ep (", p.ep, ") must be >= 1"));
  p.cp = absl::GetFlag(FLAGS_cp);
  if (p.cp < 1 || p.world % p.cp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cp (", p.cp, ") must be >= 1 and divide --world (", p.world, ")"));
  }
  p.tp = absl::GetFlag(FLAGS_tp);
  if (p.tp < 1 || p.world % (p.tp * p.cp) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tp (", p.tp, ") must be >= 1 and tp * cp (",
                                                   p.tp * p.cp, ") must divide --world (", p.world,
                                                   ")"));
  }
  p.etp = absl::GetFlag(FLAGS_etp) > 0 ? absl::GetFlag(FLAGS_etp) : p.tp;
  if (p.world % (p.etp * p.ep) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--etp (", p.etp, ") * --ep (", p.ep,
                                                   ") must divide --world (", p.world, ")"));
  }
  p.dp = p.world / (p.cp * p.tp);
  if (p.world % p.ep != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ep (", p.ep, ") must divide --world (", p.world, ")"));
  }
  if (!absl::GetFlag(FLAGS_torch_json).empty()) {
    return absl::InvalidArgumentError(
        "--torch_json: only with --world 1 (the PyTorch reference runs on one GPU)");
  }
  if (absl::GetFlag(FLAGS_breakdown)) {
    return absl::InvalidArgumentError("--breakdown: only with --world 1");
  }
  if (absl::GetFlag(FLAGS_plan_batch)) {
    return absl::InvalidArgumentError(
        "--plan_batch: only with --world 1 (the batch plan of a distributed run would need the "
        "node's link bandwidths, which this benchmark does not know)");
  }
  SY_ASSIGN_OR_RETURN(p.per_gpu, SelectModel(p.name));
  if (p.per_gpu.experts % p.ep != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--ep (", p.ep, ") must divide num_experts (",
                                                   p.per_gpu.experts, ") of --model ", p.name));
  }
  if (p.per_gpu.seq % (2 * p.cp) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--seq_length (", p.per_gpu.seq,
                                                   ") must be a multiple of 2 * --cp (", 2 * p.cp,
                                                   "): each CP rank holds two equal chunks"));
  }
  p.edp = p.world / (p.ep * p.etp);
  p.global = p.per_gpu;
  // The TP and CP ranks of a DP rank share its sequences: the batch scales with DP, not the
  // world (tokens per GPU shrink by tp * cp against the single-GPU benchmark).
  p.global.global = p.per_gpu.global * p.dp;
  p.steps = std::max(1, absl::GetFlag(FLAGS_steps));
  p.warmup = std::max(0, absl::GetFlag(FLAGS_warmup));
  p.peak = absl::GetFlag(FLAGS_peak_tflops);
  p.spec = MakeSpec(p.name, p.global, p.warmup + p.steps);
  p.spec.mutable_parallel()->set_world_size(p.world);
  p.spec.mutable_parallel()->set_expert_model_parallel_size(p.ep);
  if (p.cp > 1) p.spec.mutable_parallel()->set_context_parallel_size(p.cp);
  if (p.tp > 1) {
    p.spec.mutable_parallel()->set_tensor_model_parallel_size(p.tp);
    p.spec.mutable_parallel()->set_sequence_parallel(true);
  }
  if (p.etp != p.tp) p.spec.mutable_parallel()->set_expert_tensor_parallel_size(p.etp);
  ApplyDefaults(&p.spec);
  SY_RETURN_IF_ERROR(Annotate(ValidateJobSpec(p.spec), "distributed benchmark spec"));
  p.dims.world_size = p.world;
  p.dims.expert_model_parallel_size = p.ep;
  p.dims.context_parallel_size = p.cp;
  p.dims.tensor_model_parallel_size = p.tp;
  p.dims.expert_tensor_parallel_size = p.etp;
  SY_RETURN_IF_ERROR(Annotate(ParallelLayout::Create(p.dims).status(), "parallel layout"));
  SY_ASSIGN_OR_RETURN(model::GptConfig cfg,
                      model::GptConfig::FromProto(p.spec.model(), DType::kBF16));
  p.flops_per_token = model::GptTrainingFlopsPerToken(cfg);
  p.params_total = model::GptTotalParams(cfg);
  p.params_active = model::GptActiveParams(cfg);
  p.tokens_per_step = static_cast<int64_t>(p.global.global) * p.global.seq;
  SY_ASSIGN_OR_RETURN(p.mem_est, PlannerEstimate(p.spec));
  return p;
}

void PrintDistPlan(const DistPlan& p) {
  const int micro_per_gpu = p.per_gpu.global / p.per_gpu.micro;
  std::printf(
      "train_benchmark plan: model %s (%s total / %s active, %.4f GFLOP/token), world %d = "
      "TP %d x DP %d x CP %d; ETP %d x EP %d x EDP %d (%d experts per GPU); global batch %d x seq "
      "%d = %lld "
      "tokens/step, %d micro-batches of %d per DP rank (%lld tokens per GPU); %d warm-up + %d "
      "timed steps\n",
      p.name.c_str(), Human(p.params_total).c_str(), Human(p.params_active).c_str(),
      p.flops_per_token / 1e9, p.world, p.tp, p.dp, p.cp, p.etp, p.ep, p.edp,
      p.per_gpu.experts / p.ep, p.global.global, p.global.seq,
      static_cast<long long>(p.tokens_per_step), micro_per_gpu, p.per_gpu.micro,
      static_cast<long long>(p.tokens_per_step / p.world), p.warmup, p.steps);
  nlohmann::json plan = PlanFields(p);
  plan.update({{"bench", "train"},
               {"dry_run", absl::GetFlag(FLAGS_dry_run)},
               {"micro_batch", p.global.micro},
               {"seq_length", p.global.seq},
               {"mem_est_gib", p.mem_est.total() / kGiB}});
  PrintEstimate(p.mem_est);
  std::printf("PLAN_JSON %s\n", plan.dump().c_str());
}

// One rank: device `rank`, one non-blocking stream for the NCCL groups and the trainer. Writes
// {"device", "step_ms": [...], "mem_used_gb", "final_loss"} to <dir>/rank_<rank>.json.
// --checkpoint_dir (issue 14, "sharded save of that model"): on every rank, (1) an asynchronous
// save (Save copies the state to the host, a background thread writes this rank's shards) with
// one training step run while it writes, then WaitForSave (commits the manifest); (2) a save
// waited for at once; (3) a Load of that checkpoint into the same trainer. Host-clock seconds;
// bytes = every file of the step's directory (all ranks' shards and the manifest).
absl::StatusOr<nlohmann::json> TimeCheckpoints(train::Trainer& tr, const std::string& root,
                                               int rank, int world) {
  auto seconds = [](absl::Time t0) { return absl::ToDoubleSeconds(absl::Now() - t0); };
  absl::Time t0 = absl::Now();
  SY_ASSIGN_OR_RETURN(const std::string async_dir, tr.Save(root));
  const double copy_s = seconds(t0);
  SY_ASSIGN_OR_RETURN(const train::StepResult during, tr.Step());
  SY_RETURN_IF_ERROR(tr.WaitForSave());
  const double async_total_s = seconds(t0);
  int64_t bytes = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(async_dir)) {
    if (e.is_regular_file()) bytes += static_cast<int64_t>(e.file_size());
  }
  // Rank 0 removes the first checkpoint (disk space: a large model's two checkpoints may not
  // fit); WaitForSave committed it, so every rank has finished writing, and nothing reads it.
  if (rank == 0) std::filesystem::remove_all(async_dir);
  t0 = absl::Now();
  SY_ASSIGN_OR_RETURN(const std::string dir, tr.Save(root));
  SY_RETURN_IF_ERROR(tr.WaitForSave());
  const double save_s = seconds(t0);
  t0 = absl::Now();
  SY_RETURN_IF_ERROR(tr.Load(root, tr.step()));
  const double load_s = seconds(t0);
  if (rank == 0) {
    std::printf(
        "checkpoint (rank 0 of %d, %s): async save: host copy %.2f s, written and committed "
        "%.2f s after it started, the step run during the write %.1f ms; save waited at once "
        "%.2f s; load %.2f s; %.3f GiB on disk (%.3f GiB per rank)\n",
        world, dir.c_str(), copy_s, async_total_s, during.step_ms, save_s, load_s,
        bytes / 1073741824.0, bytes / 1073741824.0 / world);
    std::fflush(stdout);
  }
  return nlohmann::json{{"async_copy_s", copy_s},
                        {"async_total_s", async_total_s},
                        {"step_ms_during_save", during.step_ms},
                        {"save_s", save_s},
                        {"load_s", load_s},
                        {"bytes", bytes}};
}

absl::Status RankMain(const DistPlan& p, const std::string& dir, int rank) {
  int count = 0;
  SY_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (count < p.world) {
    return absl::FailedPreconditionError(
        absl::StrCat("--world ", p.world, " needs ", p.world, " GPUs; ", count, " visible"));
  }
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(rank));
  cudaDeviceProp prop;
  SY_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, rank));
  cudaStream_t cs = nullptr;
  SY_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  nlohmann::json result;
  {
    SY_ASSIGN_OR_RETURN(const size_t mem_before, MemUsed());
    SY_ASSIGN_OR_RETURN(std::unique_ptr<comm::FileKvStore> store,
                        comm::FileKvStore::Create(dir + "/store"));
    comm::NcclOptions nopt;
    nopt.timeout = absl::Seconds(300);  // a slow rank's first step (allocation, warm-up)
    SY_ASSIGN_OR_RETURN(
        std::unique_ptr<train::ProcessGroups> groups,
        train::CreateNcclProcessGroups(std::shared_ptr<comm::KvStore>(std::move(store)), rank,
                                       p.dims, rank, cs, nopt));
    train::TrainerOptions opt;
    opt.device = Device::Cuda(rank);
    opt.peak_tflops = p.peak;
    opt.groups = groups.get();
    opt.cuda_stream = cs;
    const std::string ckpt = absl::GetFlag(FLAGS_checkpoint_dir);
    opt.async_save = !ckpt.empty();
    SY_ASSIGN_OR_RETURN(std::unique_ptr<train::Trainer> tr, train::Trainer::Create(p.spec, opt));
    if (rank == 0) std::printf("device: %s x %d\n%s\n", prop.name, p.world, tr->Describe().c_str());
    std::vector<double> ms;
    double last_loss = 0;
    size_t mem_max = mem_before;
    for (int i = 0; i < p.warmup + p.steps; ++i) {
      absl::StatusOr<train::StepResult> r = tr->Step();
      SY_RETURN_IF_ERROR(Annotate(r.status(), absl::StrCat("step ", i + 1)));
      if (rank == 0) {
        std::printf("%s%s\n", tr->FormatLogLine(*r).c_str(), i < p.warmup ? "  (warm-up)" : "");
        std::fflush(stdout);
      }
      if (i >= p.warmup) ms.push_back(r->step_ms);
      last_loss = r->loss;
      SY_ASSIGN_OR_RETURN(const size_t used, MemUsed());
      mem_max = std::max(mem_max, used);
    }
    nlohmann::json ckpt_times;
    if (!ckpt.empty()) {
      SY_ASSIGN_OR_RETURN(ckpt_times, TimeCheckpoints(*tr, ckpt, rank, p.world));
    }
    result = {{"device", prop.name},
              {"checkpoint", ckpt_times},
              {"step_ms", ms},
              {"mem_used_gb", static_cast<double>(mem_max - mem_before) / (1024.0 * 1024 * 1024)},
              // The engine's own device buffers (kernels::Buffer counter) at their peak: what the
              // planner's buffer terms estimate; mem_used_gb minus this is the CUDA/NCCL runtime.
              {"buffers_peak_gb",
               static_cast<double>(kernels::BufferMemory(DeviceType::kCuda).peak_bytes) /
                   (1024.0 * 1024 * 1024)},
              {"final_loss", last_loss}};
    SY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cs));
  }  // the trainer, then the communicators, go before the stream
  SY_CUDA_RETURN_IF_ERROR(cudaStreamDestroy(cs));
  const std::string path = absl::StrCat(dir, "/rank_", rank, ".json");
  std::ofstream f(path);
  f << result.dump();
  if (!f.good()) return absl::InternalError(absl::StrCat("writing ", path));
  return absl::OkStatus();
}

int DistributedMain(const DistPlan& p) {
  // GPU count from a probe child: the parent must not initialise CUDA before forking the ranks.
  const int gpus = ForkRanks(1, absl::Seconds(60), [](int) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    return std::min(n, 100);
  })[0];
  if (gpus == 0 || gpus > 100) {
    std::printf("train_benchmark: no CUDA device; nothing to measure\n");
    return 0;
  }
  if (gpus < p.world) {
    std::fprintf(stderr, "train_benchmark: --world %d needs %d GPUs; %d visible\n", p.world,
                 p.world, gpus);
    return 1;
  }
  const std::string dir = MakeRunDirectory("train_benchmark");
  if (dir.empty()) return 1;
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink SHARP is off on the GPU hosts (KINDS.md)
  const std::vector<int> codes =
      ForkRanks(p.world, absl::Seconds(absl::GetFlag(FLAGS_rank_timeout_s)), [&](int rank) {
        const absl::Status s = RankMain(p, dir, rank);
        if (!s.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
        return s.ok() ? 0 : 1;
      });
  for (int r = 0; r < p.world; ++r) {
    if (codes[r] != 0) {
      std::fprintf(stderr, "train_benchmark: rank %d exited with %d (files in %s)\n", r, codes[r],
                   dir.c_str());
      return 1;
    }
  }
  std::vector<nlohmann::json> ranks(p.world);
  for (int r = 0; r < p.world; ++r) {
    std::ifstream f(absl::StrCat(dir, "/rank_", r, ".json"));
    std::stringstream ss;
    ss << f.rdbuf();
    ranks[r] = nlohmann::json::parse(ss.str(), nullptr, false);
    if (ranks[r].is_discarded() || !ranks[r].contains("step_ms") ||
        ranks[r]["step_ms"].size() != static_cast<size_t>(p.steps)) {
      std::fprintf(stderr, "train_benchmark: bad results of rank %d in %s\n", r, dir.c_str());
      return 1;
    }
  }
  // Per timed step the slowest rank (the ranks meet in every step's collectives), then the median.
  std::vector<double> slowest(p.steps, 0.0);
  double spread = 0, mem_gb = 0;
  for (int i = 0; i < p.steps; ++i) {
    double fastest = 1e300;
    for (const nlohmann::json& rj : ranks) {
      const double v = rj["step_ms"][i].get<double>();
      slowest[i] = std::max(slowest[i], v);
      fastest = std::min(fastest, v);
    }
    spread = std::max(spread, slowest[i] - fastest);
  }
  double buffers_gb = 0;
  for (const nlohmann::json& rj : ranks) {
    if (rj["mem_used_gb"].get<double>() >= mem_gb) {
      mem_gb = rj["mem_used_gb"].get<double>();
      buffers_gb = rj.value("buffers_peak_gb", 0.0);
    }
  }
  std::printf(
      "memory of the largest rank: %.2f GiB used (cudaMemGetInfo), %.2f GiB of it the "
      "engine's buffers (peak of the Buffer counter), %.2f GiB CUDA/NCCL runtime\n",
      mem_gb, buffers_gb, mem_gb - buffers_gb);
  const double step_ms = Median(slowest);
  const double tok_s = static_cast<double>(p.tokens_per_step) / (step_ms / 1e3);
  const double tflops_gpu = p.flops_per_token * tok_s / 1e12 / p.world;
  const double mfu = p.peak > 0 ? tflops_gpu / p.peak : -1;
  const double last_loss = ranks[0]["final_loss"].get<double>();
  const std::string device = ranks[0]["device"].get<std::string>();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);

  std::printf("\n%-26s %s\n", "model", p.name.c_str());
  std::printf("%-26s %s total / %s active\n", "parameters", Human(p.params_total).c_str(),
              Human(p.params_active).c_str());
  std::printf("%-26s %d x %s: TP %d x DP %d x CP %d, ETP %d x EP %d x EDP %d\n", "layout", p.world,
              device.c_str(), p.tp, p.dp, p.cp, p.etp, p.ep, p.edp);
  std::printf("%-26s %lld (%d DP ranks x %d micro-batches x %d x %d)\n", "tokens/step",
              static_cast<long long>(p.tokens_per_step), p.dp, p.per_gpu.global / p.per_gpu.micro,
              p.per_gpu.micro, p.global.seq);
  std::printf("%-26s %.3f GFLOP\n", "model FLOPs/token", p.flops_per_token / 1e9);
  std::printf("%-26s %d timed after %d warm-up; final loss %.4f\n", "steps", p.steps, p.warmup,
              last_loss);
  const double est_gb = p.mem_est.total() / kGiB;
  const double mem_ratio = mem_gb > 0 ? est_gb / mem_gb : 0;
  std::printf("%-12s %5s %4s %12s %14s %14s %12s %8s %10s %8s %9s\n", "impl", "GPUs", "EP",
              "step ms", "tokens/s", "tokens/s/GPU", "TFLOP/s/GPU", "MFU", "mem GiB", "est GiB",
              "est/meas");
  std::printf("%-12s %5d %4d %12.1f %14.0f %14.0f %12.1f %7.1f%% %10.1f %8.1f %9.3f\n",
              "switchyard", p.world, p.ep, step_ms, tok_s, tok_s / p.world, tflops_gpu, 100 * mfu,
              mem_gb, est_gb, mem_ratio);
  PrintEstimate(p.mem_est);
  std::printf(
      "(step ms: median over timed steps of the slowest rank; largest rank spread %.1f ms)\n",
      spread);
  nlohmann::json out = PlanFields(p);
  out.update({
      {"device", device},
      {"steps", p.steps},
      {"warmup", p.warmup},
      {"step_ms_median", step_ms},
      {"step_ms_slowest_rank", slowest},
      {"rank_spread_ms_max", spread},
      {"tokens_per_s", tok_s},
      {"tokens_per_s_per_gpu", tok_s / p.world},
      {"tflops_per_gpu", tflops_gpu},
      {"mfu", mfu},
      {"mem_used_gb_max_rank", mem_gb},
      {"mem_est_gib", est_gb},
      {"mem_ratio", mem_ratio},
      {"mem_est_create_peak_gib", (p.mem_est.total() + p.mem_est.create_transient) / kGiB},
      {"final_loss", last_loss},
  });
  std::printf("RESULT_JSON %s\n", out.dump().c_str());
  return 0;
}

int Main() {
  if (absl::GetFlag(FLAGS_plan_batch) && absl::GetFlag(FLAGS_micro_batch) > 0) {
    std::fprintf(stderr,
                 "train_benchmark: --plan_batch chooses the micro-batch; leave --micro_batch "
                 "unset\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_world) != 1 || absl::GetFlag(FLAGS_ep) != 1 ||
      absl::GetFlag(FLAGS_cp) != 1 || absl::GetFlag(FLAGS_tp) != 1) {
    absl::StatusOr<DistPlan> plan = MakeDistPlan();
    if (!plan.ok()) {
      std::fprintf(stderr, "train_benchmark: %s\n", plan.status().ToString().c_str());
      return 2;
    }
    PrintDistPlan(*plan);
    if (absl::GetFlag(FLAGS_dry_run)) return 0;
    return DistributedMain(*plan);
  }
  if (absl::GetFlag(FLAGS_dry_run)) {
    absl::StatusOr<BenchModel> bm = SelectModel(absl::GetFlag(FLAGS_model));
    if (!bm.ok()) {
      std::fprintf(stderr, "%s\n", bm.status().ToString().c_str());
      return 2;
    }
    return DryRun(absl::GetFlag(FLAGS_model), *bm);
  }
  if (absl::GetFlag(FLAGS_device_gib) != 0) {
    // Only a dry run has no device to ask; a GPU run plans for the memory it has.
    std::fprintf(stderr,
                 "train_benchmark: --device_gib is for --dry_run only (a GPU run plans for "
                 "cudaMemGetInfo's total); drop it or add --dry_run\n");
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    std::printf("train_benchmark: no CUDA device; nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "train_benchmark: cudaGetDeviceProperties failed\n");
    return 1;
  }
  const std::string name = absl::GetFlag(FLAGS_model);
  absl::StatusOr<BenchModel> bm = SelectModel(name);
  if (!bm.ok()) {
    std::fprintf(stderr, "%s\n", bm.status().ToString().c_str());
    return 2;
  }
  const int steps = std::max(1, absl::GetFlag(FLAGS_steps));
  const int warmup = std::max(0, absl::GetFlag(FLAGS_warmup));
  const double peak = absl::GetFlag(FLAGS_peak_tflops);

  // PyTorch reference results (optional).
  nlohmann::json torch = nullptr;
  if (!absl::GetFlag(FLAGS_torch_json).empty()) {
    std::ifstream in(absl::GetFlag(FLAGS_torch_json));
    if (in) {
      nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
      if (!j.is_discarded() && j.is_object()) torch = j;
    }
    if (torch.is_null()) {
      std::fprintf(stderr, "train_benchmark: could not read %s\n",
                   absl::GetFlag(FLAGS_torch_json).c_str());
    }
  }

  absl::StatusOr<size_t> mem_before = MemUsed();
  if (!mem_before.ok()) {
    std::fprintf(stderr, "%s\n", mem_before.status().ToString().c_str());
    return 1;
  }
  // --plan_batch: the planner's micro-batch and recompute modules for this device's memory.
  std::vector<std::string> recompute;
  nlohmann::json plan_json = nullptr;
  if (absl::GetFlag(FLAGS_plan_batch)) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
      std::fprintf(stderr, "train_benchmark: cudaMemGetInfo failed\n");
      return 1;
    }
    absl::StatusOr<planner::BatchPlan> plan = PlanBatch(name, *bm, static_cast<double>(total_b));
    if (!plan.ok()) {
      std::fprintf(stderr, "train_benchmark --plan_batch: %s\n", plan.status().ToString().c_str());
      return 1;
    }
    const planner::BatchCandidate& best = plan->candidates[plan->best];
    bm->micro = static_cast<int>(best.micro_batch_size);
    recompute = best.recompute_modules;
    plan_json = PlanBatchJson(*plan, static_cast<double>(total_b));
  }
  const v1::JobSpec spec =
      MakeSpec(name, *bm, warmup + steps + (absl::GetFlag(FLAGS_breakdown) ? 1 : 0), recompute);
  absl::StatusOr<EngineMemory> mem_est = PlannerEstimate(spec);
  if (!mem_est.ok()) {
    std::fprintf(stderr, "memory estimate: %s\n", mem_est.status().ToString().c_str());
    return 1;
  }
  train::TrainerOptions opt;
  opt.device = Device::Cuda(0);
  opt.peak_tflops = peak;
  auto trainer = train::Trainer::Create(spec, opt);
  if (!trainer.ok()) {
    std::fprintf(stderr, "Trainer::Create: %s\n", trainer.status().ToString().c_str());
    return 1;
  }
  train::Trainer& tr = **trainer;
  std::printf("device: %s\n%s\n", prop.name, tr.Describe().c_str());
  const model::GptConfig& cfg = tr.model_config();
  const double flops_per_token = model::GptTrainingFlopsPerToken(cfg);
  const int64_t params_total = model::GptTotalParams(cfg);
  const int64_t params_active = model::GptActiveParams(cfg);
  const int64_t tokens = tr.tokens_per_step();

  // ms: the trainer's step time (CUDA events); host_ms: the host clock around Step(), which ends
  // synchronised, for comparing with binaries from before the step time moved to CUDA events.
  std::vector<double> ms, host_ms;
  double last_loss = 0;
  size_t mem_max = *mem_before;
  for (int i = 0; i < warmup + steps; ++i) {
    const absl::Time t0 = absl::Now();
    absl::StatusOr<train::StepResult> r = tr.Step();
    const double host = absl::ToDoubleMilliseconds(absl::Now() - t0);
    if (!r.ok()) {
      std::fprintf(stderr, "step %d: %s\n", i + 1, r.status().ToString().c_str());
      return 1;
    }
    std::printf("%s%s\n", tr.FormatLogLine(*r).c_str(), i < warmup ? "  (warm-up)" : "");
    std::fflush(stdout);
    if (i >= warmup) {
      ms.push_back(r->step_ms);
      host_ms.push_back(host);
    }
    last_loss = r->loss;
    absl::StatusOr<size_t> used = MemUsed();
    if (used.ok()) mem_max = std::max(mem_max, *used);
  }
  if (absl::GetFlag(FLAGS_breakdown)) {
    // One more step with every nested range timed (two CUDA events per range): the timed step is
    // slightly slower than the untimed ones above, which time only the top-level sections.
    tr.SetTimingDepth(-1);
    absl::StatusOr<train::StepResult> r = tr.Step();
    tr.SetTimingDepth(0);
    if (!r.ok()) {
      std::fprintf(stderr, "breakdown step: %s\n", r.status().ToString().c_str());
      return 1;
    }
    const std::vector<model::PhaseTotal> totals = model::SumByPath(tr.last_timing());
    double top = 0;
    for (const model::PhaseTotal& p : totals) {
      if (p.depth == 0) top += p.ms;
    }
    std::printf(
        "\nphase breakdown of one step (CUDA events; %.1f ms with every range timed; nested "
        "ranges summed over layers and micro-batches, indented under their parent; %% of the "
        "step):\n",
        r->step_ms);
    for (const model::PhaseTotal& p : totals) {
      const size_t slash = p.path.rfind('/');
      const std::string leaf = slash == std::string::npos ? p.path : p.path.substr(slash + 1);
      const std::string label = std::string(2 * p.depth, ' ') + leaf;
      std::printf("  %-40s %9.2f ms  %5.1f %%  (x%lld)\n", label.c_str(), p.ms,
                  100.0 * p.ms / r->step_ms, static_cast<long long>(p.count));
    }
    std::printf("  %-40s %9.2f ms  %5.1f %%\n", "outside the timed sections", r->step_ms - top,
                100.0 * (r->step_ms - top) / r->step_ms);
  }
  // The trainer plans every buffer at Create (no allocation inside a step), so device memory in
  // use after the steps, less what was in use before Create, is the run's footprint.
  const double mem_gb = static_cast<double>(mem_max - *mem_before) / (1024.0 * 1024 * 1024);
  const double step_ms = Median(ms);
  const double tok_s = static_cast<double>(tokens) / (step_ms / 1e3);
  const double tflops = flops_per_token * tok_s / 1e12;
  const double mfu = peak > 0 ? tflops / peak : -1;

  double t_ms = 0, t_tok = 0, t_mfu = -1, t_tflops = 0, t_mem = 0;
  std::string t_err;
  const bool have_torch = torch.is_object();
  if (have_torch) {
    if (torch.contains("error")) t_err = torch["error"].dump();
    if (torch.contains("step_ms_median") && torch["step_ms_median"].is_number()) {
      t_ms = torch["step_ms_median"].get<double>();
    }
    if (torch.contains("tokens_per_s") && torch["tokens_per_s"].is_number()) {
      t_tok = torch["tokens_per_s"].get<double>();
    }
    if (torch.contains("tflops") && torch["tflops"].is_number()) {
      t_tflops = torch["tflops"].get<double>();
    }
    if (torch.contains("mfu") && torch["mfu"].is_number()) t_mfu = torch["mfu"].get<double>();
    if (torch.contains("peak_mem_gb") && torch["peak_mem_gb"].is_number()) {
      t_mem = torch["peak_mem_gb"].get<double>();
    }
  }

  std::printf("\n%-26s %s\n", "model", name.c_str());
  std::printf("%-26s %s total / %s active\n", "parameters", Human(params_total).c_str(),
              Human(params_active).c_str());
  std::printf("%-26s %lld (%d x %d micro-batches x %lld)\n", "tokens/step",
              static_cast<long long>(tokens), bm->global / bm->micro, bm->micro,
              static_cast<long long>(cfg.seq_length));
  std::printf("%-26s %.3f GFLOP\n", "model FLOPs/token", flops_per_token / 1e9);
  std::printf("%-26s %d timed after %d warm-up; final loss %.4f\n", "steps", steps, warmup,
              last_loss);
  const double est_gb = mem_est->total() / kGiB;
  const double mem_ratio = mem_gb > 0 ? est_gb / mem_gb : 0;
  std::printf("%-12s %12s %12s %10s %8s %10s %8s %9s\n", "impl", "step ms", "tokens/s", "TFLOP/s",
              "MFU", "mem GiB", "est GiB", "est/meas");
  std::printf("%-12s %12.1f %12.0f %10.1f %7.1f%% %10.1f %8.1f %9.3f\n", "switchyard", step_ms,
              tok_s, tflops, 100 * mfu, mem_gb, est_gb, mem_ratio);
  const double step_ms_host = Median(host_ms);
  std::printf("step ms by the host clock around Step() (median): %.1f\n", step_ms_host);
  PrintEstimate(*mem_est);
  double speedup = 0;
  if (have_torch && t_ms > 0) {
    speedup = t_ms / step_ms;
    std::printf("%-12s %12.1f %12.0f %10.1f %7.1f%% %10.1f\n", "pytorch", t_ms, t_tok, t_tflops,
                100 * t_mfu, t_mem);
    std::printf("speedup (PyTorch step ms / Switchyard step ms): %.2fx\n", speedup);
  } else if (have_torch) {
    std::printf("%-12s %12s (no result%s%s)\n", "pytorch", "-", t_err.empty() ? "" : ": ",
                t_err.c_str());
  }

  nlohmann::json out = {
      {"model", name},
      {"device", prop.name},
      {"params_total", params_total},
      {"params_active", params_active},
      {"tokens_per_step", tokens},
      {"flops_per_token", flops_per_token},
      {"steps", steps},
      {"warmup", warmup},
      {"step_ms_median", step_ms},
      {"step_ms_host_median", step_ms_host},
      {"tokens_per_s", tok_s},
      {"tflops", tflops},
      {"mfu", mfu},
      {"mem_used_gb", mem_gb},
      {"mem_est_gib", est_gb},
      {"mem_ratio", mem_ratio},
      {"final_loss", last_loss},
  };
  if (have_torch) {
    out["torch"] = torch;
    if (speedup > 0) out["speedup"] = speedup;
  }
  out["micro_batch"] = bm->micro;
  out["global_batch"] = bm->global;
  if (!plan_json.is_null()) out["plan_batch"] = plan_json;
  std::printf("RESULT_JSON %s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "End-to-end training benchmark of the benchmark model on one GPU or --world N GPUs; prints "
      "step time, tokens/s, TFLOP/s, MFU (bench/README.md).");
  switchyard::ParseCommandLine(argc, argv);
  return switchyard::bench::Main();
}
