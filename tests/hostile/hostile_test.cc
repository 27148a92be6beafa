// File: tests/hostile/hostile_test.cc
//
// Hostile input against the REAL switchyard-coordinator binary (fresh SQLite store, token file,
// no default corpus) through all three front doors: REST (httplib), gRPC (generated stubs) and
// syctl (a subprocess). One table of cases (hostile_cases.cc); each case asserts
//   - the status: HTTP status, gRPC code, or syctl's exit code;
//   - that the message names the field and the rule (every needle of the case);
//   - that syctl printed no raw control character (cli/render.h TerminalSafe);
//   - that the coordinator still serves (GET /healthz, gRPC ListJobs);
//   - that nothing was persisted (the job count and the sentinel job's last event unchanged).
// Each case is its own gtest test (HostileInput/Cases.<name>), so CI reports which one broke.
// argv[1]: the switchyard-coordinator binary; argv[2]: syctl.
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config/validate.h"
#include "gtest/gtest.h"
#include "tests/e2e/e2e_util.h"
#include "tests/hostile/hostile_cases.h"

namespace switchyard::hostile {
namespace {

Env* g_env = nullptr;

class HostileInput : public ::testing::TestWithParam<Case> {};

TEST_P(HostileInput, Cases) {
  const Case& c = GetParam();
  ASSERT_NE(g_env, nullptr) << "the coordinator did not start";
  const Snapshot before = TakeSnapshot(*g_env);
  ASSERT_TRUE(before.ok) << "the coordinator did not serve before the case";
  const Outcome got = c.run(*g_env);
  std::printf("[%s] %s -> %d: %s\n", ViaName(c.via), c.name.c_str(), got.code,
              got.message.substr(0, 300).c_str());
  EXPECT_EQ(got.code, c.want) << "message: " << got.message;
  for (const std::string& needle : c.needles) {
    EXPECT_NE(got.message.find(needle), std::string::npos)
        << "message does not name \"" << needle << "\": " << got.message;
  }
  // The shared check (common/config/validate.h), line by line (newlines end syctl's lines): C0,
  // DEL and C1 controls (a hand-written byte test here missed C1, which terminals obey too).
  size_t line_start = 0;
  for (absl::string_view line : absl::StrSplit(got.printed, '\n')) {
    const size_t at = FirstControlCharacter(line);
    ASSERT_EQ(at, absl::string_view::npos)
        << "syctl printed a raw control character, byte "
        << static_cast<int>(static_cast<unsigned char>(line[at])) << " at " << line_start + at;
    line_start += line.size() + 1;
  }
  const Snapshot after = TakeSnapshot(*g_env);
  EXPECT_TRUE(after.ok) << "the coordinator stopped serving after the case";
  EXPECT_EQ(after.jobs, before.jobs) << "a job was persisted";
  EXPECT_EQ(after.sentinel_events, before.sentinel_events) << "an event was persisted";
}

INSTANTIATE_TEST_SUITE_P(Table, HostileInput, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(ViaName(info.param.via), "_", info.param.name);
                         });

}  // namespace
}  // namespace switchyard::hostile

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <switchyard-coordinator> <syctl>\n", argv[0]);
    return 2;
  }
  // No default corpus: a spec without vocab_size must be refused at submit.
  const std::string data_dir = switchyard::e2e::TmpPath("hostile_no_corpus");
  mkdir(data_dir.c_str(), 0755);
  setenv("SWITCHYARD_DATA_DIR", data_dir.c_str(), 1);
  std::unique_ptr<switchyard::hostile::Env> env = switchyard::hostile::Env::Start(argv[1], argv[2]);
  switchyard::hostile::g_env = env.get();
  std::printf("%zu hostile cases\n", switchyard::hostile::AllCases().size());
  return RUN_ALL_TESTS();
}
