#include "bench/moe_configs.h"

#include <cstdlib>

#include "bench/bench_model.h"

namespace switchyard::bench {

const std::vector<MoeLayerConfig>& MoeLayerConfigs() {
  static const auto* v = [] {
    auto* c = new std::vector<MoeLayerConfig>{
        {"mixtral8x7b", 4096, 14336, 8, 2, 8192, 0},
        {"qwen3_30b_a3b", 2048, 768, 128, 8, 8192, 0},
        {"dsv3_layer", 7168, 2048, 256, 8, 4096, 2048},
    };
    const absl::StatusOr<BenchModel> b = BenchModelByName("benchmark");
    if (!b.ok()) std::abort();  // the documented model always exists
    for (int mb : {2, 4, 8}) {
      c->push_back({"bench_model_mb" + std::to_string(mb), b->hidden, b->moe_ffn, b->experts,
                    b->topk, static_cast<int64_t>(b->seq) * mb, 0});
    }
    return c;
  }();
  return *v;
}

const MoeLayerConfig* FindMoeLayerConfig(const std::string& name) {
  for (const MoeLayerConfig& c : MoeLayerConfigs()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

}  // namespace switchyard::bench
