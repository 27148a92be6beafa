// File: worker/comm/gloo_communicator_test.cc
//
// Real processes, no mocks: each test forks W children (before any thread exists in the parent;
// the parent never creates a communicator), each child connects a GlooCommunicator on loopback
// through a FileKvStore in TEST_TMPDIR, runs its checks and reports through its exit code. The
// parent waits for all of them (killing stragglers after a deadline) and checks every code.
#include "worker/comm/gloo_communicator.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/model/parallel_state.h"
#include "gtest/gtest.h"
#include "worker/comm/testing/forked_ranks.h"

namespace switchyard::comm {
namespace {

template <typename T>
Tensor View(DType dtype, std::vector<T>& v) {
  return Tensor(dtype, {static_cast<int64_t>(v.size())}, Device::Cpu(), v.data());
}

// In a forked rank: the world group of `size` ranks over the file store in `dir`, every
// operation under `timeout`.
absl::StatusOr<std::unique_ptr<GlooCommunicator>> ConnectWorld(const std::string& dir, int rank,
                                                               int size, absl::Duration timeout) {
  std::shared_ptr<KvStore> store = testing::OpenFileStore(dir);
  if (store == nullptr) return absl::InternalError("cannot open the file store in " + dir);
  GlooOptions options;
  options.timeout = timeout;
  return GlooCommunicator::Create(store, rank, size, options);
}

// Every collective with known integer-valued inputs; results must be exact.
int CollectivesChild(const std::string& dir, int rank, int world) {
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> made =
      ConnectWorld(dir, rank, world, absl::Seconds(10));
  SY_CHILD_OK(made.status());
  GlooCommunicator& comm = **made;
  SY_CHILD_CHECK(comm.rank() == rank && comm.size() == world && comm.name() == "world");
  const int tri = world * (world - 1) / 2;

  // AllReduce: f32, f64, i32, i64, bf16; sum/max/min; out-of-place and in place.
  {
    const int n = 5;
    std::vector<float> in(n), out(n, -7.0f);
    for (int i = 0; i < n; ++i) in[i] = static_cast<float>(rank * 10 + i) + 0.5f;
    SY_CHILD_OK(comm.AllReduce(View(DType::kF32, in), View(DType::kF32, out), ReduceOp::kSum));
    for (int i = 0; i < n; ++i) SY_CHILD_CHECK(out[i] == 10.0f * tri + world * (i + 0.5f));
    SY_CHILD_OK(comm.AllReduce(View(DType::kF32, in), View(DType::kF32, out), ReduceOp::kMax));
    for (int i = 0; i < n; ++i) SY_CHILD_CHECK(out[i] == 10.0f * (world - 1) + i + 0.5f);
    SY_CHILD_OK(comm.AllReduce(View(DType::kF32, in), View(DType::kF32, in), ReduceOp::kMin));
    for (int i = 0; i < n; ++i) SY_CHILD_CHECK(in[i] == i + 0.5f);

    std::vector<double> d = {static_cast<double>(rank), -1.0 * rank};
    SY_CHILD_OK(comm.AllReduce(View(DType::kF64, d), View(DType::kF64, d), ReduceOp::kSum));
    SY_CHILD_CHECK(d[0] == tri && d[1] == -tri);

    // Large enough for several ring segments per rank.
    std::vector<int32_t> big(300000);
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<int32_t>(i % 1000) * (rank + 1);
    SY_CHILD_OK(comm.AllReduce(View(DType::kI32, big), View(DType::kI32, big), ReduceOp::kSum));
    for (size_t i = 0; i < big.size(); ++i) {
      SY_CHILD_CHECK(big[i] == static_cast<int32_t>(i % 1000) * (tri + world));
    }

    std::vector<int64_t> l = {int64_t{1} << 40, rank - 100};
    SY_CHILD_OK(comm.AllReduce(View(DType::kI64, l), View(DType::kI64, l), ReduceOp::kSum));
    SY_CHILD_CHECK(l[0] == (int64_t{1} << 40) * world && l[1] == tri - 100 * world);

    std::vector<BF16> b = {BF16::FromFloat(rank + 1.0f), BF16::FromFloat(-2.0f * rank)};
    SY_CHILD_OK(comm.AllReduce(View(DType::kBF16, b), View(DType::kBF16, b), ReduceOp::kSum));
    SY_CHILD_CHECK(b[0].ToFloat() == tri + world && b[1].ToFloat() == -2.0f * tri);
  }

  // ReduceScatter (rank-ordered local reduction): in[j] = 1000 * rank + j.
  {
    const int n = 3;
    std::vector<int32_t> in(n * world), out(n, -1);
    for (int j = 0; j < n * world; ++j) in[j] = 1000 * rank + j;
    SY_CHILD_OK(comm.ReduceScatter(View(DType::kI32, in), View(DType::kI32, out), ReduceOp::kSum));
    for (int k = 0; k < n; ++k) SY_CHILD_CHECK(out[k] == 1000 * tri + world * (rank * n + k));
    SY_CHILD_OK(comm.ReduceScatter(View(DType::kI32, in), View(DType::kI32, out), ReduceOp::kMax));
    for (int k = 0; k < n; ++k) SY_CHILD_CHECK(out[k] == 1000 * (world - 1) + rank * n + k);
    std::vector<float> fin(2 * world), fout(2);
    for (int j = 0; j < 2 * world; ++j) fin[j] = 0.25f * rank + j;
    SY_CHILD_OK(
        comm.ReduceScatter(View(DType::kF32, fin), View(DType::kF32, fout), ReduceOp::kSum));
    for (int k = 0; k < 2; ++k) SY_CHILD_CHECK(fout[k] == 0.25f * tri + world * (2 * rank + k));
  }

  // AllGather / AllGatherV (rank 0 contributes nothing to the V variant).
  {
    std::vector<float> in = {static_cast<float>(rank), rank + 0.5f}, out(2 * world, -1.0f);
    SY_CHILD_OK(comm.AllGather(View(DType::kF32, in), View(DType::kF32, out)));
    for (int r = 0; r < world; ++r) SY_CHILD_CHECK(out[2 * r] == r && out[2 * r + 1] == r + 0.5f);

    std::vector<int64_t> counts(world);
    for (int r = 0; r < world; ++r) counts[r] = r;
    std::vector<int64_t> vin(rank), vout(tri, -1);
    for (int j = 0; j < rank; ++j) vin[j] = 100 * rank + j;
    SY_CHILD_OK(comm.AllGatherV(View(DType::kI64, vin), View(DType::kI64, vout), counts));
    int pos = 0;
    for (int r = 0; r < world; ++r) {
      for (int j = 0; j < r; ++j) SY_CHILD_CHECK(vout[pos++] == 100 * r + j);
    }
  }

  // AllToAllV: rank s sends (s + d) % 3 elements 1000 * s + 10 * d + j to rank d (zeros included).
  {
    std::vector<int64_t> send_counts(world), recv_counts(world);
    std::vector<int32_t> in, out;
    for (int d = 0; d < world; ++d) {
      send_counts[d] = (rank + d) % 3;
      recv_counts[d] = (d + rank) % 3;
      for (int j = 0; j < send_counts[d]; ++j) in.push_back(1000 * rank + 10 * d + j);
    }
    int64_t recv_total = 0;
    for (int64_t c : recv_counts) recv_total += c;
    out.assign(recv_total, -1);
    SY_CHILD_OK(
        comm.AllToAllV(View(DType::kI32, in), send_counts, View(DType::kI32, out), recv_counts));
    int pos = 0;
    for (int s = 0; s < world; ++s) {
      for (int j = 0; j < recv_counts[s]; ++j)
        SY_CHILD_CHECK(out[pos++] == 1000 * s + 10 * rank + j);
    }
  }

  // Broadcast from the last rank.
  {
    std::vector<int64_t> t = {-1, -2, -3};
    if (rank == world - 1) t = {7, 8, 9};
    SY_CHILD_OK(comm.Broadcast(View(DType::kI64, t), world - 1));
    SY_CHILD_CHECK(t == (std::vector<int64_t>{7, 8, 9}));
  }

  // Send/Recv: rank 0 sends a distinct message to every other rank, which answers with its rank.
  {
    if (rank == 0) {
      for (int r = 1; r < world; ++r) {
        std::vector<float> msg = {r * 1.5f, -r * 1.0f};
        SY_CHILD_OK(comm.Send(View(DType::kF32, msg), r, 3));
      }
      for (int r = 1; r < world; ++r) {
        std::vector<int32_t> reply(1, -1);
        SY_CHILD_OK(comm.Recv(View(DType::kI32, reply), r, 4));
        SY_CHILD_CHECK(reply[0] == r * r);
      }
    } else {
      std::vector<float> msg(2, 0.0f);
      SY_CHILD_OK(comm.Recv(View(DType::kF32, msg), 0, 3));
      SY_CHILD_CHECK(msg[0] == rank * 1.5f && msg[1] == -rank * 1.0f);
      std::vector<int32_t> reply = {rank * rank};
      SY_CHILD_OK(comm.Send(View(DType::kI32, reply), 0, 4));
    }
  }

  SY_CHILD_OK(comm.Barrier());

  // Bad arguments fail locally with INVALID_ARGUMENT naming the group; the group stays usable.
  {
    std::vector<float> a(3), b(4);
    absl::Status s = comm.AllReduce(View(DType::kF32, a), View(DType::kF32, b), ReduceOp::kSum);
    SY_CHILD_CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    SY_CHILD_CHECK(absl::StrContains(s.message(), "group 'world'"));
    SY_CHILD_CHECK(comm.Send(View(DType::kF32, a), rank, 0).code() ==
                   absl::StatusCode::kInvalidArgument);
    std::vector<uint8_t> u(2);
    SY_CHILD_CHECK(
        comm.AllReduce(View(DType::kU8, u), View(DType::kU8, u), ReduceOp::kSum).code() ==
        absl::StatusCode::kInvalidArgument);
    SY_CHILD_OK(comm.Barrier());
  }
  return 0;
}

TEST(GlooCommunicatorTest, AllCollectivesExact) {
  for (int world : {2, 3, 4}) {
    const std::string dir = testing::UniqueStoreDir(absl::StrCat("collectives_w", world));
    const absl::Time start = absl::Now();
    std::vector<int> codes = testing::RunProcesses(
        world, absl::Seconds(30), [&](int rank) { return CollectivesChild(dir, rank, world); });
    std::printf("W=%d: all collectives in %s\n", world,
                absl::FormatDuration(absl::Now() - start).c_str());
    EXPECT_EQ(codes, std::vector<int>(world, 0)) << "world " << world;
  }
}

// W=4, EP=2 (TP=1, DP=4): expert groups {0,1},{2,3}, expert-data groups {0,2},{1,3}, data group
// {0,1,2,3}. Each sub-group sums (world rank + 1) and gathers world ranks.
TEST(GlooCommunicatorTest, ParallelLayoutSubgroups) {
  ParallelDims dims;
  dims.world_size = 4;
  dims.expert_model_parallel_size = 2;
  absl::StatusOr<ParallelLayout> layout = ParallelLayout::Create(dims);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const std::string dir = testing::UniqueStoreDir("subgroups");
  std::vector<int> codes = testing::RunProcesses(4, absl::Seconds(30), [&](int rank) -> int {
    auto world = ConnectWorld(dir, rank, 4, absl::Seconds(10));
    SY_CHILD_OK(world.status());
    for (ParallelGroup kind :
         {ParallelGroup::kExpert, ParallelGroup::kExpertData, ParallelGroup::kData}) {
      const std::vector<int> members = layout->Group(kind, rank);
      auto group = (*world)->CreateSubgroup(members, std::string(ParallelGroupName(kind)));
      SY_CHILD_OK(group.status());
      SY_CHILD_CHECK((*group)->size() == static_cast<int>(members.size()));
      SY_CHILD_CHECK((*group)->rank() == layout->RankInGroup(kind, rank));
      std::vector<int32_t> v = {rank + 1};
      SY_CHILD_OK((*group)->AllReduce(View(DType::kI32, v), View(DType::kI32, v), ReduceOp::kSum));
      int expected = 0;
      for (int m : members) expected += m + 1;
      SY_CHILD_CHECK(v[0] == expected);
      std::vector<int32_t> me = {rank}, all(members.size(), -1);
      SY_CHILD_OK((*group)->AllGather(View(DType::kI32, me), View(DType::kI32, all)));
      SY_CHILD_CHECK(all == std::vector<int32_t>(members.begin(), members.end()));
    }
    // The world group still works after the sub-groups.
    SY_CHILD_OK((*world)->Barrier());
    // Not a member: INVALID_ARGUMENT naming the rank.
    std::vector<int> others;
    for (int r = 0; r < 4; ++r) {
      if (r != rank) others.push_back(r);
    }
    SY_CHILD_CHECK((*world)->CreateSubgroup(others, "x").status().code() ==
                   absl::StatusCode::kInvalidArgument);
    return 0;
  });
  EXPECT_EQ(codes, std::vector<int>(4, 0));
  std::vector<int> ep = layout->Group(ParallelGroup::kExpert, 0);
  EXPECT_EQ(ep, (std::vector<int>{0, 1}));
}

// One child exits abruptly after the first barrier; the others' next collective must fail within
// a bounded time with an error naming the group, and every later call must fail too.
TEST(GlooCommunicatorTest, KilledPeerFailsCollectivesWithinTimeout) {
  const std::string dir = testing::UniqueStoreDir("killed");
  constexpr int kWorld = 3;
  constexpr int kDeadCode = 42;
  std::vector<int> codes = testing::RunProcesses(kWorld, absl::Seconds(30), [&](int rank) -> int {
    auto comm = ConnectWorld(dir, rank, kWorld, absl::Seconds(5));
    SY_CHILD_OK(comm.status());
    SY_CHILD_OK((*comm)->Barrier());
    if (rank == kWorld - 1) _exit(kDeadCode);  // no cleanup: the sockets just close
    const absl::Time start = absl::Now();
    std::vector<float> v(1000, 1.0f);
    absl::Status s = (*comm)->AllReduce(View(DType::kF32, v), View(DType::kF32, v), ReduceOp::kSum);
    const absl::Duration took = absl::Now() - start;
    std::fprintf(stderr, "rank %d: after the peer died, AllReduce failed in %s: %s\n", rank,
                 absl::FormatDuration(took).c_str(), s.ToString().c_str());
    SY_CHILD_CHECK(!s.ok());
    SY_CHILD_CHECK(s.code() == absl::StatusCode::kUnavailable ||
                   s.code() == absl::StatusCode::kDeadlineExceeded);
    SY_CHILD_CHECK(absl::StrContains(s.message(), "group 'world'"));
    SY_CHILD_CHECK(took < absl::Seconds(8));
    absl::Status later = (*comm)->Barrier();
    SY_CHILD_CHECK(later.code() == s.code());
    SY_CHILD_CHECK(absl::StrContains(later.message(), "group 'world'"));
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, kDeadCode}));
}

// Send to a peer that has died fails with a Status naming the group (Gloo's pair notices the
// closed connection), and the process lives on.
TEST(GlooCommunicatorTest, SendToADeadPeerFailsNamingTheGroup) {
  const std::string dir = testing::UniqueStoreDir("deadsend");
  constexpr int kDeadCode = 42;
  std::vector<int> codes = testing::RunProcesses(2, absl::Seconds(30), [&](int rank) -> int {
    auto comm = ConnectWorld(dir, rank, 2, absl::Seconds(5));
    SY_CHILD_OK(comm.status());
    SY_CHILD_OK((*comm)->Barrier());
    if (rank == 1) _exit(kDeadCode);
    std::vector<float> v(1 << 18, 1.0f);  // 1 MiB
    absl::Status s;
    int tries = 0;
    while (tries < 64 && s.ok()) {
      s = (*comm)->Send(View(DType::kF32, v), 1, 7);
      ++tries;
    }
    std::fprintf(stderr, "rank 0: Send to the dead peer, try %d: %s\n", tries,
                 s.ToString().c_str());
    SY_CHILD_CHECK(!s.ok());
    SY_CHILD_CHECK(absl::StrContains(s.message(), "group 'world'"));
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, kDeadCode})) << "141 = 128 + SIGPIPE";
}

