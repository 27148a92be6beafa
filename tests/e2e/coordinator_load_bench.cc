// coordinator_load_bench: load on the real switchyard-coordinator process.
//
// Starts the binary (fresh SQLite store and token file under --dir), attaches --workers simulated
// workers (real gRPC Attach streams over --channels loopback connections, registration then a
// heartbeat every second: coordinator/api/worker_test_util.h's FakeWorker), and while they
// heartbeat (first --idle-seconds with no API calls) runs --clients threads that each loop
// CreateJob, GetJob (that job), ListJobs (page_size 50) for --seconds. Submitted jobs want exactly
// one worker, so the scheduler also assigns them to the simulated workers (which never train: the
// jobs stay STARTING). Prints a latency table (p50/p99/max per method), the coordinator's CPU usage
// from /proc/<pid>/stat over the load window (and over the attach phase), then one JSON line with
// the same numbers.
//
//   bazel run //tests/e2e:coordinator_load_bench -- [--workers 1000] [--seconds 20]
//
// Exit status 0 when every call succeeded and every worker stayed attached, 1 otherwise.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "coordinator/api/worker_test_util.h"
#include "nlohmann/json.hpp"
#include "switchyard/v1/job.grpc.pb.h"
#include "tests/e2e/e2e_util.h"

ABSL_FLAG(std::string, coordinator, "", "Path of the switchyard-coordinator binary. Required.");
ABSL_FLAG(int, workers, 1000, "Simulated workers to attach.");
ABSL_FLAG(int, channels, 10, "Loopback gRPC connections the workers' streams share.");
ABSL_FLAG(int, clients, 4, "API client threads (CreateJob, GetJob, ListJobs in a loop).");
ABSL_FLAG(double, seconds, 20, "Length of the load window.");
ABSL_FLAG(double, idle_seconds, 5,
          "Heartbeats only (no API calls) for this long before the load window.");
ABSL_FLAG(std::string, dir, "",
          "Directory for the store, token and log (default: a new /tmp dir).");

namespace switchyard::e2e {
namespace {

using api::testing::FakeWorker;
using api::testing::HeartbeatTicker;

constexpr char kSpec[] = R"(
display_name: bench
model: {num_layers: 2, hidden_size: 32, num_attention_heads: 4, num_query_groups: 2,
        ffn_hidden_size: 48, seq_length: 16, vocab_size: 64, num_experts: 8, moe_router_topk: 2,
        moe_ffn_hidden_size: 24, moe_layer_pattern: [1, 1]}
training: {micro_batch_size: 1, global_batch_size: 8, train_iters: 40}
data: {mock_data: true}
min_workers: 1
max_workers: 1
)";

struct CpuSample {
  double cpu_seconds = 0;  // utime + stime
  long threads = 0;
  double rss_mib = 0;
  absl::Time at;
};

// Fields 14 (utime), 15 (stime), 20 (num_threads), 24 (rss, pages) of /proc/<pid>/stat.
CpuSample SampleCpu(pid_t pid) {
  CpuSample s;
  s.at = absl::Now();
  const std::string stat = ReadText(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return s;
  std::vector<std::string> f = absl::StrSplit(stat.substr(paren + 2), ' ');
  // f[0] is field 3 (state).
  auto field = [&](int n) { return f.size() > size_t(n - 3) ? std::atof(f[n - 3].c_str()) : 0.0; };
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  s.cpu_seconds = (field(14) + field(15)) / tick;
  s.threads = static_cast<long>(field(20));
  s.rss_mib = field(24) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20);
  return s;
}

double CpuPercent(const CpuSample& a, const CpuSample& b) {
  const double wall = absl::ToDoubleSeconds(b.at - a.at);
  return wall > 0 ? 100.0 * (b.cpu_seconds - a.cpu_seconds) / wall : 0;
}

struct Latencies {
  std::vector<double> ms;
  int errors = 0;
  std::string first_error;
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

int Run() {
  const std::string binary = absl::GetFlag(FLAGS_coordinator);
  if (binary.empty()) {
    std::fprintf(stderr, "coordinator_load_bench: --coordinator is required\n");
    return 2;
  }
  const int n_workers = absl::GetFlag(FLAGS_workers);
  const int n_channels = std::max(1, absl::GetFlag(FLAGS_channels));
  const int n_clients = std::max(1, absl::GetFlag(FLAGS_clients));
  const double seconds = absl::GetFlag(FLAGS_seconds);
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) {
    char tmpl[] = "/tmp/coordinator_load_bench.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return 1;
    dir = tmpl;
  }
  mkdir(dir.c_str(), 0755);  // --dir may not exist yet
  CoordinatorFlags flags;
  flags.binary = binary;
  flags.store = dir + "/bench.db";
  flags.token_file = dir + "/bench.token";
  flags.worker_token_file = dir + "/bench.worker-token";
  flags.checkpoint_root = dir + "/checkpoints";
  flags.log_path = dir + "/coordinator.log";
  std::remove(flags.store.c_str());
  WriteText(flags.token_file, kToken);
  WriteText(flags.worker_token_file, kWorkerToken);
  auto coordinator = CoordinatorProcess::Start(flags);
  if (coordinator == nullptr) return 1;
  const pid_t pid = coordinator->pid();
  httplib::Client http("127.0.0.1", coordinator->http_port());
  auto attached = [&] {
    auto r = http.Get("/metrics");
    return r && r->status == 200 ? MetricValue(r->body, "switchyard_coordinator_workers_attached")
                                 : -1.0;
  };

