// File: data/gpt_samples.cc
#include "data/gpt_samples.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace switchyard {

namespace {

// Bound on tokens per stream, document visits and samples: keeps every int64 product far from
// overflow and rejects absurd options before allocating.
constexpr int64_t kMaxIndexEntries = int64_t{1} << 40;

// Explicit Fisher-Yates (std::shuffle's algorithm is implementation-defined).
void Shuffle(std::vector<int64_t>::iterator begin, std::vector<int64_t>::iterator end,
             std::mt19937_64* rng) {
  const int64_t n = end - begin;
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(UniformBelow(static_cast<uint64_t>(i) + 1, rng));
    std::swap(begin[i], begin[j]);
  }
}

}  // namespace

uint64_t UniformBelow(uint64_t n, std::mt19937_64* rng) {
  // Values below `threshold` = 2^64 mod n would make the low residues more likely.
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    const uint64_t r = (*rng)();
    if (r >= threshold) return r % n;
  }
}

absl::Status InMemoryDocuments::ReadTokens(int64_t doc, int64_t offset,
                                           absl::Span<int32_t> out) const {
  if (doc < 0 || doc >= num_documents()) {
    return absl::OutOfRangeError(
        absl::StrCat("document ", doc, " is not in [0, ", num_documents(), ")"));
  }
  const std::vector<int32_t>& d = documents_[doc];
  const int64_t count = static_cast<int64_t>(out.size());
  if (offset < 0 || offset > static_cast<int64_t>(d.size()) ||
      count > static_cast<int64_t>(d.size()) - offset) {
    return absl::OutOfRangeError(absl::StrCat("document ", doc, ": tokens [", offset, ", ",
                                              offset + count, ") are not within its ", d.size(),
                                              " tokens"));
  }
  std::copy(d.begin() + offset, d.begin() + offset + count, out.begin());
  return absl::OkStatus();
}

absl::StatusOr<GptSamples> GptSamples::Build(std::shared_ptr<const TokenDocuments> documents,
                                             const GptSampleOptions& options) {
  auto error = [](absl::string_view text) {
    return absl::InvalidArgumentError(absl::StrCat("GptSamples: ", text));
  };
  if (documents == nullptr) return error("documents is null");
  if (options.seq_length <= 0) {
    return error(absl::StrCat("seq_length (", options.seq_length, ") must be > 0"));
  }
  if ((options.num_samples > 0) == (options.num_epochs > 0) || options.num_samples < 0 ||
      options.num_epochs < 0) {
    return error(absl::StrCat("exactly one of num_samples (", options.num_samples,
                              ") and num_epochs (", options.num_epochs, ") must be > 0"));
  }
  const int64_t num_docs = documents->num_documents();
  int64_t tokens_per_epoch = 0;
  for (int64_t d = 0; d < num_docs; ++d) {
    const int64_t len = documents->DocumentLength(d);
    if (len < 0) return error(absl::StrCat("document ", d, " has negative length ", len));
    tokens_per_epoch += len;
    if (tokens_per_epoch > kMaxIndexEntries) {
      return error(absl::StrCat("documents hold more than 2^40 tokens"));
    }
  }
  if (tokens_per_epoch == 0) {
    return error(absl::StrCat("the ", num_docs, " documents hold no token"));
  }
  const int64_t seq = options.seq_length;
  int64_t epochs = options.num_epochs;
  if (options.num_samples > 0) {
    if (options.num_samples > kMaxIndexEntries / seq) {
      return error(absl::StrCat("num_samples (", options.num_samples, ") * seq_length (", seq,
                                ") exceeds 2^40 tokens"));
    }
    // The fewest epochs E with (E * tokens_per_epoch - 1) / seq >= num_samples.
    const int64_t needed_tokens = options.num_samples * seq + 1;
    epochs = (needed_tokens + tokens_per_epoch - 1) / tokens_per_epoch;
  }
  if (epochs > kMaxIndexEntries / std::max<int64_t>(num_docs, 1) ||
      epochs > kMaxIndexEntries / tokens_per_epoch) {
    return error(absl::StrCat(epochs, " epochs of ", num_docs, " documents (", tokens_per_epoch,
                              " tokens) exceed the 2^40 index limit"));
  }
  const int64_t num_windows = (epochs * tokens_per_epoch - 1) / seq;
  if (num_windows < 1) {
    return error(absl::StrCat("num_epochs (", epochs, ") of ", tokens_per_epoch,
                              " tokens cannot fill one window of seq_length + 1 = ", seq + 1,
                              " tokens"));
  }

  GptSamples s;
  s.documents_ = std::move(documents);
  s.seq_length_ = seq;
  s.num_epochs_ = epochs;
  s.tokens_per_epoch_ = tokens_per_epoch;
  std::mt19937_64 rng(options.seed);
  s.document_order_.resize(epochs * num_docs);
  for (int64_t e = 0; e < epochs; ++e) {
    auto begin = s.document_order_.begin() + e * num_docs;
    for (int64_t d = 0; d < num_docs; ++d) begin[d] = d;
    Shuffle(begin, begin + num_docs, &rng);
  }
  s.stream_offset_.resize(s.document_order_.size() + 1);
  s.stream_offset_[0] = 0;
  for (size_t k = 0; k < s.document_order_.size(); ++k) {
    s.stream_offset_[k + 1] =
        s.stream_offset_[k] + s.documents_->DocumentLength(s.document_order_[k]);
  }
  s.window_of_sample_.resize(num_windows);
  for (int64_t w = 0; w < num_windows; ++w) s.window_of_sample_[w] = w;
  Shuffle(s.window_of_sample_.begin(), s.window_of_sample_.end(), &rng);
  return s;
}

absl::Status GptSamples::Window(int64_t w, absl::Span<int32_t> out) const {
  if (w < 0 || w >= size()) {
    return absl::OutOfRangeError(
        absl::StrCat("GptSamples: window ", w, " is not in [0, ", size(), ")"));
  }
  if (static_cast<int64_t>(out.size()) != seq_length_ + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptSamples: out has ", out.size(), " tokens, must be seq_length + 1 = ", seq_length_ + 1));
  }
  int64_t pos = w * seq_length_;
  // The last document-order entry starting at or before `pos` (skips empty documents).
  size_t k =
      static_cast<size_t>(std::upper_bound(stream_offset_.begin(), stream_offset_.end(), pos) -
                          stream_offset_.begin() - 1);
  size_t written = 0;
  while (written < out.size()) {
    // size() guarantees the window ends inside the stream.
    assert(k < document_order_.size());
    const int64_t doc_begin = stream_offset_[k];
    const int64_t doc_end = stream_offset_[k + 1];
    const int64_t take = std::min<int64_t>(doc_end - pos, out.size() - written);
    if (take > 0) {
      SY_RETURN_IF_ERROR(
          documents_->ReadTokens(document_order_[k], pos - doc_begin, out.subspan(written, take)));
      written += take;
      pos += take;
    }
    ++k;
  }
  return absl::OkStatus();
}

absl::Status GptSamples::Sample(int64_t i, absl::Span<int32_t> out) const {
  if (i < 0 || i >= size()) {
    return absl::OutOfRangeError(
        absl::StrCat("GptSamples: sample ", i, " is not in [0, ", size(), ")"));
  }
  return Window(window_of_sample_[i], out);
}

absl::StatusOr<std::vector<int32_t>> GptSamples::Sample(int64_t i) const {
  std::vector<int32_t> out(seq_length_ + 1);
  SY_RETURN_IF_ERROR(Sample(i, absl::MakeSpan(out)));
  return out;
}

}  // namespace switchyard
