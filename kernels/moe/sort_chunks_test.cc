// CPU chunk sort (sort_chunks.h): Megatron's constant orders, hand-computed cases (ragged and
// empty chunks, rows past the total untouched), a naive transcription of sort_chunks_by_idxs
// (split then cat) on random cases, round trips, Megatron's combine form, and bad arguments.
#include "kernels/moe/sort_chunks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace switchyard::kernels {
namespace {

using ::testing::HasSubstr;

constexpr float kPoison = -999.0f;

Tensor View(std::vector<float>& v, int64_t rows, int64_t cols) {
  return Tensor(DType::kF32, {rows, cols}, Device::Cpu(), v.data());
}
Tensor View1(std::vector<float>& v) {
  return Tensor(DType::kF32, {static_cast<int64_t>(v.size())}, Device::Cpu(), v.data());
}
Tensor Splits(std::vector<int32_t>& s) {
  return Tensor(DType::kI32, {static_cast<int64_t>(s.size())}, Device::Cpu(), s.data());
}

// Rows valued 10*row + col.
std::vector<float> Rows(int64_t n, int64_t h) {
  std::vector<float> v(n * h);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < h; ++c) v[r * h + c] = static_cast<float>(10 * r + c);
  }
  return v;
}

// Row r of `v` (width h) as written by a source row, or -1 when it is poison.
std::vector<int> SourceRows(const std::vector<float>& v, int64_t h) {
  std::vector<int> rows;
  for (size_t r = 0; r * h < v.size(); ++r) {
    rows.push_back(v[r * h] == kPoison ? -1 : static_cast<int>(v[r * h] / 10));
    for (int64_t c = 0; c < h; ++c) {
      EXPECT_EQ(v[r * h + c], v[r * h] == kPoison ? kPoison : v[r * h] + c) << "row " << r;
    }
  }
  return rows;
}

// Naive Megatron: torch.cat([torch.split(x, sizes)[i] for i in order]) over row indices.
std::vector<int> NaiveSort(const std::vector<int32_t>& sizes, const std::vector<int32_t>& order) {
  std::vector<std::vector<int>> chunks;
  int row = 0;
  for (int32_t s : sizes) {
    chunks.emplace_back();
    for (int i = 0; i < s; ++i) chunks.back().push_back(row++);
  }
  std::vector<int> out;
  for (int32_t i : order) out.insert(out.end(), chunks[i].begin(), chunks[i].end());
  return out;
}

TEST(LocalExpertChunkOrderTest, MatchesMegatronExample) {
  // megatron_moe.md §3.2: E=8, EP=4, ETP=1 (nle=2).
  auto o = LocalExpertChunkOrder(4, 2);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->sort, (std::vector<int32_t>{0, 2, 4, 6, 1, 3, 5, 7}));
  EXPECT_EQ(o->restore, (std::vector<int32_t>{0, 4, 1, 5, 2, 6, 3, 7}));
}

TEST(LocalExpertChunkOrderTest, RestoreIsInverseOfSort) {
  for (int s : {1, 2, 3, 8}) {
    for (int l : {1, 2, 5}) {
      auto o = LocalExpertChunkOrder(s, l);
      ASSERT_TRUE(o.ok()) << o.status();
      for (int r = 0; r < s; ++r) {
        for (int e = 0; e < l; ++e) {
          EXPECT_EQ(o->sort[e * s + r], r * l + e);
          EXPECT_EQ(o->restore[r * l + e], e * s + r);
        }
      }
      for (int i = 0; i < s * l; ++i) EXPECT_EQ(o->restore[o->sort[i]], i);
    }
  }
}

TEST(LocalExpertChunkOrderTest, RejectsBadSizes) {
  EXPECT_THAT(std::string(LocalExpertChunkOrder(0, 2).status().message()),
              HasSubstr("num_sources (0)"));
  EXPECT_THAT(std::string(LocalExpertChunkOrder(2, -1).status().message()),
              HasSubstr("num_local_experts (-1)"));
  EXPECT_FALSE(LocalExpertChunkOrder(1 << 20, 1 << 20).ok());
}

TEST(SortChunksTest, HandComputedRaggedChunks) {
  // S=2 sources, L=2 experts: chunks (r0,e0)=rows 0-1, (r0,e1)=row 2, (r1,e0)=rows 3-5,
  // (r1,e1)=row 6; row 7 is spare. Sorted by expert: [0, 2, 1, 3].
  std::vector<float> in = Rows(8, 3), out(8 * 3, kPoison);
  std::vector<int32_t> sizes = {2, 1, 3, 1};
  std::vector<float> p = {0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f}, po(8, kPoison);
  const std::vector<int32_t> order = {0, 2, 1, 3};
  ASSERT_TRUE(SortChunks(Stream::Cpu(), View(in, 8, 3), Splits(sizes), order, View(out, 8, 3),
                         View1(p), View1(po), Tensor())
                  .ok());
  EXPECT_EQ(SourceRows(out, 3), (std::vector<int>{0, 1, 3, 4, 5, 2, 6, -1}));
  EXPECT_EQ(po, (std::vector<float>{0, 1, 3, 4, 5, 2, 6, kPoison}));
  // Inverse of the result gives the input back; the spare row stays untouched.
  std::vector<float> back(8 * 3, kPoison), pb(8, kPoison);
  ASSERT_TRUE(UnsortChunks(Stream::Cpu(), View(out, 8, 3), Splits(sizes), order, View(back, 8, 3),
                           View1(po), View1(pb), Tensor())
                  .ok());
  EXPECT_EQ(SourceRows(back, 3), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, -1}));
  EXPECT_EQ(pb, (std::vector<float>{0, 1, 2, 3, 4, 5, 6, kPoison}));
}

