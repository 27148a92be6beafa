#include "data/bpe_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace switchyard {
namespace {

std::vector<std::string> Corpus() {
  return {
      "The quick brown fox jumps over the lazy dog. The dog sleeps.",
      "A mixture of experts routes every token to the top k experts of the router.",
      "The router computes a softmax over experts; the experts compute the token's output.",
      "Tokens, tokens, tokens: the tokenizer turns text into tokens and back into text.",
      "Unicode too: naïve café, Grüße, 東京, and emoji 🙂🙂🙂.\n\n  Indented "
      "line\twith "
      "tab.",
      "the the the the the then there these those",
  };
}

BpeTokenizer TrainOrDie(int64_t vocab_size) {
  auto tok = BpeTokenizer::Train(Corpus(), vocab_size);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return *std::move(tok);
}

TEST(BpePreTokenizeTest, PiecesConcatenateToTheText) {
  const std::string text = "Hello  world\n\n x\t y ";
  const std::vector<absl::string_view> pieces = BpePreTokenize(text);
  std::vector<std::string> got(pieces.begin(), pieces.end());
  EXPECT_EQ(got, (std::vector<std::string>{"Hello", " ", " world", "\n\n", " x", "\t", " y", " "}));
}

TEST(BpeByteUnicodeTest, GptTwoTableAndInverse) {
  EXPECT_EQ(BytesToUnicode(" "), "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ(BytesToUnicode("\n"), "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(BytesToUnicode("az!~"), "az!~");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  auto back = UnicodeToBytes(BytesToUnicode(all));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, all);
  EXPECT_EQ(UnicodeToBytes("\xE2\x96\x81").status().code(),  // '▁' (SentencePiece)
            absl::StatusCode::kInvalidArgument);
}

TEST(BpeTokenizerTest, TrainRejectsTinyVocab) {
  EXPECT_EQ(BpeTokenizer::Train(Corpus(), 256).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BpeTokenizerTest, RoundTripsRandomByteStrings) {
  const BpeTokenizer tok = TrainOrDie(400);
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> byte(0, 255), len(0, 200), pick(0, 3);
  const std::string ascii = "the experts  tokens\n\t ";
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    const int n = len(rng);
    for (int i = 0; i < n; ++i) {
      // Mix raw bytes (invalid UTF-8 included) with corpus-like text so merges fire.
      s.push_back(pick(rng) == 0 ? static_cast<char>(byte(rng)) : ascii[byte(rng) % ascii.size()]);
    }
    auto ids = tok.Encode(s);
    ASSERT_TRUE(ids.ok()) << ids.status();
    for (int32_t id : *ids) ASSERT_TRUE(id >= 0 && id < tok.vocab_size() && id != *tok.eod_id());
    auto text = tok.Decode(*ids);
    ASSERT_TRUE(text.ok()) << text.status();
    ASSERT_EQ(*text, s) << "trial " << trial;
  }
}

TEST(BpeTokenizerTest, MergesReduceTokenCount) {
  const BpeTokenizer tok = TrainOrDie(500);
  EXPECT_GT(tok.num_merges(), 50);
  // The small corpus runs out of pairs occurring twice before 500 tokens.
  EXPECT_LE(tok.vocab_size(), 500);
  EXPECT_LE(tok.vocab_size(), 256 + tok.num_merges() + 1);  // two merges may make one token
  EXPECT_EQ(tok.eod_id(), tok.vocab_size() - 1);
  size_t bytes = 0, tokens = 0;
  for (const std::string& doc : Corpus()) {
    auto ids = tok.Encode(doc);
    ASSERT_TRUE(ids.ok());
    bytes += doc.size();
    tokens += ids->size();
  }
  std::printf("corpus: %zu bytes -> %zu tokens (vocab %lld, %lld merges)\n", bytes, tokens,
              static_cast<long long>(tok.vocab_size()), static_cast<long long>(tok.num_merges()));
  EXPECT_LT(tokens * 2, bytes);
  auto the = tok.Encode(" the");
  ASSERT_TRUE(the.ok());
  EXPECT_EQ(the->size(), 1u);  // a frequent word is one token
}

TEST(BpeTokenizerTest, SmallCorpusStopsEarly) {
  auto tok = BpeTokenizer::Train({"abab"}, 100000);
  ASSERT_TRUE(tok.ok()) << tok.status();
  // "ab" occurs twice; "abab" after that occurs once, below the threshold of two.
  EXPECT_EQ(tok->num_merges(), 1);
  EXPECT_EQ(tok->vocab_size(), 258);
}

TEST(BpeTokenizerTest, SaveLoadGivesIdenticalEncodings) {
  const BpeTokenizer tok = TrainOrDie(450);
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/tok_", getpid(), ".json");
  ASSERT_TRUE(tok.Save(path).ok());
  auto loaded = BpeTokenizer::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->vocab_size(), tok.vocab_size());
  EXPECT_EQ(loaded->num_merges(), tok.num_merges());
  EXPECT_EQ(loaded->eod_id(), tok.eod_id());
  for (const std::string& doc : Corpus()) {
    EXPECT_EQ(*loaded->Encode(doc), *tok.Encode(doc));
  }
  const std::string odd = "\xFF\xFE the\x80 experts\r\n";
  EXPECT_EQ(*loaded->Encode(odd), *tok.Encode(odd));
}

