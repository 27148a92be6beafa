// data/corpus.h: the manifest reader on a fake corpus in a temp dir (through
// SWITCHYARD_DATA_DIR), the unigram entropy on hand-computed distributions, and, when
// tools/prepare_corpus.sh has built it on this machine, the real default corpus.
#include "data/corpus.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/bpe_tokenizer.h"
#include "data/indexed_dataset.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace switchyard {
namespace {

using ::testing::HasSubstr;

// Sets SWITCHYARD_DATA_DIR for its lifetime, then restores the previous value.
class ScopedDataDir {
 public:
  explicit ScopedDataDir(const std::string& dir) {
    if (const char* old = std::getenv(kDataDirEnv)) old_ = old;
    setenv(kDataDirEnv, dir.c_str(), 1);
  }
  ~ScopedDataDir() {
    if (old_) {
      setenv(kDataDirEnv, old_->c_str(), 1);
    } else {
      unsetenv(kDataDirEnv);
    }
  }

 private:
  std::optional<std::string> old_;
};

std::string TempDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/corpus_test_", getpid(), "_", name);
  mkdir(dir.c_str(), 0755);
  return dir;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
  ASSERT_TRUE(f.good()) << path;
}

constexpr char kManifest[] = R"({
  "name": "kjv",
  "source_package": "bible-kjv-text",
  "package_version": "4.38",
  "dataset_prefix": "kjv_text_document",
  "tokenizer": "tokenizer.json",
  "documents": 3,
  "tokens": 12,
  "vocab_size": 300,
  "bin_sha256": "abc123",
  "extra_field": [1, 2]
})";

// A fake corpus dir under a fresh data dir: the manifest plus empty stand-ins for the files.
std::string MakeFakeCorpus(const std::string& data_dir, const std::string& manifest) {
  const std::string dir = data_dir + "/" + kDefaultCorpusName;
  mkdir(dir.c_str(), 0755);
  WriteFile(dir + "/corpus.json", manifest);
  WriteFile(dir + "/kjv_text_document.bin", "");
  WriteFile(dir + "/kjv_text_document.idx", "");
  WriteFile(dir + "/tokenizer.json", "{}");
  return dir;
}

TEST(CorpusTest, DataDirComesFromTheEnvironment) {
  ScopedDataDir env("/some/data");
  EXPECT_EQ(DataDir(), "/some/data");
  EXPECT_EQ(DefaultCorpusDir(), "/some/data/kjv");
}

TEST(CorpusTest, FindsAFakeManifestThroughTheEnvironment) {
  const std::string data = TempDir("fake");
  const std::string dir = MakeFakeCorpus(data, kManifest);
  ScopedDataDir env(data);
  absl::StatusOr<CorpusInfo> info = FindDefaultCorpus();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->name, "kjv");
  EXPECT_EQ(info->dir, dir);
  EXPECT_EQ(info->dataset_prefix, dir + "/kjv_text_document");
  EXPECT_EQ(info->tokenizer_path, dir + "/tokenizer.json");
  EXPECT_EQ(info->source_package, "bible-kjv-text");
  EXPECT_EQ(info->package_version, "4.38");
  EXPECT_EQ(info->documents, 3);
  EXPECT_EQ(info->tokens, 12);
  EXPECT_EQ(info->vocab_size, 300);
  EXPECT_EQ(info->bin_sha256, "abc123");
}

TEST(CorpusTest, MissingCorpusIsNotFoundAndSaysToRunSetup) {
  ScopedDataDir env(TempDir("empty"));
  absl::StatusOr<CorpusInfo> info = FindDefaultCorpus();
  ASSERT_EQ(info.status().code(), absl::StatusCode::kNotFound) << info.status();
  EXPECT_THAT(info.status().message(), HasSubstr("tools/setup.sh"));
  EXPECT_THAT(info.status().message(), HasSubstr("corpus.json"));
}

TEST(CorpusTest, MissingDatasetFileIsNotFound) {
  const std::string dir = MakeFakeCorpus(TempDir("nobin"), kManifest);
  std::remove((dir + "/kjv_text_document.bin").c_str());
  absl::StatusOr<CorpusInfo> info = LoadCorpusInfo(dir);
  ASSERT_EQ(info.status().code(), absl::StatusCode::kNotFound) << info.status();
  EXPECT_THAT(info.status().message(), HasSubstr("kjv_text_document.bin"));
  EXPECT_THAT(info.status().message(), HasSubstr("tools/setup.sh"));
}

TEST(CorpusTest, MalformedManifestsAreInvalidArgumentNamingTheField) {
  struct Case {
    std::string manifest;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"not json", "not valid JSON"},
      {"[1, 2]", "not an object"},
      {R"({"name": "kjv"})", "dataset_prefix"},
      {R"({"name": 7})", "\"name\" must be a string"},
  };
  for (const Case& c : cases) {
    const std::string dir = MakeFakeCorpus(TempDir("bad"), c.manifest);
    absl::StatusOr<CorpusInfo> info = LoadCorpusInfo(dir);
    ASSERT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument)
        << c.manifest << ": " << info.status();
    EXPECT_THAT(info.status().message(), HasSubstr(c.expect));
    EXPECT_THAT(info.status().message(), HasSubstr("corpus.json"));
  }
  std::string negative = kManifest;
  negative.replace(negative.find("\"tokens\": 12"), 12, "\"tokens\": -1");
  absl::StatusOr<CorpusInfo> info = LoadCorpusInfo(MakeFakeCorpus(TempDir("neg"), negative));
  ASSERT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument) << info.status();
  EXPECT_THAT(info.status().message(), HasSubstr("\"tokens\" must be an integer >= 0"));
}

