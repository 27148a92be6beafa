// CPU tests of worker/model/profiling.h: ranges nest and keep their names and indices, children
// add up to no more than their parent and the top level to no more than the step, every NVTX
// range pushed is popped (also when a phase returns an error), misuse is refused by code, and
// steps after the first make no heap allocation (a counting operator new). On the CPU the timer
// uses the host clock; the CUDA-event path is tested by //worker/train:step_timing_gpu_test.
#include "worker/model/profiling.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

// Counts heap allocations while `counting` is set (this test binary's global operator new).
namespace alloc_count {
std::atomic<bool> counting{false};
std::atomic<int64_t> allocations{0};
}  // namespace alloc_count

void* operator new(size_t n) {
  if (alloc_count::counting.load(std::memory_order_relaxed)) ++alloc_count::allocations;
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace switchyard::model {
namespace {

// Records the NVTX pushes and pops as "+name[index]" / "-" and checks the stack depth.
class Recorder : public RangeRecorder {
 public:
  Recorder() { previous_ = SetRangeRecorderForTesting(this); }
  ~Recorder() override { SetRangeRecorderForTesting(previous_); }
  void OnPush(const char* name, int64_t index) override {
    events.push_back(index < 0 ? std::string("+") + name
                               : std::string("+") + name + "[" + std::to_string(index) + "]");
    ++depth;
    max_depth = std::max(max_depth, depth);
  }
  void OnPop() override {
    events.push_back("-");
    --depth;
  }
  std::vector<std::string> events;
  int depth = 0, max_depth = 0;

 private:
  RangeRecorder* previous_;
};

void Busy(double ms) {
  std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(ms * 1000)));
}

// A miniature step: two layers with two phases each, then an optimizer phase.
absl::Status MiniStep(const Stream& s, bool fail_in_layer_1) {
  ScopedRange fb(s, "forward_backward");
  for (int l = 0; l < 2; ++l) {
    ScopedRange layer(s, "layer.fwd", l);
    PhaseSequence phases(s);
    phases.Next("attention");
    Busy(2);
    phases.Next("mlp");
    Busy(1);
    if (fail_in_layer_1 && l == 1) return absl::InternalError("injected failure in layer 1 mlp");
  }
  return absl::OkStatus();
}

TEST(ProfilingTest, NestedRangesHaveNamesIndicesAndSumsWithinTheirParents) {
  PhaseTimer timer;
  const Stream s = Stream::Cpu();
  Recorder rec;
  ASSERT_TRUE(timer.BeginStep(s).ok());
  EXPECT_EQ(PhaseTimer::Active(), &timer);
  ASSERT_TRUE(MiniStep(s, false).ok());
  {
    ScopedRange opt(s, "optimizer");
    Busy(1);
  }
  ASSERT_TRUE(timer.EndStep(s).ok());
  EXPECT_EQ(PhaseTimer::Active(), nullptr);
  absl::StatusOr<StepTiming> t = timer.Resolve();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->device);
  EXPECT_EQ(timer.events_created(), 0);  // the CPU uses the host clock, no CUDA events

  // Order, names, indices, depths, parents.
  const std::vector<std::string> want = {"forward_backward", "layer.fwd", "attention", "mlp",
                                         "layer.fwd",        "attention", "mlp",       "optimizer"};
  const std::vector<int> depth = {0, 1, 2, 2, 1, 2, 2, 0};
  const std::vector<int64_t> index = {-1, 0, -1, -1, 1, -1, -1, -1};
  const std::vector<int> parent = {-1, 0, 1, 1, 0, 4, 4, -1};
  ASSERT_EQ(t->ranges.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const TimedRange& r = t->ranges[i];
    std::printf("  range %zu: %-16s index %2lld depth %d parent %2d  %.3f ms\n", i, r.name,
                static_cast<long long>(r.index), r.depth, r.parent, r.ms);
    EXPECT_EQ(r.name, want[i]);
    EXPECT_EQ(r.depth, depth[i]);
    EXPECT_EQ(r.index, index[i]);
    EXPECT_EQ(r.parent, parent[i]);
  }
  // Lower bounds from the sleeps (a sleep never returns early).
  EXPECT_GE(t->ranges[2].ms, 2.0);
  EXPECT_GE(t->ranges[3].ms, 1.0);
  EXPECT_GE(t->ranges[7].ms, 1.0);
  // Children within their parent; top level within the step.
  std::vector<double> child_sum(t->ranges.size(), 0.0);
  double top = 0;
  for (const TimedRange& r : t->ranges) {
    if (r.parent >= 0) {
      child_sum[r.parent] += r.ms;
    } else {
      top += r.ms;
    }
  }
  for (size_t i = 0; i < t->ranges.size(); ++i) {
    EXPECT_LE(child_sum[i], t->ranges[i].ms) << want[i];
  }
  std::printf("  step %.3f ms, top-level ranges sum to %.3f ms\n", t->step_ms, top);
  EXPECT_LE(top, t->step_ms);
  EXPECT_GE(t->step_ms, 7.0);

  // NVTX: the same ranges, properly nested, all popped.
  const std::vector<std::string> nvtx = {"+forward_backward",
                                         "+layer.fwd[0]",
                                         "+attention",
                                         "-",
                                         "+mlp",
                                         "-",
                                         "-",
                                         "+layer.fwd[1]",
                                         "+attention",
                                         "-",
                                         "+mlp",
                                         "-",
                                         "-",
                                         "-",
                                         "+optimizer",
                                         "-"};
  EXPECT_EQ(rec.events, nvtx);
  EXPECT_EQ(rec.depth, 0);
  EXPECT_EQ(rec.max_depth, 3);

  // Totals by path merge the two layers.
  const std::vector<PhaseTotal> totals = SumByPath(*t);
  ASSERT_EQ(totals.size(), 5u);
  EXPECT_EQ(totals[0].path, "forward_backward");
  EXPECT_EQ(totals[1].path, "forward_backward/layer.fwd");
  EXPECT_EQ(totals[1].count, 2);
  EXPECT_DOUBLE_EQ(totals[1].ms, t->ranges[1].ms + t->ranges[4].ms);
  EXPECT_EQ(totals[2].path, "forward_backward/layer.fwd/attention");
  EXPECT_EQ(totals[4].path, "optimizer");
  EXPECT_EQ(SumByPath(*t, 0).size(), 2u);
}

