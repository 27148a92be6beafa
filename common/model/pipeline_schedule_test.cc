// File: common/model/pipeline_schedule_test.cc
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
// Interleaved orders of PP 2·VPP 2 and PP 4·VPP 2 with 8 micro-batches against lists written by
// hand from megatron_parallel.md §3.4, and PipelineProgram's messages run as blocking rendezvous
// Send/Recv (deadlock-free, every input arrived before its op, the stages' orders unchanged).
// The counts of what a stage keeps alive: PipelineAliveMicroBatches equals MaxAliveMicroBatches of
// the orders for every stage of PP 1..8, VPP 1..4, M up to 8·PP; PipelineReceiveBuffers by hand
// for PP 2·VPP 2, and its 2·PP cap equal to the whole step's count up to M = 10·PP.
#include "common/model/pipeline_schedule.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace switchyard {
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

// "F0.1 B3.0 ...": forward / backward of micro-batch 0 / 3 in chunk 1 / 0.
std::vector<PipelineOp> Parse(const std::string& text) {
  std::vector<PipelineOp> out;
  std::istringstream in(text);
  std::string w;
  while (in >> w) {
    PipelineOp op;
    op.forward = w[0] == 'F';
    const size_t dot = w.find('.');
    op.micro = std::stoll(w.substr(1, dot - 1));
    op.chunk = std::stoll(w.substr(dot + 1));
    out.push_back(op);
  }
  return out;
}

std::string Show(const std::vector<PipelineOp>& ops) {
  std::string out;
  for (const PipelineOp& op : ops) {
    out +=
        (op.forward ? "F" : "B") + std::to_string(op.micro) + "." + std::to_string(op.chunk) + " ";
  }
  return out;
}

// Written by hand from megatron_parallel.md §3.4 (not from the code): the table of M = 8, V = 2,
// N = PP (groups of PP micro-batches, chunk 0 then chunk 1 of each group; a backward walks the
// same table with the chunks reversed), warm-up 2·(PP − s − 1) + (V − 1)·PP table entries, then
// "forward k + warm-up, backward k", then the remaining backwards.
TEST(PipelineScheduleTest, InterleavedOrdersOfPp2Vpp2AndPp4Vpp2WithEightMicroBatches) {
  struct Case {
    int64_t pp, stage;
    const char* want;
  };
  const Case cases[] = {
      // PP 2: table (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1) ...; stage 0 warm-up 4.
      {2, 0,
       "F0.0 F1.0 F0.1 F1.1 "
       "F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 F4.0 B2.1 F5.0 B3.1 F4.1 B2.0 F5.1 B3.0 "
       "F6.0 B4.1 F7.0 B5.1 F6.1 B4.0 F7.1 B5.0 "
       "B6.1 B7.1 B6.0 B7.0"},
      // Stage 1 warm-up 2.
      {2, 1,
       "F0.0 F1.0 "
       "F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 F4.0 B2.0 F5.0 B3.0 "
       "F4.1 B4.1 F5.1 B5.1 F6.0 B4.0 F7.0 B5.0 F6.1 B6.1 F7.1 B7.1 "
       "B6.0 B7.0"},
      // PP 4: table (0..3, 0) (0..3, 1) (4..7, 0) (4..7, 1); stage 0 warm-up 2·3 + 4 = 10.
      {4, 0,
       "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 F5.0 "
       "F6.0 B0.1 F7.0 B1.1 F4.1 B2.1 F5.1 B3.1 F6.1 B0.0 F7.1 B1.0 "
       "B2.0 B3.0 B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0"},
      // Stage 1 warm-up 8.
      {4, 1,
       "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 "
       "F4.0 B0.1 F5.0 B1.1 F6.0 B2.1 F7.0 B3.1 F4.1 B0.0 F5.1 B1.0 F6.1 B2.0 F7.1 B3.0 "
       "B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0"},
      // Stage 3 warm-up 4.
      {4, 3,
       "F0.0 F1.0 F2.0 F3.0 "
       "F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 F4.0 B0.0 F5.0 B1.0 F6.0 B2.0 F7.0 B3.0 "
       "F4.1 B4.1 F5.1 B5.1 F6.1 B6.1 F7.1 B7.1 "
       "B4.0 B5.0 B6.0 B7.0"},
  };
  for (const Case& c : cases) {
    auto ops = PipelineSchedule(c.pp, c.stage, /*vpp=*/2, /*num_micro=*/8);
    ASSERT_TRUE(ops.ok()) << ops.status();
    EXPECT_EQ(Show(*ops), Show(Parse(c.want))) << "PP " << c.pp << " stage " << c.stage;
  }
}

