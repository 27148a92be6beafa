// OwnedStream and Event on a CUDA device: a join through an event orders a second stream after
// the first (the copy it gates reads the first stream's last write), device timing is positive,
// and Done() turns true once the recorded work completes.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/runtime/buffer.h"
#include "kernels/runtime/stream.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

TEST(StreamGpuTest, EventJoinOrdersTheSecondStream) {
  SY_REQUIRE_GPU();
  const Device dev = Device::Cuda(0);
  OwnedStream producer = OwnedStream::Create(dev).value();
  OwnedStream consumer = OwnedStream::Create(dev).value();
  ASSERT_NE(producer.view().cuda_stream, nullptr);
  ASSERT_NE(producer.view().cuda_stream, consumer.view().cuda_stream);
  Event start = Event::Create(dev, Event::Timing::kOn).value();
  Event joined = Event::Create(dev, Event::Timing::kOn).value();

  const size_t bytes = size_t{256} << 20;
  Buffer x = Buffer::Allocate(dev, bytes).value();
  Buffer y = Buffer::Allocate(dev, bytes).value();
  ASSERT_EQ(cudaMemset(y.data(), 0, bytes), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // Many full-buffer writes on the producer, the last one 0x5A; the consumer copies x to y only
  // after the join. Without the wait, the copy would start at once and read an earlier value.
  ASSERT_TRUE(start.Record(producer.view()).ok());
  for (int i = 0; i < 16; ++i) {
    ASSERT_EQ(cudaMemsetAsync(x.data(), i, bytes, producer.view().cuda_stream), cudaSuccess);
  }
  ASSERT_EQ(cudaMemsetAsync(x.data(), 0x5A, bytes, producer.view().cuda_stream), cudaSuccess);
  ASSERT_TRUE(StreamWaitStream(consumer.view(), producer.view(), joined).ok());
  ASSERT_EQ(cudaMemcpyAsync(y.data(), x.data(), bytes, cudaMemcpyDeviceToDevice,
                            consumer.view().cuda_stream),
            cudaSuccess);
  ASSERT_TRUE(consumer.Synchronize().ok());

  std::vector<uint8_t> host(bytes);
  ASSERT_EQ(cudaMemcpy(host.data(), y.data(), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  int64_t wrong = 0;
  for (uint8_t b : host) wrong += b != 0x5A;
  EXPECT_EQ(wrong, 0) << "bytes the consumer copied before the producer's last write";

  ASSERT_TRUE(joined.Synchronize().ok());
  absl::StatusOr<bool> done = joined.Done();
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  absl::StatusOr<float> ms = joined.ElapsedMsSince(start);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GT(*ms, 0.0f);
  std::printf("17 x 256 MiB memsets: %.3f ms of device time\n", *ms);
}

TEST(StreamGpuTest, OwnedStreamIsNonBlockingAndReleased) {
  SY_REQUIRE_GPU();
  OwnedStream s = OwnedStream::Create(Device::Cuda(0)).value();
  unsigned flags = 0;
  ASSERT_EQ(cudaStreamGetFlags(s.view().cuda_stream, &flags), cudaSuccess);
  EXPECT_EQ(flags & cudaStreamNonBlocking, cudaStreamNonBlocking);
  OwnedStream moved = std::move(s);
  EXPECT_EQ(s.view().cuda_stream, nullptr);  // NOLINT(bugprone-use-after-move): documented state
  EXPECT_TRUE(moved.Synchronize().ok());
}

}  // namespace
}  // namespace switchyard::kernels
