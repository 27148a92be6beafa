// File: coordinator/jobs/step_hub_test.cc
#include "coordinator/jobs/step_hub.h"

#include <thread>

#include "gtest/gtest.h"

namespace switchyard::jobs {
namespace {

v1::StepMetrics Step(int64_t step) {
  v1::StepMetrics m;
  m.set_step(step);
  m.set_loss(10.0 / (step + 1));
  return m;
}

TEST(StepHubTest, FansOutPerJobAndRemembersTheLastStep) {
  StepHub hub;
  auto a1 = hub.Subscribe("jobs/1");
  auto a2 = hub.Subscribe("jobs/1");
  auto b = hub.Subscribe("jobs/2");
  hub.Publish("jobs/1", Step(1));
  hub.Publish("jobs/1", Step(2));
  for (auto* sub : {&a1, &a2}) {
    EXPECT_EQ((*sub)->Next(absl::Seconds(1))->step(), 1);
    EXPECT_EQ((*sub)->Next(absl::Seconds(1))->step(), 2);
  }
  EXPECT_FALSE(b->Next(absl::Milliseconds(50)).has_value());
  EXPECT_EQ(hub.LastStep("jobs/1")->step(), 2);
  EXPECT_FALSE(hub.LastStep("jobs/2").has_value());
}

TEST(StepHubTest, NextWaitsAndCloseEndsTheStream) {
  StepHub hub;
  auto sub = hub.Subscribe("jobs/1");
  std::thread publisher([&] {
    absl::SleepFor(absl::Milliseconds(100));
    hub.Publish("jobs/1", Step(7));
    hub.CloseJob("jobs/1");
  });
  auto step = sub->Next(absl::Seconds(5));
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->step(), 7);
  const absl::Time start = absl::Now();
  EXPECT_FALSE(sub->Next(absl::Seconds(5)).has_value());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "a closed subscription must not wait";
  EXPECT_TRUE(sub->done());
  publisher.join();
  EXPECT_TRUE(hub.Subscribe("jobs/1")->done()) << "subscribing to an ended job";
}

TEST(StepHubTest, SlowReaderDropsOldestAndReleasedSubscriptionsAreForgotten) {
  StepHub hub;
  auto slow = hub.Subscribe("jobs/1");
  { auto released = hub.Subscribe("jobs/1"); }
  for (int64_t s = 0; s < static_cast<int64_t>(kMaxQueuedSteps) + 10; ++s) {
    hub.Publish("jobs/1", Step(s));
  }
  EXPECT_EQ(slow->dropped(), 10);
  EXPECT_EQ(slow->Next(absl::ZeroDuration())->step(), 10);
  std::printf("queue of %zu kept the newest; dropped %lld\n", kMaxQueuedSteps,
              static_cast<long long>(slow->dropped()));
}

}  // namespace
}  // namespace switchyard::jobs
