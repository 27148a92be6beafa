// File: worker/agent/testing/running_agent.h
//
// Test helpers shared by the agent tests: an Agent running on a thread of its own, and a path
// under the test's temporary directory (the agent's roots in tests).
#ifndef SWITCHYARD_WORKER_AGENT_TESTING_RUNNING_AGENT_H_
#define SWITCHYARD_WORKER_AGENT_TESTING_RUNNING_AGENT_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "worker/agent/agent.h"

namespace switchyard::agent::testing {

// $TEST_TMPDIR/name (or /tmp/name outside Bazel).
inline std::string TmpDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
}

// The roots of an agent under test: $TEST_TMPDIR (or /tmp) for both, so that the TmpDir paths
// of hand-made assignments are inside them (common/config/job_paths.h).
inline JobRoots TestRoots() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  return JobRoots{dir, dir};
}

// An agent running Agent::Run on its own thread; Stop (or destruction) shuts it down and joins,
// after which `result` holds what Run returned.
struct RunningAgent {
  std::unique_ptr<Agent> agent;
  std::thread thread;
  absl::Status result;
  void Stop() {
    if (agent) agent->Shutdown();
    if (thread.joinable()) thread.join();
  }
  ~RunningAgent() { Stop(); }
};

// Creates an agent from `options` and starts it; nullptr (and a test failure naming the error)
// when Agent::Create refuses the options.
inline std::unique_ptr<RunningAgent> StartRunningAgent(const AgentOptions& options) {
  absl::StatusOr<std::unique_ptr<Agent>> agent = Agent::Create(options);
  EXPECT_TRUE(agent.ok()) << agent.status();
  if (!agent.ok()) return nullptr;
  auto r = std::make_unique<RunningAgent>();
  r->agent = std::move(*agent);
  r->thread = std::thread([p = r.get()] { p->result = p->agent->Run(); });
  return r;
}

}  // namespace switchyard::agent::testing

#endif  // SWITCHYARD_WORKER_AGENT_TESTING_RUNNING_AGENT_H_
