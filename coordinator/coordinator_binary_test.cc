// The real switchyard-coordinator binary, fork/exec'ed: reads the ports it prints, submits a job
// over REST, is stopped with SIGTERM (exit 0, an open WatchJob ends UNAVAILABLE), restarts on the
// same store and finds the job; SIGINT; the documented exit codes for bad flags and failed
// starts; TLS on both ports with a self-signed certificate (when openssl is installed); stores
// that are missing, empty, truncated or corrupt refused with exit 1 naming the file and the
// problem; --store-backup then a restart on the backup; corruption found while serving logged
// once, /healthz 503.
#include <fcntl.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "coordinator/api/api_test_util.h"
#include "coordinator/store/store.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "switchyard/v1/job.grpc.pb.h"

namespace switchyard {
namespace {

using api::testing::FreshPath;
using api::testing::kToken;
using api::testing::WriteFile;
using Json = nlohmann::json;

std::string g_binary;  // argv[1]

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// One child process of the binary; its stdout is a pipe, its stderr a file.
class Coordinator {
 public:
  explicit Coordinator(std::vector<std::string> args, const std::string& log_name) {
    log_ = FreshPath(log_name);
    int out[2];
    EXPECT_EQ(pipe(out), 0);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      int err = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(err, 2);
      close(out[0]);
      std::vector<char*> argv;
      args.insert(args.begin(), g_binary);
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    out_ = out[0];
  }
  ~Coordinator() {
    if (pid_ > 0 && !waited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) close(out_);
  }

  // The first stdout line, or "" after `seconds` or at EOF.
  std::string ReadLine(int seconds = 20) {
    std::string line;
    const absl::Time deadline = absl::Now() + absl::Seconds(seconds);
    while (absl::Now() < deadline) {
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char c;
      if (read(out_, &c, 1) != 1) break;
      if (c == '\n') return line;
      line.push_back(c);
    }
    return line;
  }

  // Parses "... grpc=HOST:P http=HOST:Q tls=..." into the ports.
  bool ReadPorts() {
    line_ = ReadLine();
    const std::string& line = line_;
    std::printf("coordinator stdout: %s\n", line.c_str());
    auto port_after = [&](const std::string& key) {
      size_t at = line.find(key);
      if (at == std::string::npos) return 0;
      at = line.find(':', at);
      int port = 0;
      absl::SimpleAtoi(line.substr(at + 1, line.find(' ', at) - at - 1), &port);
      return port;
    };
    grpc_port_ = port_after("grpc=");
    http_port_ = port_after("http=");
    health_port_ = port_after("health=");
    return grpc_port_ > 0 && http_port_ > 0;
  }

  void Signal(int sig) { kill(pid_, sig); }