TEST(ProfilingTest, EveryRangeIsPoppedOnAnErrorReturn) {
  PhaseTimer timer;
  const Stream s = Stream::Cpu();
  Recorder rec;
  ASSERT_TRUE(timer.BeginStep(s).ok());
  const absl::Status st = MiniStep(s, /*fail_in_layer_1=*/true);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_EQ(rec.depth, 0) << "NVTX ranges left open after the error return";
  // The timer saw every range closed too: the step ends cleanly and resolves.
  ASSERT_TRUE(timer.EndStep(s).ok());
  absl::StatusOr<StepTiming> t = timer.Resolve();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->ranges.size(), 7u);
  std::printf("  error path: %zu pushes/pops recorded, depth back to %d\n", rec.events.size(),
              rec.depth);
}

TEST(ProfilingTest, WithoutAnActiveTimerRangesAreNvtxOnly) {
  Recorder rec;
  const Stream s = Stream::Cpu();
  ASSERT_EQ(PhaseTimer::Active(), nullptr);
  ASSERT_TRUE(MiniStep(s, false).ok());
  EXPECT_EQ(rec.events.size(), 14u);
  EXPECT_EQ(rec.depth, 0);
  // A timer started afterwards sees none of them.
  PhaseTimer timer;
  ASSERT_TRUE(timer.BeginStep(s).ok());
  ASSERT_TRUE(timer.EndStep(s).ok());
  absl::StatusOr<StepTiming> t = timer.Resolve();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->ranges.empty());
}

