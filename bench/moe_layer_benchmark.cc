// MoE-layer benchmark (BASELINES.md): one layer on one GPU, bf16 weights and activations, fp32
// router, forward + backward (router, permute, grouped-GEMM SwiGLU experts, unpermute, shared
// expert where listed, aux loss), median of 10 timed iterations after 3 warm-ups, CUDA events,
// random inputs; fp32 weight gradients, written by the first (here: only) micro-batch. Prints
// config, ms, TFLOP/s (BASELINES.md formula), fraction of the bf16 GEMM peak measured in the same
// process, and the ratio to the PyTorch layer when its JSON results (bench/torch_moe_baseline.py
// --json) are given with --torch_json.
//
//   moe_layer_benchmark [--configs a,b] [--torch_json torch.json] [--iters 10] [--warmup 3]
//                       [--tile auto|<GroupedGemmTileName>]
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/moe_configs.h"
#include "common/command_line.h"
#include "common/status.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/grouped_gemm.h"
#include "kernels/runtime/buffer.h"
#include "kernels/runtime/cuda_status.h"
#include "worker/comm/kv_store.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/model/moe_layer.h"
#include "worker/model/moe_layer_tensors.h"
#include "worker/model/profiling.h"

ABSL_FLAG(std::string, configs, "mixtral8x7b,qwen3_30b_a3b,dsv3_layer", "configs to run");
ABSL_FLAG(std::string, torch_json, "", "results of torch_moe_baseline.py --json, for the ratio");
ABSL_FLAG(int, ep, 1,
          "expert parallelism: fork this many ranks, one GPU each, NCCL all-to-all dispatch; "
          "tokens per GPU as in BASELINES.md, experts split E/ep per GPU");
ABSL_FLAG(int, iters, 10, "timed iterations (median reported)");
ABSL_FLAG(int, warmup, 3, "warm-up iterations");
ABSL_FLAG(bool, breakdown, false, "also print CUDA-event times of the layer's phases");
ABSL_FLAG(bool, moe_permute_fusion, false,
          "the permutation fused into the experts' grouped GEMMs (MoELayerConfig::permute_fusion; "
          "EP = 1 only)");
ABSL_FLAG(std::string, tile, "auto",
          "grouped-GEMM tile: auto or a GroupedGemmTileName (pingpong_128x128x64, "
          "cooperative_256x128x64, cooperative_128x128x64, pingpong_64x128x64, "
          "cooperative_128x256x64); pingpong and cooperative are short for the first two");
ABSL_FLAG(std::string, grad_dtype, "f32",
          "weight-gradient dtype: f32 (Megatron's bf16 training accumulates grads in fp32) or "
          "bf16 (what the PyTorch reference layer produces)");

