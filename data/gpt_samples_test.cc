#include "data/gpt_samples.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/indexed_dataset.h"
#include "gtest/gtest.h"

namespace switchyard {
namespace {

// Documents of varied lengths (some empty), tokens unique per position so that any misplaced
// token is visible: token = 1000 * (doc + 1) + position.
std::vector<std::vector<int32_t>> MakeDocuments(int num_docs, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> docs(num_docs);
  for (int d = 0; d < num_docs; ++d) {
    const int len = d % 7 == 3 ? 0 : 1 + static_cast<int>(rng() % 40);
    for (int p = 0; p < len; ++p) docs[d].push_back(1000 * (d + 1) + p);
  }
  return docs;
}

std::shared_ptr<const TokenDocuments> Docs(const std::vector<std::vector<int32_t>>& docs) {
  return std::make_shared<InMemoryDocuments>(docs);
}

std::vector<std::vector<int32_t>> AllSamples(const GptSamples& s, int64_t from = 0) {
  std::vector<std::vector<int32_t>> out;
  for (int64_t i = from; i < s.size(); ++i) {
    absl::StatusOr<std::vector<int32_t>> sample = s.Sample(i);
    EXPECT_TRUE(sample.ok()) << sample.status();
    out.push_back(sample.ok() ? *sample : std::vector<int32_t>{});
  }
  return out;
}

TEST(GptSamplesTest, UniformBelowIsPortableAndInRange) {
  std::mt19937_64 rng(42);
  // The first outputs of std::mt19937_64(42) are fixed by the standard, so these are too.
  std::mt19937_64 check(42);
  const uint64_t r0 = check();
  std::mt19937_64 rng2(42);
  EXPECT_EQ(UniformBelow(1000, &rng2), r0 % 1000);  // threshold for 1000 is tiny: r0 accepted
  std::vector<int> counts(7, 0);
  for (int k = 0; k < 70000; ++k) ++counts[UniformBelow(7, &rng)];
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
  EXPECT_EQ(UniformBelow(1, &rng), 0u);
}

TEST(GptSamplesTest, WindowsHaveSeqLengthPlusOneTokensAndTileTheStream) {
  const auto docs = MakeDocuments(50, 1);
  const GptSampleOptions options{/*seq_length=*/16, /*seed=*/1234, /*num_samples=*/300, 0};
  absl::StatusOr<GptSamples> s = GptSamples::Build(Docs(docs), options);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GE(s->size(), 300);
  // Fewest epochs: one epoch less would not give 300 windows.
  EXPECT_LT(((s->num_epochs() - 1) * s->tokens_per_epoch() - 1) / 16, 300);
  EXPECT_EQ(s->size(), (s->num_epochs() * s->tokens_per_epoch() - 1) / 16);
  std::printf("documents 50, tokens/epoch %lld, epochs %lld, samples %lld\n",
              static_cast<long long>(s->tokens_per_epoch()),
              static_cast<long long>(s->num_epochs()), static_cast<long long>(s->size()));

  // Each epoch visits every document exactly once.
  const auto& order = s->document_order();
  ASSERT_EQ(order.size(), static_cast<size_t>(s->num_epochs() * 50));
  for (int64_t e = 0; e < s->num_epochs(); ++e) {
    std::vector<int64_t> epoch(order.begin() + e * 50, order.begin() + (e + 1) * 50);
    std::sort(epoch.begin(), epoch.end());
    for (int d = 0; d < 50; ++d) ASSERT_EQ(epoch[d], d) << "epoch " << e;
  }
  // The stream: documents in document_order, concatenated.
  std::vector<int32_t> stream;
  for (int64_t d : order) stream.insert(stream.end(), docs[d].begin(), docs[d].end());

  // Every sample is a window of 17 tokens; window w is stream[16w, 16w + 16].
  std::vector<int> seen(s->size(), 0);
  for (int64_t i = 0; i < s->size(); ++i) {
    absl::StatusOr<std::vector<int32_t>> sample = s->Sample(i);
    ASSERT_TRUE(sample.ok()) << sample.status();
    ASSERT_EQ(sample->size(), 17u);
    const int64_t w = s->WindowOf(i);
    ++seen[w];
    ASSERT_EQ(*sample, std::vector<int32_t>(stream.begin() + 16 * w, stream.begin() + 16 * w + 17))
        << "sample " << i << " window " << w;
  }
  // The sample order is a permutation of the windows.
  for (int64_t w = 0; w < s->size(); ++w) ASSERT_EQ(seen[w], 1) << "window " << w;
  // Consecutive windows share one token.
  std::vector<int32_t> a(17), b(17);
  for (int64_t w = 0; w + 1 < s->size(); ++w) {
    ASSERT_TRUE(s->Window(w, absl::MakeSpan(a)).ok());
    ASSERT_TRUE(s->Window(w + 1, absl::MakeSpan(b)).ok());
    ASSERT_EQ(a.back(), b.front()) << "window " << w;
  }
  // The sample order is shuffled, not the identity.
  int64_t fixed = 0;
  for (int64_t i = 0; i < s->size(); ++i) fixed += s->WindowOf(i) == i;
  EXPECT_LT(fixed, s->size() / 10);
}

TEST(GptSamplesTest, DeterministicBySeedAndSeedsDiffer) {
  const auto docs = MakeDocuments(30, 2);
  const GptSampleOptions options{8, 77, 200, 0};
  auto a = GptSamples::Build(Docs(docs), options);
  auto b = GptSamples::Build(Docs(docs), options);
  GptSampleOptions other = options;
  other.seed = 78;
  auto c = GptSamples::Build(Docs(docs), other);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->document_order(), b->document_order());
  EXPECT_EQ(AllSamples(*a), AllSamples(*b));
  ASSERT_EQ(a->size(), c->size());  // the index size does not depend on the seed
  EXPECT_NE(a->document_order(), c->document_order());
  const auto sa = AllSamples(*a);
  const auto sc = AllSamples(*c);
  int64_t same = 0;
  for (size_t i = 0; i < sa.size(); ++i) same += sa[i] == sc[i];
  EXPECT_LT(same, static_cast<int64_t>(sa.size()) / 10);
  std::printf("seed 77 vs 78: %lld of %zu samples equal\n", static_cast<long long>(same),
              sa.size());
}

TEST(GptSamplesTest, ResumingAtSampleKGivesTheUninterruptedSamples) {
  const auto docs = MakeDocuments(40, 3);
  const GptSampleOptions options{32, 9, 100, 0};
  auto run = GptSamples::Build(Docs(docs), options);
  ASSERT_TRUE(run.ok());
  const auto uninterrupted = AllSamples(*run);
  for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{37}, run->size() - 1}) {
    // A restarted job rebuilds the index from the same options and continues at sample k.
    auto resumed = GptSamples::Build(Docs(docs), options);
    ASSERT_TRUE(resumed.ok());
    const auto rest = AllSamples(*resumed, k);
    ASSERT_EQ(rest.size(), uninterrupted.size() - k);
    EXPECT_TRUE(std::equal(rest.begin(), rest.end(), uninterrupted.begin() + k)) << "k = " << k;
  }
}