// Handwritten in HF's form, with fields we ignore and both merge spellings.
constexpr char kTinyJson[] = R"json({
  "version": "1.0",
  "truncation": null,
  "added_tokens": [{"id": 9, "content": "<|endoftext|>", "special": true}],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},
  "model": {
    "type": "BPE",
    "dropout": null,
    "unk_token": null,
    "vocab": {"a": 0, "b": 1, "c": 2, "Ġ": 3, "ab": 4, "abc": 5, "Ġab": 6, "Ċ": 7, "ĠĠ": 8,
              "<|endoftext|>": 9},
    "merges": ["a b", ["ab", "c"], "Ġ ab", "Ġ Ġ"]
  }
})json";

TEST(BpeTokenizerTest, LoadsHandwrittenHfJson) {
  auto tok = BpeTokenizer::FromJson(kTinyJson);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->vocab_size(), 10);
  EXPECT_EQ(tok->num_merges(), 4);
  EXPECT_EQ(tok->eod_id(), 9);
  EXPECT_EQ(*tok->TokenBytes(3), " ");
  EXPECT_EQ(*tok->TokenBytes(7), "\n");
  // Pieces: "abc", " ab", "\n   " (the run leaves its last space to the word), " cab".
  auto ids = tok->Encode("abc ab\n    cab");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int32_t>{5, 6, 7, 8, 3, 3, 2, 4}));
  EXPECT_EQ(*tok->Decode(*ids), "abc ab\n    cab");
  EXPECT_EQ(tok->Encode("abx").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tok->Decode({10}).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(BpeTokenizerTest, AddedTokensOutsideVocabDecode) {
  // Qwen-style: special tokens only in added_tokens.
  auto tok = BpeTokenizer::FromJson(R"({
    "added_tokens": [{"id": 5, "content": "<|endoftext|>"}, {"id": 6, "content": "<|im_start|>"}],
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->eod_id(), 5);
  EXPECT_EQ(tok->vocab_size(), 7);
  EXPECT_EQ(*tok->Decode({6, 2, 5}), "<|im_start|>ab<|endoftext|>");
  EXPECT_EQ(*tok->Encode("abab"), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(tok->Decode({3}).status().code(), absl::StatusCode::kOutOfRange);  // a hole
}

TEST(BpeTokenizerTest, RejectsUnsupportedFiles) {
  auto code = [](const std::string& json) { return BpeTokenizer::FromJson(json).status(); };
  const absl::Status wordpiece = code(R"({"model": {"type": "WordPiece", "vocab": {}}})");
  EXPECT_EQ(wordpiece.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wordpiece.message().find("WordPiece"), absl::string_view::npos) << wordpiece;
  EXPECT_EQ(code("{not json").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})").code(),
            absl::StatusCode::kInvalidArgument);  // merge part not in vocab
  EXPECT_EQ(code(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}, "merges": []}})").code(),
            absl::StatusCode::kInvalidArgument);  // duplicate id
  EXPECT_EQ(code(R"({"model": {"type": "BPE", "vocab": {"▁a": 0}, "merges": []}})").code(),
            absl::StatusCode::kInvalidArgument);  // SentencePiece-style vocab string
  EXPECT_EQ(code(R"({"model": {"type": "BPE", "vocab": {"a": 2000000000}, "merges": []}})").code(),
            absl::StatusCode::kInvalidArgument);  // id too large for the dense table
  EXPECT_EQ(BpeTokenizer::Load("/nonexistent/tokenizer.json").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace switchyard