TEST(SortChunksTest, HandComputedEmptyChunks) {
  // sizes [2, 0, 3, 1], order [3, 1, 0, 2] -> chunk 3 (row 5), chunk 1 (none), chunk 0 (0-1),
  // chunk 2 (2-4).
  std::vector<float> in = Rows(6, 2), out(6 * 2, kPoison);
  std::vector<int32_t> sizes = {2, 0, 3, 1};
  ASSERT_TRUE(SortChunks(Stream::Cpu(), View(in, 6, 2), Splits(sizes), {3, 1, 0, 2},
                         View(out, 6, 2), Tensor(), Tensor(), Tensor())
                  .ok());
  EXPECT_EQ(SourceRows(out, 2), (std::vector<int>{5, 0, 1, 2, 3, 4}));
  // All chunks empty: nothing written.
  std::vector<int32_t> zeros = {0, 0, 0, 0};
  std::vector<float> out2(6 * 2, kPoison);
  ASSERT_TRUE(SortChunks(Stream::Cpu(), View(in, 6, 2), Splits(zeros), {3, 1, 0, 2},
                         View(out2, 6, 2), Tensor(), Tensor(), Tensor())
                  .ok());
  EXPECT_EQ(SourceRows(out2, 2), std::vector<int>(6, -1));
}

TEST(SortChunksTest, ZeroRowsAndOneChunk) {
  std::vector<float> in, out;
  std::vector<int32_t> sizes = {0, 0};
  EXPECT_TRUE(SortChunks(Stream::Cpu(), View(in, 0, 4), Splits(sizes), {1, 0}, View(out, 0, 4),
                         Tensor(), Tensor(), Tensor())
                  .ok());
  std::vector<float> in1 = Rows(3, 1), out1(3, kPoison);
  std::vector<int32_t> one = {3};
  ASSERT_TRUE(SortChunks(Stream::Cpu(), View(in1, 3, 1), Splits(one), {0}, View(out1, 3, 1),
                         Tensor(), Tensor(), Tensor())
                  .ok());
  EXPECT_EQ(out1, in1);
}

TEST(SortChunksTest, Bf16RowsAndF64Probs) {
  std::vector<BF16> in(4 * 2), out(4 * 2, BF16::FromFloat(kPoison));
  for (int i = 0; i < 8; ++i) in[i] = BF16::FromFloat(static_cast<float>(i));
  std::vector<double> p = {0.5, 1.5, 2.5, 3.5}, po(4, -1.0);
  std::vector<int32_t> sizes = {1, 3};
  ASSERT_TRUE(SortChunks(Stream::Cpu(), Tensor(DType::kBF16, {4, 2}, Device::Cpu(), in.data()),
                         Splits(sizes), {1, 0},
                         Tensor(DType::kBF16, {4, 2}, Device::Cpu(), out.data()),
                         Tensor(DType::kF64, {4}, Device::Cpu(), p.data()),
                         Tensor(DType::kF64, {4}, Device::Cpu(), po.data()), Tensor())
                  .ok());
  const std::vector<float> want = {2, 3, 4, 5, 6, 7, 0, 1};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i].ToFloat(), want[i]) << i;
  EXPECT_EQ(po, (std::vector<double>{1.5, 2.5, 3.5, 0.5}));
}