// Gloo's TCP pairs write with writev, which raises SIGPIPE when the peer has reset the
// connection; its default action kills the process (seen: a survivor of a killed peer exiting
// 141 mid-AllReduce instead of returning UNAVAILABLE). Python, hence PyTorch's ProcessGroupGloo,
// always ignores SIGPIPE; GlooCommunicator::Create does the same for a process that left it at
// the default. Checked deterministically: in a child with the default disposition, after Create,
// a write to a socket whose other end is closed returns EPIPE instead of killing the child.
TEST(GlooCommunicatorTest, CreateMakesAResetConnectionAnErrorNotSigpipe) {
  const std::string dir = testing::UniqueStoreDir("sigpipe");
  std::vector<int> codes = testing::RunProcesses(1, absl::Seconds(30), [&](int rank) -> int {
    signal(SIGPIPE, SIG_DFL);
    std::shared_ptr<KvStore> store = testing::OpenFileStore(dir);
    SY_CHILD_CHECK(store != nullptr);
    auto comm = GlooCommunicator::Create(store, rank, 1, GlooOptions{});
    SY_CHILD_OK(comm.status());
    int fds[2];
    SY_CHILD_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
    close(fds[1]);
    const char byte = 1;
    const ssize_t n = write(fds[0], &byte, 1);  // SIGPIPE here unless it is ignored
    const int err = errno;
    std::fprintf(stderr, "after Create: write to a closed peer -> %zd, %s\n", n, strerror(err));
    SY_CHILD_CHECK(n == -1 && err == EPIPE);
    close(fds[0]);
    // A program that installed its own SIGPIPE handler keeps it.
    void (*const mine)(int) = [](int) {};
    signal(SIGPIPE, mine);
    auto again = GlooCommunicator::Create(store, rank, 1, GlooOptions{}, "again");
    SY_CHILD_OK(again.status());
    SY_CHILD_CHECK(signal(SIGPIPE, mine) == mine);
    return 0;
  });
  EXPECT_EQ(codes, std::vector<int>{0}) << "141 = 128 + SIGPIPE";
}

