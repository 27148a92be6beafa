// File: common/model/parallel_state.cc
//
// RankGenerator arithmetic (Megatron-Core parallel_state.py:269-375, :465-557, :601-1580).
#include "common/model/parallel_state.h"

#include <cassert>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace switchyard {

namespace {

constexpr int64_t kMaxWorld = int64_t{1} << 24;
constexpr const char* kAxisNames[] = {"tp", "cp", "ep", "dp", "pp"};

}  // namespace

absl::string_view ParallelGroupName(ParallelGroup group) {
  switch (group) {
    case ParallelGroup::kTensor:
      return "tp";
    case ParallelGroup::kContext:
      return "cp";
    case ParallelGroup::kData:
      return "dp";
    case ParallelGroup::kDataContext:
      return "dp-cp";
    case ParallelGroup::kTensorContext:
      return "tp-cp";
    case ParallelGroup::kTensorDataContext:
      return "tp-dp-cp";
    case ParallelGroup::kModel:
      return "tp-pp";
    case ParallelGroup::kPipeline:
      return "pp";
    case ParallelGroup::kExpertTensor:
      return "etp";
    case ParallelGroup::kExpert:
      return "ep";
    case ParallelGroup::kExpertTensorExpert:
      return "etp-ep";
    case ParallelGroup::kExpertTensorExpertPipeline:
      return "etp-ep-pp";
    case ParallelGroup::kExpertData:
      return "edp";
  }
  return "unknown";
}

std::array<int, 5> ParallelLayout::Grid::coord(int rank) const {
  std::array<int, kNumAxes> c{};
  for (int a = 0; a < kNumAxes; ++a) c[a] = (rank / stride[a]) % size[a];
  return c;
}

