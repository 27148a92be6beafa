#include "common/logging.h"

#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace switchyard {
namespace {

// Restores stderr output and the INFO level after each test.
class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogSink([this](LogSeverity severity, absl::string_view line) {
      lines_.emplace_back(line);
      severities_.push_back(severity);
    });
  }
  void TearDown() override {
    SetLogSink(nullptr);
    SetMinLogLevel(LogSeverity::kInfo);
  }
  std::vector<std::string> lines_;
  std::vector<LogSeverity> severities_;
};

TEST_F(LoggingTest, FormatsGlogStyleLine) {
  SY_LOG(INFO) << "hello " << 42;
  ASSERT_EQ(lines_.size(), 1u);
  // I1122 12:00:00.123 logging_test.cc:32] hello 42
  const std::regex kLine(R"(I\d{4} \d{2}:\d{2}:\d{2}\.\d{3} logging_test\.cc:\d+\] hello 42\n)");
  EXPECT_TRUE(std::regex_match(lines_[0], kLine)) << lines_[0];
}

TEST_F(LoggingTest, SeverityLetters) {
  SY_LOG(INFO) << "i";
  SY_LOG(WARNING) << "w";
  SY_LOG(ERROR) << "e";
  ASSERT_EQ(lines_.size(), 3u);
  EXPECT_EQ(lines_[0][0], 'I');
  EXPECT_EQ(lines_[1][0], 'W');
  EXPECT_EQ(lines_[2][0], 'E');
  EXPECT_EQ(severities_[2], LogSeverity::kError);
}

TEST_F(LoggingTest, MinLevelDropsAndSkipsEvaluation) {
  SetMinLogLevel(LogSeverity::kWarning);
  int evaluated = 0;
  auto count = [&evaluated]() { return ++evaluated; };
  SY_LOG(INFO) << "dropped " << count();
  EXPECT_EQ(evaluated, 0);
  EXPECT_TRUE(lines_.empty());
  SY_LOG(WARNING) << "kept " << count();
  EXPECT_EQ(evaluated, 1);
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_NE(lines_[0].find("kept 1"), std::string::npos);
  EXPECT_EQ(MinLogLevel(), LogSeverity::kWarning);
}

TEST_F(LoggingTest, ErrorDoesNotExit) {
  SY_LOG(ERROR) << "still alive";
  EXPECT_EQ(lines_.size(), 1u);
}

TEST_F(LoggingTest, WorksInsideUnbracedIfElse) {
  bool flag = false;
  if (flag)
    SY_LOG(INFO) << "then";
  else
    SY_LOG(INFO) << "else";
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_NE(lines_[0].find("else"), std::string::npos);
}

TEST_F(LoggingTest, ConcurrentLinesStayWhole) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t]() {
      for (int i = 0; i < kPerThread; ++i) SY_LOG(INFO) << "thread " << t << " message " << i;
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_EQ(lines_.size(), static_cast<size_t>(kThreads * kPerThread));
  const std::regex kLine(R"(I\d{4} [0-9:.]+ logging_test\.cc:\d+\] thread \d message \d+\n)");
  for (const std::string& line : lines_) ASSERT_TRUE(std::regex_match(line, kLine)) << line;
}

TEST(LoggingStderrTest, WritesToStderr) {
  ::testing::internal::CaptureStderr();
  SY_LOG(WARNING) << "to stderr";
  std::string captured = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(captured[0], 'W');
  EXPECT_NE(captured.find("logging_test.cc:"), std::string::npos);
  EXPECT_NE(captured.find("] to stderr\n"), std::string::npos);
}

TEST(ParseLogSeverityTest, AcceptsNamesAndRejectsOthers) {
  EXPECT_EQ(*ParseLogSeverity("info"), LogSeverity::kInfo);
  EXPECT_EQ(*ParseLogSeverity("WARNING"), LogSeverity::kWarning);
  EXPECT_EQ(*ParseLogSeverity(" Error "), LogSeverity::kError);
  auto bad = ParseLogSeverity("verbose");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("verbose"), std::string::npos);
  EXPECT_STREQ(LogSeverityName(LogSeverity::kWarning), "WARNING");
}

}  // namespace
}  // namespace switchyard
