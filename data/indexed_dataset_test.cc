#include "data/indexed_dataset.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace switchyard {
namespace {

using ::testing::HasSubstr;

std::string TempPrefix(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/indexed_dataset_test_", getpid(), "_", name);
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

template <typename T>
void Put(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// Documents of sequences of tokens.
using Docs = std::vector<std::vector<std::vector<int64_t>>>;

template <typename T>
void RoundTrip(IndexedDType dtype, const Docs& docs, const std::string& name) {
  IndexedDatasetWriter writer(dtype);
  for (const auto& doc : docs) {
    for (const auto& seq : doc) ASSERT_TRUE(writer.Add(seq).ok());
    writer.EndDocument();
  }
  const std::string prefix = TempPrefix(name);
  ASSERT_TRUE(writer.Finalize(prefix).ok());
  EXPECT_NE(access((prefix + ".idx.tmp." + std::to_string(getpid())).c_str(), F_OK), 0);

  absl::StatusOr<IndexedDataset> ds = IndexedDataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->dtype(), dtype);
  ASSERT_EQ(ds->num_documents(), static_cast<int64_t>(docs.size()));
  int64_t seq = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    EXPECT_EQ(ds->DocumentIndex(d), seq) << "document " << d;
    for (const auto& expected : docs[d]) {
      absl::StatusOr<absl::Span<const T>> got = ds->Get<T>(seq);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->size(), expected.size()) << "sequence " << seq;
      std::vector<int32_t> widened(expected.size());
      ASSERT_TRUE(ds->ReadTokens(seq, 0, absl::MakeSpan(widened)).ok());
      for (size_t k = 0; k < expected.size(); ++k) {
        EXPECT_EQ(static_cast<int64_t>((*got)[k]), expected[k]) << "sequence " << seq;
        EXPECT_EQ(widened[k], expected[k]);
      }
      ++seq;
    }
  }
  EXPECT_EQ(ds->num_sequences(), seq);
  EXPECT_EQ(ds->DocumentIndex(docs.size()), seq);
  EXPECT_EQ(ds->DocumentIndices().size(), docs.size() + 1);
  // The .idx on disk is what IndexBytes describes.
  EXPECT_EQ(ReadFile(prefix + ".idx"), writer.IndexBytes());
}

TEST(IndexedDatasetTest, RoundTripInt32WithEmptyDocumentsAndSequences) {
  const Docs docs = {{{1, 2, 3}, {4}},  {}, {{-7, 2147483647, -2147483648LL}}, {{}},
                     {{5, 6}, {}, {8}}, {}};
  RoundTrip<int32_t>(IndexedDType::kInt32, docs, "int32");
}

TEST(IndexedDatasetTest, RoundTripUInt16WithEmptyDocuments) {
  std::mt19937_64 rng(7);
  Docs docs(20);
  for (size_t d = 0; d < docs.size(); ++d) {
    if (d % 5 == 1) continue;  // empty documents
    const int n_seq = 1 + static_cast<int>(rng() % 3);
    for (int s = 0; s < n_seq; ++s) {
      std::vector<int64_t> seq(rng() % 50);
      for (auto& t : seq) t = static_cast<int64_t>(rng() % 65536);
      docs[d].push_back(seq);
    }
  }
  docs[0].push_back({0, 65535});
  RoundTrip<uint16_t>(IndexedDType::kUInt16, docs, "uint16");
}

TEST(IndexedDatasetTest, EmptyDataset) {
  IndexedDatasetWriter writer(IndexedDType::kInt32);
  const std::string prefix = TempPrefix("empty");
  ASSERT_TRUE(writer.Finalize(prefix).ok());
  absl::StatusOr<IndexedDataset> ds = IndexedDataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->num_sequences(), 0);
  EXPECT_EQ(ds->num_documents(), 0);
  EXPECT_EQ(ds->Get<int32_t>(0).status().code(), absl::StatusCode::kOutOfRange);
}

// The example dataset laid out byte by byte from the format description: dtype uint16, three
// sequences {10, 11}, {}, {20, 21, 22}; documents [seq 0, seq 1] and [seq 2].
std::string HandIndex() {
  std::string idx;
  idx.append("MMIDIDX\x00\x00", 9);
  Put<uint64_t>(&idx, 1);  // version
  Put<uint8_t>(&idx, 8);   // uint16
  Put<uint64_t>(&idx, 3);  // sequence count
  Put<uint64_t>(&idx, 3);  // document count (entries of the document index)
  for (int32_t len : {2, 0, 3}) Put<int32_t>(&idx, len);
  for (int64_t ptr : {0, 4, 4}) Put<int64_t>(&idx, ptr);
  for (int64_t doc : {0, 2, 3}) Put<int64_t>(&idx, doc);
  return idx;
}

std::string HandBin() {
  std::string bin;
  for (uint16_t t : {10, 11, 20, 21, 22}) Put<uint16_t>(&bin, t);
  return bin;
}

