// File: data/gpt_samples.h
//
// The sample index of Megatron's GPTDataset (megatron/core/datasets/gpt_dataset.py): documents
// are visited in a shuffled order, concatenated into one token stream, and the stream is cut
// into windows of seq_length + 1 tokens (inputs are tokens [0, seq_length), labels [1,
// seq_length]). Consecutive windows share one token: window w covers stream positions
// [w * seq_length, w * seq_length + seq_length], so the label of window w's last position is
// the first input of window w + 1, and no token is lost between windows. The windows are then
// visited in a shuffled order: sample i is window WindowOf(i).
//
// Epochs. With num_samples > 0 the index uses the fewest epochs E whose stream of
// E * tokens_per_epoch tokens yields at least num_samples windows, as Megatron's
// _get_num_epochs does; size() = (E * tokens_per_epoch - 1) / seq_length >= num_samples
// (the tail of the stream that does not fill a window is dropped). With num_samples = 0,
// num_epochs is used as given.
//
// Determinism. Everything is a pure function of (document lengths, seq_length, seed, E): one
// std::mt19937_64 seeded with `seed` shuffles the documents of epoch 0, 1, ..., E-1 in turn
// (explicit Fisher-Yates with an unbiased rejection draw, so the order is the same on every
// platform and standard library), then shuffles the windows. Resuming a run at sample k is
// therefore: build the index again with the same options and continue at Sample(k).
//
// Deliberate differences from Megatron (whose numpy RandomState streams cannot be reproduced
// with std::mt19937_64 anyway, so the orders differ from Megatron's for the same seed):
//   - each epoch is a permutation of all documents of its own (Megatron shuffles the
//     concatenation of all epochs jointly, so one epoch may repeat a document);
//   - no separate_final_epoch handling: all windows are shuffled together;
//   - no add_extra_token_to_sequence = False mode, no per-rank caching of the index on disk.
#ifndef SWITCHYARD_DATA_GPT_SAMPLES_H_
#define SWITCHYARD_DATA_GPT_SAMPLES_H_

#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "data/indexed_dataset.h"

namespace switchyard {

// The documents a sample index draws tokens from. Implementations must be thread-safe for
// concurrent const calls if the GptSamples using them is shared across threads.
class TokenDocuments {
 public:
  virtual ~TokenDocuments() = default;
  virtual int64_t num_documents() const = 0;
  // Precondition: 0 <= doc < num_documents(). Result >= 0.
  virtual int64_t DocumentLength(int64_t doc) const = 0;
  // Copies tokens [offset, offset + out.size()) of document `doc` into `out`.
  virtual absl::Status ReadTokens(int64_t doc, int64_t offset, absl::Span<int32_t> out) const = 0;
};

// Documents held in memory (tests, small corpora).
class InMemoryDocuments : public TokenDocuments {
 public:
  explicit InMemoryDocuments(std::vector<std::vector<int32_t>> documents)
      : documents_(std::move(documents)) {}
  int64_t num_documents() const override { return static_cast<int64_t>(documents_.size()); }
  int64_t DocumentLength(int64_t doc) const override {
    return static_cast<int64_t>(documents_[doc].size());
  }
  absl::Status ReadTokens(int64_t doc, int64_t offset, absl::Span<int32_t> out) const override;

 private:
  std::vector<std::vector<int32_t>> documents_;
};

// The sequences of an IndexedDataset as documents. As in Megatron's GPTDataset, the unit is the
// dataset's SEQUENCE (preprocess_data.py writes one sequence per document unless sentences are
// split). Tokens are widened to int32 (IndexedDataset::ReadTokens).
class IndexedDatasetDocuments : public TokenDocuments {
 public:
  explicit IndexedDatasetDocuments(IndexedDataset dataset) : dataset_(std::move(dataset)) {}
  int64_t num_documents() const override { return dataset_.num_sequences(); }
  int64_t DocumentLength(int64_t doc) const override { return dataset_.SequenceLength(doc); }
  absl::Status ReadTokens(int64_t doc, int64_t offset, absl::Span<int32_t> out) const override {
    return dataset_.ReadTokens(doc, offset, out);
  }

 private:
  IndexedDataset dataset_;
};

struct GptSampleOptions {
  int64_t seq_length = 0;  // > 0: tokens per sample are seq_length + 1
  uint64_t seed = 0;
  // Exactly one of the two is > 0 (see the file comment).
  int64_t num_samples = 0;
  int64_t num_epochs = 0;
};

// An immutable sample index over `documents`. Build costs O(E * num_documents + size()) time
// and memory (16 bytes per document visit, 8 per sample); Sample costs O(log(E * documents) +
// seq_length). Thread-safety: const methods may be called concurrently if the documents allow.
class GptSamples {
 public:
  // kInvalidArgument (naming the option and the rule) for seq_length <= 0, not exactly one of
  // num_samples / num_epochs > 0, documents without any token, an index above 2^40 entries, or
  // num_epochs too small to fill a single window.
  static absl::StatusOr<GptSamples> Build(std::shared_ptr<const TokenDocuments> documents,
                                          const GptSampleOptions& options);

  // Number of samples available (>= options.num_samples).
  int64_t size() const { return static_cast<int64_t>(window_of_sample_.size()); }
  int64_t num_epochs() const { return num_epochs_; }
  int64_t seq_length() const { return seq_length_; }
  int64_t tokens_per_epoch() const { return tokens_per_epoch_; }
  // Document visited at stream position p, p in [0, num_epochs() * num_documents).
  const std::vector<int64_t>& document_order() const { return document_order_; }
  // The stream window that sample i reads. Precondition: 0 <= i < size().
  int64_t WindowOf(int64_t i) const { return window_of_sample_[i]; }

  // Writes the seq_length + 1 tokens of sample i to `out`. kOutOfRange if i is not in
  // [0, size()), kInvalidArgument if out.size() != seq_length + 1; errors of the documents pass
  // through.
  absl::Status Sample(int64_t i, absl::Span<int32_t> out) const;
  absl::StatusOr<std::vector<int32_t>> Sample(int64_t i) const;
  // The same for stream window w (no sample shuffle), w in [0, size()).
  absl::Status Window(int64_t w, absl::Span<int32_t> out) const;

 private:
  GptSamples() = default;

  std::shared_ptr<const TokenDocuments> documents_;
  int64_t seq_length_ = 0;
  int64_t num_epochs_ = 0;
  int64_t tokens_per_epoch_ = 0;
  std::vector<int64_t> document_order_;
  // stream_offset_[k]: stream position where document_order_[k] starts; one extra final entry.
  std::vector<int64_t> stream_offset_;
  std::vector<int64_t> window_of_sample_;
};

// A uniform integer in [0, n), n >= 1, from `rng` by rejection (no modulo bias), the same on
// every platform. Exposed for tests.
uint64_t UniformBelow(uint64_t n, std::mt19937_64* rng);

}  // namespace switchyard

#endif  // SWITCHYARD_DATA_GPT_SAMPLES_H_
