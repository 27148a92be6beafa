// File: common/model/parallel_state.h
//
// Parallel state arithmetic (megatron_moe.md §5): rank <-> coordinates and process-group member
// lists for the attention grid TP x CP x DP x PP and the expert grid ETP x EP x EDP x PP laid over
// the same ranks ("MoE parallel folding"), exactly as Megatron-Core's RankGenerator /
// generate_masked_orthogonal_rank_groups build them. Pure arithmetic: no I/O, no threads, no
// communicators. The planner and the workers both build their groups from here, so they agree by
// construction.
//
// Rank layout for the default order "tp-cp-ep-dp-pp" (axes listed fastest-varying first):
//   attention rank = tp  + TP  * (cp + CP * (dp  + DP  * pp))     DP  = W / (TP * CP * PP)
//   expert rank    = etp + ETP * (ep + EP * (edp + EDP * pp))     EDP = W / (ETP * EP * PP)
// The attention grid has EP = 1, the expert grid has CP = 1; both share the order string.
#ifndef SWITCHYARD_COMMON_MODEL_PARALLEL_STATE_H_
#define SWITCHYARD_COMMON_MODEL_PARALLEL_STATE_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/config/parallel_rules.h"

namespace switchyard {

// The sizes a layout is built from. Field names follow v1::ParallelConfig.
struct ParallelDims {
  int64_t world_size = 1;
  int64_t tensor_model_parallel_size = 1;
  int64_t context_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  int64_t expert_model_parallel_size = 1;
  // 0 means "same as tensor_model_parallel_size" (Megatron's default).
  int64_t expert_tensor_parallel_size = 0;
  int64_t num_distributed_optimizer_instances = 1;
  // Axes "tp", "cp", "ep", "dp", "pp", fastest-varying first, joined by '-'. An axis of size 1 in
  // both grids may be left out (it is appended, as Megatron does).
  std::string order = "tp-cp-ep-dp-pp";
};

// Process groups of §5.1. The comment gives the generator and its order token; a group's members
// are listed with the first axis of the order string varying fastest, and the groups of one kind
// are listed in the order Megatron creates them (by the remaining axes, fastest first).
enum class ParallelGroup {
  kTensor,                      // attention "tp"
  kContext,                     // attention "cp"
  kData,                        // attention "dp"
  kDataContext,                 // attention "dp-cp" (dense gradient reduction)
  kTensorContext,               // attention "tp-cp"
  kTensorDataContext,           // attention "tp-dp-cp" (amax, router expert-bias / global aux)
  kModel,                       // attention "tp-pp" (model parallel)
  kPipeline,                    // "pp" (identical in both grids; checked by Create)
  kExpertTensor,                // expert "tp" (ETP)
  kExpert,                      // expert "ep"
  kExpertTensorExpert,          // expert "tp-ep" (flex / allgather dispatch)
  kExpertTensorExpertPipeline,  // expert "tp-ep-pp"
  kExpertData,                  // expert "dp" (EDP: expert gradient reduction, expert dist-opt)
};
inline constexpr std::array<ParallelGroup, 13> kAllParallelGroups = {
    ParallelGroup::kTensor,
    ParallelGroup::kContext,
    ParallelGroup::kData,
    ParallelGroup::kDataContext,
    ParallelGroup::kTensorContext,
    ParallelGroup::kTensorDataContext,
    ParallelGroup::kModel,
    ParallelGroup::kPipeline,
    ParallelGroup::kExpertTensor,
    ParallelGroup::kExpert,
    ParallelGroup::kExpertTensorExpert,
    ParallelGroup::kExpertTensorExpertPipeline,
    ParallelGroup::kExpertData,
};

// "tp", "cp", "dp", "dp-cp", "tp-cp", "tp-dp-cp", "tp-pp", "pp", "etp", "ep", "etp-ep",
// "etp-ep-pp", "edp".
absl::string_view ParallelGroupName(ParallelGroup group);

struct AttentionCoord {
  int tp = 0, cp = 0, dp = 0, pp = 0;
};
struct ExpertCoord {
  int etp = 0, ep = 0, edp = 0, pp = 0;
};

// A validated layout. Immutable, cheap to copy. Methods taking a rank require 0 <= rank <
// world_size() (checked by assert); methods taking a coordinate require each component in range.
class ParallelLayout {
 public:
  // INVALID_ARGUMENT naming the field and the rule when: a size is not positive (or world_size
  // exceeds 2^24); a divisibility rule of §5.2 fails; the order has an unknown or repeated axis,
  // or leaves out an axis whose size is > 1; the order does not end with "pp", PP > 1 and
  // EDP != DP (parallel_state.py:898-902); the two grids' PP groups differ (:904-907).
  static absl::StatusOr<ParallelLayout> Create(const ParallelDims& dims);

  int world_size() const { return world_; }
  int tp() const { return attn_.size[kTp]; }
  int cp() const { return attn_.size[kCp]; }
  int dp() const { return attn_.size[kDp]; }
  int pp() const { return attn_.size[kPp]; }
  int etp() const { return expert_.size[kTp]; }
  int ep() const { return expert_.size[kEp]; }
  int edp() const { return expert_.size[kDp]; }
  int num_distributed_optimizer_instances() const { return instances_; }
  // The full order, with any appended axes ("tp-cp-ep-dp-pp" by default).
  const std::string& order() const { return order_; }

  AttentionCoord AttentionCoordOf(int rank) const;
  ExpertCoord ExpertCoordOf(int rank) const;
  int AttentionRank(const AttentionCoord& c) const;
  int ExpertRank(const ExpertCoord& c) const;

  // Members of `rank`'s group of this kind, in Megatron's order; contains `rank`.
  std::vector<int> Group(ParallelGroup group, int rank) const;
  // Position of that group in AllGroups(group), and of `rank` within it.
  int GroupIndex(ParallelGroup group, int rank) const;
  int RankInGroup(ParallelGroup group, int rank) const;
  int GroupSize(ParallelGroup group) const;
  int NumGroups(ParallelGroup group) const { return world_ / GroupSize(group); }
  // Every group of this kind, in the order Megatron creates them; they partition the world.
  std::vector<std::vector<int>> AllGroups(ParallelGroup group) const;

 private:
  // Axis slots, fixed; the order string decides the strides.
  enum Axis { kTp = 0, kCp, kEp, kDp, kPp, kNumAxes };
  struct Grid {
    std::array<int, kNumAxes> size{};
    std::array<int, kNumAxes> stride{};
    std::array<int, kNumAxes> coord(int rank) const;
  };
  struct Spec {
    const Grid* grid;
    unsigned mask;  // bit per Axis in the group
  };

  ParallelLayout() = default;
  Spec SpecOf(ParallelGroup group) const;
  // Linear index over the axes selected by `bits`, taken in order_axes_ order (fastest first).
  int LinearIndex(const Grid& g, unsigned bits, int rank) const;
  std::vector<int> Members(const Grid& g, unsigned mask, int base) const;

  int world_ = 1;
  int instances_ = 1;
  std::string order_;
  std::array<int, kNumAxes> order_axes_{};  // axes, fastest first
  Grid attn_, expert_;
};

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_MODEL_PARALLEL_STATE_H_
