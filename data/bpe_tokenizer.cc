// File: data/bpe_tokenizer.cc
//
// Encoding, decoding and the tokenizer.json format of BpeTokenizer (training is in bpe_train.cc).
#include "data/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace switchyard {
namespace {

bool IsSpace(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the other 68 to 256, 257, ...
struct ByteUnicodeTable {
  std::array<uint32_t, 256> to_code;
  std::array<int16_t, 512> to_byte;  // code point -> byte, -1 if none
  ByteUnicodeTable() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_code[b] = printable ? static_cast<uint32_t>(b) : next++;
      to_byte[to_code[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteUnicodeTable& Table() {
  static const ByteUnicodeTable* table = new ByteUnicodeTable();
  return *table;
}

}  // namespace

std::string BytesToUnicode(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    const uint32_t cp = Table().to_code[b];  // < 0x800: one or two UTF-8 bytes
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

absl::StatusOr<std::string> UnicodeToBytes(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = text[i];
    uint32_t cp;
    size_t len;
    if (c < 0x80) {
      cp = c;
      len = 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < text.size() &&
               (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3Fu);
      len = 2;
    } else {
      // Three- and four-byte sequences encode code points >= 0x800, outside the table.
      return absl::InvalidArgumentError(absl::StrFormat(
          "string \"%s\": byte %d is not a UTF-8 code point of GPT-2's byte-to-unicode table",
          absl::CEscape(text), i));
    }
    if (cp >= Table().to_byte.size() || Table().to_byte[cp] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "string \"%s\": code point U+%04X is not in GPT-2's byte-to-unicode table",
          absl::CEscape(text), cp));
    }
    out.push_back(static_cast<char>(Table().to_byte[cp]));
    i += len;
  }
  return out;
}

std::vector<absl::string_view> BpePreTokenize(absl::string_view text) {
  std::vector<absl::string_view> pieces;
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const size_t start = i;
    if (!IsSpace(text[i]) || (text[i] == ' ' && i + 1 < n && !IsSpace(text[i + 1]))) {
      // A word, with at most one leading ' '.
      if (IsSpace(text[i])) ++i;
      while (i < n && !IsSpace(text[i])) ++i;
    } else {
      // A whitespace run, leaving a final ' ' to the word that follows it.
      while (i < n && IsSpace(text[i])) ++i;
      if (i < n && text[i - 1] == ' ' && i - 1 > start) --i;
    }
    pieces.push_back(text.substr(start, i - start));
  }
  return pieces;
}

BpeTokenizer::BpeTokenizer() { std::fill(std::begin(byte_id_), std::end(byte_id_), -1); }

absl::Status BpeTokenizer::AddToken(int32_t id, std::string bytes) {
  if (id < 0) return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is negative"));
  if (static_cast<size_t>(id) >= tokens_.size()) {
    tokens_.resize(id + 1);
    present_.resize(id + 1, false);
  }
  if (present_[id]) {
    return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is used twice"));
  }
  if (!ids_.emplace(bytes, id).second) {
    return absl::InvalidArgumentError(absl::StrCat("tokens ", ids_[bytes], " and ", id,
                                                   " have the same bytes \"", absl::CEscape(bytes),
                                                   "\""));
  }
  if (bytes.size() == 1) byte_id_[static_cast<unsigned char>(bytes[0])] = id;
  present_[id] = true;
  tokens_[id] = std::move(bytes);
  return absl::OkStatus();
}

absl::Status BpeTokenizer::AddMerge(int32_t a, int32_t b) {
  const auto it = ids_.find(tokens_[a] + tokens_[b]);
  if (it == ids_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("merge ", merges_.size(), " (", a, ", ", b,
                                                   "): the merged token is not in vocab"));
  }
  const int32_t rank = static_cast<int32_t>(merges_.size());
  // HF keeps the first rank of a repeated merge; so do we.
  if (merge_of_pair_.emplace(PairKey(a, b), Merge{rank, it->second}).second) {
    merges_.emplace_back(a, b);
  }
  return absl::OkStatus();
}

