// Causal GQA attention benchmark: bf16 forward and backward of kernels/attention on one GPU, random
// inputs (N(0, 1)), scale 1/sqrt(D), median of --iters timed iterations after --warmup warm-ups,
// CUDA events. TFLOP/s counts causal FLOPs: forward 2 * 2 * B * Hq * S^2 / 2 * D (QK^T and PV over
// the lower triangle), backward 2.5x that (five products, the delta pass not counted).
// Every shape runs on each backend (attention.h): the native kernels, cuDNN with its
// deterministic backward, and cuDNN's default (atomic dQ) backward. The PyTorch reference is
// bench/torch_attention_baseline.py (same shapes), run beside it by tools/run_gpu_bench.sh.
//
//   attention_benchmark [--iters 20] [--warmup 3]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "bench/bench_util.h"
#include "common/command_line.h"
#include "common/status.h"
#include "kernels/attention/attention.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/runtime/buffer.h"
#include "kernels/runtime/cuda_status.h"

ABSL_FLAG(int, iters, 20, "timed iterations (median reported)");
ABSL_FLAG(int, warmup, 3, "warm-up iterations");

namespace switchyard::bench {
namespace {

using kernels::Buffer;

struct Shape {
  int64_t b, s, hq, hkv, d;
};

struct Backend {
  const char* name;
  kernels::AttentionSettings settings;
};

struct Row {
  Shape shape;
  const char* backend = "";
  double fwd_ms = 0, bwd_ms = 0, fwd_tflops = 0, bwd_tflops = 0;
};

absl::StatusOr<Row> RunOne(const Shape& c, int warmup, int iters) {
  const Device dev = Device::Cuda(0);
  const Stream s{dev, nullptr};
  const int64_t t_n = c.b * c.s;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  auto make = [&](DType dt, std::vector<int64_t> shape) {
    return Buffer::ForTensor(dt, std::move(shape), dev);
  };
  SY_ASSIGN_OR_RETURN(Buffer q, make(DType::kBF16, {t_n, c.hq, c.d}));
  SY_ASSIGN_OR_RETURN(Buffer k, make(DType::kBF16, {t_n, c.hkv, c.d}));
  SY_ASSIGN_OR_RETURN(Buffer v, make(DType::kBF16, {t_n, c.hkv, c.d}));
  SY_ASSIGN_OR_RETURN(Buffer o, make(DType::kBF16, {t_n, c.hq, c.d}));
  SY_ASSIGN_OR_RETURN(Buffer d_o, make(DType::kBF16, {t_n, c.hq, c.d}));
  SY_ASSIGN_OR_RETURN(Buffer dq, make(DType::kBF16, {t_n, c.hq, c.d}));
  SY_ASSIGN_OR_RETURN(Buffer dk, make(DType::kBF16, {t_n, c.hkv, c.d}));
  SY_ASSIGN_OR_RETURN(Buffer dv, make(DType::kBF16, {t_n, c.hkv, c.d}));
  SY_ASSIGN_OR_RETURN(Buffer lse, make(DType::kF32, {c.b, c.hq, c.s}));
  SY_ASSIGN_OR_RETURN(Buffer delta, make(DType::kF32, {c.b, c.hq, c.s}));
  uint64_t seed = 1;
  for (Buffer* x : {&q, &k, &v, &d_o}) {
    SY_RETURN_IF_ERROR(kernels::FillNormal(s, x->View(), ++seed, 1.0f));
  }
  auto forward = [&] {
    return kernels::AttentionForward(s, q.View(), k.View(), v.View(), c.s, scale, o.View(),
                                     lse.View());
  };
  auto backward = [&] {
    return kernels::AttentionBackward(s, q.View(), k.View(), v.View(), o.View(), lse.View(),
                                      d_o.View(), c.s, scale, delta.View(), dq.View(), dk.View(),
                                      dv.View());
  };
  Row row{c, ""};
  SY_ASSIGN_OR_RETURN(row.fwd_ms, MedianMs(forward, warmup, iters));
  SY_ASSIGN_OR_RETURN(row.bwd_ms, MedianMs(backward, warmup, iters));
  const double fwd_flops = 2.0 * 2.0 * c.b * c.hq * (static_cast<double>(c.s) * c.s / 2) * c.d;
  row.fwd_tflops = fwd_flops / row.fwd_ms / 1e9;
  row.bwd_tflops = 2.5 * fwd_flops / row.bwd_ms / 1e9;
  return row;
}

int Main() {
  int devices = 0;
  cudaDeviceProp prop;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0 ||
      cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::printf("attention_benchmark: no CUDA device, nothing to measure\n");
    return 0;
  }
  // The benchmark model's layer (12 query heads, 4 groups, S = 4096) at micro-batch 2 and 4 first.
  const Shape shapes[] = {{2, 4096, 12, 4, 128}, {4, 4096, 12, 4, 128}, {1, 4096, 16, 16, 128},
                          {2, 4096, 16, 4, 128}, {1, 8192, 8, 8, 128},  {4, 2048, 16, 16, 64}};
  const Backend backends[] = {
      {"native", {kernels::AttentionBackend::kNative, true}},
      {"cudnn-det", {kernels::AttentionBackend::kCudnn, true}},
      {"cudnn", {kernels::AttentionBackend::kCudnn, false}},
  };
  std::printf("attention backends: %s\n", kernels::DescribeAttentionBackend().c_str());
  std::printf("device: %s; causal attention, bf16, median of %d after %d warm-ups\n", prop.name,
              absl::GetFlag(FLAGS_iters), absl::GetFlag(FLAGS_warmup));
  std::vector<Row> rows;
  int rc = 0;
  for (const Shape& c : shapes) {
    for (const Backend& be : backends) {
      kernels::SetAttentionSettings(be.settings);
      absl::StatusOr<Row> row = RunOne(c, absl::GetFlag(FLAGS_warmup), absl::GetFlag(FLAGS_iters));
      if (!row.ok()) {
        std::fprintf(stderr, "%s B=%lld S=%lld: %s\n", be.name, static_cast<long long>(c.b),
                     static_cast<long long>(c.s), row.status().ToString().c_str());
        rc = 1;
        continue;
      }
      row->backend = be.name;
      rows.push_back(*row);
    }
  }
  kernels::SetAttentionSettings(kernels::AttentionSettings{});
  std::printf("%-10s %3s %6s %4s %4s %4s %10s %10s %10s %10s\n", "backend", "B", "S", "Hq", "Hkv",
              "D", "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s");
  for (const Row& r : rows) {
    std::printf("%-10s %3lld %6lld %4lld %4lld %4lld %10.3f %10.0f %10.3f %10.0f\n", r.backend,
                static_cast<long long>(r.shape.b), static_cast<long long>(r.shape.s),
                static_cast<long long>(r.shape.hq), static_cast<long long>(r.shape.hkv),
                static_cast<long long>(r.shape.d), r.fwd_ms, r.fwd_tflops, r.bwd_ms, r.bwd_tflops);
  }
  return rc;
}

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Causal GQA attention benchmark: bf16 forward and backward on one GPU; prints ms and TFLOP/s "
      "per shape (bench/README.md).");
  switchyard::ParseCommandLine(argc, argv);
  return switchyard::bench::Main();
}
