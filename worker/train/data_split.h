// File: worker/train/data_split.h
//
// Megatron's data.split ("969,30,1"): the train / valid / test document ranges of an indexed
// dataset. Megatron (megatron/core/datasets/utils.py) normalises the up-to-3 weights (missing
// ones are 0), then split_indices[i + 1] = split_indices[i] + round(w_i * N) and shifts every
// index after the first so that the last is N. Training reads [0, split_indices[1]), validation
// [split_indices[1], split_indices[2]), test [split_indices[2], N).
//
// WHY a separate file: validation loss (issue 18 item 1) needs the valid range, and trainer.cc
// is edited by several helpers at once; this keeps the arithmetic in one tested place. The
// trainer takes both ranges from here (Trainer::Init; TrainDocuments is a wrapper kept for its
// callers), so training and evaluation can never disagree on where the valid share starts.

#ifndef SWITCHYARD_WORKER_TRAIN_DATA_SPLIT_H_
#define SWITCHYARD_WORKER_TRAIN_DATA_SPLIT_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace switchyard::train {

// A half-open document range [begin, end).
struct DocumentRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// The train, valid and test ranges of `num_documents` documents under `split`. INVALID_ARGUMENT
// naming data.split when it is not up to 3 non-negative numbers (',' or '/' separated) with a
// positive sum, or when num_documents is negative. Ranges may be empty (e.g. "100,0,0").
absl::StatusOr<std::array<DocumentRange, 3>> SplitDocuments(const std::string& split,
                                                            int64_t num_documents);

}  // namespace switchyard::train

#endif  // SWITCHYARD_WORKER_TRAIN_DATA_SPLIT_H_