std::optional<std::string> BpeTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !present_[id]) return std::nullopt;
  return tokens_[id];
}

absl::Status BpeTokenizer::EncodePiece(absl::string_view piece, std::vector<int32_t>* out) const {
  if (ignore_merges_) {
    const auto it = ids_.find(piece);
    if (it != ids_.end()) {
      out->push_back(it->second);
      return absl::OkStatus();
    }
  }
  std::vector<int32_t> syms;
  syms.reserve(piece.size());
  for (unsigned char b : piece) {
    if (byte_id_[b] < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("text has byte 0x%02X, which has no token in this vocab", b));
    }
    syms.push_back(byte_id_[b]);
  }
  while (syms.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max();
    uint64_t best_key = 0;
    int32_t best_result = -1;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      const uint64_t key = PairKey(syms[i], syms[i + 1]);
      const auto it = merge_of_pair_.find(key);
      if (it != merge_of_pair_.end() && it->second.rank < best_rank) {
        best_rank = it->second.rank;
        best_key = key;
        best_result = it->second.result;
      }
    }
    if (best_result < 0) break;
    size_t w = 0;
    for (size_t r = 0; r < syms.size(); ++w) {
      if (r + 1 < syms.size() && PairKey(syms[r], syms[r + 1]) == best_key) {
        syms[w] = best_result;
        r += 2;
      } else {
        syms[w] = syms[r];
        r += 1;
      }
    }
    syms.resize(w);
  }
  out->insert(out->end(), syms.begin(), syms.end());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> BpeTokenizer::Encode(absl::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  for (absl::string_view piece : BpePreTokenize(text)) {
    SY_RETURN_IF_ERROR(EncodePiece(piece, &ids));
  }
  return ids;
}

absl::StatusOr<std::string> BpeTokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size() || !present_[id]) {
      return absl::OutOfRangeError(
          absl::StrCat("ids[", i, "] = ", id, " is not a token (vocab_size ", vocab_size(), ")"));
    }
    out += tokens_[id];
  }
  return out;
}

