// File: worker/train/pipeline_schedule_test.cc
//
// PipelineSchedule against Megatron's orders: a hand-written 1F1B order, the argument rules, and
// for many (PP, VPP, M) a lock-step simulation of all stages together: each round every stage
// runs its next op if what it needs was finished in an earlier round (a forward needs the
// previous stage's forward of the same micro-batch, or of the previous chunk on the last stage;
// a backward its own forward and the next stage's backward, or the next chunk's on the first
// stage). The schedule must finish (no stage waits forever), run every forward and backward
// exactly once per stage, and for 1F1B take exactly 2·(M + PP − 1) rounds (the bubble is
// 2·(PP − 1) op slots) with at most min(PP − s, M) micro-batches alive on stage s; interleaved,
// where a round is one chunk op, the bubble is 2·(PP − 1) chunk ops (VPP times smaller).
#include "worker/train/pipeline_schedule.h"

#include <cstdio>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace switchyard::train {
namespace {

TEST(PipelineScheduleTest, OneFOneBOrderOfTheFirstStage) {
  auto ops = PipelineSchedule(/*pp=*/4, /*stage=*/0, /*vpp=*/1, /*num_micro=*/6);
  ASSERT_TRUE(ops.ok()) << ops.status();
  // Warm-up F0 F1 F2, steady F3 B0 F4 B1 F5 B2, cool-down B3 B4 B5.
  const std::vector<PipelineOp> want = {{true, 0, 0},  {true, 1, 0},  {true, 2, 0},  {true, 3, 0},
                                        {false, 0, 0}, {true, 4, 0},  {false, 1, 0}, {true, 5, 0},
                                        {false, 2, 0}, {false, 3, 0}, {false, 4, 0}, {false, 5, 0}};
  EXPECT_EQ(*ops, want);
  auto last = PipelineSchedule(4, 3, 1, 6);  // no warm-up: F0 B0 F1 B1 ...
  ASSERT_TRUE(last.ok());
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ((*last)[2 * i], (PipelineOp{true, i, 0}));
    EXPECT_EQ((*last)[2 * i + 1], (PipelineOp{false, i, 0}));
  }
}

TEST(PipelineScheduleTest, InterleavedChunkOrder) {
  // PP 2, VPP 2, M 4, stage 1: warm-up (2 - 1 - 1) * 2 + (2 - 1) * 2 = 2 forwards; virtual
  // micro-batches go through chunk 0 in groups of PP (m0 m1), then chunk 1 (m0 m1), then m2 m3.
  auto ops = PipelineSchedule(2, 1, 2, 4);
  ASSERT_TRUE(ops.ok()) << ops.status();
  ASSERT_EQ(ops->size(), 16u);
  EXPECT_EQ((*ops)[0], (PipelineOp{true, 0, 0}));
  EXPECT_EQ((*ops)[1], (PipelineOp{true, 1, 0}));
  EXPECT_EQ((*ops)[2], (PipelineOp{true, 0, 1}));   // steady: forward k = 2
  EXPECT_EQ((*ops)[3], (PipelineOp{false, 0, 1}));  // backward k = 0: last chunk first
  EXPECT_EQ((*ops)[4], (PipelineOp{true, 1, 1}));
  EXPECT_EQ((*ops)[5], (PipelineOp{false, 1, 1}));
  EXPECT_EQ((*ops)[6], (PipelineOp{true, 2, 0}));
  EXPECT_EQ((*ops)[7], (PipelineOp{false, 0, 0}));
}

TEST(PipelineScheduleTest, RejectsBadArguments) {
  struct Case {
    int64_t pp, stage, vpp, micro;
    const char* needle;
  };
  for (const Case& c : std::vector<Case>{
           {0, 0, 1, 4, "pp (0) must be at least 1"},
           {2, 2, 1, 4, "stage (2) must be in [0, pp 2)"},
           {2, 0, 0, 4, "vpp (0) must be at least 1"},
           {4, 0, 1, 3, "num_micro (3) must be at least pp (4)"},
           {2, 0, 2, 5, "num_micro (5) must be a multiple of pp (2) with vpp (2) > 1"},
       }) {
    auto ops = PipelineSchedule(c.pp, c.stage, c.vpp, c.micro);
    ASSERT_EQ(ops.status().code(), absl::StatusCode::kInvalidArgument) << c.needle;
    EXPECT_NE(ops.status().message().find(c.needle), absl::string_view::npos)
        << ops.status().message();
  }
  EXPECT_TRUE(PipelineSchedule(4, 0, 1, 5).ok());  // 1F1B: any M >= PP
}

