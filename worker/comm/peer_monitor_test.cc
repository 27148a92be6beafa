// PeerMonitor between real forked processes over a real FileKvStore: a SIGKILLed rank and a
// SIGSTOPped (hung) rank are reported lost, exactly them, within grace + 2 x interval; a rank that
// Stop()s is never reported; the watchdog callback fires once; errors are annotated with the lost
// rank and UNAVAILABLE, others returned unchanged; argument and startup rules.
#include "worker/comm/peer_monitor.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/comm/kv_store.h"
#include "worker/comm/testing/forked_ranks.h"

namespace switchyard::comm {
namespace {

namespace ct = ::switchyard::comm::testing;

constexpr absl::Duration kBarrierTimeout = absl::Seconds(60);

PeerMonitorOptions FastOptions() {
  PeerMonitorOptions o;
  o.interval = absl::Milliseconds(100);  // grace defaults to 3 x interval = 300 ms
  return o;
}

// The bound the header promises for noticing a death, plus slack for a loaded 2-core machine.
absl::Duration DetectionBound(const PeerMonitor& m) {
  return m.grace() + 2 * m.interval() + absl::Seconds(1);
}

absl::Status Barrier(KvStore& store, const std::string& name, int n) {
  absl::StatusOr<int64_t> c = store.Increment(name);
  if (!c.ok()) return c.status();
  return store.WaitForCount(name, n, kBarrierTimeout);
}

void SetNow(KvStore& store, const std::string& key) {
  (void)store.Set(key, absl::StrCat(absl::ToUnixNanos(absl::Now())));
}

absl::StatusOr<absl::Time> GetTime(KvStore& store, const std::string& key) {
  absl::StatusOr<std::string> v = store.Get(key, kBarrierTimeout);
  if (!v.ok()) return v.status();
  int64_t ns = 0;
  if (!absl::SimpleAtoi(*v, &ns)) return absl::DataLossError("bad time " + *v);
  return absl::FromUnixNanos(ns);
}

// Polls LostPeers until it is non-empty or `limit` passes.
std::vector<LostPeer> WaitForLoss(PeerMonitor& m, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (true) {
    std::vector<LostPeer> lost = m.LostPeers();
    if (!lost.empty() || absl::Now() > deadline) return lost;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

// Observers of a dead (or hung) `victim`: each checks that exactly the victim is lost within the
// bound, that errors get annotated, and stores a line of evidence under "result/<rank>".
int Observe(KvStore& store, PeerMonitor& m, int victim, int observers) {
  const int rank = m.rank();
  auto died = GetTime(store, "victim_at");
  SY_CHILD_OK(died.status());
  const std::vector<LostPeer> lost = WaitForLoss(m, absl::Seconds(20));
  const absl::Duration took = absl::Now() - *died;
  SY_CHILD_CHECK(lost.size() == 1);
  SY_CHILD_CHECK(lost[0].rank == victim);
  SY_CHILD_CHECK(lost[0].pid > 0);
  SY_CHILD_CHECK(took < DetectionBound(m));

  const absl::Status gloo_like = absl::UnavailableError(
      "group 'world' rank 0/3 AllReduce: Connection closed by peer [127.0.0.1]:45704");
  const absl::Status annotated = m.AnnotateFailure(gloo_like);
  SY_CHILD_CHECK(annotated.code() == absl::StatusCode::kUnavailable);
  SY_CHILD_CHECK(absl::StartsWith(annotated.message(), gloo_like.message()));
  SY_CHILD_CHECK(absl::StrContains(annotated.message(),
                                   absl::StrCat("(lost rank(s): ", victim, " [pid ", lost[0].pid)));
  const absl::Status nccl_like = m.AnnotateFailure(absl::DeadlineExceededError("ncclAllReduce"));
  SY_CHILD_CHECK(nccl_like.code() == absl::StatusCode::kUnavailable);
  SY_CHILD_CHECK(absl::StrContains(nccl_like.message(), absl::StrCat("lost rank(s): ", victim)));
  SY_CHILD_CHECK(m.AnnotateFailure(absl::OkStatus()).ok());

  SY_CHILD_OK(store.Set(
      absl::StrCat("result/", rank),
      absl::StrCat("rank ", rank, " saw LostRanks() = {", lost[0].rank, "} after ",
                   absl::FormatDuration(took), " (bound ", absl::FormatDuration(DetectionBound(m)),
                   "); annotated: ", annotated.ToString())));
  SY_CHILD_OK(Barrier(store, "observed", observers));
  return 0;
}

void PrintResults(const std::string& dir, const std::vector<int>& ranks) {
  std::shared_ptr<KvStore> store = ct::OpenFileStore(dir);
  ASSERT_NE(store, nullptr);
  for (int r : ranks) {
    absl::StatusOr<std::string> v = store->Get(absl::StrCat("result/", r), absl::ZeroDuration());
    ASSERT_TRUE(v.ok()) << "rank " << r << ": " << v.status();
    std::printf("%s\n", v->c_str());
  }
}

TEST(PeerMonitorTest, KilledRankIsReportedLost) {
  const std::string dir = ct::UniqueStoreDir("peer_killed");
  const std::vector<int> codes = ct::RunProcesses(3, absl::Minutes(2), [&](int rank) {
    std::shared_ptr<KvStore> store = ct::OpenFileStore(dir);
    SY_CHILD_CHECK(store != nullptr);
    auto m = PeerMonitor::Create(store, rank, 3, FastOptions());
    SY_CHILD_OK(m.status());
    // Healthy for several graces: nobody is lost, errors pass unchanged.
    absl::SleepFor(3 * (*m)->grace());
    SY_CHILD_CHECK((*m)->LostRanks().empty());
    const absl::Status plain = absl::UnavailableError("transient");
    SY_CHILD_CHECK((*m)->AnnotateFailure(plain) == plain);
    SY_CHILD_OK(Barrier(*store, "healthy", 3));
    if (rank == 2) {
      SetNow(*store, "victim_at");
      kill(getpid(), SIGKILL);
    }
    return Observe(*store, **m, 2, 2);
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 128 + SIGKILL}));
  PrintResults(dir, {0, 1});
}

TEST(PeerMonitorTest, HungRankIsReportedLost) {
  const std::string dir = ct::UniqueStoreDir("peer_hung");
  const std::vector<int> codes = ct::RunProcesses(3, absl::Minutes(2), [&](int rank) {
    std::shared_ptr<KvStore> store = ct::OpenFileStore(dir);
    SY_CHILD_CHECK(store != nullptr);
    auto m = PeerMonitor::Create(store, rank, 3, FastOptions());
    SY_CHILD_OK(m.status());
    SY_CHILD_OK(Barrier(*store, "healthy", 3));
    if (rank == 1) {
      SetNow(*store, "victim_at");
      raise(SIGSTOP);  // alive but silent, like a rank stuck in a driver call
      return 0;
    }
    const int code = Observe(*store, **m, 1, 2);
    if (rank == 0) {
      // Ends the stopped rank so that the runner does not wait for its time limit.
      const std::vector<LostPeer> lost = (*m)->LostPeers();
      SY_CHILD_CHECK(lost.size() == 1 && lost[0].rank == 1);
      kill(static_cast<pid_t>(lost[0].pid), SIGKILL);
    }
    return code;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 128 + SIGKILL, 0}));
  PrintResults(dir, {0, 2});
}

TEST(PeerMonitorTest, StoppedRankIsNotReported) {
  const std::string dir = ct::UniqueStoreDir("peer_stopped");
  const std::vector<int> codes = ct::RunProcesses(3, absl::Minutes(2), [&](int rank) {
    std::shared_ptr<KvStore> store = ct::OpenFileStore(dir);
    SY_CHILD_CHECK(store != nullptr);
    auto m = PeerMonitor::Create(store, rank, 3, FastOptions());
    SY_CHILD_OK(m.status());
    SY_CHILD_OK(Barrier(*store, "healthy", 3));
    if (rank == 2) {
      (*m)->Stop();
      (*m)->Stop();  // idempotent
      SY_CHILD_OK(store->Set("stopped", "1"));
      return 0;  // the process ends; its heartbeat says "exited"
    }
    SY_CHILD_OK(store->Get("stopped", kBarrierTimeout).status());
    absl::SleepFor(3 * (*m)->grace());
    SY_CHILD_CHECK((*m)->LostRanks().empty());
    const absl::Time start = absl::Now();
    const absl::Status err = absl::UnavailableError("Connection closed by peer [127.0.0.1]:45704");
    const absl::Status got = (*m)->AnnotateFailure(err);
    const absl::Duration waited = absl::Now() - start;
    SY_CHILD_CHECK(got == err);
    // A communication error waits for the verdict (grace + 2 x interval), not longer.
    SY_CHILD_CHECK(waited >= (*m)->grace());
    SY_CHILD_CHECK(waited < DetectionBound(**m));
    SY_CHILD_OK(store->Set(absl::StrCat("result/", rank),
                           absl::StrCat("rank ", rank,
                                        ": rank 2 stopped 3 graces ago, LostRanks() "
                                        "= {}, error unchanged after waiting ",
                                        absl::FormatDuration(waited), ": ", got.ToString())));
    SY_CHILD_OK(Barrier(*store, "observed", 2));
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 0}));
  PrintResults(dir, {0, 1});
}

TEST(PeerMonitorTest, WatchdogCallsOnLostOnce) {
  const std::string dir = ct::UniqueStoreDir("peer_watchdog");
  const std::vector<int> codes = ct::RunProcesses(2, absl::Minutes(2), [&](int rank) {
    std::shared_ptr<KvStore> store = ct::OpenFileStore(dir);
    SY_CHILD_CHECK(store != nullptr);
    std::atomic<int> calls{0};
    std::atomic<int64_t> called_at{0};
    std::string verdict;
    absl::Mutex mu;
    PeerMonitorOptions o = FastOptions();
    o.on_lost = [&](const std::string& v) {
      absl::MutexLock lock(&mu);
      verdict = v;
      called_at = absl::ToUnixNanos(absl::Now());
      ++calls;
    };
    auto m = PeerMonitor::Create(store, rank, 2, o);
    SY_CHILD_OK(m.status());
    SY_CHILD_OK(Barrier(*store, "healthy", 2));
    if (rank == 1) {
      SetNow(*store, "victim_at");
      kill(getpid(), SIGKILL);
    }
    auto died = GetTime(*store, "victim_at");
    SY_CHILD_OK(died.status());
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (calls == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
    absl::SleepFor(5 * (*m)->interval());  // a second call would come within a few intervals
    SY_CHILD_CHECK(calls == 1);
    const absl::Duration took = absl::FromUnixNanos(called_at) - *died;
    SY_CHILD_CHECK(took < DetectionBound(**m));
    absl::MutexLock lock(&mu);
    SY_CHILD_CHECK(absl::StartsWith(verdict, "lost rank(s): 1 [pid "));
    SY_CHILD_OK(store->Set("result/0",
                           absl::StrCat("rank 0: on_lost called once, ", absl::FormatDuration(took),
                                        " after the kill: ", verdict)));
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 128 + SIGKILL}));
  PrintResults(dir, {0});
}

// Rank 0 watches only {0, 1} (its own group's members): the death of rank 2 is rank 1's to
// report, not rank 0's.
TEST(PeerMonitorTest, WatchLimitsWhatIsReported) {
  const std::string dir = ct::UniqueStoreDir("peer_watch");
  const std::vector<int> codes = ct::RunProcesses(3, absl::Minutes(2), [&](int rank) {
    std::shared_ptr<KvStore> store = ct::OpenFileStore(dir);
    SY_CHILD_CHECK(store != nullptr);
    PeerMonitorOptions o = FastOptions();
    if (rank == 0) o.watch = {0, 1, 1};
    auto m = PeerMonitor::Create(store, rank, 3, o);
    SY_CHILD_OK(m.status());
    SY_CHILD_OK(Barrier(*store, "healthy", 3));
    if (rank == 2) {
      SetNow(*store, "victim_at");
      kill(getpid(), SIGKILL);
    }
    if (rank == 1) return Observe(*store, **m, 2, 1);
    SY_CHILD_OK(store->Get("result/1", kBarrierTimeout).status());
    absl::SleepFor(2 * (*m)->grace());
    SY_CHILD_CHECK((*m)->LostRanks().empty());
    const absl::Status err = absl::UnavailableError("Connection closed by peer");
    SY_CHILD_CHECK((*m)->AnnotateFailure(err) == err);
    SY_CHILD_OK(store->Set("result/0",
                           "rank 0 (watching {0, 1}): LostRanks() = {} after rank 2 "
                           "died; error unchanged"));
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 128 + SIGKILL}));
  PrintResults(dir, {0, 1});
}