TEST(CorpusTest, UnigramEntropyMatchesHandComputedValues) {
  // p = (1/2, 1/4, 1/4): H = 1/2 ln 2 + 2 * 1/4 ln 4 = 1.5 ln 2.
  const std::vector<int32_t> skewed = {7, 3, 7, -5};
  EXPECT_NEAR(UnigramEntropyNats(skewed), 1.5 * std::log(2.0), 1e-12);
  // Uniform over 4: ln 4, whatever the order and the ids.
  EXPECT_NEAR(UnigramEntropyNats(std::vector<int32_t>{0, 4095, 1, 2, 2, 1, 4095, 0}), std::log(4.0),
              1e-12);
  // p = (0.9, 0.1).
  std::vector<int32_t> biased(9, 1);
  biased.push_back(2);
  EXPECT_NEAR(UnigramEntropyNats(biased), -(0.9 * std::log(0.9) + 0.1 * std::log(0.1)), 1e-12);
  EXPECT_EQ(UnigramEntropyNats(std::vector<int32_t>(1000, 3)), 0.0);
  EXPECT_EQ(UnigramEntropyNats({}), 0.0);
}

TEST(CorpusTest, DatasetUnigramEntropyCountsEverySequence) {
  const std::string prefix = TempDir("ds") + "/ds";
  IndexedDatasetWriter writer(IndexedDType::kUInt16);
  ASSERT_TRUE(writer.Add(std::vector<int64_t>{7, 3}).ok());
  ASSERT_TRUE(writer.Add(std::vector<int64_t>{}).ok());
  writer.EndDocument();
  ASSERT_TRUE(writer.Add(std::vector<int64_t>{7, 65535}).ok());
  writer.EndDocument();
  ASSERT_TRUE(writer.Finalize(prefix).ok());
  absl::StatusOr<IndexedDataset> ds = IndexedDataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  absl::StatusOr<double> h = DatasetUnigramEntropyNats(*ds);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_NEAR(*h, 1.5 * std::log(2.0), 1e-12);
}

// The real corpus, if tools/prepare_corpus.sh has built it. Bazel gives tests their own HOME,
// so without SWITCHYARD_DATA_DIR this looks under the passwd home directory.
TEST(CorpusTest, RealDefaultCorpusOpens) {
  std::string dir = DefaultCorpusDir();
  if (std::getenv(kDataDirEnv) == nullptr) {
    const passwd* pw = getpwuid(getuid());
    if (pw != nullptr && pw->pw_dir != nullptr) {
      dir = absl::StrCat(pw->pw_dir, "/.cache/switchyard/data/", kDefaultCorpusName);
    }
  }
  absl::StatusOr<CorpusInfo> info = LoadCorpusInfo(dir);
  if (absl::IsNotFound(info.status())) {
    GTEST_SKIP() << "no default corpus at " << dir << " (run tools/setup.sh): " << info.status();
  }
  ASSERT_TRUE(info.ok()) << info.status();
  absl::StatusOr<IndexedDataset> ds = IndexedDataset::Open(info->dataset_prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_GT(ds->num_documents(), 0);
  EXPECT_EQ(ds->num_documents(), info->documents);
  absl::StatusOr<BpeTokenizer> tok = BpeTokenizer::Load(info->tokenizer_path);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->vocab_size(), info->vocab_size);

  int64_t tokens = 0;
  int32_t max_id = 0;
  std::vector<int32_t> buf;
  for (int64_t i = 0; i < ds->num_sequences(); ++i) {
    buf.resize(static_cast<size_t>(ds->SequenceLength(i)));
    ASSERT_TRUE(ds->ReadTokens(i, 0, absl::MakeSpan(buf)).ok());
    for (int32_t t : buf) max_id = std::max(max_id, t);
    tokens += static_cast<int64_t>(buf.size());
  }
  EXPECT_EQ(tokens, info->tokens);
  EXPECT_LT(max_id, info->vocab_size);
  buf.resize(static_cast<size_t>(std::min<int64_t>(ds->SequenceLength(0), 16)));
  ASSERT_TRUE(ds->ReadTokens(0, 0, absl::MakeSpan(buf)).ok());
  absl::StatusOr<std::string> text = tok->Decode(buf);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_FALSE(text->empty());
  absl::StatusOr<double> h = DatasetUnigramEntropyNats(*ds);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_GT(*h, 0.0);
  EXPECT_LT(*h, std::log(static_cast<double>(info->vocab_size)));
  std::printf(
      "corpus %s (%s %s): %lld documents, %lld tokens, vocab %lld, unigram entropy %.4f "
      "nats/token (uniform: %.4f); document 0 starts \"%s\"\n",
      info->name.c_str(), info->source_package.c_str(), info->package_version.c_str(),
      static_cast<long long>(info->documents), static_cast<long long>(tokens),
      static_cast<long long>(info->vocab_size), *h, std::log(static_cast<double>(info->vocab_size)),
      text->c_str());
}

}  // namespace
}  // namespace switchyard
