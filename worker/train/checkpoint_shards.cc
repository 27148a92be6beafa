// File: worker/train/checkpoint_shards.cc
#include "worker/train/checkpoint_shards.h"

#include "absl/strings/match.h"

namespace switchyard::train {

ShardSlice ModelParallelSlice(const model::ParamInfo& p, const model::GptConfig& c) {
  ShardSlice s = ShardSlice::Whole(p.global_shape);
  if (p.tp_sharded() && c.tp_size > 1) {
    const int64_t part = p.global_shape[p.tp_dim] / p.tp_parts, piece = part / c.tp_size;
    std::vector<DimRun>& runs = s.runs[p.tp_dim];
    runs.clear();
    for (int j = 0; j < p.tp_parts; ++j) runs.push_back({j * part + c.tp_rank * piece, piece});
  }
  if (p.expert) {
    const int64_t l = p.shape[0];
    s.runs[0] = {{c.moe.ep_rank * l, l}};
    const int64_t etp = c.moe.etp_size, f = c.moe.ffn_hidden_size, fl = c.moe.local_ffn_size();
    if (etp > 1 && absl::EndsWith(p.name, ".fc1")) {
      s.runs[2] = {{c.moe.etp_rank * fl, fl}, {f + c.moe.etp_rank * fl, fl}};
    } else if (etp > 1 && absl::EndsWith(p.name, ".fc2")) {
      s.runs[1] = {{c.moe.etp_rank * fl, fl}};
    }
  }
  return s;
}

}  // namespace switchyard::train
