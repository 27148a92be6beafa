// CPU reference of the permutation ops (permute.h): plain loops, fp64 sums, exact row copies.
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/moe/permute.h"

namespace switchyard::kernels::internal {
namespace {

// Copies element `src_i` of `src` to element `dst_i` of `dst`, `n` elements (same dtype).
void CopyElems(const Tensor& src, int64_t src_i, const Tensor& dst, int64_t dst_i, int64_t n) {
  const size_t es = DTypeSize(src.dtype);
  std::memcpy(static_cast<char*>(dst.data) + dst_i * es,
              static_cast<const char*>(src.data) + src_i * es, n * es);
}

absl::Status CheckExpertIds(const Tensor& topk_idx, int64_t num_experts) {
  const int32_t* idx = topk_idx.as<int32_t>();
  for (int64_t i = 0; i < topk_idx.numel(); ++i) {
    if (idx[i] < -1 || idx[i] >= num_experts) {
      return absl::InvalidArgumentError(
          absl::StrCat("topk_idx[", i / topk_idx.dim(1), ", ", i % topk_idx.dim(1), "] = ", idx[i],
                       " is outside [-1, num_experts = ", num_experts, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRowMapValues(const Tensor& row_map, int64_t max_rows) {
  const int32_t* map = row_map.as<int32_t>();
  for (int64_t i = 0; i < row_map.numel(); ++i) {
    if (map[i] < -1 || map[i] >= max_rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("row_map[", i / row_map.dim(1), ", ", i % row_map.dim(1), "] = ", map[i],
                       " is outside [-1, max_rows = ", max_rows, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TokensPerExpertCpu(const Tensor& topk_idx, int64_t num_experts, const Tensor& counts) {
  if (absl::Status s = CheckExpertIds(topk_idx, num_experts); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("TokensPerExpert: ", s.message()));
  }
  int32_t* c = counts.as<int32_t>();
  std::fill(c, c + num_experts, 0);
  const int32_t* idx = topk_idx.as<int32_t>();
  for (int64_t i = 0; i < topk_idx.numel(); ++i) {
    if (idx[i] >= 0) ++c[idx[i]];
  }
  return absl::OkStatus();
}

absl::Status PermuteCpu(const Tensor& x, const Tensor& topk_idx, const Tensor& topk_probs,
                        int64_t num_experts, int64_t pad_to_capacity, int64_t max_rows,
                        const Tensor& permuted_x, const Tensor& permuted_probs,
                        const Tensor& row_map, const Tensor& source_rows,
                        const Tensor& tokens_per_expert) {
  if (absl::Status s = CheckExpertIds(topk_idx, num_experts); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("Permute: ", s.message()));
  }
  const int64_t t_count = topk_idx.dim(0), k = topk_idx.dim(1);
  const bool move_rows = permuted_x.data != nullptr;
  const int64_t h = move_rows ? x.dim(1) : 0;
  int32_t* sources = source_rows.data != nullptr ? source_rows.as<int32_t>() : nullptr;
  const int32_t* idx = topk_idx.as<int32_t>();
  std::vector<int64_t> counts(num_experts, 0);
  for (int64_t i = 0; i < t_count * k; ++i) {
    if (idx[i] >= 0) ++counts[idx[i]];
  }
  int64_t kept = 0;
  for (int64_t n : counts) kept += n;
  if (pad_to_capacity == 0 && kept > max_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        move_rows ? "Permute" : "PermuteIndex", ": the routing keeps ", kept, " slots, more than ",
        move_rows ? "permuted_x's " : "source_rows' ", max_rows, " rows (max_routed_rows)"));
  }
  std::vector<int64_t> start(num_experts, 0);
  for (int64_t e = 0; e < num_experts; ++e) {
    if (pad_to_capacity > 0 && counts[e] > pad_to_capacity) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Permute: expert ", e, " receives ", counts[e], " tokens, more than pad_to_capacity (",
          pad_to_capacity, "); the router must drop them first"));
    }
    start[e] =
        pad_to_capacity > 0 ? e * pad_to_capacity : (e == 0 ? 0 : start[e - 1] + counts[e - 1]);
  }
  // Visiting (token, slot) in ascending order fills each expert in ascending token order.
  std::vector<int64_t> cursor = start;
  int32_t* map = row_map.as<int32_t>();
  for (int64_t i = 0; i < t_count * k; ++i) {
    if (idx[i] < 0) {
      map[i] = -1;
      continue;
    }
    const int64_t row = cursor[idx[i]]++;
    map[i] = static_cast<int32_t>(row);
    if (move_rows) CopyElems(x, (i / k) * h, permuted_x, row * h, h);
    if (sources != nullptr) sources[row] = static_cast<int32_t>(i / k);
    CopyElems(topk_probs, i, permuted_probs, row, 1);
  }
  int32_t* tpe = tokens_per_expert.as<int32_t>();
  for (int64_t e = 0; e < num_experts; ++e) {
    tpe[e] = static_cast<int32_t>(pad_to_capacity > 0 ? pad_to_capacity : counts[e]);
    if (pad_to_capacity == 0) continue;
    for (int64_t row = start[e] + counts[e]; row < start[e] + pad_to_capacity; ++row) {
      std::memset(static_cast<char*>(permuted_x.data) + row * h * DTypeSize(permuted_x.dtype), 0,
                  h * DTypeSize(permuted_x.dtype));
      StoreFromDouble(permuted_probs, row, 0.0);
    }
  }
  return absl::OkStatus();
}

absl::Status GatherSumCpu(const Tensor& y, const Tensor& probs, const Tensor& row_map,
                          const Tensor& out, const Tensor& out_probs) {
  if (absl::Status s = CheckRowMapValues(row_map, y.dim(0)); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(probs.data ? "PermuteBackward: " : "Unpermute: ", s.message()));
  }
  const int64_t t_count = out.dim(0), h = out.dim(1), k = row_map.dim(1);
  const int32_t* map = row_map.as<int32_t>();
  std::vector<double> acc(h);
  for (int64_t t = 0; t < t_count; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t s = 0; s < k; ++s) {
      const int64_t row = map[t * k + s];
      if (out_probs.data != nullptr)
        StoreFromDouble(out_probs, t * k + s, row < 0 ? 0.0 : LoadAsDouble(probs, row));
      if (row < 0) continue;
      for (int64_t j = 0; j < h; ++j) acc[j] += LoadAsDouble(y, row * h + j);
    }
    for (int64_t j = 0; j < h; ++j) StoreFromDouble(out, t * h + j, acc[j]);
  }
  return absl::OkStatus();
}

absl::Status ScatterRowsCpu(const Tensor& dout, const Tensor& row_map, const Tensor& dy,
                            bool zero_unmapped_rows) {
  if (absl::Status s = CheckRowMapValues(row_map, dy.dim(0)); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("UnpermuteBackward: ", s.message()));
  }
  if (zero_unmapped_rows && dy.numel() > 0) std::memset(dy.data, 0, dy.bytes());
  const int64_t t_count = dout.dim(0), h = dout.dim(1), k = row_map.dim(1);
  const int32_t* map = row_map.as<int32_t>();
  for (int64_t i = 0; i < t_count * k; ++i) {
    if (map[i] >= 0) CopyElems(dout, (i / k) * h, dy, map[i] * h, h);
  }
  return absl::OkStatus();
}

}  // namespace switchyard::kernels::internal
