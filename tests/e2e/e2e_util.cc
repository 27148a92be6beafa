#include "tests/e2e/e2e_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace switchyard::e2e {

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

bool WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  return static_cast<bool>(out);
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Process::Process(const std::vector<std::string>& argv, const std::string& log_path,
                 bool pipe_stdout)
    : log_path_(log_path) {
  int out[2] = {-1, -1};
  if (pipe_stdout && pipe(out) != 0) return;
  pid_ = fork();
  if (pid_ == 0) {
    // The child dies with the test process, even when that one crashes or is killed.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(pipe_stdout ? out[1] : log, 1);
    dup2(log, 2);
    if (pipe_stdout) close(out[0]);
    std::vector<std::string> args = argv;
    std::vector<char*> ptrs;
    for (std::string& a : args) ptrs.push_back(a.data());
    ptrs.push_back(nullptr);
    execv(ptrs[0], ptrs.data());
    _exit(127);
  }
  if (pipe_stdout) {
    close(out[1]);
    out_ = out[0];
  }
}

Process::~Process() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_ >= 0) close(out_);
}

std::string Process::ReadLine(double seconds) {
  std::string line;
  if (out_ < 0) return line;
  const absl::Time deadline = absl::Now() + absl::Seconds(seconds);
  while (absl::Now() < deadline) {
    pollfd p{out_, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char c;
    if (read(out_, &c, 1) != 1) break;
    if (c == '\n') return line;
    line.push_back(c);
  }
  return line;
}

void Process::Signal(int sig) {
  if (pid_ > 0 && !reaped_) kill(pid_, sig);
}

int Process::Wait(double seconds) {
  if (pid_ <= 0) return -1;
  const absl::Time deadline = absl::Now() + absl::Seconds(seconds);
  do {
    int status = 0;
    if (!reaped_ && waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (reaped_) return exit_status_;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (absl::Now() < deadline);
  return -1;
}

bool Process::Running() { return pid_ > 0 && Wait(0) == -1; }

std::unique_ptr<CoordinatorProcess> CoordinatorProcess::Start(const CoordinatorFlags& f) {
  std::unique_ptr<CoordinatorProcess> c(new CoordinatorProcess());
  std::vector<std::string> argv = {f.binary,
                                   "--store",
                                   f.store,
                                   "--create-store",
                                   "--token-file",
                                   f.token_file,
                                   "--host",
                                   "127.0.0.1",
                                   "--grpc-port",
                                   std::to_string(f.grpc_port),
                                   "--http-port",
                                   std::to_string(f.http_port),
                                   "--checkpoint-root",
                                   f.checkpoint_root,
                                   "--shutdown-grace",
                                   "1",
                                   "--worker-token-file",
                                   f.worker_token_file};
  if (!f.data_root.empty()) {
    argv.push_back("--data-root");
    argv.push_back(f.data_root);
  }
  if (!f.queues.empty()) argv.push_back("--queues=" + f.queues);
  for (const std::string& flag : f.extra) argv.push_back(flag);
  c->process_ = std::make_unique<Process>(argv, f.log_path, /*pipe_stdout=*/true);
  const std::string line = c->process_->ReadLine(20);
  std::printf("coordinator pid %d: %s\n", c->pid(), line.c_str());
  // "switchyard-coordinator listening grpc=127.0.0.1:P http=127.0.0.1:Q tls=false"
  for (absl::string_view word : absl::StrSplit(line, ' ')) {
    std::vector<std::string> kv = absl::StrSplit(word, absl::MaxSplits('=', 1));
    if (kv.size() != 2) continue;
    const size_t colon = kv[1].rfind(':');
    int port = 0;
    if (colon == std::string::npos || !absl::SimpleAtoi(kv[1].substr(colon + 1), &port)) continue;
    if (kv[0] == "grpc") c->grpc_port_ = port;
    if (kv[0] == "http") c->http_port_ = port;
  }
  if (c->grpc_port_ <= 0 || c->http_port_ <= 0) {
    std::printf("coordinator did not start; log:\n%s\n", c->process_->Log().c_str());
    return nullptr;
  }
  return c;
}

std::unique_ptr<grpc::ClientContext> Context(bool with_token, double seconds) {
  auto context = std::make_unique<grpc::ClientContext>();
  if (with_token) context->AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  return context;
}

httplib::Headers AuthHeaders() { return {{"Authorization", absl::StrCat("Bearer ", kToken)}}; }

double MetricValue(const std::string& page, const std::string& metric) {
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    if (!absl::StartsWith(line, metric)) continue;
    const absl::string_view rest = line.substr(metric.size());
    if (!rest.empty() && rest[0] != ' ' && rest[0] != '{') continue;
    const size_t space = line.rfind(' ');
    double value = 0;
    if (space != absl::string_view::npos && absl::SimpleAtod(line.substr(space + 1), &value)) {
      return value;
    }
  }
  return -1;
}

}  // namespace switchyard::e2e
