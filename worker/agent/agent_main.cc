// RunAgent and AgentMain (agent.h): the agent as a process.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "worker/agent/agent.h"

namespace switchyard::agent {

absl::Status RunAgent(const AgentOptions& options) {
  absl::StatusOr<std::unique_ptr<Agent>> agent = Agent::Create(options);
  if (!agent.ok()) return agent.status();
  return (*agent)->Run();
}

int AgentMain(const AgentOptions& options) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  absl::StatusOr<std::unique_ptr<Agent>> agent = Agent::Create(options);
  if (!agent.ok()) {
    std::fprintf(stderr, "switchyard-worker: %s\n", agent.status().ToString().c_str());
    return 1;
  }
  std::atomic<bool> finished{false};
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (!finished.load()) (*agent)->Shutdown();
  });
  absl::Status st = (*agent)->Run();
  finished.store(true);
  // Wake the waiter (the signals are blocked in every thread, so this goes to sigwait).
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  if (st.ok()) return 0;
  std::fprintf(stderr, "switchyard-worker: %s\n", st.ToString().c_str());
  return st.code() == absl::StatusCode::kUnavailable ? 75 : 1;
}
}  // namespace switchyard::agent