namespace switchyard::bench {
namespace {

using kernels::Buffer;

struct BenchConfig {
  int64_t h, f, e, k, t, shared;
};

// The layer benchmarks' shared table (moe_configs.h); the BASELINES.md three run by default, the
// benchmark model's layers (bench_model_mb2/4/8) on request, to see where its time goes.
const std::map<std::string, BenchConfig>& Configs() {
  static const auto* m = [] {
    auto* c = new std::map<std::string, BenchConfig>;
    for (const MoeLayerConfig& l : MoeLayerConfigs()) {
      (*c)[l.name] = {l.hidden, l.ffn, l.experts, l.topk, l.tokens, l.shared_ffn};
    }
    return c;
  }();
  return *m;
}

double Flops(const BenchConfig& c) {
  const double fwd =
      2.0 * c.t * c.k * 3 * c.h * c.f + 2.0 * c.t * c.h * c.e + 2.0 * c.t * 3 * c.h * c.shared;
  return 3 * fwd;
}

absl::StatusOr<double> GemmPeak() {
  const int64_t n = 8192;
  const Stream s{Device::Cuda(0), nullptr};
  SY_ASSIGN_OR_RETURN(Buffer a, Buffer::ForTensor(DType::kBF16, {n, n}, Device::Cuda(0)));
  SY_ASSIGN_OR_RETURN(Buffer b, Buffer::ForTensor(DType::kBF16, {n, n}, Device::Cuda(0)));
  SY_ASSIGN_OR_RETURN(Buffer c, Buffer::ForTensor(DType::kBF16, {n, n}, Device::Cuda(0)));
  SY_RETURN_IF_ERROR(kernels::FillNormal(s, a.View(), 1, 1.0f));
  SY_RETURN_IF_ERROR(kernels::FillNormal(s, b.View(), 2, 1.0f));
  SY_ASSIGN_OR_RETURN(
      double ms,
      MedianMs([&] { return kernels::Gemm(s, a.View(), false, b.View(), false, c.View()); }, 3,
               20));
  return 2.0 * n * n * n / ms / 1e9;
}

// --tile as a GroupedGemmTile; the short names of the two original tiles are still accepted.
absl::StatusOr<kernels::GroupedGemmTile> TileFlag() {
  const std::string tile = absl::GetFlag(FLAGS_tile);
  if (tile == "pingpong") return kernels::GroupedGemmTile::kPingpong128x128;
  if (tile == "cooperative") return kernels::GroupedGemmTile::kCooperative256x128;
  absl::StatusOr<kernels::GroupedGemmTile> parsed = kernels::ParseGroupedGemmTile(tile);
  if (!parsed.ok()) return Annotate(parsed.status(), "--tile");
  return parsed;
}

struct Row {
  std::string name;
  double ms = 0, tflops = 0;
};

// ep > 1: this process is EP rank `rank` (one GPU each) and `ep_group` its NCCL group, created on
// `stream` (a blocking stream, so MedianMs's default-stream events order with it).
absl::StatusOr<Row> RunOne(const std::string& name, const BenchConfig& b, int warmup, int iters,
                           int ep = 1, int rank = 0, comm::Communicator* ep_group = nullptr,
                           cudaStream_t stream = nullptr) {
  model::MoELayerConfig c;
  c.dtype = DType::kBF16;
  c.hidden_size = b.h;
  c.ffn_hidden_size = b.f;
  c.shared_ffn_size = b.shared;
  c.router.num_experts = static_cast<int>(b.e);
  c.router.topk = static_cast<int>(b.k);
  c.router.aux_losses = {{kernels::AuxLossType::kAuxLoss, 0.01}};
  c.router.seq_length = b.t;
  SY_ASSIGN_OR_RETURN(c.gemm_options.tile, TileFlag());
  const DType grad_dtype = absl::GetFlag(FLAGS_grad_dtype) == "bf16" ? DType::kBF16 : DType::kF32;
  c.ep_size = ep;
  c.dispatcher = model::MoELayerConfig::Dispatcher::kAllToAll;  // the path BASELINES.md measured
  c.permute_fusion = absl::GetFlag(FLAGS_moe_permute_fusion);
  c.ep_rank = rank;
  const Device dev = Device::Cuda(ep > 1 ? rank : 0);
  const Stream s{dev, stream};
  SY_ASSIGN_OR_RETURN(auto w, model::MoELayerTensors::Create(c, dev, DType::kBF16, grad_dtype));
  uint64_t seed = 100;
  for (auto& [pname, shape] : model::MoELayerTensors::ParamShapes(c)) {
    SY_RETURN_IF_ERROR(kernels::FillNormal(s, w.Param(pname), ++seed, 0.02f));
  }
  SY_ASSIGN_OR_RETURN(auto layer,
                      model::MoELayer::Create(c, dev, b.t, model::MoEParallelGroups{ep_group}));
  if (c.permute_fusion && rank == 0) {
    // --moe_permute_fusion applies only where MoELayerConfig::permute_fusion says (EP = 1, ...).
    std::fprintf(stderr, "%s: MoE permutation %s\n", name.c_str(),
                 layer->permute_fused() ? "fused into the experts (gathered grouped GEMMs)"
                                        : "unfused (moe_permute_fusion does not apply here)");
  }
  SY_ASSIGN_OR_RETURN(Buffer x, Buffer::ForTensor(DType::kBF16, {b.t, b.h}, dev));
  SY_ASSIGN_OR_RETURN(Buffer y, Buffer::ForTensor(DType::kBF16, {b.t, b.h}, dev));
  SY_ASSIGN_OR_RETURN(Buffer dy, Buffer::ForTensor(DType::kBF16, {b.t, b.h}, dev));
  SY_ASSIGN_OR_RETURN(Buffer dx, Buffer::ForTensor(DType::kBF16, {b.t, b.h}, dev));
  SY_RETURN_IF_ERROR(kernels::FillNormal(s, x.View(), 7 + 1000 * rank, 1.0f));
  SY_RETURN_IF_ERROR(kernels::FillNormal(s, dy.View(), 8 + 1000 * rank, 1.0f));
  auto step = [&]() -> absl::Status {
    SY_RETURN_IF_ERROR(layer->Forward(s, w.params(), w.router_state(), x.View(), y.View()));
    // One micro-batch per step: the first micro-batch overwrites the fp32 gradients.
    return layer->Backward(s, w.params(), w.grads(), dy.View(), dx.View(), 1.0,
                           model::MoELayer::GradMode::kOverwrite);
  };
  SY_ASSIGN_OR_RETURN(double ms, MedianMs(step, warmup, iters));
  if (absl::GetFlag(FLAGS_breakdown)) {
    // One more forward+backward with every phase timed by CUDA events (profiling.h).
    model::PhaseTimer timer;
    SY_RETURN_IF_ERROR(timer.BeginStep(s));
    const absl::Status st = step();
    SY_RETURN_IF_ERROR(timer.EndStep(s));
    SY_RETURN_IF_ERROR(st);
    SY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s.cuda_stream));
    SY_ASSIGN_OR_RETURN(model::StepTiming timing, timer.Resolve());
    std::fprintf(stderr, "%s phases (ms, forward+backward %.3f):", name.c_str(), timing.step_ms);
    for (const model::PhaseTotal& p : model::SumByPath(timing)) {
      std::fprintf(stderr, " %s=%.3f", p.path.c_str(), p.ms);
    }
    std::fprintf(stderr, "\n");
  }
  // Load of the last step, for the record: max/mean tokens per expert.
  std::vector<int32_t> tpe(b.e);
  SY_CUDA_RETURN_IF_ERROR(cudaMemcpy(tpe.data(), layer->tokens_per_expert().data,
                                     b.e * sizeof(int32_t), cudaMemcpyDeviceToHost));
  const double mean = static_cast<double>(b.t * b.k) / b.e;
  std::fprintf(stderr, "%s: max/mean tokens per expert %.2f\n", name.c_str(),
               *std::max_element(tpe.begin(), tpe.end()) / mean);
  return Row{name, ms, Flops(b) / ms / 1e9};
}

