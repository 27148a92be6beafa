// File: bench/bench_model.h
//
// The training benchmark's documented models (bench/README.md, "The benchmark model"), shared by
// bench/train_benchmark and the tests that run the same models (bench/memory_estimate_gpu_test):
//   "benchmark": Qwen3-MoE-like, 12 layers, hidden 1536, 12 heads x 128 (4 query groups), 64
//                experts of F 384, top-8, vocab 32768, seq 4096, micro-batch 2, global batch 16;
//   "small":     4 layers, hidden 768, 6 heads x 128 (2 groups), 32 experts of F 192, top-4,
//                seq 1024, micro-batch 2, global batch 8.
// Both: every layer MoE, RMSNorm, RoPE base 1e6, QK-norm, untied output, softmax router with
// aux loss 1e-3, AdamW lr 1e-4 constant, clip 1.0, bf16, mock data.
#ifndef SWITCHYARD_BENCH_BENCH_MODEL_H_
#define SWITCHYARD_BENCH_BENCH_MODEL_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "switchyard/v1/config.pb.h"

namespace switchyard::bench {

struct BenchModel {
  int layers, hidden, heads, head_dim, groups, vocab, experts, topk, moe_ffn, seq, micro, global;
};

// INVALID_ARGUMENT naming --model for an unknown name.
absl::StatusOr<BenchModel> BenchModelByName(absl::string_view name);

// The JobSpec of `b` (display name train_benchmark_<name>), training for `iters` steps.
v1::JobSpec MakeBenchSpec(absl::string_view name, const BenchModel& b, int64_t iters);

}  // namespace switchyard::bench

#endif  // SWITCHYARD_BENCH_BENCH_MODEL_H_
