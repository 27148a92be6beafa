// File: tests/e2e/e2e_util.h
//
// Helpers for the end-to-end tests and the load benchmark: child processes of the real binaries
// (fork/exec, stdout piped or logged, SIGKILLed when the owner goes away), a coordinator process
// that reports its ports, paths in TEST_TMPDIR, and the token on gRPC and REST calls.
#ifndef SWITCHYARD_TESTS_E2E_E2E_UTIL_H_
#define SWITCHYARD_TESTS_E2E_E2E_UTIL_H_

#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "common/port_test_util.h"

namespace switchyard::e2e {

inline constexpr char kToken[] = "e2e-secret-token";        // the API (user) token
inline constexpr char kWorkerToken[] = "e2e-worker-token";  // the workers' token

// TEST_TMPDIR/`name` (or /tmp/`name`); nothing is created.
std::string TmpPath(const std::string& name);
// Writes `text` to `path`; false on failure.
bool WriteText(const std::string& path, const std::string& text);
std::string ReadText(const std::string& path);

// FreePort (common/port_test_util.h): a free TCP port below the ephemeral range.
using ::switchyard::testing::FreePort;

// One child process. stderr (and stdout unless piped) go to `log_path`. The destructor SIGKILLs
// and reaps a child still running; a child also gets SIGKILL when the thread that forked it
// exits (PR_SET_PDEATHSIG), so a crashed test leaves no processes behind. Not thread-safe; one
// owner.
class Process {
 public:
  // Starts argv[0] with `argv`; `pipe_stdout` keeps stdout readable through ReadLine.
  Process(const std::vector<std::string>& argv, const std::string& log_path, bool pipe_stdout);
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  std::string Log() const { return ReadText(log_path_); }
  // One line of the piped stdout, "" after `seconds` or at EOF.
  std::string ReadLine(double seconds);
  void Signal(int sig);
  // Exit status (128 + signal when killed), -1 when still running after `seconds`.
  int Wait(double seconds);
  bool Running();

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  bool reaped_ = false;
  int exit_status_ = -1;
  std::string log_path_;
};

struct CoordinatorFlags {
  std::string binary;
  std::string store;
  std::string token_file;
  std::string worker_token_file;  // --worker-token-file
  std::string checkpoint_root;
  std::string data_root;           // empty: the coordinator's default
  std::string queues;              // --queues (empty: none)
  std::vector<std::string> extra;  // more flags, e.g. "--scale-up-delay=2s"
  int grpc_port = 0;               // 0: any
  int http_port = 0;
  std::string log_path;
};

// The real switchyard-coordinator, started and waited for until it prints its listening line.
class CoordinatorProcess {
 public:
  // nullptr (the log printed) when it does not print its ports within 20 s.
  static std::unique_ptr<CoordinatorProcess> Start(const CoordinatorFlags& flags);

  int grpc_port() const { return grpc_port_; }
  int http_port() const { return http_port_; }
  std::string grpc_address() const { return "127.0.0.1:" + std::to_string(grpc_port_); }
  Process& process() { return *process_; }
  pid_t pid() const { return process_->pid(); }

 private:
  std::unique_ptr<Process> process_;
  int grpc_port_ = 0;
  int http_port_ = 0;
};

// A context with "authorization: Bearer kToken" (none when `with_token` is false) and a deadline.
std::unique_ptr<grpc::ClientContext> Context(bool with_token = true, double seconds = 30);
httplib::Headers AuthHeaders();
// The value of an unlabelled (or the first matching) sample `metric` in a Prometheus text page;
// -1 when absent.
double MetricValue(const std::string& page, const std::string& metric);

}  // namespace switchyard::e2e

#endif  // SWITCHYARD_TESTS_E2E_E2E_UTIL_H_