// --ep N: one forked rank per GPU; rank 0 prints the rows (per-GPU numbers: every rank has
// b.t tokens and E/N experts, so the per-GPU FLOPs are those of the EP = 1 layer).
int MainEp(int ep) {
  const std::string dir = absl::StrCat("/tmp/sy_moe_bench_", getpid());
  std::vector<pid_t> pids;
  for (int rank = 0; rank < ep; ++rank) {
    const pid_t pid = fork();
    if (pid != 0) {
      pids.push_back(pid);
      continue;
    }
    auto child = [&]() -> int {
      if (cudaSetDevice(rank) != cudaSuccess) {
        std::fprintf(stderr, "rank %d: no CUDA device %d\n", rank, rank);
        return 1;
      }
      cudaStream_t stream;
      if (cudaStreamCreate(&stream) != cudaSuccess) return 1;
      auto store = comm::FileKvStore::Create(dir);
      if (!store.ok()) {
        std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
        return 1;
      }
      auto group =
          comm::NcclCommunicator::Create(std::shared_ptr<comm::KvStore>(std::move(*store)), rank,
                                         ep, rank, stream, comm::NcclOptions{}, "ep");
      if (!group.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, group.status().ToString().c_str());
        return 1;
      }
      int rc = 0;
      for (const std::string& name :
           std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_configs), ','))) {
        auto it = Configs().find(name);
        if (it == Configs().end() || it->second.e % ep != 0) {
          std::fprintf(stderr, "config %s: unknown or E not divisible by %d\n", name.c_str(), ep);
          return 2;
        }
        absl::StatusOr<Row> row =
            RunOne(name, it->second, absl::GetFlag(FLAGS_warmup), absl::GetFlag(FLAGS_iters), ep,
                   rank, group->get(), stream);
        if (!row.ok()) {
          std::fprintf(stderr, "rank %d %s: %s\n", rank, name.c_str(),
                       row.status().ToString().c_str());
          return 1;
        }
        if (rank == 0) {
          std::printf("%-16s %-12s %4d %9.2f %14.0f\n", name.c_str(), "switchyard", ep, row->ms,
                      row->tflops);
          std::printf(
              "JSON {\"bench\":\"moe_layer_ep\",\"config\":\"%s\",\"ep\":%d,"
              "\"ms\":%.3f,\"tflops_per_gpu\":%.1f}\n",
              name.c_str(), ep, row->ms, row->tflops);
          std::fflush(stdout);
        }
      }
      return rc;
    };
    if (rank == 0) {
      std::printf("%-16s %-12s %4s %9s %14s\n", "config", "impl", "EP", "ms", "TFLOP/s/GPU");
      std::fflush(stdout);
    }
    const int code = child();
    std::fflush(nullptr);
    _exit(code);
  }
  int rc = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  std::filesystem::remove_all(dir);
  return rc;
}

