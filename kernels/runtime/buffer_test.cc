// Buffer ownership: moves transfer the memory exactly once (no leak, no double free).
#include "kernels/runtime/buffer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <utility>

namespace switchyard::kernels {
namespace {

TEST(BufferTest, MoveAssignmentIntoNonEmptyBufferFreesOnce) {
  Buffer a = Buffer::ForTensor(DType::kF32, {4, 3}, Device::Cpu()).value();
  Buffer b = Buffer::ForTensor(DType::kI32, {5}, Device::Cpu()).value();
  void* b_data = b.data();
  a = std::move(b);  // a's old memory and shape vector are released first
  EXPECT_EQ(a.data(), b_data);
  EXPECT_EQ(a.View().shape, (std::vector<int64_t>{5}));
  EXPECT_EQ(a.View().dtype, DType::kI32);
  EXPECT_EQ(b.data(), nullptr);
  a = Buffer();  // reset to empty
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.bytes(), 0u);
  Buffer c(std::move(a));
  EXPECT_EQ(c.data(), nullptr);
}

TEST(BufferTest, CopyAndFillOnTheCpu) {
  Buffer a = Buffer::ForTensor(DType::kF32, {3}, Device::Cpu()).value();
  Buffer b = Buffer::ForTensor(DType::kF32, {3}, Device::Cpu()).value();
  for (int i = 0; i < 3; ++i) a.View().as<float>()[i] = i + 0.5f;
  ASSERT_TRUE(CopyTensor(a.View(), b.View()).ok());
  EXPECT_EQ(b.View().as<float>()[2], 2.5f);
  ASSERT_TRUE(FillBytes(b.View(), 0).ok());
  EXPECT_EQ(b.View().as<float>()[1], 0.0f);
  Buffer wrong = Buffer::ForTensor(DType::kF32, {2}, Device::Cpu()).value();
  EXPECT_EQ(CopyTensor(a.View(), wrong.View()).code(), absl::StatusCode::kInvalidArgument);
}

// The process-wide counters follow allocations, moves and releases exactly.
TEST(BufferTest, MemoryCountersTrackCurrentAndPeak) {
  const BufferMemoryStats start = BufferMemory(DeviceType::kCpu);
  ResetBufferPeak(DeviceType::kCpu);
  {
    Buffer a = Buffer::ForTensor(DType::kF32, {1000}, Device::Cpu()).value();  // 4000 bytes
    Buffer b = Buffer::Allocate(Device::Cpu(), 96).value();
    EXPECT_EQ(BufferMemory(DeviceType::kCpu).current_bytes, start.current_bytes + 4096);
    Buffer c(std::move(a));  // a move neither allocates nor frees
    b = Buffer();            // frees 96
    EXPECT_EQ(BufferMemory(DeviceType::kCpu).current_bytes, start.current_bytes + 4000);
    Buffer empty = Buffer::Allocate(Device::Cpu(), 0).value();
  }
  const BufferMemoryStats end = BufferMemory(DeviceType::kCpu);
  std::printf("CPU buffer bytes: current %lld -> %lld, peak %lld, allocations +%lld\n",
              static_cast<long long>(start.current_bytes),
              static_cast<long long>(end.current_bytes), static_cast<long long>(end.peak_bytes),
              static_cast<long long>(end.allocations - start.allocations));
  EXPECT_EQ(end.current_bytes, start.current_bytes);
  EXPECT_EQ(end.peak_bytes, start.current_bytes + 4096);
  EXPECT_EQ(end.allocations - start.allocations, 2);  // the empty buffer is not counted
  ResetBufferPeak(DeviceType::kCpu);
  EXPECT_EQ(BufferMemory(DeviceType::kCpu).peak_bytes, end.current_bytes);
  EXPECT_EQ(BufferMemory(DeviceType::kCuda).current_bytes, 0);  // no CUDA buffer in this test
}

}  // namespace
}  // namespace switchyard::kernels