TEST(ProfilingTest, RangesTheStepRepeatsAreRecordedAgainEachStep) {
  PhaseTimer timer;
  const Stream s = Stream::Cpu();
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(timer.BeginStep(s).ok());
    ASSERT_TRUE(MiniStep(s, false).ok());
    ASSERT_TRUE(timer.EndStep(s).ok());
    absl::StatusOr<StepTiming> t = timer.Resolve();
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->ranges.size(), 7u) << "step " << step;  // the previous step's ranges dropped
  }
}

TEST(ProfilingTest, MaxDepthTimesOnlyTheUpperLevelsButNvtxSeesAll) {
  PhaseTimer timer;
  timer.set_max_depth(1);
  const Stream s = Stream::Cpu();
  Recorder rec;
  ASSERT_TRUE(timer.BeginStep(s).ok());
  ASSERT_TRUE(MiniStep(s, false).ok());
  { ScopedRange opt(s, "optimizer"); }
  ASSERT_TRUE(timer.EndStep(s).ok());
  absl::StatusOr<StepTiming> t = timer.Resolve();
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<std::string> names;
  for (const TimedRange& r : t->ranges) names.push_back(r.name);
  const std::vector<std::string> want = {"forward_backward", "layer.fwd", "layer.fwd", "optimizer"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(t->ranges[3].depth, 0);
  EXPECT_EQ(t->ranges[3].parent, -1);
  EXPECT_EQ(rec.events.size(), 16u);  // NVTX: all 8 ranges pushed and popped
  EXPECT_EQ(rec.depth, 0);
}

TEST(ProfilingTest, StepsAfterTheFirstDoNotAllocate) {
  PhaseTimer timer;
  const Stream s = Stream::Cpu();
  StepTiming t;
  for (int step = 0; step < 4; ++step) {
    alloc_count::allocations = 0;
    alloc_count::counting = true;
    const absl::Status begin = timer.BeginStep(s);
    const absl::Status run = MiniStep(s, false);
    const absl::Status end = timer.EndStep(s);
    const absl::Status resolved = timer.ResolveInto(&t);
    alloc_count::counting = false;
    ASSERT_TRUE(begin.ok() && run.ok() && end.ok() && resolved.ok())
        << begin << run << end << resolved;
    std::printf("  step %d: %lld heap allocations (timer, ranges, ResolveInto)\n", step,
                static_cast<long long>(alloc_count::allocations.load()));
    if (step > 0) {
      EXPECT_EQ(alloc_count::allocations.load(), 0) << "step " << step;
    }
  }
}

TEST(ProfilingTest, MisuseIsRefusedByCode) {
  const Stream s = Stream::Cpu();
  PhaseTimer a, b;
  EXPECT_EQ(a.EndStep(s).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a.BeginStep(s).ok());
  EXPECT_EQ(a.BeginStep(s).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b.BeginStep(s).code(), absl::StatusCode::kFailedPrecondition);  // a is active
  EXPECT_EQ(a.Resolve().status().code(), absl::StatusCode::kFailedPrecondition);

  // A range still open at the end of the step.
  auto open = std::make_unique<ScopedRange>(s, "left_open");
  const absl::Status st = a.EndStep(s);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("left_open"), std::string::npos) << st;
  open.reset();  // after the step: NVTX pop only
  EXPECT_EQ(a.Resolve().status().code(), absl::StatusCode::kFailedPrecondition);

  // Ranges closed out of order.
  ASSERT_TRUE(a.BeginStep(s).ok());
  auto outer = std::make_unique<ScopedRange>(s, "outer");
  auto inner = std::make_unique<ScopedRange>(s, "inner");
  outer.reset();
  inner.reset();
  const absl::Status order = a.EndStep(s);
  EXPECT_EQ(order.code(), absl::StatusCode::kFailedPrecondition) << order;
  EXPECT_NE(order.message().find("must nest"), std::string::npos) << order;
  std::printf("  refused: %s\n  refused: %s\n", st.ToString().c_str(), order.ToString().c_str());

  // The next step starts clean.
  ASSERT_TRUE(a.BeginStep(s).ok());
  ASSERT_TRUE(a.EndStep(s).ok());
  EXPECT_TRUE(a.Resolve().ok());
}

}  // namespace
}  // namespace switchyard::model