TEST(GptSamplesTest, NumEpochsGivenExplicitly) {
  const auto docs = MakeDocuments(10, 4);
  auto s = GptSamples::Build(Docs(docs), GptSampleOptions{4, 5, 0, 3});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->num_epochs(), 3);
  EXPECT_EQ(s->size(), (3 * s->tokens_per_epoch() - 1) / 4);
}

TEST(GptSamplesTest, WindowLongerThanEveryDocumentSpansMany) {
  const std::vector<std::vector<int32_t>> docs = {{1, 2}, {}, {3}, {4, 5, 6}, {7}};
  auto s = GptSamples::Build(Docs(docs), GptSampleOptions{20, 0, 4, 0});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->num_epochs(), 12);  // 12 * 7 tokens = 84 >= 4 * 20 + 1
  for (int64_t i = 0; i < s->size(); ++i) {
    auto sample = s->Sample(i);
    ASSERT_TRUE(sample.ok());
    EXPECT_EQ(sample->size(), 21u);
  }
}

TEST(GptSamplesTest, BadOptionsAreRejected) {
  const auto docs = Docs(MakeDocuments(5, 5));
  auto code = [&](GptSampleOptions o) { return GptSamples::Build(docs, o).status().code(); };
  EXPECT_EQ(code({0, 0, 10, 0}), absl::StatusCode::kInvalidArgument);       // seq_length
  EXPECT_EQ(code({8, 0, 0, 0}), absl::StatusCode::kInvalidArgument);        // neither
  EXPECT_EQ(code({8, 0, 10, 2}), absl::StatusCode::kInvalidArgument);       // both
  EXPECT_EQ(code({8, 0, -1, 0}), absl::StatusCode::kInvalidArgument);       // negative
  EXPECT_EQ(code({1000000, 0, 0, 1}), absl::StatusCode::kInvalidArgument);  // no full window
  EXPECT_EQ(code({8, 0, int64_t{1} << 50, 0}), absl::StatusCode::kInvalidArgument);
  auto empty = GptSamples::Build(Docs({{}, {}}), GptSampleOptions{8, 0, 10, 0});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  auto s = GptSamples::Build(docs, GptSampleOptions{8, 0, 10, 0});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->Sample(s->size()).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s->Sample(-1).status().code(), absl::StatusCode::kOutOfRange);
  std::vector<int32_t> short_out(8);
  EXPECT_EQ(s->Sample(0, absl::MakeSpan(short_out)).code(), absl::StatusCode::kInvalidArgument);
}

