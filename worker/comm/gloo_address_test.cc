// File: worker/comm/gloo_address_test.cc
//
// Ranks whose Gloo transports listen on (and advertise) DIFFERENT addresses, as workers on
// different hosts do (issue 15, item 4: "the rendezvous works with workers that advertise
// different addresses, tested on the CPU with Gloo on two loopback addresses"): forked ranks,
// rank r on 127.0.0.(r + 1) (Linux routes all of 127/8 to loopback), meet through one file store
// and run an all-reduce, an uneven all-to-all and a send/recv, each checked exactly; and a rank
// given an address that is not on this host fails at Create naming the address, so the option
// is really what the transport binds to.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/testing/forked_ranks.h"

namespace switchyard::comm {
namespace {

template <typename T>
Tensor View(DType dtype, std::vector<T>& v) {
  return Tensor(dtype, {static_cast<int64_t>(v.size())}, Device::Cpu(), v.data());
}

int Child(const std::string& dir, int rank, int world) {
  std::shared_ptr<KvStore> store = testing::OpenFileStore(dir);
  SY_CHILD_CHECK(store != nullptr);
  GlooOptions options;
  options.timeout = absl::Seconds(10);
  options.hostname = absl::StrCat("127.0.0.", rank + 1);
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> comm =
      GlooCommunicator::Create(store, rank, world, options, "two_addresses");
  SY_CHILD_OK(comm.status());
  // AllReduce of rank + 1: 1 + 2 + ... + world.
  std::vector<int32_t> v = {rank + 1};
  SY_CHILD_OK((*comm)->AllReduce(View(DType::kI32, v), View(DType::kI32, v), ReduceOp::kSum));
  SY_CHILD_CHECK(v[0] == world * (world + 1) / 2);
  // Uneven AllToAllV: rank r sends j + 1 values (100 r + j) to rank j.
  std::vector<float> send, recv;
  std::vector<int64_t> send_counts(world), recv_counts(world);
  for (int j = 0; j < world; ++j) {
    send_counts[j] = j + 1;
    recv_counts[j] = rank + 1;
    for (int i = 0; i <= j; ++i) send.push_back(100.0f * rank + j);
  }
  recv.assign((rank + 1) * world, -1.0f);
  SY_CHILD_OK((*comm)->AllToAllV(View(DType::kF32, send), send_counts, View(DType::kF32, recv),
                                 recv_counts));
  for (int j = 0; j < world; ++j) {
    for (int i = 0; i <= rank; ++i) SY_CHILD_CHECK(recv[j * (rank + 1) + i] == 100.0f * j + rank);
  }
  // Send / Recv around the ring.
  std::vector<int64_t> out = {1000 + rank}, in = {-1};
  const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  if (rank % 2 == 0) {
    SY_CHILD_OK((*comm)->Send(View(DType::kI64, out), next, 7));
    SY_CHILD_OK((*comm)->Recv(View(DType::kI64, in), prev, 7));
  } else {
    SY_CHILD_OK((*comm)->Recv(View(DType::kI64, in), prev, 7));
    SY_CHILD_OK((*comm)->Send(View(DType::kI64, out), next, 7));
  }
  SY_CHILD_CHECK(in[0] == 1000 + prev);
  return 0;
}

TEST(GlooAddressTest, RanksOnDifferentLoopbackAddresses) {
  constexpr int kWorld = 4;  // 127.0.0.1 .. 127.0.0.4
  const std::string dir = testing::UniqueStoreDir("gloo_addresses");
  std::vector<int> codes = testing::RunProcesses(
      kWorld, absl::Seconds(30), [&](int rank) { return Child(dir, rank, kWorld); });
  EXPECT_EQ(codes, std::vector<int>(kWorld, 0));
}

TEST(GlooAddressTest, AnAddressNotOnThisHostFailsNamingIt) {
  std::vector<int> codes = testing::RunProcesses(1, absl::Seconds(30), [&](int) -> int {
    std::shared_ptr<KvStore> store =
        testing::OpenFileStore(testing::UniqueStoreDir("gloo_bad_address"));
    SY_CHILD_CHECK(store != nullptr);
    GlooOptions options;
    options.timeout = absl::Seconds(2);
    options.hostname = "192.0.2.1";  // TEST-NET-1 (RFC 5737): never a local address
    absl::StatusOr<std::unique_ptr<GlooCommunicator>> comm =
        GlooCommunicator::Create(store, 0, 1, options, "elsewhere");
    SY_CHILD_CHECK(!comm.ok());
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    SY_CHILD_CHECK(absl::StrContains(comm.status().message(), "192.0.2.1"));
    return 0;
  });
  EXPECT_EQ(codes, std::vector<int>{0});
}

}  // namespace
}  // namespace switchyard::comm
