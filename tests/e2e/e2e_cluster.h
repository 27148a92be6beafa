// File: tests/e2e/e2e_cluster.h
//
// Shared pieces of the end-to-end tests (header-only, testonly): the tiny CPU MoE spec, a
// JobWatcher that follows a job through gRPC WatchJob (events with arrival times, rank 0's steps
// tagged with the generation they belong to, re-watching across a coordinator restart), a
// Cluster: one switchyard-coordinator process and CPU switchyard-worker agents with their logs,
// REST submission, /metrics scrapes, and the comparison of a job's losses with one standalone
// process's. The binaries' paths come from main (e2e_main.cc).
#ifndef SWITCHYARD_TESTS_E2E_E2E_CLUSTER_H_
#define SWITCHYARD_TESTS_E2E_E2E_CLUSTER_H_

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/config/config.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "switchyard/v1/job.grpc.pb.h"
#include "tests/e2e/e2e_util.h"

namespace switchyard::e2e {

using Json = nlohmann::json;
using v1::Job;

// Paths of the binaries under test (set by main from argv).
inline std::string g_coordinator;
inline std::string g_worker;
inline std::string g_syctl;  // argv[3] when given (tests that run syctl)

// The tiny CPU MoE of worker/train/distributed_trainer_test.cc (seq 32), elastic over 1..2
// workers. training.save is set per job by Cluster::Submit: the coordinator would default it to
// <checkpoint root>/<job id>, but validation rejects save_interval without save at submission.
inline constexpr char kSpec[] = R"(
display_name: e2e
model:
  num_layers: 3
  hidden_size: 32
  num_attention_heads: 4
  num_query_groups: 2
  ffn_hidden_size: 48
  seq_length: 32
  vocab_size: 64
  qk_layernorm: true
  num_experts: 8
  moe_router_topk: 2
  moe_ffn_hidden_size: 24
  moe_shared_expert_intermediate_size: 16
  moe_router_score_function: sigmoid
  moe_router_enable_expert_bias: true
  moe_router_bias_update_rate: 0.01
  moe_router_load_balancing_type: aux_loss
  moe_aux_loss_coeff: 0.01
  moe_z_loss_coeff: 0.001
  moe_layer_pattern: [1, 0, 1]
  init_method_std: 0.2
training:
  micro_batch_size: 1
  global_batch_size: 8
  train_iters: 40
  lr: 0.003
  lr_warmup_iters: 2
  seed: 11
  save_interval: 5
data:
  mock_data: true
min_workers: 1
max_workers: 2
max_restarts: 3
)";
inline constexpr int64_t kTrainIters = 40;
inline constexpr int64_t kSaveInterval = 5;

inline bool Terminal(Job::State s) {
  return s == Job::SUCCEEDED || s == Job::FAILED || s == Job::CANCELLED;
}

inline double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }

struct SeenEvent {
  v1::JobEvent event;
  double at = 0;  // seconds since the watcher started
};

struct SeenStep {
  v1::StepMetrics metrics;
  double at = 0;
  int64_t generation = 0;  // the highest generation among the events received before it
};