int Main() {
  if (absl::StatusOr<kernels::GroupedGemmTile> tile = TileFlag(); !tile.ok()) {
    std::fprintf(stderr, "moe_layer_benchmark: %s\n", tile.status().ToString().c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_ep) > 1) return MainEp(absl::GetFlag(FLAGS_ep));
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "moe_layer_benchmark: no CUDA device\n");
    return 1;
  }
  std::map<std::string, double> torch_ms;
  if (!absl::GetFlag(FLAGS_torch_json).empty()) {
    std::ifstream in(absl::GetFlag(FLAGS_torch_json));
    if (in) {
      nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
      if (!j.is_discarded() && j.contains("rows")) {
        for (const auto& r : j["rows"]) torch_ms[r[0].get<std::string>()] = r[1].get<double>();
      }
    }
  }
  absl::StatusOr<double> peak = GemmPeak();
  if (!peak.ok()) {
    std::fprintf(stderr, "GEMM peak: %s\n", peak.status().ToString().c_str());
    return 1;
  }
  std::printf("device: %s; bf16 8192^3 GEMM (cuBLAS): %.0f TFLOP/s; grads %s, tile %s\n", prop.name,
              *peak, absl::GetFlag(FLAGS_grad_dtype).c_str(), absl::GetFlag(FLAGS_tile).c_str());
  std::vector<Row> rows;
  int rc = 0;
  for (const std::string& name :
       std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_configs), ','))) {
    auto it = Configs().find(name);
    if (it == Configs().end()) {
      std::fprintf(stderr, "unknown config %s\n", name.c_str());
      return 2;
    }
    absl::StatusOr<Row> row =
        RunOne(name, it->second, absl::GetFlag(FLAGS_warmup), absl::GetFlag(FLAGS_iters));
    if (!row.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), row.status().ToString().c_str());
      rc = 1;
      continue;
    }
    rows.push_back(*row);
  }
  std::printf("%-16s %-12s %9s %9s %8s %10s %8s\n", "config", "impl", "ms", "TFLOP/s", "of peak",
              "torch ms", "speedup");
  for (const Row& r : rows) {
    auto t = torch_ms.find(r.name);
    if (t != torch_ms.end()) {
      std::printf("%-16s %-12s %9.2f %9.0f %7.1f%% %10.2f %7.2fx\n", r.name.c_str(), "switchyard",
                  r.ms, r.tflops, 100 * r.tflops / *peak, t->second, t->second / r.ms);
    } else {
      std::printf("%-16s %-12s %9.2f %9.0f %7.1f%% %10s %8s\n", r.name.c_str(), "switchyard", r.ms,
                  r.tflops, 100 * r.tflops / *peak, "-", "-");
    }
  }
  return rc;
}

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "MoE-layer benchmark: one layer forward + backward on one GPU (bf16), median of timed "
      "iterations; prints a table (bench/README.md).");
  switchyard::ParseCommandLine(argc, argv);
  return switchyard::bench::Main();
}
