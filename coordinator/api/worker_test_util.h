// File: coordinator/api/worker_test_util.h
//
// Test harness for the worker side: a real SQLite store in TEST_TMPDIR, the JobRegistry and
// JobHub, a WorkerPlane served by a real gRPC server on 127.0.0.1, and FAKE WORKERS: real gRPC
// clients (one Attach stream and one reader thread each) that speak WORKER_PROTOCOL.md but train
// nothing. A shared ticker thread sends every fake worker's heartbeats.
#ifndef SWITCHYARD_COORDINATOR_WORKERS_WORKER_TEST_UTIL_H_
#define SWITCHYARD_COORDINATOR_WORKERS_WORKER_TEST_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/api/api_test_util.h"
#include "coordinator/api/auth.h"
#include "coordinator/api/worker_plane.h"
#include "coordinator/jobs/job_hub.h"
#include "coordinator/jobs/job_registry.h"
#include "coordinator/store/store.h"
#include "switchyard/v1/worker.grpc.pb.h"

namespace switchyard::api::testing {

// The worker token (role "worker") is api_test_util.h's kWorkerToken.

// FreshPath: api_test_util.h.

// A small MoE spec (2 layers, 12 experts, top-2) that plans on CPU workers for worlds 1..12:
// global batch 12, micro-batch 1, elastic range [min_workers, max_workers].
v1::JobSpec SmallSpec(int min_workers, int max_workers, int max_restarts = 3);

// Options with short timeouts for tests: heartbeat_timeout 1 s, monitor 100 ms, tick 20 ms,
// stop_timeout 3 s, adopt_grace 3 s.
WorkerPlaneOptions FastOptions(const std::string& checkpoint_root);

class FakeWorker;

// The coordinator's worker side on loopback over a fresh store file.
class Harness {
 public:
  // `store_name` under TEST_TMPDIR; `fresh` false keeps an existing file (coordinator restart).
  // `queue_quotas`: the coordinator's queues (CoordinatorContext.queue_quotas, --queues).
  static std::unique_ptr<Harness> Start(const std::string& store_name, bool fresh = true,
                                        WorkerPlaneOptions options = {},
                                        std::map<std::string, int32_t> queue_quotas = {});
  ~Harness();

  int port() const { return port_; }
  std::string address() const;
  jobs::JobRegistry* registry() { return registry_.get(); }
  jobs::JobHub* hub() { return hub_.get(); }
  store::Store* store() { return store_.get(); }
  WorkerPlane* plane() { return plane_.get(); }

  // Creates a job through the hub (as JobService would) and returns its name.
  std::string Submit(const v1::JobSpec& spec);
  // Polls the job until it is in `state` or `timeout` passes; returns the last job read.
  v1::Job WaitForState(const std::string& name, v1::Job::State state,
                       absl::Duration timeout = absl::Seconds(20));
  // Stops the scheduler, ends the streams and shuts the server down (as a coordinator exit).
  void Stop();

 private:
  Harness() = default;
  int port_ = 0;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<jobs::JobRegistry> registry_;
  std::unique_ptr<jobs::JobHub> hub_;
  std::unique_ptr<api::TokenAuth> auth_;
  std::unique_ptr<WorkerPlane> plane_;
  std::unique_ptr<grpc::Server> server_;
  bool stopped_ = false;
};

std::shared_ptr<grpc::Channel> MakeChannel(int port, int channel_id = 0);

// One fake worker process.
class FakeWorker {
 public:
  struct Received {
    v1::CoordinatorMessage message;
    absl::Time time;
  };

  FakeWorker(std::shared_ptr<grpc::Channel> channel, std::string id, std::string host = "host-a");
  ~FakeWorker();

  // Opens the stream (with the token unless `token` is null) and sends the registration unless
  // `register_first` is false.
  void Attach(const char* token = kWorkerToken, bool register_first = true);
  // Pretends to be running `assignment` (a worker re-attaching after a coordinator restart).
  void set_assignment(const v1::Assignment& assignment);
  // Registers as a job-scoped worker of `job` ("jobs/<id>"; Registration.job). Before Attach.
  void set_scope(const std::string& job) { scope_ = job; }
  // Sends a heartbeat with the current generation (0 when idle).
  void Heartbeat();
  // `validation_loss` (when set) as an evaluation step reports it (perplexity = exp of it).
  void SendStep(int64_t step, double loss, std::optional<double> validation_loss = std::nullopt);
  // Sends WorkerExit for the current assignment and becomes idle.
  void SendExit(int32_t code, const std::string& message = "");
  void SendRaw(const v1::WorkerMessage& message);
  // Ends the stream from the client side and waits for its status.
  grpc::Status Close();

  // Waits for the next received message of `kind`, skipping (but keeping in history) others.
  std::optional<Received> WaitFor(v1::CoordinatorMessage::MsgCase kind,
                                  absl::Duration timeout = absl::Seconds(20));
  // Waits until the stream ended (by the server); returns its status.
  std::optional<grpc::Status> WaitForEnd(absl::Duration timeout = absl::Seconds(20));
  std::vector<Received> History() const;
  int CountReceived(v1::CoordinatorMessage::MsgCase kind) const;

  // Heartbeats on/off (off: the coordinator must mark it LOST); answering Stop with
  // WorkerExit(143) on/off.
  void set_heartbeating(bool on) { heartbeating_ = on; }
  bool heartbeating() const { return heartbeating_; }
  void set_ack_stop(bool on) { ack_stop_ = on; }

  const std::string& id() const { return id_; }
  // The current assignment (after Assignment, cleared by SendExit or an acknowledged Stop).
  std::optional<v1::Assignment> assignment() const;
  absl::Time attach_started() const { return attach_started_; }

 private:
  void ReadLoop();
  void Write(const v1::WorkerMessage& message);

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  const std::string id_;
  const std::string host_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream_;
  std::thread reader_;
  std::atomic<bool> heartbeating_{true};
  std::atomic<bool> ack_stop_{true};
  absl::Time attach_started_;

  absl::Mutex write_mu_;
  bool writes_done_ ABSL_GUARDED_BY(write_mu_) = false;
  mutable absl::Mutex mu_;
  std::deque<Received> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<Received> history_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::Assignment> assignment_ ABSL_GUARDED_BY(mu_);
  std::string scope_;  // Registration.job
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_status_ ABSL_GUARDED_BY(mu_);
};

// Sends a heartbeat for every worker with heartbeating on, every `interval`.
class HeartbeatTicker {
 public:
  HeartbeatTicker(std::vector<FakeWorker*> workers, absl::Duration interval);
  ~HeartbeatTicker();
  void Add(FakeWorker* worker);

 private:
  absl::Mutex mu_;
  std::vector<FakeWorker*> workers_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  const absl::Duration interval_;
  std::thread thread_;
};

}  // namespace switchyard::api::testing

#endif  // SWITCHYARD_COORDINATOR_WORKERS_WORKER_TEST_UTIL_H_