// A peer that is alive but never joins the collective: DEADLINE_EXCEEDED after the timeout.
TEST(GlooCommunicatorTest, HungPeerTimesOut) {
  const std::string dir = testing::UniqueStoreDir("hung");
  std::vector<int> codes = testing::RunProcesses(2, absl::Seconds(30), [&](int rank) -> int {
    auto comm = ConnectWorld(dir, rank, 2, absl::Seconds(1));
    SY_CHILD_OK(comm.status());
    if (rank == 1) {
      absl::SleepFor(absl::Seconds(3));
      return 0;
    }
    const absl::Time start = absl::Now();
    std::vector<int32_t> v(4, 1);
    absl::Status s = (*comm)->AllReduce(View(DType::kI32, v), View(DType::kI32, v), ReduceOp::kSum);
    const absl::Duration took = absl::Now() - start;
    std::fprintf(stderr, "rank 0: with a hung peer, AllReduce failed in %s: %s\n",
                 absl::FormatDuration(took).c_str(), s.ToString().c_str());
    SY_CHILD_CHECK(s.code() == absl::StatusCode::kDeadlineExceeded);
    SY_CHILD_CHECK(absl::StrContains(s.message(), "group 'world'"));
    SY_CHILD_CHECK(took >= absl::Milliseconds(900) && took < absl::Seconds(3));
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// Abort on one rank: its later calls return ABORTED, the peer's pending barrier fails.
TEST(GlooCommunicatorTest, AbortFailsLaterCallsAndPeers) {
  const std::string dir = testing::UniqueStoreDir("abort");
  std::vector<int> codes = testing::RunProcesses(2, absl::Seconds(30), [&](int rank) -> int {
    auto comm = ConnectWorld(dir, rank, 2, absl::Seconds(5));
    SY_CHILD_OK(comm.status());
    SY_CHILD_OK((*comm)->Barrier());
    if (rank == 0) {
      (*comm)->Abort();
      absl::Status s = (*comm)->Barrier();
      SY_CHILD_CHECK(s.code() == absl::StatusCode::kAborted);
      SY_CHILD_CHECK(absl::StrContains(s.message(), "group 'world'"));
      absl::SleepFor(absl::Milliseconds(500));  // stay alive: rank 1 must see the close itself
      return 0;
    }
    const absl::Time start = absl::Now();
    absl::Status s = (*comm)->Barrier();
    std::fprintf(stderr, "rank 1: peer aborted, Barrier failed in %s: %s\n",
                 absl::FormatDuration(absl::Now() - start).c_str(), s.ToString().c_str());
    SY_CHILD_CHECK(!s.ok());
    SY_CHILD_CHECK(absl::Now() - start < absl::Seconds(6));
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// Abort wakes this process's own collective blocked in another thread on a peer that hangs (its
// sockets stay open, it sends nothing): the Barrier returns ABORTED at once, not at the 10 min
// Gloo timeout. The bound (5 s) is the requirement: a Stop must not wait for the timeout.
TEST(GlooCommunicatorTest, AbortWakesOwnCollectiveBlockedOnAHungPeer) {
  const std::string dir = testing::UniqueStoreDir("abort_own");
  std::vector<int> codes = testing::RunProcesses(2, absl::Seconds(60), [&](int rank) -> int {
    auto comm = ConnectWorld(dir, rank, 2, absl::Minutes(10));
    SY_CHILD_OK(comm.status());
    SY_CHILD_OK((*comm)->Barrier());
    if (rank == 1) {  // the hung peer: connected, silent, then gone
      absl::SleepFor(absl::Seconds(3));
      return 0;
    }
    absl::Status s;
    absl::Time returned;
    std::thread blocked([&] {
      s = (*comm)->Barrier();
      returned = absl::Now();
    });
    absl::SleepFor(absl::Milliseconds(300));  // the Barrier is waiting on rank 1 by now
    const absl::Time aborted = absl::Now();
    (*comm)->Abort();
    blocked.join();
    const absl::Duration woke = returned - aborted;
    std::fprintf(stderr, "rank 0: Barrier returned %s after Abort (Gloo timeout 10 min): %s\n",
                 absl::FormatDuration(woke).c_str(), s.ToString().c_str());
    SY_CHILD_CHECK(s.code() == absl::StatusCode::kAborted);
    SY_CHILD_CHECK(absl::StrContains(s.message(), "group 'world'"));
    SY_CHILD_CHECK(woke < absl::Seconds(5));
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// A member that never shows up: Create fails with DEADLINE_EXCEEDED naming the missing key.
TEST(GlooCommunicatorTest, RendezvousTimeoutNamesTheKey) {
  const std::string dir = testing::UniqueStoreDir("rendezvous");
  std::vector<int> codes = testing::RunProcesses(1, absl::Seconds(30), [&](int rank) -> int {
    std::shared_ptr<KvStore> store = testing::OpenFileStore(dir);
    SY_CHILD_CHECK(store != nullptr);
    GlooOptions options;
    options.timeout = absl::Milliseconds(300);
    auto comm = GlooCommunicator::Create(store, 0, 2, options, "lonely");
    std::fprintf(stderr, "rank 0: %s\n", comm.status().ToString().c_str());
    SY_CHILD_CHECK(comm.status().code() == absl::StatusCode::kDeadlineExceeded);
    SY_CHILD_CHECK(absl::StrContains(comm.status().message(), "group 'lonely'"));
    SY_CHILD_CHECK(absl::StrContains(comm.status().message(), "gloo/lonely/"));
    return 0;
  });
  EXPECT_EQ(codes, std::vector<int>{0});
}

// Threads of one process (inside one forked child, so the parent stays thread-free) rendezvous
// through an InMemoryKvStore.
TEST(GlooCommunicatorTest, ThreadsWithInMemoryStore) {
  std::vector<int> codes = testing::RunProcesses(1, absl::Seconds(30), [&](int) -> int {
    constexpr int kWorld = 3;
    auto store = std::make_shared<InMemoryKvStore>();
    std::vector<int> results(kWorld, -1);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        GlooOptions options;
        options.timeout = absl::Seconds(10);
        auto comm = GlooCommunicator::Create(store, r, kWorld, options, "threads");
        if (!comm.ok()) return;
        std::vector<int32_t> v = {r + 1};
        if ((*comm)->AllReduce(View(DType::kI32, v), View(DType::kI32, v), ReduceOp::kSum).ok()) {
          results[r] = v[0];
        }
      });
    }
    for (auto& t : threads) t.join();
    SY_CHILD_CHECK(results == std::vector<int>(kWorld, 6));
    return 0;
  });
  EXPECT_EQ(codes, std::vector<int>{0});
}

}  // namespace
}  // namespace switchyard::comm
