// api_status.h (reasons, HTTP mapping, the REST error body) and auth.h (token rules, Check).
#include "coordinator/api/api_status.h"

#include <cstdio>

#include "coordinator/api/api_test_util.h"
#include "coordinator/api/auth.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace switchyard::api {
namespace {

TEST(ApiStatusTest, ReasonsAreAddedOnceAndParsedBack) {
  absl::Status s = WithDefaultReason(absl::InvalidArgumentError("model.hidden_size is required"));
  EXPECT_EQ(s.message(), "model.hidden_size is required (reason: INVALID_REQUEST)");
  EXPECT_EQ(ReasonOf(s.message()), "INVALID_REQUEST");
  EXPECT_EQ(WithReason(s, "OTHER"), s);  // already has one
  EXPECT_TRUE(WithDefaultReason(absl::OkStatus()).ok());
  EXPECT_EQ(ReasonOf("no reason here"), "");
  EXPECT_EQ(DefaultReason(absl::StatusCode::kAlreadyExists), "REQUEST_ID_CONFLICT");
  EXPECT_EQ(DefaultReason(absl::StatusCode::kFailedPrecondition), "INVALID_STATE");
  EXPECT_EQ(DefaultReason(absl::StatusCode::kUnavailable), "UNAVAILABLE");
}

TEST(ApiStatusTest, HttpMapping) {
  const std::pair<absl::StatusCode, int> table[] = {
      {absl::StatusCode::kOk, 200},
      {absl::StatusCode::kInvalidArgument, 400},
      {absl::StatusCode::kFailedPrecondition, 400},
      {absl::StatusCode::kOutOfRange, 400},
      {absl::StatusCode::kUnauthenticated, 401},
      {absl::StatusCode::kPermissionDenied, 403},
      {absl::StatusCode::kNotFound, 404},
      {absl::StatusCode::kAlreadyExists, 409},
      {absl::StatusCode::kAborted, 409},
      {absl::StatusCode::kResourceExhausted, 429},
      {absl::StatusCode::kCancelled, 499},
      {absl::StatusCode::kInternal, 500},
      {absl::StatusCode::kUnknown, 500},
      {absl::StatusCode::kDataLoss, 500},
      {absl::StatusCode::kUnimplemented, 501},
      {absl::StatusCode::kUnavailable, 503},
      {absl::StatusCode::kDeadlineExceeded, 504},
  };
  for (const auto& [code, http] : table) {
    EXPECT_EQ(HttpStatusFor(code), http) << CodeName(code);
    std::printf("  %-20s -> %d\n", CodeName(code).c_str(), http);
  }
}

// A full store is 507 with reason STORE_FULL; a planner's RESOURCE_EXHAUSTED stays 429 with
// NO_FEASIBLE_PLAN.
TEST(ApiStatusTest, FullStoreIs507NotNoFeasiblePlan) {
  const absl::Status full = absl::ResourceExhaustedError(
      "store \"/var/lib/s.db\" is full (no space on its disk, or its size limit): nothing was "
      "written (reason: STORE_FULL)");
  EXPECT_EQ(HttpStatusOf(full), 507);
  EXPECT_EQ(ReasonOf(WithDefaultReason(full).message()), "STORE_FULL");
  nlohmann::json body = nlohmann::json::parse(ErrorJson(full));
  EXPECT_EQ(body["error"]["code"], 507);
  EXPECT_EQ(body["error"]["status"], "RESOURCE_EXHAUSTED");
  EXPECT_EQ(body["error"]["reason"], "STORE_FULL");
  const absl::Status plan = absl::ResourceExhaustedError("no mapping fits in 80 GiB");
  EXPECT_EQ(HttpStatusOf(plan), 429);
  // Only the planner's verdict is NO_FEASIBLE_PLAN (PlanForUser sets it); another
  // RESOURCE_EXHAUSTED keeps its code name, never a misleading reason.
  EXPECT_EQ(ReasonOf(WithDefaultReason(plan).message()), "RESOURCE_EXHAUSTED");
  std::printf("%s\n", body.dump().c_str());
}

TEST(ApiStatusTest, ErrorJsonShape) {
  nlohmann::json body =
      nlohmann::json::parse(ErrorJson(absl::NotFoundError("jobs/7 does not exist")));
  std::printf("%s\n", body.dump().c_str());
  ASSERT_TRUE(body.contains("error"));
  EXPECT_EQ(body["error"]["code"], 404);
  EXPECT_EQ(body["error"]["status"], "NOT_FOUND");
  EXPECT_EQ(body["error"]["message"], "jobs/7 does not exist (reason: NOT_FOUND)");
  EXPECT_EQ(body["error"]["reason"], "NOT_FOUND");
  EXPECT_EQ(body["error"].size(), 4u);
}

TEST(TokenAuthTest, TokenRulesAndCheck) {
  EXPECT_EQ(TokenAuth::FromToken("  \n").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenAuth::FromToken("two words").status().code(), absl::StatusCode::kInvalidArgument);
  auto missing = TokenAuth::FromFile(testing::FreshPath("no_such_token"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  auto empty = TokenAuth::FromFile(testing::WriteFile("empty_token", "\n"));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("token file"), absl::string_view::npos);

  auto auth = TokenAuth::FromFile(testing::WriteFile("token", "abc123\n"));
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_TRUE((*auth)->Check("Bearer abc123").ok());
  EXPECT_TRUE((*auth)->Check("bearer abc123").ok());  // the scheme is case-insensitive
  for (const char* bad : {"", "Bearer", "Bearer ", "Bearer abc12", "Bearer abc1234",
                          "Bearer ABC123", "Basic abc123", "abc123"}) {
    absl::Status s = (*auth)->Check(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << "'" << bad << "'";
    EXPECT_EQ(ReasonOf(s.message()), bad[0] == '\0' ? "MISSING_TOKEN" : "INVALID_TOKEN") << bad;
  }
}

}  // namespace
}  // namespace switchyard::api
