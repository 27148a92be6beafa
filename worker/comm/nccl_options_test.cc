// File: worker/comm/nccl_options_test.cc
//
// The SWITCHYARD_NCCL_BLOCKING override of NcclOptions::blocking (nccl_communicator.h), on the
// CPU: the parser's table, and NcclCommunicator::Create refusing a bad value before it touches
// CUDA or the store (so it runs without a GPU). The modes themselves are tested on GPUs by
// nccl_communicator_gpu_test.
#include <cstdlib>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "worker/comm/kv_store.h"
#include "worker/comm/nccl_communicator.h"

namespace switchyard::comm {
namespace {

class BlockingEnvTest : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv("SWITCHYARD_NCCL_BLOCKING"); }
};

TEST_F(BlockingEnvTest, UnsetOrEmptyOrZeroKeepsTheOption) {
  unsetenv("SWITCHYARD_NCCL_BLOCKING");
  EXPECT_EQ(*BlockingFromEnvironment(false), false);
  EXPECT_EQ(*BlockingFromEnvironment(true), true);
  setenv("SWITCHYARD_NCCL_BLOCKING", "", 1);
  EXPECT_EQ(*BlockingFromEnvironment(false), false);
  EXPECT_EQ(*BlockingFromEnvironment(true), true);
  setenv("SWITCHYARD_NCCL_BLOCKING", "0", 1);
  EXPECT_EQ(*BlockingFromEnvironment(false), false);
  EXPECT_EQ(*BlockingFromEnvironment(true), true);
}

TEST_F(BlockingEnvTest, OneForcesBlocking) {
  setenv("SWITCHYARD_NCCL_BLOCKING", "1", 1);
  EXPECT_EQ(*BlockingFromEnvironment(false), true);
  EXPECT_EQ(*BlockingFromEnvironment(true), true);
}

TEST_F(BlockingEnvTest, OtherValuesAreRefusedNamingTheVariable) {
  for (const char* bad : {"yes", "true", "2", " 1"}) {
    setenv("SWITCHYARD_NCCL_BLOCKING", bad, 1);
    const absl::StatusOr<bool> got = BlockingFromEnvironment(false);
    ASSERT_FALSE(got.ok()) << bad;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(got.status().message(), "SWITCHYARD_NCCL_BLOCKING"))
        << got.status();
    EXPECT_TRUE(absl::StrContains(got.status().message(), "must be 1")) << got.status();
  }
}

TEST_F(BlockingEnvTest, CreateRefusesABadValueBeforeAnyCudaCall) {
  setenv("SWITCHYARD_NCCL_BLOCKING", "yes", 1);
  auto comm = NcclCommunicator::Create(std::make_shared<InMemoryKvStore>(), 0, 2, 0, nullptr,
                                       NcclOptions{}, "world");
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument) << comm.status();
  EXPECT_TRUE(absl::StrContains(comm.status().message(), "group 'world' rank 0/2 Create"))
      << comm.status();
  EXPECT_TRUE(absl::StrContains(comm.status().message(), "SWITCHYARD_NCCL_BLOCKING"))
      << comm.status();
}

}  // namespace
}  // namespace switchyard::comm
