// OwnedStream and Event on the CPU: inert by design (stream.h), and move-only ownership.
#include "kernels/runtime/stream.h"

#include <gtest/gtest.h>

#include <utility>

namespace switchyard::kernels {
namespace {

TEST(StreamTest, CpuStreamIsTheCallingThread) {
  absl::StatusOr<OwnedStream> s = OwnedStream::Create(Device::Cpu());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->view().is_cuda());
  EXPECT_EQ(s->view().cuda_stream, nullptr);
  EXPECT_TRUE(s->Synchronize().ok());
}

TEST(StreamTest, CpuEventIsAlwaysComplete) {
  absl::StatusOr<Event> start = Event::Create(Device::Cpu(), Event::Timing::kOn);
  absl::StatusOr<Event> end = Event::Create(Device::Cpu(), Event::Timing::kOn);
  ASSERT_TRUE(start.ok() && end.ok());
  const Stream cpu = Stream::Cpu();
  EXPECT_TRUE(start->Record(cpu).ok());
  EXPECT_TRUE(end->Record(cpu).ok());
  EXPECT_TRUE(end->MakeWait(cpu).ok());
  EXPECT_TRUE(end->Synchronize().ok());
  ASSERT_TRUE(end->Done().ok());
  EXPECT_TRUE(*end->Done());
  absl::StatusOr<float> ms = end->ElapsedMsSince(*start);
  ASSERT_TRUE(ms.ok());
  EXPECT_EQ(*ms, 0.0f);
  EXPECT_EQ(end->cuda_event(), nullptr);
  EXPECT_FALSE(end->is_cuda());
  EXPECT_TRUE(StreamWaitStream(cpu, cpu, *end).ok());
}

TEST(StreamTest, MovesTransferOwnership) {
  OwnedStream a = OwnedStream::Create(Device::Cpu()).value();
  OwnedStream b = std::move(a);
  EXPECT_FALSE(b.view().is_cuda());
  Event e = Event::Create(Device::Cpu()).value();
  Event f;
  f = std::move(e);
  EXPECT_TRUE(f.Record(Stream::Cpu()).ok());
}

}  // namespace
}  // namespace switchyard::kernels
