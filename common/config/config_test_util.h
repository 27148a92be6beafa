// File: common/config/config_test_util.h
//
// Helpers shared by the config tests: test data files (through Bazel runfiles) and the
// INVALID_ARGUMENT assertion.
#ifndef SWITCHYARD_COMMON_CONFIG_CONFIG_TEST_UTIL_H_
#define SWITCHYARD_COMMON_CONFIG_CONFIG_TEST_UTIL_H_

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "switchyard/v1/config.pb.h"

namespace switchyard::testing {

// common/config/testdata/<name> in the test's runfiles (TEST_SRCDIR/TEST_WORKSPACE), else relative
// to the working directory.
inline std::string TestdataPath(const std::string& name) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir != nullptr && workspace != nullptr) {
    return absl::StrCat(srcdir, "/", workspace, "/common/config/testdata/", name);
  }
  return "common/config/testdata/" + name;
}

inline std::string ReadTestdata(const std::string& name) {
  std::ifstream in(TestdataPath(name));
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_FALSE(text.str().empty()) << name;
  return text.str();
}

// A path in the test's private temporary directory.
inline std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

// Asserts INVALID_ARGUMENT whose message contains `needle` (and prints it as evidence).
inline void ExpectInvalid(const absl::StatusOr<v1::JobSpec>& result, const std::string& needle) {
  ASSERT_FALSE(result.ok()) << "expected an error containing: " << needle;
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_NE(result.status().message().find(needle), absl::string_view::npos)
      << "message: " << result.status().message() << "\nexpected to contain: " << needle;
  std::printf("  rejected: %s\n", std::string(result.status().message()).c_str());
}

}  // namespace switchyard::testing

#endif  // SWITCHYARD_COMMON_CONFIG_CONFIG_TEST_UTIL_H_