TEST(GptSamplesTest, IndexedDatasetDocumentsMatchInMemory) {
  const auto docs = MakeDocuments(25, 6);
  IndexedDatasetWriter writer(IndexedDType::kUInt16);
  for (const auto& d : docs) {
    ASSERT_TRUE(writer.Add(std::vector<int64_t>(d.begin(), d.end())).ok());
    writer.EndDocument();
  }
  const std::string prefix =
      absl::StrCat(::testing::TempDir(), "/gpt_samples_test_", getpid(), "_ds");
  ASSERT_TRUE(writer.Finalize(prefix).ok());
  auto ds = IndexedDataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const GptSampleOptions options{12, 31, 150, 0};
  auto from_file =
      GptSamples::Build(std::make_shared<IndexedDatasetDocuments>(*std::move(ds)), options);
  auto from_memory = GptSamples::Build(Docs(docs), options);
  ASSERT_TRUE(from_file.ok() && from_memory.ok());
  EXPECT_EQ(AllSamples(*from_file), AllSamples(*from_memory));
}

// Pins the orders for one small case, so that any change to the engine, the bounded draw or the
// shuffle (which would silently change every run's data order) fails here. The expected values
// were cross-checked with an independent Python implementation of mt19937_64, the rejection
// draw and Fisher-Yates.
TEST(GptSamplesTest, GoldenOrdersArePinned) {
  std::mt19937_64 engine;  // the standard fixes the 10000th output of the default seed
  engine.discard(9999);
  ASSERT_EQ(engine(), 9981545732273789042ULL);
  const std::vector<std::vector<int32_t>> docs = {{1, 2, 3}, {4}, {5, 6}, {7, 8, 9, 10}, {11}};
  auto s = GptSamples::Build(Docs(docs), GptSampleOptions{3, 2026, 0, 2});
  ASSERT_TRUE(s.ok()) << s.status();
  std::string order, windows;
  for (int64_t d : s->document_order()) absl::StrAppend(&order, d, " ");
  for (int64_t i = 0; i < s->size(); ++i) absl::StrAppend(&windows, s->WindowOf(i), " ");
  std::printf("golden: document_order %s| windows %s\n", order.c_str(), windows.c_str());
  EXPECT_EQ(order, "4 2 3 0 1 2 3 0 1 4 ");
  EXPECT_EQ(windows, "0 4 6 1 5 2 3 ");
}

}  // namespace
}  // namespace switchyard