// The program's messages as BLOCKING rendezvous Send/Recv (Gloo's Send does not return before
// the peer's Recv): every stage walks, round by round, its op and then the round's messages that
// name it; a Send and the peer's Recv complete only together, when both stages stand at them.
// Returns false on a deadlock (no pair can complete). Also checks that every op's input arrived
// in an earlier round and that the program runs exactly PipelineSchedule's order per stage.
bool RunProgramAsRendezvous(int64_t pp, int64_t vpp, int64_t m) {
  auto program = PipelineProgram(pp, vpp, m);
  EXPECT_TRUE(program.ok()) << program.status();
  if (!program.ok()) return false;
  struct Action {
    bool send;
    int64_t peer;
    uint32_t tag;
  };
  std::vector<std::vector<Action>> actions(pp);
  std::vector<std::vector<PipelineOp>> ran(pp);
  std::set<std::tuple<bool, int64_t, int64_t, int64_t>> arrived;  // (activation, to, micro, chunk)
  for (const PipelineRound& r : *program) {
    for (int64_t s = 0; s < pp; ++s) {
      if (!r.has_op[s]) continue;
      const PipelineOp& op = r.ops[s];
      ran[s].push_back(op);
      const int64_t virt = op.chunk * pp + s;
      const bool needs = op.forward ? virt != 0 : virt != pp * vpp - 1;
      EXPECT_TRUE(!needs || arrived.count({op.forward, s, op.micro, op.chunk}))
          << "PP " << pp << " VPP " << vpp << " M " << m << ": stage " << s << " runs "
          << Show({op}) << "before its input arrived";
    }
    for (const PipelineMessage& msg : r.messages) {
      EXPECT_NE(msg.from, msg.to);
      EXPECT_EQ((msg.from + (msg.activation ? 1 : pp - 1)) % pp, msg.to);
      EXPECT_TRUE(arrived.insert({msg.activation, msg.to, msg.micro, msg.chunk}).second)
          << "a message is sent twice";
      actions[msg.from].push_back({true, msg.to, msg.tag});
      actions[msg.to].push_back({false, msg.from, msg.tag});
    }
  }
  for (int64_t s = 0; s < pp; ++s) {
    auto want = PipelineSchedule(pp, s, vpp, m);
    EXPECT_EQ(Show(ran[s]), Show(*want)) << "stage " << s;
  }
  std::vector<size_t> at(pp, 0);
  size_t left = 0;
  for (const auto& a : actions) left += a.size();
  while (left > 0) {
    bool progressed = false;
    for (int64_t s = 0; s < pp; ++s) {
      if (at[s] == actions[s].size() || !actions[s][at[s]].send) continue;
      const Action& a = actions[s][at[s]];
      const int64_t p = a.peer;
      if (at[p] == actions[p].size()) continue;
      const Action& b = actions[p][at[p]];
      if (b.send || b.peer != s || b.tag != a.tag) continue;
      ++at[s];
      ++at[p];
      left -= 2;
      progressed = true;
    }
    if (!progressed) return false;
  }
  return true;
}

TEST(PipelineScheduleTest, InterleavedProgramIsDeadlockFreeAsBlockingSendRecv) {
  for (int64_t pp : {2, 3, 4, 8}) {
    for (int64_t vpp : {2, 3, 4}) {
      for (int64_t m : {pp, 2 * pp, 4 * pp}) {
        EXPECT_TRUE(RunProgramAsRendezvous(pp, vpp, m))
            << "deadlock at PP " << pp << " VPP " << vpp << " M " << m;
      }
    }
  }
  // 1F1B too (the program is defined for VPP 1; the trainer runs its own pairing there).
  EXPECT_TRUE(RunProgramAsRendezvous(4, 1, 6));
  EXPECT_EQ(PipelineProgram(2, 2, 5).status().code(), absl::StatusCode::kInvalidArgument);
}