// Random (S, L), ragged sizes with many empty chunks and spare rows: SortChunks matches the naive
// split+cat, UnsortChunks inverts it, and Megatron's combine form (SortChunks with the sizes in
// sorted order and the restore order) equals UnsortChunks.
TEST(SortChunksTest, RandomCasesMatchNaiveAndRoundTrip) {
  std::mt19937_64 rng(12345);
  for (int iter = 0; iter < 200; ++iter) {
    const int s = 1 + static_cast<int>(rng() % 6), l = 1 + static_cast<int>(rng() % 5);
    const int c = s * l;
    std::vector<int32_t> sizes(c);
    for (auto& v : sizes) v = rng() % 3 == 0 ? 0 : static_cast<int32_t>(rng() % 5);
    const int total = std::accumulate(sizes.begin(), sizes.end(), 0);
    const int n = total + static_cast<int>(rng() % 3), h = 1 + static_cast<int>(rng() % 3);
    const ChunkOrder o = LocalExpertChunkOrder(s, l).value();
    std::vector<int32_t> order = o.sort;
    if (iter % 2 == 1) std::shuffle(order.begin(), order.end(), rng);  // any permutation
    std::vector<float> in = Rows(n, h), fwd(n * h, kPoison), back(n * h, kPoison);
    ASSERT_TRUE(SortChunks(Stream::Cpu(), View(in, n, h), Splits(sizes), order, View(fwd, n, h),
                           Tensor(), Tensor(), Tensor())
                    .ok());
    std::vector<int> want = NaiveSort(sizes, order);
    want.resize(n, -1);
    ASSERT_EQ(SourceRows(fwd, h), want) << "iter " << iter;
    ASSERT_TRUE(UnsortChunks(Stream::Cpu(), View(fwd, n, h), Splits(sizes), order, View(back, n, h),
                             Tensor(), Tensor(), Tensor())
                    .ok());
    std::vector<int> ident(n, -1);
    std::iota(ident.begin(), ident.begin() + total, 0);
    ASSERT_EQ(SourceRows(back, h), ident) << "iter " << iter;
    // Megatron's combine: split = sizes permuted into the sorted order, idx = inverse order.
    std::vector<int32_t> sorted_sizes(c), inverse(c);
    for (int i = 0; i < c; ++i) {
      sorted_sizes[i] = sizes[order[i]];
      inverse[order[i]] = i;
    }
    if (iter % 2 == 0) {
      ASSERT_EQ(inverse, o.restore);
    }
    std::vector<float> back2(n * h, kPoison);
    ASSERT_TRUE(SortChunks(Stream::Cpu(), View(fwd, n, h), Splits(sorted_sizes), inverse,
                           View(back2, n, h), Tensor(), Tensor(), Tensor())
                    .ok());
    ASSERT_EQ(back2, back) << "iter " << iter;
  }
}

std::string Err(const absl::Status& s) { return std::string(s.message()); }

TEST(SortChunksTest, RejectsBadArguments) {
  std::vector<float> in = Rows(6, 2), out(12), p(6), po(6), p5(5);
  std::vector<int32_t> sizes = {2, 0, 3, 1}, neg = {2, -1, 3, 1}, big = {2, 4, 3, 1};
  std::vector<int32_t> three = {2, 0, 3};
  const Stream cpu = Stream::Cpu();
  const std::vector<int32_t> order = {0, 2, 1, 3};
  auto run = [&](const Tensor& x, const Tensor& sz, std::vector<int32_t> ord, const Tensor& y,
                 const Tensor& pr = Tensor(), const Tensor& pro = Tensor()) {
    return Err(SortChunks(cpu, x, sz, ord, y, pr, pro, Tensor()));
  };
  const Tensor x = View(in, 6, 2), y = View(out, 6, 2);
  EXPECT_THAT(run(x, Splits(sizes), {0, 2, 2, 3}, y), HasSubstr("sorted_order must be a perm"));
  EXPECT_THAT(run(x, Splits(sizes), {0, 2, 1, 4}, y), HasSubstr("entry 3 is 4"));
  EXPECT_THAT(run(x, Splits(sizes), {}, y), HasSubstr("sorted_order has 0 chunks"));
  EXPECT_THAT(run(x, Splits(sizes), std::vector<int32_t>(kMaxSortChunks + 1, 0), y),
              HasSubstr("sorted_order has 1025 chunks"));
  EXPECT_THAT(run(x, Splits(three), order, y), HasSubstr("split_sizes"));
  EXPECT_THAT(run(x, Splits(neg), order, y), HasSubstr("split_sizes[1] is -1"));
  EXPECT_THAT(run(x, Splits(big), order, y), HasSubstr("split_sizes sum to 10"));
  EXPECT_THAT(run(x, Tensor(DType::kF32, {4}, Device::Cpu(), p.data()), order, y),
              HasSubstr("split_sizes"));
  EXPECT_THAT(run(x, Splits(sizes), order, View(out, 3, 4)), HasSubstr("output"));
  EXPECT_THAT(run(x, Splits(sizes), order, x), HasSubstr("overlap"));
  EXPECT_THAT(run(Tensor(DType::kI32, {6, 2}, Device::Cpu(), in.data()), Splits(sizes), order, y),
              HasSubstr("input must be 2-D"));
  EXPECT_THAT(run(x, Splits(sizes), order, y, View1(p)), HasSubstr("probs_out"));
  EXPECT_THAT(run(x, Splits(sizes), order, y, View1(p5), View1(po)), HasSubstr("probs"));
  EXPECT_THAT(run(x, Splits(sizes), order, y, View1(p), View1(p)),
              HasSubstr("probs_out must not overlap"));
  EXPECT_THAT(
      run(x, Splits(sizes), order, Tensor(DType::kF32, {6, 2}, Device::Cuda(0), out.data())),
      HasSubstr("output"));
  // The op name leads the message.
  EXPECT_THAT(Err(UnsortChunks(cpu, x, Splits(neg), order, y, Tensor(), Tensor(), Tensor())),
              HasSubstr("UnsortChunks"));
}

}  // namespace
}  // namespace switchyard::kernels