TEST(PeerMonitorTest, ArgumentRules) {
  auto store = std::make_shared<InMemoryKvStore>();
  struct Case {
    std::shared_ptr<KvStore> store;
    int rank, world;
    PeerMonitorOptions options;
    std::string needle;
  };
  std::vector<Case> cases;
  cases.push_back({nullptr, 0, 1, {}, "store must not be null"});
  cases.push_back({store, 0, 0, {}, "world (0) must be >= 1"});
  cases.push_back({store, 3, 3, {}, "rank (3) must be in [0, world 3)"});
  cases.push_back({store, -1, 3, {}, "rank (-1) must be in [0, world 3)"});
  PeerMonitorOptions o;
  o.prefix = "";
  cases.push_back({store, 0, 1, o, "PeerMonitorOptions.prefix must not be empty"});
  o = {};
  o.interval = absl::ZeroDuration();
  cases.push_back({store, 0, 1, o, "PeerMonitorOptions.interval (0) must be > 0"});
  o = {};
  o.grace = absl::Milliseconds(400);
  cases.push_back(
      {store, 0, 1, o, "PeerMonitorOptions.grace (400ms) must be at least 2 x interval"});
  o = {};
  o.watch = {0, 3};
  cases.push_back({store, 0, 3, o, "PeerMonitorOptions.watch[1] (3) must be in [0, world 3)"});
  o = {};
  o.startup_timeout = absl::Seconds(-1);
  cases.push_back({store, 0, 1, o, "PeerMonitorOptions.startup_timeout (-1s) must be >= 0"});
  for (const Case& c : cases) {
    auto m = PeerMonitor::Create(c.store, c.rank, c.world, c.options);
    ASSERT_FALSE(m.ok()) << c.needle;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
    EXPECT_TRUE(absl::StrContains(m.status().message(), c.needle)) << m.status();
    std::printf("rejected: %s\n", m.status().ToString().c_str());
  }
  auto m = PeerMonitor::Create(store, 0, 1, {});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->grace(), absl::Milliseconds(750));  // 3 x the default 250 ms
  EXPECT_TRUE((*m)->LostRanks().empty());             // a world of one has no peers
  EXPECT_TRUE(store->Check("peer_monitor/heartbeat/0").value());
}