// Forward-only (evaluation): every op in warm-up, the forwards in the schedule's order (the
// chunk table with VPP: PP 2, VPP 2, M 4 -> (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1)); the
// program carries activations only and runs as blocking rendezvous Send/Recv.
TEST(PipelineScheduleTest, ForwardOnlyOrdersAndProgram) {
  auto one = PipelineSchedule(4, 2, 1, 4, /*forward_only=*/true);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(Show(*one), Show(Parse("F0.0 F1.0 F2.0 F3.0")));
  auto vpp = PipelineSchedule(2, 1, 2, 4, /*forward_only=*/true);
  ASSERT_TRUE(vpp.ok()) << vpp.status();
  EXPECT_EQ(Show(*vpp), Show(Parse("F0.0 F1.0 F0.1 F1.1 F2.0 F3.0 F2.1 F3.1")));
  for (int64_t pp : {2, 3, 4}) {
    for (int64_t v : {1, 2, 3}) {
      auto program = PipelineProgram(pp, v, 2 * pp, /*forward_only=*/true);
      ASSERT_TRUE(program.ok()) << program.status();
      std::vector<std::vector<std::pair<bool, int64_t>>> acts(pp);  // (send, peer)
      std::set<std::tuple<int64_t, int64_t, int64_t>> arrived;      // (to, micro, chunk)
      int64_t forwards = 0;
      for (const PipelineRound& r : *program) {
        for (int64_t s = 0; s < pp; ++s) {
          if (!r.has_op[s]) continue;
          EXPECT_TRUE(r.ops[s].forward);
          ++forwards;
          if (r.ops[s].chunk * pp + s > 0) {
            EXPECT_TRUE(arrived.count({s, r.ops[s].micro, r.ops[s].chunk}))
                << "PP " << pp << " VPP " << v << ": input missing";
          }
        }
        for (const PipelineMessage& m : r.messages) {
          EXPECT_TRUE(m.activation);
          arrived.insert({m.to, m.micro, m.chunk});
          acts[m.from].push_back({true, m.to});
          acts[m.to].push_back({false, m.from});
        }
      }
      EXPECT_EQ(forwards, pp * v * 2 * pp);
      // Blocking rendezvous over the global order (as RunProgramAsRendezvous).
      std::vector<size_t> at(pp, 0);
      bool progressed = true;
      while (progressed) {
        progressed = false;
        for (int64_t s = 0; s < pp; ++s) {
          if (at[s] == acts[s].size() || !acts[s][at[s]].first) continue;
          const int64_t p = acts[s][at[s]].second;
          if (at[p] < acts[p].size() && !acts[p][at[p]].first && acts[p][at[p]].second == s) {
            ++at[s];
            ++at[p];
            progressed = true;
          }
        }
      }
      for (int64_t s = 0; s < pp; ++s) {
        EXPECT_EQ(at[s], acts[s].size()) << "deadlock at PP " << pp << " VPP " << v;
      }
    }
  }
}

TEST(PipelineScheduleTest, AliveMicroBatchesBoundTheActivationSlots) {
  // 1F1B: stage s keeps min(PP − s, M) micro-batches alive (Megatron's memory claim).
  for (int64_t s = 0; s < 4; ++s) {
    EXPECT_EQ(MaxAliveMicroBatches(*PipelineSchedule(4, s, 1, 8)), 4 - s);
  }
  // PP 2, VPP 2, M 8, stage 0 (order above): F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 -> 0..3 alive
  // before B0.0 frees micro-batch 0.
  EXPECT_EQ(MaxAliveMicroBatches(*PipelineSchedule(2, 0, 2, 8)), 4);
  // Stage 1: F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0: 0..2 alive.
  EXPECT_EQ(MaxAliveMicroBatches(*PipelineSchedule(2, 1, 2, 8)), 3);
}