// Runs all stages in lock step; returns the number of rounds, or -1 on a deadlock.
int64_t Simulate(int64_t pp, int64_t vpp, int64_t m, std::vector<int64_t>* peak_alive) {
  std::vector<std::vector<PipelineOp>> ops(pp);
  for (int64_t s = 0; s < pp; ++s) {
    auto o = PipelineSchedule(pp, s, vpp, m);
    EXPECT_TRUE(o.ok()) << o.status();
    if (!o.ok()) return -1;
    ops[s] = *o;
    EXPECT_EQ(static_cast<int64_t>(ops[s].size()), 2 * m * vpp);
    std::set<std::tuple<bool, int64_t, int64_t>> seen;
    for (const PipelineOp& op : ops[s]) {
      EXPECT_TRUE(seen.insert({op.forward, op.micro, op.chunk}).second)
          << "stage " << s << " runs an op twice";
      EXPECT_TRUE(op.micro >= 0 && op.micro < m && op.chunk >= 0 && op.chunk < vpp);
    }
  }
  // done[(forward, stage, micro, chunk)] = round it finished in.
  std::map<std::tuple<bool, int64_t, int64_t, int64_t>, int64_t> done;
  auto finished_before = [&](bool f, int64_t s, int64_t mi, int64_t c, int64_t round) {
    auto it = done.find({f, s, mi, c});
    return it != done.end() && it->second < round;
  };
  std::vector<size_t> next(pp, 0);
  std::vector<int64_t> alive(pp, 0);
  peak_alive->assign(pp, 0);
  int64_t round = 0;
  size_t remaining = 0;
  for (const auto& o : ops) remaining += o.size();
  while (remaining > 0) {
    bool progressed = false;
    for (int64_t s = 0; s < pp; ++s) {
      if (next[s] == ops[s].size()) continue;
      const PipelineOp& op = ops[s][next[s]];
      bool ready;
      if (op.forward) {
        ready =
            s > 0 ? finished_before(true, s - 1, op.micro, op.chunk, round)
                  : (op.chunk == 0 || finished_before(true, pp - 1, op.micro, op.chunk - 1, round));
      } else {
        ready = finished_before(true, s, op.micro, op.chunk, round) &&
                (s < pp - 1 ? finished_before(false, s + 1, op.micro, op.chunk, round)
                            : (op.chunk == vpp - 1 ||
                               finished_before(false, 0, op.micro, op.chunk + 1, round)));
      }
      if (!ready) continue;
      done[{op.forward, s, op.micro, op.chunk}] = round;
      alive[s] += op.forward ? 1 : -1;
      (*peak_alive)[s] = std::max((*peak_alive)[s], alive[s]);
      ++next[s];
      --remaining;
      progressed = true;
    }
    if (!progressed) return -1;
    ++round;
  }
  return round;
}

TEST(PipelineScheduleTest, EveryStageFinishesAndOneFOneBBubbleIsMegatrons) {
  for (int64_t pp : {1, 2, 3, 4, 8}) {
    for (int64_t m : {pp, pp + 1, 2 * pp, 4 * pp + 3}) {
      std::vector<int64_t> peak;
      const int64_t rounds = Simulate(pp, 1, m, &peak);
      ASSERT_GE(rounds, 0) << "deadlock at PP " << pp << " M " << m;
      EXPECT_EQ(rounds, 2 * (m + pp - 1)) << "PP " << pp << " M " << m;
      for (int64_t s = 0; s < pp; ++s) {
        EXPECT_LE(peak[s], std::min(pp - s, m)) << "PP " << pp << " stage " << s << " M " << m;
      }
    }
  }
}

TEST(PipelineScheduleTest, InterleavedFinishesWithABubbleSmallerByVpp) {
  for (int64_t pp : {2, 4}) {
    for (int64_t vpp : {2, 3}) {
      for (int64_t m : {pp, 2 * pp, 4 * pp}) {
        std::vector<int64_t> peak;
        const int64_t rounds = Simulate(pp, vpp, m, &peak);
        ASSERT_GE(rounds, 0) << "deadlock at PP " << pp << " VPP " << vpp << " M " << m;
        // A round is one chunk op (1/VPP of a stage's layers): the useful work is 2·M·VPP rounds;
        // plain 1F1B's bubble would be 2·(PP − 1)·VPP of these rounds.
        const int64_t bubble = rounds - 2 * m * vpp;
        std::printf("PP %lld VPP %lld M %lld: %lld rounds, bubble %lld (1F1B: %lld)\n",
                    static_cast<long long>(pp), static_cast<long long>(vpp),
                    static_cast<long long>(m), static_cast<long long>(rounds),
                    static_cast<long long>(bubble), static_cast<long long>(2 * (pp - 1) * vpp));
        // Megatron's claim for the interleaved schedule: the bubble shrinks by VPP, i.e. it is
        // 2·(PP − 1) chunk ops instead of 2·(PP − 1)·VPP.
        EXPECT_EQ(bubble, 2 * (pp - 1));
      }
    }
  }
}

}  // namespace
}  // namespace switchyard::train