TEST(IndexedDatasetTest, HandLaidOutFileLoads) {
  const std::string idx = HandIndex();
  ASSERT_EQ(idx.size(), 34u + 12 * 3 + 8 * 3);
  ASSERT_EQ(static_cast<unsigned char>(idx[17]), 8);  // dtype code byte
  const std::string prefix = TempPrefix("hand");
  WriteFile(prefix + ".idx", idx);
  WriteFile(prefix + ".bin", HandBin());
  absl::StatusOr<IndexedDataset> ds = IndexedDataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->dtype(), IndexedDType::kUInt16);
  EXPECT_EQ(ds->num_sequences(), 3);
  EXPECT_EQ(ds->num_documents(), 2);
  EXPECT_EQ(ds->DocumentIndices(), (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(ds->SequenceLength(2), 3);
  EXPECT_EQ(ds->SequencePointer(2), 4);
  auto s0 = ds->Get<uint16_t>(0);
  auto s1 = ds->Get<uint16_t>(1);
  auto s2 = ds->Get<uint16_t>(2);
  ASSERT_TRUE(s0.ok() && s1.ok() && s2.ok());
  EXPECT_EQ(std::vector<uint16_t>(s0->begin(), s0->end()), (std::vector<uint16_t>{10, 11}));
  EXPECT_TRUE(s1->empty());
  EXPECT_EQ(std::vector<uint16_t>(s2->begin(), s2->end()), (std::vector<uint16_t>{20, 21, 22}));
  std::vector<int32_t> part(2);
  ASSERT_TRUE(ds->ReadTokens(2, 1, absl::MakeSpan(part)).ok());
  EXPECT_EQ(part, (std::vector<int32_t>{21, 22}));
  EXPECT_EQ(ds->ReadTokens(2, 2, absl::MakeSpan(part)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ds->Get<int32_t>(0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ds->Get<uint16_t>(3).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ds->Get<uint16_t>(-1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(IndexedDatasetTest, WriterProducesTheHandLaidOutBytes) {
  IndexedDatasetWriter writer(IndexedDType::kUInt16);
  ASSERT_TRUE(writer.Add({10, 11}).ok());
  ASSERT_TRUE(writer.Add({}).ok());
  writer.EndDocument();
  ASSERT_TRUE(writer.Add({20, 21, 22}).ok());
  // No EndDocument: Finalize closes the open document.
  EXPECT_EQ(writer.IndexBytes(), HandIndex());
  const std::string prefix = TempPrefix("hand_writer");
  ASSERT_TRUE(writer.Finalize(prefix).ok());
  EXPECT_EQ(ReadFile(prefix + ".idx"), HandIndex());
  EXPECT_EQ(ReadFile(prefix + ".bin"), HandBin());
}

TEST(IndexedDatasetTest, WriterRejectsTokensOutsideTheDtype) {
  IndexedDatasetWriter writer(IndexedDType::kUInt16);
  EXPECT_EQ(writer.Add({1, 65536}).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(writer.Add({-1}).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(writer.num_sequences(), 0);
  IndexedDatasetWriter int8_writer(IndexedDType::kInt8);
  EXPECT_TRUE(int8_writer.Add({-128, 127}).ok());
  EXPECT_EQ(int8_writer.Add({128}).code(), absl::StatusCode::kOutOfRange);
  IndexedDatasetWriter float_writer(IndexedDType::kFloat32);
  EXPECT_EQ(float_writer.Add({1}).code(), absl::StatusCode::kFailedPrecondition);
  const float values[2] = {1.5f, -2.0f};
  EXPECT_TRUE(float_writer.AddRaw(values, 2).ok());
}

TEST(IndexedDatasetTest, MissingFilesAreNotFound) {
  EXPECT_EQ(IndexedDataset::Open(TempPrefix("nonexistent")).status().code(),
            absl::StatusCode::kNotFound);
  const std::string prefix = TempPrefix("no_bin");
  WriteFile(prefix + ".idx", HandIndex());
  EXPECT_EQ(IndexedDataset::Open(prefix).status().code(), absl::StatusCode::kNotFound);
}

// Opens `idx` + `bin` and expects kInvalidArgument whose message names the .idx file and
// contains `field`.
void ExpectRejected(const std::string& idx, const std::string& bin, const std::string& field,
                    const std::string& name) {
  const std::string prefix = TempPrefix(name);
  WriteFile(prefix + ".idx", idx);
  WriteFile(prefix + ".bin", bin);
  absl::StatusOr<IndexedDataset> ds = IndexedDataset::Open(prefix);
  ASSERT_FALSE(ds.ok()) << name;
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument) << ds.status();
  EXPECT_THAT(std::string(ds.status().message()), HasSubstr(prefix + ".idx"));
  EXPECT_THAT(std::string(ds.status().message()), HasSubstr(field));
  std::printf("%s -> %s\n", name.c_str(), std::string(ds.status().message()).c_str());
}

TEST(IndexedDatasetTest, CorruptedFieldsAreRejectedByName) {
  const std::string bin = HandBin();
  auto patched = [](size_t offset, auto value) {
    std::string idx = HandIndex();
    std::memcpy(&idx[offset], &value, sizeof(value));
    return idx;
  };
  ExpectRejected(patched(0, 'N'), bin, "magic", "bad_magic");
  ExpectRejected(patched(9, uint64_t{2}), bin, "version", "bad_version");
  ExpectRejected(patched(17, uint8_t{0}), bin, "dtype", "dtype_0");
  ExpectRejected(patched(17, uint8_t{9}), bin, "dtype", "dtype_9");
  ExpectRejected(patched(18, uint64_t{6}), bin, "sequence_count", "seq_count_big");
  ExpectRejected(patched(18, uint64_t{4}), bin, "document_count", "seq_count_4");
  ExpectRejected(patched(18, uint64_t{1} << 62), bin, "sequence_count", "seq_count_huge");
  ExpectRejected(patched(18, uint64_t{2}), bin, "file size", "seq_count_small");
  ExpectRejected(patched(26, uint64_t{4}), bin, "document_count", "doc_count_big");
  ExpectRejected(patched(26, ~uint64_t{0}), bin, "document_count", "doc_count_huge");
  ExpectRejected(patched(34, int32_t{-1}), bin, "sequence_lengths[0]", "negative_length");
  ExpectRejected(patched(34 + 8, int32_t{4}), bin, "sequence_pointers[2]", "length_past_bin");
  ExpectRejected(patched(46, int64_t{-2}), bin, "sequence_pointers[0]", "negative_pointer");
  ExpectRejected(patched(46, int64_t{1}), bin, "sequence_pointers[0]", "misaligned_pointer");
  ExpectRejected(patched(46 + 16, int64_t{1} << 62), bin, "sequence_pointers[2]", "huge_pointer");
  ExpectRejected(patched(70, int64_t{1}), bin, "document_indices[0]", "doc_start");
  ExpectRejected(patched(78, int64_t{4}), bin, "document_indices[1]", "doc_past_end");
  ExpectRejected(patched(86, int64_t{2}), bin, "document_indices[2]", "doc_short_end");
  ExpectRejected(HandIndex() + std::string(3, '\0'), bin, "file size", "trailing");
  ExpectRejected(HandIndex(), bin.substr(0, bin.size() - 2), "sequence_pointers[2]",
                 "truncated_bin");
}

TEST(IndexedDatasetTest, DecreasingDocumentIndexIsRejected) {
  // 4 document entries {0, 2, 1, 3}.
  std::string idx;
  idx.append("MMIDIDX\x00\x00", 9);
  Put<uint64_t>(&idx, 1);
  Put<uint8_t>(&idx, 8);
  Put<uint64_t>(&idx, 3);
  Put<uint64_t>(&idx, 4);
  for (int32_t len : {2, 0, 3}) Put<int32_t>(&idx, len);
  for (int64_t ptr : {0, 4, 4}) Put<int64_t>(&idx, ptr);
  for (int64_t doc : {0, 2, 1, 3}) Put<int64_t>(&idx, doc);
  ExpectRejected(idx, HandBin(), "document_indices[2]", "doc_decreasing");
}

TEST(IndexedDatasetTest, EveryTruncationIsRejected) {
  const std::string idx = HandIndex();
  for (size_t n = 0; n < idx.size(); ++n) {
    const std::string prefix = TempPrefix("trunc");
    WriteFile(prefix + ".idx", idx.substr(0, n));
    WriteFile(prefix + ".bin", HandBin());
    absl::StatusOr<IndexedDataset> ds = IndexedDataset::Open(prefix);
    ASSERT_FALSE(ds.ok()) << "idx truncated to " << n << " bytes opened";
    EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument) << ds.status();
  }
}

TEST(IndexedDatasetTest, RandomCorruptionNeverCrashes) {
  std::mt19937_64 rng(12345);
  const std::string good = HandIndex();
  int accepted = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string idx = good;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) idx[rng() % idx.size()] = static_cast<char>(rng());
    const std::string prefix = TempPrefix("fuzz");
    WriteFile(prefix + ".idx", idx);
    WriteFile(prefix + ".bin", HandBin());
    absl::StatusOr<IndexedDataset> ds = IndexedDataset::Open(prefix);
    if (!ds.ok()) {
      ASSERT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument) << ds.status();
      continue;
    }
    ++accepted;
    // Whatever was accepted must be readable within bounds.
    for (int64_t i = 0; i < ds->num_sequences(); ++i) {
      absl::StatusOr<absl::string_view> bytes = ds->GetBytes(i);
      ASSERT_TRUE(bytes.ok());
      volatile char sink = 0;
      for (char c : *bytes) sink ^= c;
      (void)sink;
    }
  }
  std::printf("random corruption: %d of 2000 mutated index files were still valid\n", accepted);
}

}  // namespace
}  // namespace switchyard
