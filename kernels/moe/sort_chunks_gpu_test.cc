// CUDA chunk sort against the CPU reference on fresh random inputs (std::random_device seed):
// random ragged split sizes (many empty chunks, spare rows past the total), Megatron's local-expert
// order and random permutations, SortChunks and UnsortChunks, bf16 and f32 rows with and without
// probs, 16-byte and narrower (misaligned) vector paths, N = 0 and the largest chunk count.
// Outputs are poisoned (0xFF bytes) on both sides first and compared byte for byte over the
// whole buffer: the op is a copy (exact), and rows past the total must stay untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/moe/sort_chunks.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

struct Case {
  int64_t sources, local_experts, h;
  DType dtype;
  bool probs;
  bool shuffle_order;  // a random permutation instead of Megatron's sort order
  int64_t misalign;    // elements by which the row views are offset (0 = aligned)
  int64_t max_chunk;   // split sizes drawn from [0, max_chunk]
  int64_t spare_rows;  // rows past the total
};

std::vector<uint8_t> Bytes(const Tensor& t) {
  std::vector<uint8_t> v(t.bytes());
  Tensor host(t.dtype, t.shape, Device::Cpu(), v.data());
  EXPECT_TRUE(CopyTensor(t, host).ok());
  return v;
}

Buffer Alloc(Device dev, size_t bytes) {
  return Buffer::Allocate(dev, std::max<size_t>(bytes, 16)).value();
}

Tensor At(const Buffer& b, DType dtype, std::vector<int64_t> shape, int64_t offset_elems) {
  return Tensor(dtype, std::move(shape), b.View().device,
                static_cast<char*>(b.View().data) + offset_elems * DTypeSize(dtype));
}

