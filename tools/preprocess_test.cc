// The preprocess binary end to end: writes JSONL and text inputs to a temp dir, runs the real
// binary, and reads the dataset back with IndexedDataset, decoding every document.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/bpe_tokenizer.h"
#include "data/indexed_dataset.h"

namespace switchyard::tools {
namespace {

std::string Runfile(const std::string& rel) {
  return std::string(std::getenv("TEST_SRCDIR")) + "/switchyard/" + rel;
}

std::string TempPath(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", getpid(), "_", name);
}

void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
  ASSERT_TRUE(out.good()) << path;
}

int RunPreprocess(const std::string& args) {
  const std::string cmd = Runfile("tools/preprocess") + " " + args;
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// The documents, and their JSONL lines (with escapes nlohmann must undo).
const std::vector<std::string> kDocs = {
    "The router sends every token to its top k experts.",
    "Experts compute; the router routes. Tokens, tokens, tokens!",
    "Quotes \"inside\", a tab\there and a newline\nthere.",
    "Unicode: caf\xC3\xA9 \xE6\x9D\xB1\xE4\xBA\xAC",
    "the the the the experts experts experts",
};
constexpr char kJsonl[] =
    "{\"text\": \"The router sends every token to its top k experts.\", \"id\": 1}\n"
    "{\"text\": \"Experts compute; the router routes. Tokens, tokens, tokens!\"}\n"
    "\n"
    "{\"id\": 3, \"text\": \"Quotes \\\"inside\\\", a tab\\there and a newline\\nthere.\"}\n"
    "{\"text\": \"Unicode: caf\\u00e9 \xE6\x9D\xB1\xE4\xBA\xAC\"}\n"
    "{\"text\": \"the the the the experts experts experts\"}\n";

std::vector<int32_t> Sequence(const IndexedDataset& ds, int64_t i) {
  auto span = ds.Get<uint16_t>(i);
  EXPECT_TRUE(span.ok()) << span.status();
  if (!span.ok()) return {};
  return std::vector<int32_t>(span->begin(), span->end());
}

TEST(PreprocessTest, JsonlTrainAppendEodRoundTrips) {
  const std::string input = TempPath("docs.jsonl");
  const std::string prefix = TempPath("out");
  const std::string tok_path = TempPath("tok.json");
  WriteFile(input, kJsonl);
  ASSERT_EQ(RunPreprocess(absl::StrCat("--input ", input, " --output-prefix ", prefix,
                                       " --train-vocab-size 300 --save-tokenizer ", tok_path,
                                       " --append-eod")),
            0);
  auto ds = IndexedDataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  auto tok = BpeTokenizer::Load(tok_path);
  ASSERT_TRUE(tok.ok()) << tok.status();
  ASSERT_TRUE(tok->eod_id().has_value());
  EXPECT_EQ(ds->dtype(), IndexedDType::kUInt16);
  ASSERT_EQ(ds->num_documents(), static_cast<int64_t>(kDocs.size()));
  ASSERT_EQ(ds->num_sequences(), static_cast<int64_t>(kDocs.size()));
  int64_t bytes = 0, tokens = 0;
  for (size_t d = 0; d < kDocs.size(); ++d) {
    EXPECT_EQ(ds->DocumentIndex(d), static_cast<int64_t>(d));
    std::vector<int32_t> ids = Sequence(*ds, d);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids.back(), *tok->eod_id());
    ids.pop_back();
    auto text = tok->Decode(ids);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(*text, kDocs[d]) << "document " << d;
    EXPECT_EQ(ids, *tok->Encode(kDocs[d]));
    bytes += kDocs[d].size();
    tokens += ids.size();
  }
  std::printf("%zu documents: %lld bytes -> %lld tokens (vocab %lld)\n", kDocs.size(),
              static_cast<long long>(bytes), static_cast<long long>(tokens),
              static_cast<long long>(tok->vocab_size()));
  EXPECT_LT(tokens, bytes);

  // A saved tokenizer, a JSONL and a raw text file (one document, bytes as stored), no EOD.
  const std::string text_input = TempPath("raw.txt");
  const std::string raw = "Raw file\n\nwith a blank line and \xFF invalid UTF-8.\n";
  WriteFile(text_input, raw);
  const std::string prefix2 = TempPath("out2");
  ASSERT_EQ(RunPreprocess(absl::StrCat("--input=", input, ",", text_input, " --output-prefix ",
                                       prefix2, " --tokenizer ", tok_path)),
            0);
  auto ds2 = IndexedDataset::Open(prefix2);
  ASSERT_TRUE(ds2.ok()) << ds2.status();
  ASSERT_EQ(ds2->num_documents(), static_cast<int64_t>(kDocs.size()) + 1);
  for (size_t d = 0; d < kDocs.size(); ++d) {
    EXPECT_EQ(*tok->Decode(Sequence(*ds2, d)), kDocs[d]);
  }
  EXPECT_EQ(*tok->Decode(Sequence(*ds2, kDocs.size())), raw);
}

TEST(PreprocessTest, BadInputsFail) {
  const std::string input = TempPath("bad.jsonl");
  WriteFile(input, "{\"body\": \"no text field\"}\n");
  const std::string prefix = TempPath("bad_out");
  EXPECT_EQ(RunPreprocess(absl::StrCat("--input ", input, " --output-prefix ", prefix,
                                       " --train-vocab-size 300")),
            1);
  // --json-key picks the field.
  EXPECT_EQ(RunPreprocess(absl::StrCat("--input ", input, " --output-prefix ", prefix,
                                       " --train-vocab-size 300 --json-key body")),
            0);
  auto ds = IndexedDataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->num_documents(), 1);
  // Usage errors: no tokenizer choice, unknown flag.
  EXPECT_EQ(RunPreprocess(absl::StrCat("--input ", input, " --output-prefix ", prefix)), 2);
  EXPECT_EQ(RunPreprocess("--bogus 1"), 2);
}

}  // namespace
}  // namespace switchyard::tools
