// A switchyard-worker stand-in for agent_process_test: AgentMain (signals, exit status) with a
// few options from the command line, the way worker/main.cc would call it.
//   agent_main_for_test --coordinator=H:P [--token-file=F] [--worker-id=ID] [--metrics-port=N]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "worker/agent/agent.h"

int main(int argc, char** argv) {
  switchyard::agent::AgentOptions o;
  o.device = "cpu";
  o.heartbeat_interval = absl::Milliseconds(100);
  o.comm_timeout = absl::Seconds(10);
  if (const char* tmp = std::getenv("TEST_TMPDIR")) o.roots = {tmp, tmp};  // as TestRoots()
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const std::string prefix = std::string(flag) + "=";
      return absl::StartsWith(a, prefix) ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("--coordinator")) {
      o.coordinator = v;
    } else if (const char* v = value("--token-file")) {
      o.token_file = v;
    } else if (const char* v = value("--worker-id")) {
      o.worker_id = v;
    } else if (const char* v = value("--metrics-port")) {
      o.metrics_port = std::atoi(v);
    } else {
      std::fprintf(stderr, "agent_main_for_test: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  return switchyard::agent::AgentMain(o);
}
