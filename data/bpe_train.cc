// File: data/bpe_train.cc
//
// BpeTokenizer::Train: merges learned from pair counts over the distinct pre-tokenizer pieces,
// updated incrementally. Each merge touches only the pieces that hold its pair (found through a
// per-pair set of piece indices, pruned lazily), and the best pair comes from a max-heap whose
// stale entries are skipped when popped.
#include <limits>
#include <queue>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "data/bpe_tokenizer.h"

namespace switchyard {

absl::StatusOr<BpeTokenizer> BpeTokenizer::Train(const std::vector<std::string>& texts,
                                                 int64_t vocab_size) {
  if (vocab_size < 257 || vocab_size > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab_size = ", vocab_size, ": must be in [257, 2^31) (256 bytes + end-of-document)"));
  }
  BpeTokenizer tok;
  for (int b = 0; b < 256; ++b) SY_RETURN_IF_ERROR(tok.AddToken(b, std::string(1, char(b))));

  // Distinct pieces with their counts, as symbol sequences.
  absl::flat_hash_map<absl::string_view, int64_t> piece_count;
  for (const std::string& text : texts) {
    for (absl::string_view piece : BpePreTokenize(text)) ++piece_count[piece];
  }
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> freq;
  words.reserve(piece_count.size());
  for (const auto& [piece, count] : piece_count) {
    if (piece.size() < 2) continue;  // nothing to merge
    words.emplace_back(piece.begin(), piece.end());
    for (int32_t& s : words.back()) s = static_cast<unsigned char>(s);
    freq.push_back(count);
  }

  absl::flat_hash_map<uint64_t, int64_t> pair_count;
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<int32_t>> pair_words;
  // Heap of (count, -key): the largest count first, then the smallest key.
  using Entry = std::pair<int64_t, int64_t>;
  std::priority_queue<Entry> heap;
  auto count_pairs = [&](int32_t w, int64_t sign, absl::flat_hash_set<uint64_t>* touched) {
    const std::vector<int32_t>& s = words[w];
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t key = PairKey(s[i], s[i + 1]);
      pair_count[key] += sign * freq[w];
      if (sign > 0) pair_words[key].insert(w);
      touched->insert(key);
    }
  };
  {
    absl::flat_hash_set<uint64_t> touched;
    for (int32_t w = 0; w < static_cast<int32_t>(words.size()); ++w) count_pairs(w, 1, &touched);
    for (uint64_t key : touched) heap.emplace(pair_count[key], -static_cast<int64_t>(key));
  }

  while (tok.vocab_size() < vocab_size - 1 && !heap.empty()) {
    const auto [count, neg_key] = heap.top();
    heap.pop();
    const uint64_t key = static_cast<uint64_t>(-neg_key);
    const auto pc = pair_count.find(key);
    if (pc == pair_count.end() || pc->second != count) continue;  // stale entry
    if (count < 2) break;
    const int32_t a = static_cast<int32_t>(key >> 32);
    const int32_t b = static_cast<int32_t>(key & 0xFFFFFFFFu);
    std::string merged = tok.tokens_[a] + tok.tokens_[b];
    if (merged == kEndOfTextToken) {
      pair_count.erase(pc);  // the reserved token's bytes: never merged into
      continue;
    }
    // Two pairs may make the same bytes ("ab"+"c", "a"+"bc"): both merges give one token.
    const auto existing = tok.ids_.find(merged);
    const int32_t c =
        existing != tok.ids_.end() ? existing->second : static_cast<int32_t>(tok.vocab_size());
    if (existing == tok.ids_.end()) SY_RETURN_IF_ERROR(tok.AddToken(c, std::move(merged)));
    SY_RETURN_IF_ERROR(tok.AddMerge(a, b));

    absl::flat_hash_set<uint64_t> touched;
    const absl::flat_hash_set<int32_t> where = std::move(pair_words[key]);
    pair_words.erase(key);
    for (int32_t w : where) {
      std::vector<int32_t>& s = words[w];
      bool has = false;
      for (size_t i = 0; i + 1 < s.size() && !has; ++i) has = s[i] == a && s[i + 1] == b;
      if (!has) continue;  // stale membership
      count_pairs(w, -1, &touched);
      size_t out = 0;
      for (size_t r = 0; r < s.size(); ++out) {
        if (r + 1 < s.size() && s[r] == a && s[r + 1] == b) {
          s[out] = c;
          r += 2;
        } else {
          s[out] = s[r];
          r += 1;
        }
      }
      s.resize(out);
      count_pairs(w, 1, &touched);
    }
    for (uint64_t k : touched) {
      const auto it = pair_count.find(k);
      if (it == pair_count.end()) continue;
      if (it->second <= 0) {
        pair_count.erase(it);
      } else {
        heap.emplace(it->second, -static_cast<int64_t>(k));
      }
    }
  }
  const int32_t eod = static_cast<int32_t>(tok.vocab_size());
  SY_RETURN_IF_ERROR(tok.AddToken(eod, std::string(kEndOfTextToken)));
  tok.eod_id_ = eod;
  return tok;
}

}  // namespace switchyard