absl::StatusOr<BpeTokenizer> BpeTokenizer::FromJson(absl::string_view json_text) {
  using nlohmann::json;
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: not valid JSON: ", e.what()));
  }
  if (!root.is_object() || !root.contains("model") || !root["model"].is_object()) {
    return absl::InvalidArgumentError("tokenizer.json: no \"model\" object");
  }
  const json& model = root["model"];
  if (model.contains("type")) {
    if (!model["type"].is_string() || model["type"].get<std::string>() != "BPE") {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: model.type is ",
                                                     model["type"].dump(),
                                                     "; only \"BPE\" (byte-level) is supported"));
    }
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return absl::InvalidArgumentError("tokenizer.json: model.vocab is missing or not an object");
  }
  if (!model.contains("merges") || !model["merges"].is_array()) {
    return absl::InvalidArgumentError("tokenizer.json: model.merges is missing or not an array");
  }
  BpeTokenizer tok;
  if (model.contains("ignore_merges") && model["ignore_merges"].is_boolean()) {
    tok.ignore_merges_ = model["ignore_merges"].get<bool>();
  }
  absl::flat_hash_map<std::string, int32_t> id_of_string;
  for (const auto& [key, value] : model["vocab"].items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= kMaxTokenId) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: model.vocab[\"", key,
                                                     "\"] is not an id in [0, ", kMaxTokenId, ")"));
    }
    const int32_t id = static_cast<int32_t>(value.get<int64_t>());
    auto bytes = UnicodeToBytes(key);
    if (!bytes.ok()) return Annotate(bytes.status(), "tokenizer.json: model.vocab");
    if (bytes->empty()) return absl::InvalidArgumentError("tokenizer.json: empty vocab string");
    SY_RETURN_IF_ERROR(
        Annotate(tok.AddToken(id, *std::move(bytes)), "tokenizer.json: model.vocab"));
    id_of_string[key] = id;
  }
  const json& merges = model["merges"];
  for (size_t i = 0; i < merges.size(); ++i) {
    std::string a, b;
    const json& m = merges[i];
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.json: model.merges[", i, "] = \"", s, "\" is not \"<a> <b>\""));
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: model.merges[", i,
                                                     "] is neither \"a b\" nor [\"a\", \"b\"]"));
    }
    const auto ia = id_of_string.find(a);
    const auto ib = id_of_string.find(b);
    if (ia == id_of_string.end() || ib == id_of_string.end()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: model.merges[", i, "] (\"", a,
                                                     "\", \"", b, "\") uses a token not in vocab"));
    }
    SY_RETURN_IF_ERROR(
        Annotate(tok.AddMerge(ia->second, ib->second), "tokenizer.json: model.merges"));
  }
  if (root.contains("added_tokens") && root["added_tokens"].is_array()) {
    const json& added = root["added_tokens"];
    for (size_t i = 0; i < added.size(); ++i) {
      const json& t = added[i];
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
          !t.contains("content") || !t["content"].is_string()) {
        continue;  // not a token entry we understand; ignored like other unknown fields
      }
      const int64_t id = t["id"].get<int64_t>();
      const std::string content = t["content"].get<std::string>();
      if (id < 0 || id >= kMaxTokenId || content.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: added_tokens[", i,
                                                       "] has id ", id, " outside [0, ",
                                                       kMaxTokenId, ") or empty content"));
      }
      // Special tokens outside model.vocab (Qwen's, Llama 3's) become tokens whose bytes are
      // their content, so Decode accepts them; Encode never produces them.
      if (!tok.TokenBytes(static_cast<int32_t>(id)).has_value() && !tok.ids_.contains(content)) {
        SY_RETURN_IF_ERROR(Annotate(tok.AddToken(static_cast<int32_t>(id), content),
                                    "tokenizer.json: added_tokens"));
      }
      if (content == kEndOfTextToken) tok.eod_id_ = static_cast<int32_t>(id);
    }
  }
  if (!tok.eod_id_.has_value()) {
    const auto it = tok.ids_.find(kEndOfTextToken);
    if (it != tok.ids_.end()) tok.eod_id_ = it->second;
  }
  if (tok.eod_id_.has_value() && !tok.TokenBytes(*tok.eod_id_).has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json: ", kEndOfTextToken, " id ", *tok.eod_id_, " names no token"));
  }
  return tok;
}

absl::StatusOr<BpeTokenizer> BpeTokenizer::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open tokenizer file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::InternalError(absl::StrCat("error reading ", path));
  absl::StatusOr<BpeTokenizer> tok = FromJson(ss.str());
  if (!tok.ok()) return Annotate(tok.status(), path);
  return tok;
}

std::string BpeTokenizer::ToJson() const {
  using nlohmann::json;
  json vocab = json::object();
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (present_[id]) vocab[BytesToUnicode(tokens_[id])] = id;
  }
  json merges = json::array();
  for (const auto& [a, b] : merges_) {
    merges.push_back(BytesToUnicode(tokens_[a]) + " " + BytesToUnicode(tokens_[b]));
  }
  json added = json::array();
  if (eod_id_.has_value()) {
    added.push_back({{"id", *eod_id_},
                     {"content", std::string(kEndOfTextToken)},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", true}};
  json root = {{"version", "1.0"},
               {"truncation", nullptr},
               {"padding", nullptr},
               {"added_tokens", added},
               {"normalizer", nullptr},
               {"pre_tokenizer", byte_level},
               {"post_processor", nullptr},
               {"decoder", byte_level},
               {"model",
                {{"type", "BPE"},
                 {"dropout", nullptr},
                 {"unk_token", nullptr},
                 {"continuing_subword_prefix", nullptr},
                 {"end_of_word_suffix", nullptr},
                 {"fuse_unk", false},
                 {"byte_fallback", false},
                 {"ignore_merges", ignore_merges_},
                 {"vocab", vocab},
                 {"merges", merges}}}};
  return root.dump(1);
}

absl::Status BpeTokenizer::Save(const std::string& path) const {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot open ", path, " for writing"));
  out << ToJson();
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("error writing ", path));
  return absl::OkStatus();
}

}  // namespace switchyard