// Follows one job through WatchJob: events (deduplicated by sequence, so a re-watch after a
// coordinator restart only adds new ones) and rank 0's steps. Re-watches when the stream breaks
// before the terminal event.
class JobWatcher {
 public:
  JobWatcher(const std::string& address, const std::string& job) : job_(job), start_(absl::Now()) {
    channel_ = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    stub_ = v1::JobService::NewStub(channel_);
    thread_ = std::thread([this] { Loop(); });
  }
  ~JobWatcher() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      if (context_ != nullptr) context_->TryCancel();
    }
    thread_.join();
  }

  // Waits until the job reached `state` (an event with it); false after `seconds`.
  bool WaitForState(Job::State state, double seconds, int64_t min_generation = 0) {
    auto seen = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      for (const auto& [seq, e] : events_) {
        if (e.event.state() == state && e.event.generation() >= min_generation) return true;
      }
      return false;
    };
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&seen), absl::Seconds(seconds));
  }
  // Waits for a terminal event; returns its state (STATE_UNSPECIFIED on timeout).
  Job::State WaitForEnd(double seconds) {
    auto ended = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return terminal_; };
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&ended), absl::Seconds(seconds));
    for (const auto& [seq, e] : events_) {
      if (Terminal(e.event.state())) return e.event.state();
    }
    return Job::STATE_UNSPECIFIED;
  }
  // Waits for a step report with number >= `step`.
  bool WaitForStep(int64_t step, double seconds) {
    auto seen = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      for (const SeenStep& s : steps_) {
        if (s.metrics.step() >= step) return true;
      }
      return false;
    };
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&seen), absl::Seconds(seconds));
  }

  std::vector<SeenEvent> Events() const {
    absl::MutexLock lock(&mu_);
    std::vector<SeenEvent> out;
    for (const auto& [seq, e] : events_) out.push_back(e);
    return out;
  }
  std::vector<SeenStep> Steps() const {
    absl::MutexLock lock(&mu_);
    return steps_;
  }
  int watches() const {
    absl::MutexLock lock(&mu_);
    return watches_;
  }

  void Print() const {
    std::printf("events of %s:\n", job_.c_str());
    for (const SeenEvent& e : Events()) {
      std::printf("  #%lld %+7.2fs %-10s gen %lld %-22s %s\n",
                  static_cast<long long>(e.event.sequence()), e.at,
                  Job::State_Name(e.event.state()).c_str(),
                  static_cast<long long>(e.event.generation()), e.event.reason().c_str(),
                  e.event.message().c_str());
    }
    std::string line;
    for (const SeenStep& s : Steps()) {
      absl::StrAppend(&line, " ", s.metrics.step(), "(g", s.generation, ")");
    }
    std::printf("steps (rank 0, generation of the last event before it):%s\n", line.c_str());
  }

 private:
  void Loop() {
    while (true) {
      auto context = Context(true, 600);
      {
        absl::MutexLock lock(&mu_);
        if (stop_ || terminal_) return;
        context_ = context.get();
        ++watches_;
      }
      v1::WatchJobRequest request;
      request.set_name(job_);
      auto stream = stub_->WatchJob(context.get(), request);
      v1::WatchJobResponse response;
      while (stream->Read(&response)) {
        absl::MutexLock lock(&mu_);
        const double at = Seconds(start_);
        if (response.has_event()) {
          const v1::JobEvent& e = response.event();
          generation_ = std::max(generation_, e.generation());
          if (events_.count(e.sequence()) == 0) events_[e.sequence()] = SeenEvent{e, at};
          if (Terminal(e.state())) terminal_ = true;
        } else if (response.has_step()) {
          steps_.push_back(SeenStep{response.step(), at, generation_});
        }
      }
      stream->Finish();
      {
        absl::MutexLock lock(&mu_);
        context_ = nullptr;
        if (stop_ || terminal_) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }

  const std::string job_;
  const absl::Time start_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> stub_;
  mutable absl::Mutex mu_;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool terminal_ ABSL_GUARDED_BY(mu_) = false;
  int watches_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, SeenEvent> events_ ABSL_GUARDED_BY(mu_);
  std::vector<SeenStep> steps_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// A coordinator process and CPU worker agents for one test, all files under TEST_TMPDIR/<name>_*.
class Cluster {
 public:
  explicit Cluster(const std::string& name) : name_(name) {
    flags_.binary = g_coordinator;
    flags_.store = TmpPath(name + ".db");
    std::remove(flags_.store.c_str());
    flags_.token_file = TmpPath(name + ".token");
    WriteText(flags_.token_file, absl::StrCat(kToken, "\n"));
    flags_.worker_token_file = TmpPath(name + ".worker-token");
    WriteText(flags_.worker_token_file, absl::StrCat(kWorkerToken, "\n"));
    flags_.checkpoint_root = TmpPath(name + "_checkpoints");
    flags_.data_root = TmpPath(name + "_data");  // read-only for jobs; empty here
    std::filesystem::create_directories(flags_.data_root);
  }

  // The coordinator's --queues (before StartCoordinator).
  void SetQueues(const std::string& queues) { flags_.queues = queues; }
  // One more coordinator flag (before StartCoordinator).
  void AddCoordinatorFlag(const std::string& flag) { flags_.extra.push_back(flag); }

  bool StartCoordinator() {
    flags_.log_path = TmpPath(absl::StrCat(name_, "_coordinator", ++coordinator_runs_, ".log"));
    coordinator_ = CoordinatorProcess::Start(flags_);
    if (coordinator_ == nullptr) return false;
    // A restart reuses the ports: the workers reconnect to the address they were given.
    flags_.grpc_port = coordinator_->grpc_port();
    flags_.http_port = coordinator_->http_port();
    http_ = std::make_unique<httplib::Client>("127.0.0.1", coordinator_->http_port());
    http_->set_read_timeout(30, 0);
    return true;
  }

  // A CPU worker agent serving its own /metrics on a fixed port; `comm_timeout_s` bounds its
  // rendezvous and every collective (the binary's default is 60).
  void StartWorker(int comm_timeout_s = 10) {
    const int i = static_cast<int>(workers_.size());
    metrics_ports_.push_back(FreePort());
    workers_.push_back(std::make_unique<Process>(
        std::vector<std::string>{g_worker, "--coordinator", coordinator_->grpc_address(),
                                 "--token-file", flags_.worker_token_file, "--device", "cpu",
                                 "--comm-timeout", std::to_string(comm_timeout_s), "--metrics-port",
                                 std::to_string(metrics_ports_.back()), "--checkpoint-root",
                                 flags_.checkpoint_root, "--data-root", flags_.data_root},
        TmpPath(absl::StrCat(name_, "_worker", i, ".log")), false));
    std::printf("worker %d pid %d metrics port %d\n", i, workers_.back()->pid(),
                metrics_ports_.back());
  }

  // switchyard_worker_generation from worker i's /metrics (0 idle); -1 when unreadable.
  double WorkerGeneration(int i) {
    httplib::Client client("127.0.0.1", metrics_ports_[i]);
    client.set_connection_timeout(1, 0);
    auto r = client.Get("/metrics");
    if (!r || r->status != 200) return -1;
    return MetricValue(r->body, "switchyard_worker_generation");
  }

  // Polls /metrics until switchyard_coordinator_workers_attached == n.
  bool WaitForAttached(int n, double seconds) {
    const absl::Time deadline = absl::Now() + absl::Seconds(seconds);
    double last = -1;
    while (absl::Now() < deadline) {
      last = Attached();
      if (last == n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::printf("workers attached: %g, wanted %d\n", last, n);
    return false;
  }
  double Attached() {
    auto r = http_->Get("/metrics");
    if (!r || r->status != 200) return -1;
    return MetricValue(r->body, "switchyard_coordinator_workers_attached");
  }

  // POST /v1/jobs; the job's name, "" on failure (printed).
  std::string Submit(const std::string& request_id, int min_workers = 1,
                     const std::function<void(v1::JobSpec&)>& adjust = {}) {
    auto spec = ParseJobSpecYaml(kSpec);
    EXPECT_TRUE(spec.ok()) << spec.status();
    if (!spec.ok()) return "";
    spec->set_min_workers(min_workers);
    if (adjust) adjust(*spec);
    // Relative to the job's directory: <checkpoint root>/jobs/<id>/<request id>.
    spec->mutable_training()->set_save(request_id);
    const std::string body =
        Json({{"spec", Json::parse(JobSpecToJson(*spec))}, {"request_id", request_id}}).dump();
    auto r = http_->Post("/v1/jobs", AuthHeaders(), body, "application/json");
    if (!r || r->status != 200) {
      std::printf("POST /v1/jobs failed: %d %s\n", r ? r->status : -1, r ? r->body.c_str() : "");
      return "";
    }
    return Json::parse(r->body)["name"].get<std::string>();
  }

  // GetJob over gRPC.
  Job Get(const std::string& job) {
    auto stub = v1::JobService::NewStub(
        grpc::CreateChannel(coordinator_->grpc_address(), grpc::InsecureChannelCredentials()));
    v1::GetJobRequest request;
    request.set_name(job);
    Job out;
    grpc::Status s = stub->GetJob(Context().get(), request, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out;
  }

  // The whole event log as WatchJob replays it for a terminal job.
  std::vector<v1::JobEvent> Replay(const std::string& job) {
    auto stub = v1::JobService::NewStub(
        grpc::CreateChannel(coordinator_->grpc_address(), grpc::InsecureChannelCredentials()));
    v1::WatchJobRequest request;
    request.set_name(job);
    auto context = Context(true, 10);
    auto stream = stub->WatchJob(context.get(), request);
    std::vector<v1::JobEvent> out;
    v1::WatchJobResponse r;
    while (stream->Read(&r)) {
      if (r.has_event()) out.push_back(r.event());
    }
    stream->Finish();
    return out;
  }

  void PrintLogs() {
    std::printf("---- coordinator log (%s) ----\n%s\n", flags_.log_path.c_str(),
                coordinator_ != nullptr ? coordinator_->process().Log().c_str() : "");
    for (size_t i = 0; i < workers_.size(); ++i) {
      std::printf("---- worker %zu log ----\n%s\n", i, workers_[i]->Log().c_str());
    }
  }

  CoordinatorProcess* coordinator() { return coordinator_.get(); }
  void KillCoordinator() {
    coordinator_->process().Signal(SIGKILL);
    coordinator_->process().Wait(10);
  }
  Process& worker(int i) { return *workers_[i]; }
  httplib::Client& http() { return *http_; }
  const std::string& checkpoint_root() const { return flags_.checkpoint_root; }

 private:
  const std::string name_;
  CoordinatorFlags flags_;
  int coordinator_runs_ = 0;
  std::unique_ptr<CoordinatorProcess> coordinator_;
  std::unique_ptr<httplib::Client> http_;
  std::vector<std::unique_ptr<Process>> workers_;
  std::vector<int> metrics_ports_;
};

// World size of a STARTING event: its message starts with "<W> worker(s): ...".
inline int WorldOf(const v1::JobEvent& e) {
  int world = 0;
  const std::string& m = e.message();
  absl::SimpleAtoi(m.substr(0, m.find(' ')), &world);
  return world;
}

inline const v1::JobEvent* FindEvent(const std::vector<SeenEvent>& events, Job::State state,
                                     int64_t generation) {
  for (const SeenEvent& e : events) {
    if (e.event.state() == state && e.event.generation() == generation) return &e.event;
  }
  return nullptr;
}

inline double MeanLoss(const std::vector<SeenStep>& steps, size_t from, size_t to) {
  double sum = 0;
  for (size_t i = from; i < to; ++i) sum += steps[i].metrics.loss();
  return sum / static_cast<double>(to - from);
}

// Starts the coordinator and two workers, waits until both are attached.
inline void StartTwoWorkers(Cluster& c, int comm_timeout_s = 10) {
  ASSERT_TRUE(c.StartCoordinator());
  c.StartWorker(comm_timeout_s);
  c.StartWorker(comm_timeout_s);
  ASSERT_TRUE(c.WaitForAttached(2, 30)) << (c.PrintLogs(), "");
}

// Trains `spec` in one `switchyard-worker --standalone` process (CPU; its checkpoints, YAML and
// log under TEST_TMPDIR/<name>_standalone*) and compares its losses with `steps`, a job's rank 0
// reports: every reported step must be in the standalone log, within 1e-4 (the log prints 4
// decimals, so it rounds to 5e-5). Prints the evidence, `what` naming the job's layout. Fatal
// failures inside: call it under ASSERT_NO_FATAL_FAILURE when code follows.
inline void ExpectSameLossesAsStandalone(v1::JobSpec spec, const std::string& name,
                                         const std::vector<SeenStep>& steps,
                                         const std::string& what) {
  ASSERT_FALSE(steps.empty());
  spec.mutable_training()->set_save(TmpPath(name + "_standalone_checkpoints"));
  const std::string spec_path = TmpPath(name + "_standalone.yaml");
  ASSERT_TRUE(WriteText(spec_path, JobSpecToYaml(spec)));
  Process standalone({g_worker, "--standalone", "--config", spec_path, "--device", "cpu"},
                     TmpPath(name + "_standalone.log"), /*pipe_stdout=*/true);
  std::map<int64_t, double> single;
  for (std::string line = standalone.ReadLine(60); !line.empty(); line = standalone.ReadLine(60)) {
    long long step = 0, total = 0;
    double loss = 0;
    if (std::sscanf(line.c_str(), "step %lld/%lld | loss %lf", &step, &total, &loss) == 3) {
      single[step] = loss;
    }
  }
  EXPECT_EQ(standalone.Wait(30), 0) << standalone.Log();
  double max_diff = 0;
  int compared = 0;
  for (const SeenStep& s : steps) {
    auto it = single.find(s.metrics.step());
    if (it == single.end()) continue;
    max_diff = std::max(max_diff, std::abs(it->second - s.metrics.loss()));
    ++compared;
  }
  const int64_t last = steps.back().metrics.step();
  std::printf(
      "%s vs one standalone process: %d steps compared, max |loss diff| %.2e (tolerance 1e-4; "
      "step %lld: %.4f vs %.4f)\n",
      what.c_str(), compared, max_diff, static_cast<long long>(last), steps.back().metrics.loss(),
      single[last]);
  EXPECT_EQ(compared, static_cast<int>(steps.size()));
  EXPECT_LT(max_diff, 1e-4);  // the log rounds to 5e-5
}

// The last step generation 1 reported, and the first of generation 2: it resumed right after a
// checkpoint (a multiple of save_interval, present on disk) and redid at most one interval.
inline void ExpectResumedFromCheckpoint(const JobWatcher& watch, Cluster& c, const std::string& job,
                                        const std::string& request_id) {
  int64_t last_gen1 = 0, first_gen2 = -1;
  for (const SeenStep& s : watch.Steps()) {
    if (s.generation <= 1) last_gen1 = std::max(last_gen1, s.metrics.step());
    if (s.generation >= 2 && first_gen2 < 0) first_gen2 = s.metrics.step();
  }
  const int64_t resumed_from = first_gen2 - 1;
  std::printf(
      "generation 1 reached step %lld; generation 2 started at step %lld (checkpoint "
      "step %lld); steps redone: %lld (save_interval %lld)\n",
      static_cast<long long>(last_gen1), static_cast<long long>(first_gen2),
      static_cast<long long>(resumed_from), static_cast<long long>(last_gen1 - resumed_from),
      static_cast<long long>(kSaveInterval));
  ASSERT_GT(first_gen2, 0);
  EXPECT_EQ(resumed_from % kSaveInterval, 0);
  EXPECT_GE(resumed_from, 10);
  EXPECT_LE(last_gen1 - resumed_from, kSaveInterval);
  EXPECT_EQ(watch.Steps().back().metrics.step(), kTrainIters);
  const std::string checkpoint =
      absl::StrCat(c.checkpoint_root(), "/", job, "/", request_id, "/step_", resumed_from);
  EXPECT_EQ(access(checkpoint.c_str(), F_OK), 0) << checkpoint;
}

}  // namespace switchyard::e2e

#endif  // SWITCHYARD_TESTS_E2E_E2E_CLUSTER_H_
