// File: worker/train/data_split.cc

#include "worker/train/data_split.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace switchyard::train {

absl::StatusOr<std::array<DocumentRange, 3>> SplitDocuments(const std::string& split,
                                                            int64_t num_documents) {
  if (num_documents < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.split: the dataset has a negative document count (", num_documents, ")"));
  }
  std::vector<std::string> parts = absl::StrSplit(split, absl::ByAnyChar(",/"));
  std::array<double, 3> w = {0, 0, 0};
  double sum = 0;
  bool ok = parts.size() <= 3;
  for (size_t i = 0; ok && i < parts.size(); ++i) {
    double x = 0;
    ok = absl::SimpleAtod(parts[i], &x) && x >= 0 && std::isfinite(x);
    w[i] = x;
    sum += ok ? x : 0;
  }
  if (!ok || !(sum > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.split (\"", split,
                     "\") must be up to 3 non-negative numbers separated by ',' or '/' with a "
                     "positive sum (e.g. \"969,30,1\")"));
  }
  // Megatron's _get_split_indices. Python's round() is round-half-to-even, as std::nearbyint in
  // the default rounding mode: the same document boundaries as Megatron on the same dataset.
  std::array<int64_t, 4> idx = {0, 0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    idx[i + 1] = idx[i] + static_cast<int64_t>(
                              std::nearbyint(w[i] / sum * static_cast<double>(num_documents)));
  }
  const int64_t shift = idx[3] - num_documents;
  for (int i = 1; i < 4; ++i) idx[i] -= shift;
  std::array<DocumentRange, 3> out;
  for (int i = 0; i < 3; ++i) {
    // Clamp: a shift can push an empty leading range below 0 in degenerate splits.
    const int64_t b = std::max<int64_t>(0, std::min(idx[i], num_documents));
    const int64_t e = std::max<int64_t>(b, std::min(idx[i + 1], num_documents));
    out[i] = {b, e};
  }
  return out;
}

}  // namespace switchyard::train
