// AgentMain in a real process (testing/agent_main_for_test, posix_spawn'ed) against the fake
// coordinator: SIGTERM while a job trains ends the generation with WorkerExit(143), closes the
// stream and exits 0; SIGINT while idle exits 0; a rejected token exits 1 with the reason on
// stderr.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "gtest/gtest.h"
#include "worker/agent/testing/fake_coordinator.h"

extern char** environ;

namespace switchyard::agent {
namespace {

using testing::FakeCoordinator;
using Workers = std::map<std::string, testing::WorkerRecord>;

const char* g_binary = nullptr;
constexpr char kToken[] = "process-token";

std::string TmpDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
}

struct Process {
  pid_t pid = -1;
  std::string stderr_path;
};

Process Spawn(const std::vector<std::string>& args, const std::string& name) {
  Process p;
  p.stderr_path = TmpDir(name + ".stderr");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, p.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  std::vector<std::string> all = {g_binary};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  EXPECT_EQ(posix_spawn(&p.pid, g_binary, &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  return p;
}

// The exit status, or -1 if it did not exit within `timeout` (then it is killed).
int WaitExit(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (absl::Now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

v1::CoordinatorMessage LongJob(const std::string& ckpt) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(R"(
model:
  num_layers: 2
  hidden_size: 32
  num_attention_heads: 4
  ffn_hidden_size: 48
  seq_length: 16
  vocab_size: 64
  num_experts: 4
  moe_router_topk: 2
  moe_ffn_hidden_size: 24
training:
  micro_batch_size: 1
  global_batch_size: 4
  train_iters: 1000000
  lr: 0.001
data:
  mock_data: true
)");
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->mutable_training()->set_save(ckpt);
  spec->mutable_training()->set_load(ckpt);
  v1::CoordinatorMessage m;
  v1::Assignment* a = m.mutable_assignment();
  a->set_job("proc-job");
  a->set_generation(1);
  a->set_rank(0);
  a->set_world_size(1);
  *a->mutable_spec() = *spec;
  return m;
}

TEST(AgentProcessTest, SigtermWhileTrainingReportsStoppedAndExitsZero) {
  FakeCoordinator fake(kToken);
  const std::string token_file = TmpDir("proc_token");
  std::ofstream(token_file) << kToken;
  Process p =
      Spawn({"--coordinator=" + fake.address(), "--token-file=" + token_file, "--worker-id=proc-1"},
            "sigterm");
  ASSERT_TRUE(
      fake.WaitUntil([](const Workers& ws) { return ws.count("proc-1") > 0; }, absl::Seconds(20)))
      << ReadFile(p.stderr_path);
  ASSERT_TRUE(fake.Send("proc-1", LongJob(TmpDir("proc_ckpt"))));
  v1::CoordinatorMessage start;
  start.mutable_start();
  ASSERT_TRUE(fake.Send("proc-1", start));
  ASSERT_TRUE(fake.WaitUntil([](const Workers& ws) { return ws.at("proc-1").steps.size() >= 3; },
                             absl::Seconds(60)))
      << ReadFile(p.stderr_path);
  const absl::Time t0 = absl::Now();
  ASSERT_EQ(kill(p.pid, SIGTERM), 0);
  const int code = WaitExit(p.pid, absl::Seconds(20));
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  const testing::WorkerRecord w = fake.Workers().at("proc-1");
  std::printf("SIGTERM after %zu steps: process exit %d after %.0f ms; WorkerExit %s\n",
              w.steps.size(), code, ms,
              w.exits.empty() ? "(none)" : w.exits.back().ShortDebugString().c_str());
  EXPECT_EQ(code, 0) << ReadFile(p.stderr_path);
  ASSERT_EQ(w.exits.size(), 1u);
  EXPECT_EQ(w.exits[0].exit_code(), 143);
  EXPECT_EQ(w.exits[0].job(), "proc-job");
  EXPECT_TRUE(absl::StrContains(w.exits[0].message(), "shutting down")) << w.exits[0].message();
  EXPECT_TRUE(fake.WaitUntil([](const Workers& ws) { return !ws.at("proc-1").connected; },
                             absl::Seconds(5)))
      << "stream closed";
}

TEST(AgentProcessTest, SigintWhileIdleExitsZero) {
  FakeCoordinator fake("");
  Process p = Spawn({"--coordinator=" + fake.address(), "--worker-id=proc-2"}, "sigint");
  ASSERT_TRUE(fake.WaitUntil(
      [](const Workers& ws) { return ws.count("proc-2") > 0 && ws.at("proc-2").heartbeats > 2; },
      absl::Seconds(20)));
  ASSERT_EQ(kill(p.pid, SIGINT), 0);
  const int code = WaitExit(p.pid, absl::Seconds(10));
  std::printf("SIGINT while idle: exit %d\n", code);
  EXPECT_EQ(code, 0) << ReadFile(p.stderr_path);
  EXPECT_TRUE(fake.Workers().at("proc-2").exits.empty());
}

TEST(AgentProcessTest, RejectedTokenExitsOneWithTheReason) {
  FakeCoordinator fake(kToken);
  Process p = Spawn({"--coordinator=" + fake.address(), "--worker-id=proc-3"}, "token");
  const int code = WaitExit(p.pid, absl::Seconds(20));
  const std::string err = ReadFile(p.stderr_path);
  std::printf("no token: exit %d, stderr tail: %s\n", code,
              err.substr(err.size() > 300 ? err.size() - 300 : 0).c_str());
  EXPECT_EQ(code, 1);
  EXPECT_TRUE(absl::StrContains(err, "UNAUTHENTICATED")) << err;
  EXPECT_TRUE(absl::StrContains(err, "no token was sent")) << err;
}

}  // namespace
}  // namespace switchyard::agent

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <agent_main_for_test binary>\n", argv[0]);
    return 2;
  }
  switchyard::agent::g_binary = argv[1];
  return RUN_ALL_TESTS();
}