// PipelineAliveMicroBatches (the count the trainer's slots and the memory estimate use) is the
// count of the orders themselves, for every stage of every small pipeline: 1F1B with any M from
// PP to 8·PP, interleaved with every multiple of PP up to 8·PP; and it keeps PipelineSchedule's
// argument rules and messages.
TEST(PipelineScheduleTest, AliveMicroBatchesCountTheOrders) {
  int64_t checked = 0;
  for (int64_t pp = 1; pp <= 8; ++pp) {
    for (int64_t vpp = 1; vpp <= 4; ++vpp) {
      for (int64_t m = pp; m <= 8 * pp; m += vpp == 1 ? 1 : pp) {
        for (int64_t s = 0; s < pp; ++s) {
          auto ops = PipelineSchedule(pp, s, vpp, m);
          ASSERT_TRUE(ops.ok()) << ops.status();
          auto alive = PipelineAliveMicroBatches(pp, s, vpp, m);
          ASSERT_TRUE(alive.ok()) << alive.status();
          EXPECT_EQ(*alive, MaxAliveMicroBatches(*ops))
              << "PP " << pp << " VPP " << vpp << " M " << m << " stage " << s;
          EXPECT_LE(*alive, std::min(2 * pp, m));  // the bound model_math.h states
          ++checked;
        }
      }
    }
  }
  // 1F1B: sum over PP of (7·PP + 1) values of M times PP stages = 1464; interleaved: 3 VPP times
  // 8 values of M times PP stages = 864.
  EXPECT_EQ(checked, 1464 + 864);
  // The hand-checked counts above, and PP 4·VPP 2·M 8 (stage 3: warm-up 4 chunk-0 forwards
  // F0.0 .. F3.0, then F0.1 B0.1 ... F3.1 B3.1 F4.0 before B0.0 frees micro-batch 0: 0..4 alive).
  EXPECT_EQ(*PipelineAliveMicroBatches(2, 0, 2, 8), 4);
  EXPECT_EQ(*PipelineAliveMicroBatches(2, 1, 2, 8), 3);
  std::vector<int64_t> pp4;
  for (int64_t s = 0; s < 4; ++s) pp4.push_back(*PipelineAliveMicroBatches(4, s, 2, 8));
  EXPECT_EQ(pp4, (std::vector<int64_t>{8, 8, 7, 5}));
  for (int64_t s = 0; s < 4; ++s) EXPECT_EQ(*PipelineAliveMicroBatches(4, s, 1, 8), 4 - s);
  // Bad arguments: PipelineSchedule's errors.
  for (auto [pp, stage, vpp, m] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
           {0, 0, 1, 4}, {2, 2, 1, 4}, {2, 0, 0, 4}, {4, 0, 1, 3}, {2, 0, 2, 5}}) {
    auto alive = PipelineAliveMicroBatches(pp, stage, vpp, m);
    EXPECT_EQ(alive.status(), PipelineSchedule(pp, stage, vpp, m).status());
    EXPECT_EQ(PipelineReceiveBuffers(pp, stage, vpp, m).status(), alive.status());
  }
}

// PipelineReceiveBuffers, the interleaved step's message buffers a stage holds at once (the
// step's share of the trainer's pool, PipelinePoolBuffers). By hand, PP 2·VPP 2·M 4 (the program's
// rounds, as Trainer:: InterleavedMicroBatches takes and frees them): stage 0 receives one
// activation (for chunk 1) or one gradient per round and consumes it the round after: 1. Stage 1
// holds in round 6 micro- batch 1's head gradient (B1.1 sends it; freed after the round's
// receives), micro-batch 2's activation for chunk 0 (received in round 4), micro-batch 0's gradient
// for chunk 0 (round 5) and receives micro-batch 3's activation for chunk 0: 4. The count taken on
// 2·PP micro-batches is the whole step's for every M up to 10·PP.
TEST(PipelineScheduleTest, ReceiveBuffersOfTheInterleavedStep) {
  EXPECT_EQ(*PipelineReceiveBuffers(2, 0, 2, 4), 1);
  EXPECT_EQ(*PipelineReceiveBuffers(2, 1, 2, 4), 4);
  auto small = PipelineProgram(2, 2, 4);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(PipelineReceiveBuffers(*small, 2, 0), 1);
  EXPECT_EQ(PipelineReceiveBuffers(*small, 2, 1), 4);
  EXPECT_EQ(*PipelineReceiveBuffers(4, 0, 1, 8), 0);  // 1F1B: the trainer's two buffers only
  for (int64_t pp = 2; pp <= 8; ++pp) {
    for (int64_t vpp = 2; vpp <= 4; ++vpp) {
      for (int64_t m = pp; m <= 10 * pp; m += pp) {
        auto program = PipelineProgram(pp, vpp, m);
        ASSERT_TRUE(program.ok()) << program.status();
        for (int64_t s = 0; s < pp; ++s) {
          auto capped = PipelineReceiveBuffers(pp, s, vpp, m);
          ASSERT_TRUE(capped.ok()) << capped.status();
          EXPECT_EQ(*capped, PipelineReceiveBuffers(*program, vpp, s))
              << "PP " << pp << " VPP " << vpp << " M " << m << " stage " << s;
          EXPECT_GE(*capped, 1);
        }
      }
    }
  }
}