  // Attach phase.
  const CpuSample idle = SampleCpu(pid);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int c = 0; c < n_channels; ++c) {
    channels.push_back(api::testing::MakeChannel(coordinator->grpc_port(), c));
  }
  std::vector<std::unique_ptr<FakeWorker>> fakes;
  std::vector<FakeWorker*> raw;
  for (int i = 0; i < n_workers; ++i) {
    fakes.push_back(std::make_unique<FakeWorker>(
        channels[i % n_channels], absl::StrCat("bench-", i), absl::StrCat("node-", i / 8)));
    fakes.back()->Attach(kWorkerToken);
    raw.push_back(fakes.back().get());
  }
  HeartbeatTicker ticker(raw, absl::Seconds(1));
  double count = -1;
  while (absl::Now() - idle.at < absl::Seconds(120)) {
    count = attached();
    if (count >= n_workers) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  const CpuSample attached_at = SampleCpu(pid);
  const double attach_s = absl::ToDoubleSeconds(attached_at.at - idle.at);
  std::printf("%g/%d workers attached in %.2f s\n", count, n_workers, attach_s);
  if (count < n_workers) return 1;

  // Heartbeats only.
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_idle_seconds)));
  const CpuSample idle_end = SampleCpu(pid);
  const double cpu_heartbeats = CpuPercent(attached_at, idle_end);

  // Load window: the workers heartbeat; clients create, get and list jobs.
  auto spec = ParseJobSpecYaml(kSpec);
  if (!spec.ok()) {
    std::fprintf(stderr, "bench spec: %s\n", spec.status().ToString().c_str());
    return 1;
  }
  const std::vector<std::string> kMethods = {"CreateJob", "GetJob", "ListJobs"};
  absl::Mutex mu;
  std::map<std::string, Latencies> lat;
  std::atomic<int64_t> created{0};
  const CpuSample load_start = SampleCpu(pid);
  const absl::Time end = load_start.at + absl::Seconds(seconds);
  std::vector<std::thread> clients;
  for (int t = 0; t < n_clients; ++t) {
    clients.emplace_back([&, t] {
      auto stub = v1::JobService::NewStub(grpc::CreateCustomChannel(
          coordinator->grpc_address(), grpc::InsecureChannelCredentials(), [t] {
            grpc::ChannelArguments args;
            args.SetInt("switchyard.bench_client", t);
            return args;
          }()));
      std::map<std::string, Latencies> mine;
      auto timed = [&](const std::string& method, auto&& call) {
        const absl::Time start = absl::Now();
        grpc::Status s = call();
        Latencies& l = mine[method];
        l.ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
        if (!s.ok()) {
          if (l.errors++ == 0) l.first_error = s.error_message();
        }
        return s.ok();
      };
      for (int64_t i = 0; absl::Now() < end; ++i) {
        v1::CreateJobRequest create;
        *create.mutable_spec() = *spec;
        create.set_request_id(absl::StrCat("bench-", t, "-", i));
        v1::Job job;
        if (!timed("CreateJob", [&] { return stub->CreateJob(Context().get(), create, &job); })) {
          continue;
        }
        ++created;
        v1::GetJobRequest get;
        get.set_name(job.name());
        v1::Job got;
        timed("GetJob", [&] { return stub->GetJob(Context().get(), get, &got); });
        v1::ListJobsRequest list;
        list.set_page_size(50);
        v1::ListJobsResponse page;
        timed("ListJobs", [&] { return stub->ListJobs(Context().get(), list, &page); });
      }
      absl::MutexLock lock(&mu);
      for (auto& [method, l] : mine) {
        Latencies& all = lat[method];
        all.ms.insert(all.ms.end(), l.ms.begin(), l.ms.end());
        if (all.errors == 0 && l.errors > 0) all.first_error = l.first_error;
        all.errors += l.errors;
      }
    });
  }
  for (std::thread& c : clients) c.join();
  const CpuSample load_end = SampleCpu(pid);
  const double still_attached = attached();
  auto metrics = http.Get("/metrics");
  const double starting =
      metrics ? MetricValue(metrics->body, "switchyard_coordinator_jobs{state=\"STARTING\"}") : -1;
  const double pending =
      metrics ? MetricValue(metrics->body, "switchyard_coordinator_jobs{state=\"PENDING\"}") : -1;
  const double window = absl::ToDoubleSeconds(load_end.at - load_start.at);

  std::printf(
      "\ncoordinator_load_bench: %d workers (%d connections, heartbeat 1 s), %d API "
      "clients, %.1f s window, %lld jobs created\n",
      n_workers, n_channels, n_clients, window, static_cast<long long>(created.load()));
  std::printf("%-10s %8s %8s %10s %10s %10s %8s\n", "method", "calls", "calls/s", "p50 ms",
              "p99 ms", "max ms", "errors");
  nlohmann::json json;
  bool ok = true;
  for (const std::string& m : kMethods) {
    const Latencies& l = lat[m];
    const double p50 = Percentile(l.ms, 0.5), p99 = Percentile(l.ms, 0.99),
                 mx = l.ms.empty() ? 0 : *std::max_element(l.ms.begin(), l.ms.end());
    std::printf("%-10s %8zu %8.1f %10.3f %10.3f %10.3f %8d\n", m.c_str(), l.ms.size(),
                l.ms.size() / window, p50, p99, mx, l.errors);
    if (l.errors > 0) std::printf("  first %s error: %s\n", m.c_str(), l.first_error.c_str());
    json[m] = {{"calls", l.ms.size()},
               {"p50_ms", p50},
               {"p99_ms", p99},
               {"max_ms", mx},
               {"errors", l.errors}};
    ok = ok && l.errors == 0 && !l.ms.empty();
  }
  const double cpu_attach = CpuPercent(idle, attached_at),
               cpu_load = CpuPercent(load_start, load_end);
  std::printf(
      "coordinator pid %d CPU (/proc/pid/stat utime+stime): attach phase %.1f%% of a core "
      "over %.2f s, load window %.1f%% of a core (%.2f CPU-s over %.1f s); %ld threads, "
      "RSS %.1f MiB; heartbeats only (%.1f s before the window) %.1f%%\n",
      pid, cpu_attach, attach_s, cpu_load, load_end.cpu_seconds - load_start.cpu_seconds, window,
      load_end.threads, load_end.rss_mib, absl::ToDoubleSeconds(idle_end.at - attached_at.at),
      cpu_heartbeats);
  std::printf("workers attached after the window: %g of %d; jobs STARTING %g, PENDING %g\n",
              still_attached, n_workers, starting, pending);
  ok = ok && still_attached == n_workers;
  json["workers"] = n_workers;
  json["clients"] = n_clients;
  json["window_s"] = window;
  json["jobs_created"] = created.load();
  json["cpu_percent_load"] = cpu_load;
  json["cpu_percent_attach"] = cpu_attach;
  json["cpu_percent_heartbeats_only"] = cpu_heartbeats;
  json["attach_s"] = attach_s;
  json["threads"] = load_end.threads;
  json["rss_mib"] = load_end.rss_mib;
  json["workers_attached_after"] = still_attached;
  std::printf("%s\n", json.dump().c_str());

  coordinator->process().Signal(SIGTERM);
  coordinator->process().Wait(10);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace switchyard::e2e

int main(int argc, char** argv) {
  // Accept --idle-seconds as --idle_seconds (the name part only), like the binaries.
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> ptrs;
  for (std::string& a : args) {
    if (a.size() > 2 && a[0] == '-' && a[1] == '-') {
      for (size_t i = 2; i < a.size() && a[i] != '='; ++i) {
        if (a[i] == '-') a[i] = '_';
      }
    }
    ptrs.push_back(a.data());
  }
  absl::ParseCommandLine(static_cast<int>(ptrs.size()), ptrs.data());
  return switchyard::e2e::Run();
}