void RunCase(const Case& c, bool inverse, std::mt19937_64& rng) {
  const int64_t chunks = c.sources * c.local_experts;
  std::vector<int32_t> sizes(chunks);
  for (auto& s : sizes) {
    s = rng() % 3 == 0 ? 0 : static_cast<int32_t>(rng() % (c.max_chunk + 1));
  }
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  const int64_t n = total + c.spare_rows, h = c.h;
  std::vector<int32_t> order = LocalExpertChunkOrder(c.sources, c.local_experts).value().sort;
  if (c.shuffle_order) std::shuffle(order.begin(), order.end(), rng);
  const size_t esz = DTypeSize(c.dtype);
  const size_t row_buf = (n * h + c.misalign) * esz, prob_buf = (n + c.misalign) * sizeof(float);
  const Device cpu_dev = Device::Cpu(), gpu_dev = Device::Cuda(0);

  // Host inputs: random rows (NaN-free), random probs; host outputs poisoned.
  Buffer in_h = Alloc(cpu_dev, row_buf), p_h = Alloc(cpu_dev, prob_buf);
  Buffer out_h = Alloc(cpu_dev, row_buf), po_h = Alloc(cpu_dev, prob_buf);
  Tensor in_v = At(in_h, c.dtype, {n, h}, c.misalign), p_v = At(p_h, DType::kF32, {n}, c.misalign);
  testing::FillRandom(in_v, rng);
  testing::FillRandom(p_v, rng);
  std::memset(out_h.View().data, 0xFF, std::max<size_t>(row_buf, 16));
  std::memset(po_h.View().data, 0xFF, std::max<size_t>(prob_buf, 16));
  Tensor out_v = At(out_h, c.dtype, {n, h}, c.misalign),
         po_v = At(po_h, DType::kF32, {n}, c.misalign);
  Tensor split_h(DType::kI32, {chunks}, cpu_dev, sizes.data());
  auto op = inverse ? UnsortChunks : SortChunks;
  absl::Status st = op(Stream::Cpu(), in_v, split_h, order, out_v, c.probs ? p_v : Tensor(),
                       c.probs ? po_v : Tensor(), Tensor());
  ASSERT_TRUE(st.ok()) << st;

  // Device: same bytes in, poisoned out and workspace.
  Buffer in_d = Alloc(gpu_dev, row_buf), p_d = Alloc(gpu_dev, prob_buf);
  Buffer out_d = Alloc(gpu_dev, row_buf), po_d = Alloc(gpu_dev, prob_buf);
  Buffer split_d = Alloc(gpu_dev, chunks * sizeof(int32_t));
  Buffer ws = Alloc(gpu_dev, SortChunksWorkspaceBytes(chunks));
  ASSERT_TRUE(CopyTensor(in_h.View(), in_d.View()).ok());
  ASSERT_TRUE(CopyTensor(p_h.View(), p_d.View()).ok());
  ASSERT_TRUE(FillBytes(out_d.View(), 0xFF).ok());
  ASSERT_TRUE(FillBytes(po_d.View(), 0xFF).ok());
  ASSERT_TRUE(FillBytes(ws.View(), 0xFF).ok());
  Tensor split_dv(DType::kI32, {chunks}, gpu_dev, split_d.View().data);
  ASSERT_TRUE(CopyTensor(split_h, split_dv).ok());
  const Stream gpu{gpu_dev, nullptr};
  st = op(gpu, At(in_d, c.dtype, {n, h}, c.misalign), split_dv, order,
          At(out_d, c.dtype, {n, h}, c.misalign),
          c.probs ? At(p_d, DType::kF32, {n}, c.misalign) : Tensor(),
          c.probs ? At(po_d, DType::kF32, {n}, c.misalign) : Tensor(), ws.View());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const bool rows_equal = Bytes(out_d.View()) == Bytes(out_h.View());
  const bool probs_equal = Bytes(po_d.View()) == Bytes(po_h.View());
  std::printf(
      "%s S=%lld L=%lld %s N=%lld (total %lld) H=%lld probs=%d shuffled=%d misalign=%lld: "
      "rows %s, probs %s (exact equality required)\n",
      inverse ? "UnsortChunks" : "SortChunks", static_cast<long long>(c.sources),
      static_cast<long long>(c.local_experts), c.dtype == DType::kBF16 ? "bf16" : "f32",
      static_cast<long long>(n), static_cast<long long>(total), static_cast<long long>(h), c.probs,
      c.shuffle_order, static_cast<long long>(c.misalign), rows_equal ? "equal" : "DIFFER",
      probs_equal ? "equal" : "DIFFER");
  EXPECT_TRUE(rows_equal);
  EXPECT_TRUE(probs_equal);
}

class SortChunksGpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(SortChunksGpuTest, MatchesCpuExactly) {
  SY_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  for (bool inverse : {false, true}) RunCase(GetParam(), inverse, rng);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SortChunksGpuTest,
    ::testing::Values(
        // S, L, H, dtype, probs, shuffled, misalign, max_chunk, spare
        Case{4, 2, 1024, DType::kBF16, true, false, 0, 40, 5},   // 16-byte path
        Case{8, 4, 7168, DType::kBF16, true, false, 0, 64, 0},   // wide rows
        Case{2, 3, 256, DType::kF32, true, true, 0, 50, 3},      // f32
        Case{3, 5, 129, DType::kF32, false, true, 0, 20, 2},     // 4-byte units
        Case{4, 4, 3, DType::kBF16, true, false, 1, 30, 7},      // 2-byte units, misaligned
        Case{2, 2, 64, DType::kBF16, true, false, 1, 10, 1},     // misaligned views
        Case{1, 1, 32, DType::kBF16, true, false, 0, 100, 4},    // one chunk
        Case{5, 3, 16, DType::kBF16, true, true, 0, 0, 0},       // all chunks empty, N = 0
        Case{5, 3, 16, DType::kF32, true, true, 0, 0, 9},        // all empty, spare rows only
        Case{64, 16, 8, DType::kBF16, true, false, 0, 6, 11},    // kMaxSortChunks chunks
        Case{256, 4, 128, DType::kBF16, true, true, 0, 3, 0}));  // kMaxSortChunks, shuffled

}  // namespace
}  // namespace switchyard::kernels
