// File: worker/comm/communicator_test.cc
#include "worker/comm/communicator.h"

#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace switchyard::comm {
namespace {

Tensor F32(std::vector<float>& v) {
  return Tensor(DType::kF32, {static_cast<int64_t>(v.size())}, Device::Cpu(), v.data());
}

TEST(SingleRankCommunicatorTest, CollectivesAreExactCopies) {
  auto comm = *SingleRankCommunicator::Create("solo");
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  std::vector<float> in = {1.5f, -2.25f, 3.0f}, out(3, -1.0f);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    std::fill(out.begin(), out.end(), -1.0f);
    ASSERT_TRUE(comm->AllReduce(F32(in), F32(out), op).ok());
    EXPECT_EQ(out, in);
  }
  ASSERT_TRUE(comm->AllReduce(F32(in), F32(in), ReduceOp::kSum).ok());  // in place
  std::fill(out.begin(), out.end(), -1.0f);
  ASSERT_TRUE(comm->ReduceScatter(F32(in), F32(out), ReduceOp::kSum).ok());
  EXPECT_EQ(out, in);
  std::fill(out.begin(), out.end(), -1.0f);
  ASSERT_TRUE(comm->AllGather(F32(in), F32(out)).ok());
  EXPECT_EQ(out, in);
  std::fill(out.begin(), out.end(), -1.0f);
  ASSERT_TRUE(comm->AllGatherV(F32(in), F32(out), {3}).ok());
  EXPECT_EQ(out, in);
  std::fill(out.begin(), out.end(), -1.0f);
  ASSERT_TRUE(comm->AllToAllV(F32(in), {3}, F32(out), {3}).ok());
  EXPECT_EQ(out, in);
  EXPECT_TRUE(comm->Broadcast(F32(in), 0).ok());
  EXPECT_TRUE(comm->Barrier().ok());
}

TEST(SingleRankCommunicatorTest, BadArgumentsNameTheGroup) {
  auto comm = *SingleRankCommunicator::Create("solo");
  std::vector<float> a(3), b(4);
  absl::Status s = comm->AllReduce(F32(a), F32(b), ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "group 'solo'")) << s;
  EXPECT_EQ(comm->AllGatherV(F32(a), F32(a), {3, 0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->Send(F32(a), 0, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->Recv(F32(a), 1, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->Broadcast(F32(a), 1).code(), absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> bytes(3);
  Tensor u8(DType::kU8, {3}, Device::Cpu(), bytes.data());
  EXPECT_EQ(comm->AllReduce(u8, u8, ReduceOp::kSum).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(comm->AllGather(u8, u8).ok());  // data movement accepts any dtype
}

TEST(SingleRankCommunicatorTest, AbortMakesLaterCallsFail) {
  auto comm = *SingleRankCommunicator::Create("solo");
  comm->Abort();
  comm->Abort();
  absl::Status s = comm->Barrier();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(s.message(), "solo")) << s;
}

}  // namespace
}  // namespace switchyard::comm
