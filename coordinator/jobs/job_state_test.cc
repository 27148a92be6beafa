// File: coordinator/jobs/job_state_test.cc
//
// The whole transition table: every (from, to) pair over the eight enum values is checked
// against the documented table, and the counters against their rules.
#include "coordinator/jobs/job_state.h"

#include <cstdio>
#include <set>
#include <utility>

#include "gtest/gtest.h"

namespace switchyard::jobs {
namespace {

const State kAll[] = {
    v1::Job::STATE_UNSPECIFIED, v1::Job::PENDING,   v1::Job::STARTING, v1::Job::RUNNING,
    v1::Job::RESTARTING,        v1::Job::SUCCEEDED, v1::Job::FAILED,   v1::Job::CANCELLED};

// The documented table, written out independently of job_state.cc.
const std::set<std::pair<State, State>> kExpected = {
    {v1::Job::PENDING, v1::Job::STARTING},    {v1::Job::PENDING, v1::Job::FAILED},
    {v1::Job::PENDING, v1::Job::CANCELLED},   {v1::Job::STARTING, v1::Job::RUNNING},
    {v1::Job::STARTING, v1::Job::RESTARTING}, {v1::Job::STARTING, v1::Job::FAILED},
    {v1::Job::STARTING, v1::Job::CANCELLED},  {v1::Job::RUNNING, v1::Job::SUCCEEDED},
    {v1::Job::RUNNING, v1::Job::RESTARTING},  {v1::Job::RUNNING, v1::Job::FAILED},
    {v1::Job::RUNNING, v1::Job::CANCELLED},   {v1::Job::RESTARTING, v1::Job::STARTING},
    {v1::Job::RESTARTING, v1::Job::FAILED},   {v1::Job::RESTARTING, v1::Job::CANCELLED},
    {v1::Job::RUNNING, v1::Job::PENDING},  // preempted at a checkpoint
};

TEST(JobStateTest, EveryPairMatchesTheTable) {
  int allowed = 0;
  int refused = 0;
  for (State from : kAll) {
    for (State to : kAll) {
      absl::Status s = CheckTransition(from, to);
      bool expected = kExpected.count({from, to}) > 0;
      if (expected) {
        EXPECT_TRUE(s.ok()) << v1::Job::State_Name(from) << " -> " << v1::Job::State_Name(to)
                            << ": " << s;
        ++allowed;
      } else {
        ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition)
            << v1::Job::State_Name(from) << " -> " << v1::Job::State_Name(to);
        std::string needle = "from " + v1::Job::State_Name(from) + " to " + v1::Job::State_Name(to);
        EXPECT_NE(s.message().find(needle), absl::string_view::npos) << s.message();
        ++refused;
      }
    }
  }
  EXPECT_EQ(allowed, 15);
  EXPECT_EQ(refused, 64 - 15);
  std::printf("%d allowed, %d refused; e.g. %s\n", allowed, refused,
              std::string(CheckTransition(v1::Job::RUNNING, v1::Job::STARTING).message()).c_str());
  std::printf("terminal: %s\n",
              std::string(CheckTransition(v1::Job::SUCCEEDED, v1::Job::RUNNING).message()).c_str());
}

TEST(JobStateTest, TerminalStatesAllowNothingAndCancelFromEveryActiveState) {
  for (State s : kAll) {
    bool terminal = s == v1::Job::SUCCEEDED || s == v1::Job::FAILED || s == v1::Job::CANCELLED;
    EXPECT_EQ(IsTerminal(s), terminal);
    EXPECT_TRUE(!terminal || AllowedTargets(s).empty()) << v1::Job::State_Name(s);
    if (!terminal && s != v1::Job::STATE_UNSPECIFIED) {
      EXPECT_TRUE(CheckTransition(s, v1::Job::CANCELLED).ok()) << v1::Job::State_Name(s);
      EXPECT_TRUE(CheckTransition(s, v1::Job::FAILED).ok()) << v1::Job::State_Name(s);
    }
  }
}

TEST(JobStateTest, GenerationBumpsOnEveryStartAndRestartsAreBounded) {
  Lifecycle l;
  auto step = [&](State to) -> TransitionResult {
    absl::StatusOr<TransitionResult> r = ApplyTransition(l, to, "TEST", "", /*max_restarts=*/2);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return TransitionResult();
    l = r->after;
    return *r;
  };
  step(v1::Job::STARTING);
  EXPECT_EQ(l.generation, 1);
  step(v1::Job::RUNNING);
  step(v1::Job::RESTARTING);
  EXPECT_EQ(l.restart_count, 1);
  step(v1::Job::STARTING);
  EXPECT_EQ(l.generation, 2);
  step(v1::Job::RESTARTING);  // STARTING -> RESTARTING: a worker lost while starting
  EXPECT_EQ(l.restart_count, 2);
  step(v1::Job::STARTING);
  step(v1::Job::RUNNING);
  EXPECT_EQ(l.generation, 3);
  TransitionResult r = step(v1::Job::RESTARTING);  // the third restart exceeds max_restarts = 2
  EXPECT_EQ(l.state, v1::Job::FAILED);
  EXPECT_EQ(l.restart_count, 2);
  EXPECT_EQ(r.reason, kRestartLimitExceeded);
  EXPECT_NE(l.failure_reason.find("RESTART_LIMIT_EXCEEDED"), std::string::npos);
  EXPECT_NE(l.failure_reason.find("2 of 2"), std::string::npos) << l.failure_reason;
  std::printf("failure_reason: %s\n", l.failure_reason.c_str());

  // max_restarts = 0: the first loss fails the job.
  Lifecycle running{v1::Job::RUNNING, 1, 0, ""};
  auto zero = ApplyTransition(running, v1::Job::RESTARTING, "WORKER_LOST", "rank 3", 0);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->after.state, v1::Job::FAILED);
  EXPECT_NE(zero->after.failure_reason.find("WORKER_LOST: rank 3"), std::string::npos);

  // FAILED keeps the caller's reason and message.
  auto failed = ApplyTransition(running, v1::Job::FAILED, "WORKER_EXIT_PERMANENT", "exit 3", 3);
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(failed->after.failure_reason, "WORKER_EXIT_PERMANENT: exit 3");
}

TEST(JobStateTest, BadArgumentsAreInvalid) {
  Lifecycle l;
  for (const char* reason : {"", "lower", "1ABC", "WITH SPACE", "A-B",
                             "TOO_LONG_0123456789012345678901234567890123456789012345678901234"}) {
    auto r = ApplyTransition(l, v1::Job::STARTING, reason, "", 3);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << reason;
    EXPECT_NE(r.status().message().find("reason"), absl::string_view::npos);
  }
  auto r = ApplyTransition(l, v1::Job::STARTING, "OK", "", -1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("max_restarts"), absl::string_view::npos);
}

}  // namespace
}  // namespace switchyard::jobs