  // The exit status (or 128 + signal), waiting at most `seconds`; -1 on timeout.
  int Wait(int seconds = 20) {
    const absl::Time deadline = absl::Now() + absl::Seconds(seconds);
    int status = 0;
    while (absl::Now() < deadline) {
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        waited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

  std::string Log() const { return ReadAll(log_); }
  int grpc_port() const { return grpc_port_; }
  int http_port() const { return http_port_; }
  int health_port() const { return health_port_; }
  // The startup line ReadPorts read.
  const std::string& line() const { return line_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  bool waited_ = false;
  std::string log_;
  int grpc_port_ = 0;
  int http_port_ = 0;
  int health_port_ = 0;
  std::string line_;
};

// The flags of a coordinator on loopback with free ports; `create_store` adds --create-store (a
// fresh store needs it; a restart on an existing one does not).
std::vector<std::string> Args(const std::string& store, const std::string& token_file,
                              bool create_store = true) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::vector<std::string> args = {
      "--store",
      store,
      "--grpc-port",
      "0",
      "--http-port",
      "0",
      "--token-file",
      token_file,
      "--host",
      "127.0.0.1",
      "--checkpoint-root",
      absl::StrCat(dir != nullptr ? dir : "/tmp", "/checkpoints"),
      "--worker-token-file",
      WriteFile("binary.worker-token", absl::StrCat(api::testing::kWorkerToken, "\n"))};
  if (create_store) args.push_back("--create-store");
  return args;
}

std::string CreateBody(const std::string& name) {
  return Json({{"spec", Json::parse(JobSpecToJson(api::testing::ValidSpec(name)))},
               {"request_id", name}})
      .dump();
}

httplib::Headers Auth() { return {{"Authorization", absl::StrCat("Bearer ", kToken)}}; }

// The startup line shows the addresses bound: with --host 0.0.0.0 both servers listen on every
// interface and the line says so (it used to print 127.0.0.1), and the gateway answers there.
// grpc.health.v1.Health/Check(`service`) over plaintext on 127.0.0.1:`port`, as the kubelet's
// native gRPC probe calls it (the message encoded by hand: the health proto's C++ stubs are not
// installed): the ServingStatus (1 SERVING, 2 NOT_SERVING), or -(gRPC status code) on error.
int HealthCheck(int port, const std::string& service) {
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  std::string request;
  if (!service.empty())
    request = std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", request_buffer, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  if (!cq.Next(&tag, &ok) || !ok) return -100;
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!status.ok()) return -static_cast<int>(status.error_code());
  std::vector<grpc::Slice> slices;
  response.Dump(&slices);
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes.size() >= 2 && bytes[0] == '\x08' ? bytes[1] : 0;
}

TEST(CoordinatorBinaryTest, StartupLineShowsTheBoundAddress) {
  std::vector<std::string> args =
      Args(FreshPath("bound.db"), WriteFile("bound.token", absl::StrCat(kToken, "\n")));
  auto host = std::find(args.begin(), args.end(), "--host");
  ASSERT_NE(host, args.end());
  *(host + 1) = "0.0.0.0";
  Coordinator c(args, "bound.log");
  ASSERT_TRUE(c.ReadPorts()) << c.Log();
  EXPECT_TRUE(absl::StrContains(c.line(), absl::StrCat(" grpc=0.0.0.0:", c.grpc_port(), " ")))
      << c.line();
  EXPECT_TRUE(absl::StrContains(c.line(), absl::StrCat(" http=0.0.0.0:", c.http_port(), " ")))
      << c.line();
  httplib::Client http("127.0.0.1", c.http_port());
  auto r = http.Get("/healthz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(CoordinatorBinaryTest, SubmitSigtermRestartFindsTheJob) {
  const std::string store = FreshPath("binary.db");
  const std::string token = WriteFile("binary.token", absl::StrCat(kToken, "\n"));
  std::string job_json;
  {
    std::vector<std::string> args = Args(store, token);
    args.insert(args.end(), {"--shutdown-grace", "2"});
    Coordinator c(args, "binary_run1.log");
    ASSERT_TRUE(c.ReadPorts()) << c.Log();
    httplib::Client http("127.0.0.1", c.http_port());
    auto r = http.Post("/v1/jobs", Auth(), CreateBody("survivor"), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    job_json = r->body;
    EXPECT_EQ(Json::parse(job_json)["name"], "jobs/1");

    // An open WatchJob over gRPC ends UNAVAILABLE when the process is told to stop.
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", c.grpc_port()),
                                       grpc::InsecureChannelCredentials());
    auto stub = v1::JobService::NewStub(channel);
    auto context = api::testing::Context();
    v1::WatchJobRequest watch;
    watch.set_name("jobs/1");
    auto stream = stub->WatchJob(context.get(), watch);
    v1::WatchJobResponse event;
    ASSERT_TRUE(stream->Read(&event));
    EXPECT_EQ(event.event().state(), v1::Job::PENDING);

    const absl::Time start = absl::Now();
    c.Signal(SIGTERM);
    while (stream->Read(&event)) {
    }
    grpc::Status ended = stream->Finish();
    const double watch_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    const int code = c.Wait();
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    std::printf("SIGTERM: watch ended after %.1f ms (%d %s); exit %d after %.1f ms\n", watch_ms,
                ended.error_code(), ended.error_message().c_str(), code, ms);
    EXPECT_EQ(code, 0) << c.Log();
    EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_LT(watch_ms, 1000.0);
    // Calls in flight get --shutdown-grace (2 s); gRPC core also waits for the clients to close
    // their connections after its GOAWAY, at most until that deadline, so the exit comes within
    // 2 s plus process teardown whatever the client does.
    EXPECT_LT(ms, 4000.0);
    EXPECT_TRUE(absl::StrContains(c.Log(), "shutting down")) << c.Log();
    std::printf("coordinator log:\n%s", c.Log().c_str());
  }
  {
    // The store exists now: no --create-store.
    Coordinator c(Args(store, token, /*create_store=*/false), "binary_run2.log");
    ASSERT_TRUE(c.ReadPorts()) << c.Log();
    httplib::Client http("127.0.0.1", c.http_port());
    auto r = http.Get("/v1/jobs/1", Auth());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    // GET adds the latest event (CREATED, or what the job waits for); the job is the same.
    // update_time moves whenever the scheduler records a wait reason (an event, in either run,
    // possibly before the SIGTERM): it must not go back before create_time; the rest is equal.
    Json got = Json::parse(r->body);
    EXPECT_TRUE(got["last_event"]["reason"].is_string()) << r->body;
    got.erase("last_event");
    Json want = Json::parse(job_json);
    ASSERT_TRUE(got["update_time"].is_string()) << r->body;
    EXPECT_GE(got["update_time"].get<std::string>(), want["create_time"].get<std::string>());
    got.erase("update_time");
    want.erase("update_time");
    EXPECT_EQ(got, want);
    std::printf("after restart GET /v1/jobs/1 -> %d, the same job\n", r->status);
    // Same request id: the same job, not a new one; a new one gets the next id.
    auto again = http.Post("/v1/jobs", Auth(), CreateBody("survivor"), "application/json");
    ASSERT_TRUE(again);
    EXPECT_EQ(Json::parse(again->body)["name"], "jobs/1");
    auto next = http.Post("/v1/jobs", Auth(), CreateBody("second"), "application/json");
    ASSERT_TRUE(next);
    EXPECT_EQ(Json::parse(next->body)["name"], "jobs/2");

    // A second coordinator cannot take the same gRPC or HTTP port: exit 1 (cannot start).
    for (int which : {3, 5}) {
      std::vector<std::string> args = Args(FreshPath("binary_other.db"), token);
      args[which] = std::to_string(which == 3 ? c.grpc_port() : c.http_port());
      Coordinator clash(args, "binary_clash.log");
      const int code = clash.Wait();
      EXPECT_EQ(code, 1) << clash.Log();
      std::printf("%s port clash: exit %d: %s", which == 3 ? "grpc" : "http", code,
                  clash.Log().c_str());
    }

    c.Signal(SIGINT);
    EXPECT_EQ(c.Wait(), 0) << c.Log();
  }
}

TEST(CoordinatorBinaryTest, ExitCodes) {
  const std::string token = WriteFile("codes.token", "tok\n");
  const std::string wtoken = WriteFile("codes.worker-token", "wtok\n");
  struct Case {
    const char* label;
    std::vector<std::string> args;
    int code;
  };
  const std::string garbage = WriteFile("not_a_store.db", "this is not an SQLite database file");
  const std::vector<Case> cases = {
      {"unknown flag", {"--store", "x.db", "--token-file", token, "--bogus"}, 2},
      {"missing --store", {"--token-file", token}, 2},
      {"missing --token-file", {"--store", FreshPath("codes.db")}, 2},
      {"positional argument",
       {"--store", FreshPath("codes.db"), "--token-file", token, "extra"},
       2},
      {"missing --worker-token-file",
       {"--store", FreshPath("codes.db"), "--token-file", token, "--grpc-port", "0"},
       2},
      {"unreadable token file",
       {"--store", FreshPath("codes.db"), "--token-file", FreshPath("missing.token"),
        "--worker-token-file", wtoken, "--grpc-port", "0", "--http-port", "0"},
       1},
      {"unreadable worker token file",
       {"--store", FreshPath("codes.db"), "--token-file", token, "--worker-token-file",
        FreshPath("missing.token"), "--grpc-port", "0", "--http-port", "0"},
       1},
      {"same token for users and workers",
       {"--store", FreshPath("codes.db"), "--token-file", token, "--worker-token-file", token,
        "--grpc-port", "0", "--http-port", "0"},
       1},
      {"not a store",
       {"--store", garbage, "--token-file", token, "--worker-token-file", wtoken, "--grpc-port",
        "0", "--http-port", "0"},
       1},
      {"missing store",
       {"--store", FreshPath("codes.db"), "--token-file", token, "--worker-token-file", wtoken,
        "--grpc-port", "0", "--http-port", "0"},
       1},
      {"port out of range",
       {"--store", FreshPath("codes.db"), "--token-file", token, "--worker-token-file", wtoken,
        "--grpc-port", "70000", "--create-store"},
       1},
      {"only --tls-cert",
       {"--store", FreshPath("codes.db"), "--token-file", token, "--worker-token-file", wtoken,
        "--tls-cert", token, "--create-store"},
       1},
      {"relative --checkpoint-root",
       {"--store", FreshPath("codes.db"), "--create-store", "--token-file", token,
        "--worker-token-file", wtoken, "--grpc-port", "0", "--http-port", "0", "--checkpoint-root",
        "ckpt"},
       1},
      {"relative --data-root",
       {"--store", FreshPath("codes.db"), "--create-store", "--token-file", token,
        "--worker-token-file", wtoken, "--grpc-port", "0", "--http-port", "0", "--data-root",
        "data"},
       1},
      {"per-client cap 0",
       {"--store", FreshPath("codes.db"), "--create-store", "--token-file", token,
        "--worker-token-file", wtoken, "--grpc-port", "0", "--http-port", "0",
        "--http-max-connections-per-client", "0"},
       1},
      {"health port out of range",
       {"--store", FreshPath("codes.db"), "--create-store", "--token-file", token,
        "--worker-token-file", wtoken, "--grpc-port", "0", "--http-port", "0", "--health-port",
        "-2"},
       1},
      {"--version", {"--version"}, 0},
      {"--help", {"--help"}, 0},
  };
  for (const Case& c : cases) {
    Coordinator p(c.args, "codes.log");
    const int code = p.Wait();
    EXPECT_EQ(code, c.code) << c.label << "\n" << p.Log();
    std::string log = p.Log();
    std::printf("  %-22s -> exit %d  %s", c.label, code, log.substr(0, log.find('\n') + 1).c_str());
    if (log.empty()) std::printf("\n");
  }
}

TEST(CoordinatorBinaryTest, TlsOnBothPorts) {
  if (std::system("command -v openssl > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "openssl is not installed: cannot make a test certificate";
  }
  const std::string cert = FreshPath("tls_cert.pem");
  const std::string key = FreshPath("tls_key.pem");
  const std::string cmd =
      absl::StrCat("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost ",
                   "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout ", key, " -out ",
                   cert, " > /dev/null 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<std::string> args = Args(FreshPath("tls.db"), WriteFile("tls.token", kToken));
  args.insert(args.end(), {"--tls-cert", cert, "--tls-key", key, "--health-port", "0"});
  Coordinator c(args, "tls.log");
  ASSERT_TRUE(c.ReadPorts()) << c.Log();

  // The plaintext health-only port (Kubernetes' native gRPC probes cannot speak TLS): Health
  // answers SERVING for the overall status and the API; no API method is served there.
  ASSERT_GT(c.health_port(), 0) << c.line();
  const int overall = HealthCheck(c.health_port(), "");
  const int jobs = HealthCheck(c.health_port(), "switchyard.v1.JobService");
  const int bogus = HealthCheck(c.health_port(), "switchyard.v1.NoSuchService");
  EXPECT_EQ(overall, 1);
  EXPECT_EQ(jobs, 1);
  EXPECT_EQ(bogus, -static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_LT(HealthCheck(c.grpc_port(), ""), 0) << "the TLS port answered plaintext";
  v1::ListJobsResponse on_health;
  grpc::Status api_on_health =
      v1::JobService::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", c.health_port()),
                                                  grpc::InsecureChannelCredentials()))
          ->ListJobs(api::testing::Context().get(), v1::ListJobsRequest(), &on_health);
  EXPECT_EQ(api_on_health.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  std::printf("plaintext health port %d: overall %d, JobService %d, unknown %d, ListJobs %d\n",
              c.health_port(), overall, jobs, bogus, api_on_health.error_code());

  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadAll(cert);
  auto secure = v1::JobService::NewStub(
      grpc::CreateChannel(absl::StrCat("localhost:", c.grpc_port()), grpc::SslCredentials(ssl)));
  v1::ListJobsResponse list;
  grpc::Status ok = secure->ListJobs(api::testing::Context().get(), v1::ListJobsRequest(), &list);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  grpc::Status no_token =
      secure->ListJobs(api::testing::Context(nullptr).get(), v1::ListJobsRequest(), &list);
  EXPECT_EQ(no_token.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  auto plain = v1::JobService::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", c.grpc_port()), grpc::InsecureChannelCredentials()));
  grpc::Status refused =
      plain->ListJobs(api::testing::Context(kToken, 3).get(), v1::ListJobsRequest(), &list);
  EXPECT_FALSE(refused.ok());
  std::printf("gRPC over TLS: %s; without token: %d; plaintext client: %d %s\n",
              ok.ok() ? "OK" : ok.error_message().c_str(), no_token.error_code(),
              refused.error_code(), refused.error_message().c_str());

  httplib::SSLClient https("localhost", c.http_port());
  https.set_ca_cert_path(cert.c_str());
  https.enable_server_certificate_verification(true);
  auto r = https.Post("/v1/jobs", Auth(), CreateBody("over-tls"), "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200) << r->body;
  httplib::Client http("127.0.0.1", c.http_port());
  http.set_read_timeout(3, 0);
  auto plain_http = http.Get("/v1/jobs", Auth());
  EXPECT_TRUE(!plain_http || plain_http->status != 200);
  std::printf("HTTPS POST /v1/jobs -> %d; plain HTTP -> %s\n", r->status,
              plain_http ? std::to_string(plain_http->status).c_str() : "connection failed");
  c.Signal(SIGTERM);
  EXPECT_EQ(c.Wait(), 0) << c.Log();
}

// --- the store: refusals at start, backups, corruption while serving ------------------------

constexpr int kPageSize = 4096;

// How many times `needle` occurs in `text`.
size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

int64_t FileSize(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

// A store of `n` jobs written through the store library and closed (checkpointed).
void FillStore(const std::string& path, int n) {
  auto store = store::Store::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  for (int i = 0; i < n; ++i) {
    store::JobRow job;
    job.spec = api::testing::ValidSpec(absl::StrCat("job-", i));
    job.state = v1::Job::PENDING;
    store::JobEventRow created;
    created.state = v1::Job::PENDING;
    created.reason = "CREATED";
    ASSERT_TRUE((*store)->InsertJob(job, created).ok());
  }
}

void CorruptPage(const std::string& path, int64_t page) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp((page - 1) * kPageSize);
  f.write(std::string(kPageSize, '\xa5').data(), kPageSize);
}

TEST(CoordinatorBinaryTest, RefusesMissingEmptyTruncatedAndCorruptStores) {
  const std::string token = WriteFile("refuse.token", absl::StrCat(kToken, "\n"));
  const std::string good = FreshPath("refuse_good.db");
  FillStore(good, 300);
  const std::string bytes = ReadAll(good);
  const int64_t pages = static_cast<int64_t>(bytes.size()) / kPageSize;
  ASSERT_GE(pages, 20);

  const std::string missing = FreshPath("refuse_missing.db");
  const std::string empty = WriteFile("refuse_empty.db", "");
  const std::string truncated = FreshPath("refuse_truncated.db");
  std::ofstream(truncated, std::ios::binary) << bytes.substr(0, (pages / 2) * kPageSize);
  const std::string corrupt = FreshPath("refuse_corrupt.db");
  std::ofstream(corrupt, std::ios::binary) << bytes;
  CorruptPage(corrupt, pages / 2);

  struct Case {
    const char* label;
    std::string store;
    bool create_store;
    const char* problem;
  };
  const Case cases[] = {
      {"missing", missing, false, "does not exist"},
      {"empty (0 bytes)", empty, false, "is empty (0 bytes)"},
      {"empty, --create-store", empty, true, "is empty (0 bytes)"},
      {"truncated to half", truncated, false, "is truncated"},
      {"garbage middle page", corrupt, true, "is corrupt: quick_check"},
  };
  for (const Case& k : cases) {
    const std::string before = ReadAll(k.store);
    Coordinator c(Args(k.store, token, k.create_store), "refuse.log");
    const int code = c.Wait();
    const std::string log = c.Log();
    EXPECT_EQ(code, 1) << k.label << "\n" << log;
    EXPECT_TRUE(absl::StrContains(log, k.store)) << k.label << ": file not named\n" << log;
    EXPECT_TRUE(absl::StrContains(log, k.problem)) << k.label << ": problem not named\n" << log;
    EXPECT_EQ(ReadAll(k.store), before) << k.label << ": the refused store was changed";
    const size_t at = log.find("cannot start");
    std::printf("%-22s -> exit %d: %s", k.label, code,
                log.substr(at == std::string::npos ? 0 : at).c_str());
  }
  EXPECT_EQ(FileSize(missing), -1) << "a refused start created the store";

  // The intact store starts without --create-store and has its 300 jobs.
  Coordinator c(Args(good, token, /*create_store=*/false), "refuse_good.log");
  ASSERT_TRUE(c.ReadPorts()) << c.Log();
  httplib::Client http("127.0.0.1", c.http_port());
  auto r = http.Get("/v1/jobs?page_size=1000", Auth());
  ASSERT_TRUE(r);
  EXPECT_EQ(Json::parse(r->body)["jobs"].size(), 300u);
  c.Signal(SIGTERM);
  EXPECT_EQ(c.Wait(), 0) << c.Log();
}

TEST(CoordinatorBinaryTest, BackupThenRestoreLosesNoJob) {
  const std::string token = WriteFile("backup.token", absl::StrCat(kToken, "\n"));
  const std::string store = FreshPath("backup_live.db");
  const std::string backup = FreshPath("backup_copy.db");
  std::vector<std::string> names;
  {
    std::vector<std::string> args = Args(store, token);
    args.insert(args.end(), {"--store-backup", backup, "--store-backup-interval", "100ms"});
    Coordinator c(args, "backup_run.log");
    ASSERT_TRUE(c.ReadPorts()) << c.Log();
    httplib::Client http("127.0.0.1", c.http_port());
    for (int i = 0; i < 20; ++i) {
      auto r = http.Post("/v1/jobs", Auth(), CreateBody(absl::StrCat("backed-up-", i)),
                         "application/json");
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << r->body;
      names.push_back(Json::parse(r->body)["name"]);
    }
    // Wait for one periodic backup after the last job, then stop (one more backup at shutdown).
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    const size_t backups_before = Count(c.Log(), "store backup:");
    while (absl::Now() < deadline && Count(c.Log(), "store backup:") < backups_before + 1) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    c.Signal(SIGTERM);
    EXPECT_EQ(c.Wait(), 0) << c.Log();
    const std::string log = c.Log();
    EXPECT_TRUE(absl::StrContains(log, absl::StrCat("store backup: ", store, " -> ", backup)))
        << log;
    std::printf("backup log lines: %zu\n", Count(log, "store backup:"));
  }
  struct stat st {};
  ASSERT_EQ(stat(backup.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(stat((store).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(FileSize(backup + ".tmp"), -1);
  // Restore: start on the backup (no --create-store), every job is there.
  Coordinator c(Args(backup, token, /*create_store=*/false), "backup_restore.log");
  ASSERT_TRUE(c.ReadPorts()) << c.Log();
  httplib::Client http("127.0.0.1", c.http_port());
  auto r = http.Get("/v1/jobs?page_size=1000", Auth());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  std::vector<std::string> restored;
  const Json list = Json::parse(r->body);
  for (const Json& job : list["jobs"]) restored.push_back(job["name"]);
  EXPECT_EQ(restored, names);
  std::printf("restored %zu of %zu jobs from %s\n", restored.size(), names.size(), backup.c_str());
  c.Signal(SIGTERM);
  EXPECT_EQ(c.Wait(), 0) << c.Log();
}

TEST(CoordinatorBinaryTest, CorruptionWhileServingIsLoggedOnceAndHealthGoesNotServing) {
  const std::string token = WriteFile("corrupt.token", absl::StrCat(kToken, "\n"));
  const std::string store = FreshPath("corrupt_serving.db");
  FillStore(store, 300);
  const int64_t pages = FileSize(store) / kPageSize;
  std::vector<std::string> args = Args(store, token, /*create_store=*/false);
  args.push_back("--noworkers");
  Coordinator c(args, "corrupt_serving.log");
  ASSERT_TRUE(c.ReadPorts()) << c.Log();
  httplib::Client http("127.0.0.1", c.http_port());
  auto health = http.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  CorruptPage(store, pages / 2);
  {
    // A commit from another connection makes the coordinator's connection drop its page cache.
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(store.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db,
                           "INSERT INTO workers (id, host, version, state, last_heartbeat_us) "
                           "VALUES ('w', 'h', 'v', 1, 0)",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  int failed = 0;
  for (int id = 1; id <= 300; ++id) {
    auto r = http.Post(absl::StrCat("/v1/jobs/", id, ":cancel"), Auth(), "", "application/json");
    ASSERT_TRUE(r);
    if (r->status == 200) continue;
    ++failed;
    EXPECT_EQ(r->status, 500) << r->body;
    EXPECT_TRUE(absl::StrContains(r->body, store)) << r->body;
    EXPECT_FALSE(absl::StrContains(r->body, "SELECT")) << r->body;
  }
  EXPECT_GE(failed, 1);
  health = http.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_TRUE(absl::StrContains(health->body, store)) << health->body;
  const std::string log = c.Log();
  const std::string marker = absl::StrCat("store ", store, " is corrupt: ");
  EXPECT_EQ(Count(log, marker), 1u) << "logged once?\n" << log;
  c.Signal(SIGTERM);
  EXPECT_EQ(c.Wait(), 0);
  std::printf("%d of 300 cancels failed; /healthz %d: %slog: %s\n", failed, health->status,
              health->body.c_str(),
              log.substr(std::min(log.find(marker), log.size()), 300).c_str());
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: coordinator_binary_test PATH_TO_switchyard-coordinator\n");
    return 2;
  }
  switchyard::g_binary = argv[1];
  signal(SIGPIPE, SIG_IGN);
  return RUN_ALL_TESTS();
}