absl::StatusOr<ParallelLayout> ParallelLayout::Create(const ParallelDims& d) {
  const int64_t etp = d.expert_tensor_parallel_size == 0 ? d.tensor_model_parallel_size
                                                         : d.expert_tensor_parallel_size;
  std::vector<std::string> errors;
  if (d.world_size <= 0 || d.world_size > kMaxWorld) {
    errors.push_back(
        absl::StrCat("world_size (", d.world_size, ") must be in [1, ", kMaxWorld, "]"));
  }
  const std::pair<const char*, int64_t> sizes[] = {
      {"tensor_model_parallel_size", d.tensor_model_parallel_size},
      {"context_parallel_size", d.context_parallel_size},
      {"pipeline_model_parallel_size", d.pipeline_model_parallel_size},
      {"expert_model_parallel_size", d.expert_model_parallel_size},
      {"expert_tensor_parallel_size", etp},
      {"num_distributed_optimizer_instances", d.num_distributed_optimizer_instances},
  };
  for (const auto& [name, value] : sizes) {
    if (value <= 0) {
      errors.push_back(absl::StrCat(name, " (", value, ") must be positive"));
    } else if (errors.empty() && value > d.world_size) {
      errors.push_back(
          absl::StrCat(name, " (", value, ") must be at most world_size (", d.world_size, ")"));
    }
  }
  if (!errors.empty()) return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
  errors = ParallelDivisibilityViolations("", d.world_size, d.tensor_model_parallel_size,
                                          d.context_parallel_size, d.pipeline_model_parallel_size,
                                          d.expert_model_parallel_size, etp,
                                          d.num_distributed_optimizer_instances);
  if (!errors.empty()) return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));

  ParallelLayout l;
  l.world_ = static_cast<int>(d.world_size);
  l.instances_ = static_cast<int>(d.num_distributed_optimizer_instances);
  const int pp = static_cast<int>(d.pipeline_model_parallel_size);
  l.attn_.size = {static_cast<int>(d.tensor_model_parallel_size),
                  static_cast<int>(d.context_parallel_size), 1, 0, pp};
  l.attn_.size[kDp] = l.world_ / (l.attn_.size[kTp] * l.attn_.size[kCp] * pp);
  l.expert_.size = {static_cast<int>(etp), 1, static_cast<int>(d.expert_model_parallel_size), 0,
                    pp};
  l.expert_.size[kDp] = l.world_ / (l.expert_.size[kTp] * l.expert_.size[kEp] * pp);

  // Order: known axes, no repeats; missing axes must have size 1 in both grids (then appended).
  bool seen[kNumAxes] = {};
  int n = 0;
  for (absl::string_view token : absl::StrSplit(d.order, '-')) {
    int axis = -1;
    for (int a = 0; a < kNumAxes; ++a) {
      if (token == kAxisNames[a]) axis = a;
    }
    if (axis < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("order (\"", d.order, "\") has unknown axis \"", token,
                       "\": axes are \"tp\", \"cp\", \"ep\", \"dp\", \"pp\" joined by '-'"));
    }
    if (seen[axis]) {
      return absl::InvalidArgumentError(
          absl::StrCat("order (\"", d.order, "\") repeats axis \"", token, "\""));
    }
    seen[axis] = true;
    l.order_axes_[n++] = axis;
  }
  l.order_ = d.order;
  for (int a = 0; a < kNumAxes; ++a) {
    if (seen[a]) continue;
    if (l.attn_.size[a] != 1 || l.expert_.size[a] != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("order (\"", d.order, "\") must contain axis \"", kAxisNames[a],
                       "\" because its size is > 1 (attention ", l.attn_.size[a], ", expert ",
                       l.expert_.size[a], ")"));
    }
    l.order_axes_[n++] = a;
    absl::StrAppend(&l.order_, "-", kAxisNames[a]);
  }
  for (Grid* g : {&l.attn_, &l.expert_}) {
    int stride = 1;
    for (int a : l.order_axes_) {
      g->stride[a] = stride;
      stride *= g->size[a];
    }
  }

  // parallel_state.py:898-902.
  if (l.order_axes_[kNumAxes - 1] != kPp && pp > 1 && l.dp() != l.edp()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "order (\"", l.order_, "\") does not end with \"pp\" and pipeline_model_parallel_size (",
        pp, ") > 1, so the expert data-parallel size (", l.edp(),
        ") must equal the data-parallel size (", l.dp(), ")"));
  }
  // parallel_state.py:904-907. A rank's PP group is {r + (p - pp(r)) * stride : p < PP} in each
  // grid, and pp(r) = (r / stride) % PP, so the groups agree for every rank iff the strides do.
  if (pp > 1 && l.attn_.stride[kPp] != l.expert_.stride[kPp]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "order (\"", l.order_, "\"): the attention and expert pipeline groups differ (pp stride ",
        l.attn_.stride[kPp], " vs ", l.expert_.stride[kPp], "); they must be identical"));
  }
  return l;
}

AttentionCoord ParallelLayout::AttentionCoordOf(int rank) const {
  assert(rank >= 0 && rank < world_);
  const auto c = attn_.coord(rank);
  return {c[kTp], c[kCp], c[kDp], c[kPp]};
}

ExpertCoord ParallelLayout::ExpertCoordOf(int rank) const {
  assert(rank >= 0 && rank < world_);
  const auto c = expert_.coord(rank);
  return {c[kTp], c[kEp], c[kDp], c[kPp]};
}

int ParallelLayout::AttentionRank(const AttentionCoord& c) const {
  assert(c.tp >= 0 && c.tp < tp() && c.cp >= 0 && c.cp < cp() && c.dp >= 0 && c.dp < dp() &&
         c.pp >= 0 && c.pp < pp());
  return c.tp * attn_.stride[kTp] + c.cp * attn_.stride[kCp] + c.dp * attn_.stride[kDp] +
         c.pp * attn_.stride[kPp];
}

int ParallelLayout::ExpertRank(const ExpertCoord& c) const {
  assert(c.etp >= 0 && c.etp < etp() && c.ep >= 0 && c.ep < ep() && c.edp >= 0 && c.edp < edp() &&
         c.pp >= 0 && c.pp < pp());
  return c.etp * expert_.stride[kTp] + c.ep * expert_.stride[kEp] + c.edp * expert_.stride[kDp] +
         c.pp * expert_.stride[kPp];
}