// PipelinePoolBuffers, the trainer's one pool count: the larger of the interleaved step's and the
// forward-only program's receive buffers. By hand, the forward-only program hands a stage each
// activation in the round before its forward (PP 2·VPP 1·M 2: round 0 F0 on stage 0 sends m0;
// round 1 stage 1 runs F0 (freeing it) while stage 0's F1 sends m1; round 2 F1): 1 on every
// stage that receives, 0 on stage 0 at VPP 1, so 1F1B's stages after the first hold 1 (evaluation
// only) and interleaved ones their step's count. Capped programs give the whole step's count for
// every M up to 10·PP; bad arguments give PipelineSchedule's errors.
TEST(PipelineScheduleTest, PoolBuffersCoverTheStepAndEvaluation) {
  auto fo = PipelineProgram(2, 1, 2, /*forward_only=*/true);
  ASSERT_TRUE(fo.ok()) << fo.status();
  EXPECT_EQ(PipelineForwardOnlyBuffers(*fo, 0), 0);
  EXPECT_EQ(PipelineForwardOnlyBuffers(*fo, 1), 1);
  for (int64_t s = 0; s < 4; ++s) EXPECT_EQ(*PipelinePoolBuffers(4, s, 1, 8), s == 0 ? 0 : 1);
  std::vector<int64_t> pp4;
  for (int64_t s = 0; s < 4; ++s) pp4.push_back(*PipelinePoolBuffers(4, s, 2, 8));
  EXPECT_EQ(pp4, (std::vector<int64_t>{2, 2, 2, 5}));  // the step's (ReceiveBuffersOf...)
  EXPECT_EQ(*PipelinePoolBuffers(1, 0, 1, 3), 0);
  for (int64_t pp = 2; pp <= 8; ++pp) {
    for (int64_t vpp = 1; vpp <= 4; ++vpp) {
      for (int64_t m = pp; m <= 10 * pp; m += vpp == 1 ? 1 : pp) {
        auto step = PipelineProgram(pp, vpp, m);
        auto eval = PipelineProgram(pp, vpp, m, /*forward_only=*/true);
        ASSERT_TRUE(step.ok() && eval.ok());
        for (int64_t s = 0; s < pp; ++s) {
          const int64_t want = std::max(vpp == 1 ? 0 : PipelineReceiveBuffers(*step, vpp, s),
                                        PipelineForwardOnlyBuffers(*eval, s));
          auto pool = PipelinePoolBuffers(pp, s, vpp, m);
          ASSERT_TRUE(pool.ok()) << pool.status();
          EXPECT_EQ(*pool, want) << "PP " << pp << " VPP " << vpp << " M " << m << " stage " << s;
        }
      }
    }
  }
  for (auto [pp, stage, vpp, m] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
           {0, 0, 1, 4}, {2, 2, 1, 4}, {2, 0, 0, 4}, {4, 0, 1, 3}, {2, 0, 2, 5}}) {
    EXPECT_EQ(PipelinePoolBuffers(pp, stage, vpp, m).status(),
              PipelineSchedule(pp, stage, vpp, m).status());
  }
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
}  // namespace switchyard
