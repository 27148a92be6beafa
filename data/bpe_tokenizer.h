// File: data/bpe_tokenizer.h
//
// A byte-level BPE tokenizer in the style of GPT-2, for the data preprocessing tool.
//
// Model. Every byte 0..255 has a base token; a merge (a, b) -> c joins two adjacent tokens into
// one whose bytes are bytes(a) + bytes(b). A token's identity is its byte string, so decoding is
// concatenation and Decode(Encode(x)) == x for ANY byte string x, invalid UTF-8 included.
//
// Pre-tokenizer (ours, simpler than GPT-2's regex). Text is cut into pieces whose concatenation
// is the text: a piece is either one optional leading ' ' followed by a maximal run of
// non-whitespace bytes ("hello", " world"), or a maximal run of whitespace bytes (' ', \t, \n,
// \v, \f, \r) not counting a final ' ' that starts the next word (so "a  b" is "a", " ", " b",
// like GPT-2's `\s+(?!\S)|\s+`). Bytes >= 0x80 are non-whitespace. Unlike GPT-2 there is no
// split between letters, digits and punctuation, so a HuggingFace GPT-2 tokenizer.json loaded
// here encodes text with punctuation or contractions differently from HF (the pieces differ),
// although each piece is merged exactly as HF would. Merges never cross pieces.
//
// Encoding a piece applies, repeatedly, the merge of lowest rank among the piece's adjacent
// pairs to all its occurrences, left to right, until no pair has a merge (GPT-2's `bpe()`).
// Cost is O(n^2) in the piece length n; text with very long whitespace-free runs is slow.
//
// Training (Train). Pieces of all texts are counted; starting from bytes, the most frequent
// adjacent pair (weighted by piece count; ties to the smaller (left id, right id)) becomes the
// next merge, until vocab_size is reached or no pair occurs at least twice. One id, the last,
// is reserved for the end-of-document token "<|endoftext|>", which Encode never produces.
// Base token ids: byte b has id b.
//
// Files (Save/Load): a subset of HuggingFace's tokenizer.json:
//   {"model": {"type": "BPE", "vocab": {"<token>": id, ...}, "merges": ["<a> <b>", ...]}, ...}
// Vocab strings are byte strings written through GPT-2's byte-to-unicode table (byte 0x20 is
// "Ġ", 0x0A is "Ċ", printable ASCII is itself). Merges may be "a b" strings or ["a", "b"] pairs
// (newer HF files). Load ignores every field it does not use (normalizer, pre_tokenizer, decoder,
// post_processor, dropout, unk_token, ...), honours model.ignore_merges, rejects a model type
// other than "BPE", adds each added_tokens entry whose id is not in vocab as a token with its
// content as bytes (Decode accepts it, Encode never makes it), and takes the end-of-document id
// from the "<|endoftext|>" entry of added_tokens or vocab when present. A vocab without some of the
// 256 byte tokens loads, but Encode fails on text containing such a byte.
//
// Thread-safety: a BpeTokenizer is immutable after Train/Load; all const methods may be called
// concurrently.
#ifndef SWITCHYARD_DATA_BPE_TOKENIZER_H_
#define SWITCHYARD_DATA_BPE_TOKENIZER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace switchyard {

// The end-of-document token Train reserves and Load looks for.
inline constexpr absl::string_view kEndOfTextToken = "<|endoftext|>";
// Loaded ids must be below this (ids index a dense table; real vocabularies are < 2^18).
inline constexpr int64_t kMaxTokenId = int64_t{1} << 24;

class BpeTokenizer {
 public:
  // Learns merges from `texts` (see the file comment). vocab_size counts the 256 byte tokens,
  // the merges and the end-of-document token; kInvalidArgument if it is below 257. The result
  // may have fewer tokens when the corpus runs out of pairs occurring at least twice.
  static absl::StatusOr<BpeTokenizer> Train(const std::vector<std::string>& texts,
                                            int64_t vocab_size);

  // Parses a tokenizer.json document (see the file comment). kInvalidArgument naming the field
  // for malformed JSON, an unsupported model type, a vocab string outside GPT-2's byte-to-unicode
  // alphabet, an id outside [0, kMaxTokenId), duplicate ids or byte strings, or a merge whose parts
  // or result are not in vocab.
  static absl::StatusOr<BpeTokenizer> FromJson(absl::string_view json_text);
  // Reads `path` and calls FromJson; kNotFound if the file cannot be opened.
  static absl::StatusOr<BpeTokenizer> Load(const std::string& path);

  // The tokenizer.json text (model type BPE, vocab, merges, added_tokens with the end-of-document
  // token, ByteLevel pre_tokenizer/decoder entries for HF tools).
  std::string ToJson() const;
  // Writes ToJson() to `path` (truncating); kInternal naming the path on I/O errors.
  absl::Status Save(const std::string& path) const;

  // Token ids of `text`. kInvalidArgument if `text` has a byte with no token (only possible for
  // a loaded vocab lacking byte tokens).
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const;
  // Concatenated bytes of `ids`. kOutOfRange naming the position for an id that is not a token.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const;

  // One more than the largest id (ids need not be dense in a loaded file).
  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t num_merges() const { return static_cast<int64_t>(merges_.size()); }
  std::optional<int32_t> eod_id() const { return eod_id_; }
  // The bytes of token `id`, or nullopt if `id` is not a token.
  std::optional<std::string> TokenBytes(int32_t id) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  BpeTokenizer();
  // Adds `bytes` as token `id`; kInvalidArgument for a duplicate id or byte string.
  absl::Status AddToken(int32_t id, std::string bytes);
  // Adds merge (a, b) with the next rank; its result must already be a token.
  absl::Status AddMerge(int32_t a, int32_t b);
  absl::Status EncodePiece(absl::string_view piece, std::vector<int32_t>* out) const;

  std::vector<std::string> tokens_;                  // id -> bytes
  std::vector<bool> present_;                        // id -> whether id is a token
  absl::flat_hash_map<std::string, int32_t> ids_;    // bytes -> id
  std::vector<std::pair<int32_t, int32_t>> merges_;  // by rank
  absl::flat_hash_map<uint64_t, Merge> merge_of_pair_;
  int32_t byte_id_[256];  // -1 where the byte has no token (set by the constructor)
  std::optional<int32_t> eod_id_;
  bool ignore_merges_ = false;
};

// Splits `text` into the pre-tokenizer's pieces (see the file comment); views into `text`.
std::vector<absl::string_view> BpePreTokenize(absl::string_view text);

// GPT-2's byte-to-unicode mapping: the UTF-8 string for `bytes` (each byte one code point), and
// back. The inverse is kInvalidArgument for invalid UTF-8 or a code point outside the table.
std::string BytesToUnicode(absl::string_view bytes);
absl::StatusOr<std::string> UnicodeToBytes(absl::string_view text);

}  // namespace switchyard

#endif  // SWITCHYARD_DATA_BPE_TOKENIZER_H_