TEST(PeerMonitorTest, MissingPeerAtStartupNamesIt) {
  auto store = std::make_shared<InMemoryKvStore>();
  PeerMonitorOptions o = FastOptions();
  o.startup_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  auto m = PeerMonitor::Create(store, 1, 3, o);
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDeadlineExceeded) << m.status();
  EXPECT_TRUE(absl::StrContains(m.status().message(), "rank(s) 0, 2 published no heartbeat"))
      << m.status();
  EXPECT_LT(took, absl::Seconds(5));
  // The failed rank said goodbye, so a later monitor on the same prefix does not wait for it
  // forever nor count it as lost.
  EXPECT_TRUE(absl::StrContains(
      store->Get("peer_monitor/heartbeat/1", absl::ZeroDuration()).value(), " exited"));
  std::printf("startup (%s): %s\n", absl::FormatDuration(took).c_str(),
              m.status().ToString().c_str());
}

// Threads of one process over an InMemoryKvStore: the clean path end to end (every rank Stops),
// and a non-communication error is checked once, without waiting.
TEST(PeerMonitorTest, InProcessCleanRunAndNoWaitForOtherCodes) {
  auto store = std::make_shared<InMemoryKvStore>();
  std::vector<std::unique_ptr<PeerMonitor>> monitors(3);
  std::vector<absl::Status> created(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      auto m = PeerMonitor::Create(store, r, 3, FastOptions());
      created[r] = m.status();
      if (m.ok()) monitors[r] = std::move(*m);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(created[r].ok()) << created[r];
  absl::SleepFor(3 * monitors[0]->grace());
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(monitors[r]->LostRanks().empty()) << "rank " << r;
  const absl::Time start = absl::Now();
  const absl::Status bad = absl::InvalidArgumentError("x");
  EXPECT_EQ(monitors[0]->AnnotateFailure(bad), bad);
  EXPECT_LT(absl::Now() - start, monitors[0]->grace());
  monitors[2]->Stop();
  absl::SleepFor(3 * monitors[0]->grace());
  EXPECT_TRUE(monitors[0]->LostRanks().empty());
  EXPECT_TRUE(monitors[1]->LostRanks().empty());
}

}  // namespace
}  // namespace switchyard::comm
