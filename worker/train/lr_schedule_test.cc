// LR schedule golden values against Megatron's get_lr formulas.
#include "worker/train/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

namespace switchyard::train {
namespace {

LrSchedule Make(LrDecayStyle style, double lr = 1e-3, double min_lr = 1e-5, int64_t warmup = 100,
                int64_t decay = 1100) {
  LrScheduleConfig c;
  c.lr = lr;
  c.min_lr = min_lr;
  c.lr_warmup_iters = warmup;
  c.lr_decay_iters = decay;
  c.lr_decay_style = style;
  absl::StatusOr<LrSchedule> s = LrSchedule::Create(c);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

TEST(LrScheduleTest, CosineGoldenValues) {
  const LrSchedule s = Make(LrDecayStyle::kCosine);
  EXPECT_EQ(s.LrAt(0), 0.0);
  EXPECT_DOUBLE_EQ(s.LrAt(1), 1e-5);  // 1e-3 * 1 / 100
  EXPECT_DOUBLE_EQ(s.LrAt(50), 5e-4);
  EXPECT_DOUBLE_EQ(s.LrAt(100), 1e-3);  // warmup end
  // Mid-decay: progress 0.5 -> min + (max - min) * 0.5 * (1 + cos(pi/2)) = (max + min) / 2.
  EXPECT_NEAR(s.LrAt(600), 0.5 * (1e-3 + 1e-5), 1e-18);
  // Quarter: 0.5 * (1 + cos(pi/4)).
  EXPECT_NEAR(s.LrAt(350), 1e-5 + (1e-3 - 1e-5) * 0.5 * (1.0 + std::cos(M_PI * 0.25)), 1e-18);
  EXPECT_NEAR(s.LrAt(1100), 1e-5, 1e-18);  // decay end
  EXPECT_EQ(s.LrAt(1101), 1e-5);           // after
  EXPECT_EQ(s.LrAt(100000), 1e-5);
}

TEST(LrScheduleTest, LinearGoldenValues) {
  const LrSchedule s = Make(LrDecayStyle::kLinear);
  EXPECT_EQ(s.LrAt(0), 0.0);
  EXPECT_DOUBLE_EQ(s.LrAt(100), 1e-3);
  EXPECT_NEAR(s.LrAt(350), 1e-5 + (1e-3 - 1e-5) * 0.75, 1e-18);
  EXPECT_NEAR(s.LrAt(600), 1e-5 + (1e-3 - 1e-5) * 0.5, 1e-18);
  EXPECT_NEAR(s.LrAt(1100), 1e-5, 1e-18);
  EXPECT_EQ(s.LrAt(2000), 1e-5);
}

TEST(LrScheduleTest, ConstantKeepsMaxAfterWarmup) {
  const LrSchedule s = Make(LrDecayStyle::kConstant);
  EXPECT_EQ(s.LrAt(0), 0.0);
  EXPECT_DOUBLE_EQ(s.LrAt(100), 1e-3);
  EXPECT_EQ(s.LrAt(600), 1e-3);
  EXPECT_EQ(s.LrAt(5000), 1e-3);  // Megatron: constant ignores decay_iters and min_lr
}

TEST(LrScheduleTest, NoWarmupStartsAtMax) {
  const LrSchedule s = Make(LrDecayStyle::kCosine, 2e-4, 0.0, 0, 10);
  EXPECT_EQ(s.LrAt(0), 2e-4);
  EXPECT_NEAR(s.LrAt(5), 1e-4, 1e-18);
  EXPECT_NEAR(s.LrAt(10), 0.0, 1e-18);
  EXPECT_EQ(s.LrAt(11), 0.0);
}

TEST(LrScheduleTest, RejectsBadConfig) {
  LrScheduleConfig c;
  c.lr = 1e-3;
  c.min_lr = 1e-2;
  c.lr_decay_iters = 10;
  EXPECT_EQ(LrSchedule::Create(c).status().code(), absl::StatusCode::kInvalidArgument);
  c.min_lr = 0;
  c.lr_warmup_iters = 10;
  absl::Status st = LrSchedule::Create(c).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("lr_decay_iters"), absl::string_view::npos) << st;
  c.lr_warmup_iters = -1;
  EXPECT_EQ(LrSchedule::Create(c).status().code(), absl::StatusCode::kInvalidArgument);
  c.lr_warmup_iters = 10;
  c.lr_decay_style = LrDecayStyle::kConstant;  // constant needs no decay window
  EXPECT_TRUE(LrSchedule::Create(c).ok());
  EXPECT_EQ(ParseLrDecayStyle("cosine").value(), LrDecayStyle::kCosine);
  EXPECT_EQ(ParseLrDecayStyle("").value(), LrDecayStyle::kCosine);
  EXPECT_EQ(ParseLrDecayStyle("linear").value(), LrDecayStyle::kLinear);
  EXPECT_EQ(ParseLrDecayStyle("constant").value(), LrDecayStyle::kConstant);
  EXPECT_EQ(ParseLrDecayStyle("wsd").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace switchyard::train