ParallelLayout::Spec ParallelLayout::SpecOf(ParallelGroup group) const {
  constexpr unsigned tp = 1u << kTp, cp = 1u << kCp, ep = 1u << kEp, dp = 1u << kDp, pp = 1u << kPp;
  switch (group) {
    case ParallelGroup::kTensor:
      return {&attn_, tp};
    case ParallelGroup::kContext:
      return {&attn_, cp};
    case ParallelGroup::kData:
      return {&attn_, dp};
    case ParallelGroup::kDataContext:
      return {&attn_, dp | cp};
    case ParallelGroup::kTensorContext:
      return {&attn_, tp | cp};
    case ParallelGroup::kTensorDataContext:
      return {&attn_, tp | dp | cp};
    case ParallelGroup::kModel:
      return {&attn_, tp | pp};
    case ParallelGroup::kPipeline:
      return {&attn_, pp};
    case ParallelGroup::kExpertTensor:
      return {&expert_, tp};
    case ParallelGroup::kExpert:
      return {&expert_, ep};
    case ParallelGroup::kExpertTensorExpert:
      return {&expert_, tp | ep};
    case ParallelGroup::kExpertTensorExpertPipeline:
      return {&expert_, tp | ep | pp};
    case ParallelGroup::kExpertData:
      return {&expert_, dp};
  }
  assert(false);
  return {&attn_, tp};
}

int ParallelLayout::LinearIndex(const Grid& g, unsigned bits, int rank) const {
  const auto c = g.coord(rank);
  int index = 0, scale = 1;
  for (int a : order_axes_) {
    if (!(bits & (1u << a))) continue;
    index += c[a] * scale;
    scale *= g.size[a];
  }
  return index;
}

std::vector<int> ParallelLayout::Members(const Grid& g, unsigned mask, int base) const {
  // Odometer over the masked axes, first axis of the order fastest.
  int axes[kNumAxes], n = 0, count = 1;
  for (int a : order_axes_) {
    if (mask & (1u << a)) {
      axes[n++] = a;
      count *= g.size[a];
    }
  }
  std::vector<int> out;
  out.reserve(count);
  int idx[kNumAxes] = {};
  int rank = base;
  for (int i = 0; i < count; ++i) {
    out.push_back(rank);
    for (int k = 0; k < n; ++k) {
      const int a = axes[k];
      if (++idx[k] < g.size[a]) {
        rank += g.stride[a];
        break;
      }
      rank -= (g.size[a] - 1) * g.stride[a];
      idx[k] = 0;
    }
  }
  return out;
}

std::vector<int> ParallelLayout::Group(ParallelGroup group, int rank) const {
  assert(rank >= 0 && rank < world_);
  const Spec s = SpecOf(group);
  const auto c = s.grid->coord(rank);
  int base = rank;
  for (int a = 0; a < kNumAxes; ++a) {
    if (s.mask & (1u << a)) base -= c[a] * s.grid->stride[a];
  }
  return Members(*s.grid, s.mask, base);
}

int ParallelLayout::GroupIndex(ParallelGroup group, int rank) const {
  assert(rank >= 0 && rank < world_);
  const Spec s = SpecOf(group);
  return LinearIndex(*s.grid, ~s.mask & ((1u << kNumAxes) - 1), rank);
}

int ParallelLayout::RankInGroup(ParallelGroup group, int rank) const {
  assert(rank >= 0 && rank < world_);
  const Spec s = SpecOf(group);
  return LinearIndex(*s.grid, s.mask, rank);
}

int ParallelLayout::GroupSize(ParallelGroup group) const {
  const Spec s = SpecOf(group);
  int size = 1;
  for (int a = 0; a < kNumAxes; ++a) {
    if (s.mask & (1u << a)) size *= s.grid->size[a];
  }
  return size;
}

std::vector<std::vector<int>> ParallelLayout::AllGroups(ParallelGroup group) const {
  const Spec s = SpecOf(group);
  const unsigned outer = ~s.mask & ((1u << kNumAxes) - 1);
  // The group bases are the members of the complementary "group" through rank 0, in order.
  const std::vector<int> bases = Members(*s.grid, outer, 0);
  std::vector<std::vector<int>> out;
  out.reserve(bases.size());
  for (int base : bases) out.push_back(Members(*s.grid, s.mask, base));
  return out;
}

}  // namespace switchyard
