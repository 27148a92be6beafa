// File: bench/moe_configs.h
//
// The MoE layers the layer benchmarks measure, in one table for moe_layer_benchmark (the whole
// layer, forward + backward) and grouped_gemm_benchmark (its expert GEMMs tile by tile):
// BASELINES.md's three configs, then one MoE layer of train_benchmark's benchmark model
// (bench_model.h, "benchmark": its hidden size, experts, top-k and expert FFN) at micro-batch 2,
// 4 and 8 of its sequence length.
#ifndef SWITCHYARD_BENCH_MOE_CONFIGS_H_
#define SWITCHYARD_BENCH_MOE_CONFIGS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace switchyard::bench {

struct MoeLayerConfig {
  std::string name;
  int64_t hidden, ffn, experts, topk, tokens, shared_ffn;  // shared_ffn 0: no shared expert
};

// In the order above; names are unique.
const std::vector<MoeLayerConfig>& MoeLayerConfigs();

// The entry named `name`, or nullptr.
const MoeLayerConfig* FindMoeLayerConfig(const std::string& name);

}  // namespace switchyard::bench

#endif  // SWITCHYARD_BENCH_MOE_CONFIGS_H_
