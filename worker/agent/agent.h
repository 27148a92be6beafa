// File: worker/agent/agent.h
//
// The worker agent: `switchyard-worker --coordinator host:port` attaches to the coordinator
// (WorkerService.Attach, one bidirectional stream), registers, heartbeats, and executes the
// coordinator's commands, exactly as proto/switchyard/v1/WORKER_PROTOCOL.md specifies:
//
//   Assignment     PrepareGeneration (generation.h): checked, not started. A bad one is answered
//                  at once with WorkerExit(1, why). An Assignment while another generation runs
//                  ends that one first, as a Stop would.
//   Start          the prepared generation runs on its own thread (RunGeneration): rendezvous
//                  through RendezvousService, train, one StepReport per optimizer step (every
//                  rank), then WorkerExit 0 (train_iters reached), 1 (permanent error) or 128+
//                  (retryable; generation.h ExitCodeFor), and the worker is idle again.
//   CheckpointNow  a save after the current step (agreed between the ranks, generation.h).
//   Stop           abort the communicators, join the training thread, WorkerExit(143), idle. A
//                  thread that has not ended stop_report_after after the abort (a collective
//                  the transport does not interrupt) is left to unwind in the background: the
//                  WorkerExit(143) goes out then, and the next Start waits for that thread. A
//                  Stop while assigned but not started drops the assignment with
//                  WorkerExit(143); a Stop while idle is ignored.
//
// Heartbeats go out every heartbeat_interval with the generation assigned (0 when idle), from
// the stream's writer thread, so they continue while the training thread computes and while
// the reader handles a Stop.
//
// Connection loss (coordinator restart, network): the agent reconnects with exponential backoff
// (reconnect_initial_backoff doubling to reconnect_max_backoff) and registers again with the SAME
// worker_id; training continues meanwhile, and what it reports while disconnected (step reports,
// up to kMaxQueuedReports of them, oldest dropped first, and every WorkerExit) is queued and sent
// after the new Registration. A rejection that retrying cannot fix (UNAUTHENTICATED,
// PERMISSION_DENIED, UNIMPLEMENTED, INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION: a worker
// scoped to a job that does not exist or is finished, or an unscoped one on a coordinator that
// requires job scope) ends Run with that code and a message that says what to check (the token
// file, the coordinator address, --job). One exception: a job-scoped worker that has run a
// generation of its job and, reconnecting, finds the job finished (FAILED_PRECONDITION) missed
// its JobEnded while away, and returns OK as if it had got it.
//
// Threads: Run's caller reads the stream and handles commands; one writer thread per stream
// (heartbeats and the outbox); one training thread per started generation. Shutdown from any
// thread. If a stopped generation's thread does not end within stop_grace (a collective the
// transport fails to interrupt; both Gloo's and NCCL's Abort wake a blocked collective, so this
// is a last resort), Run returns UNAVAILABLE so that the process exits with a retryable code and
// is restarted, which is the only bounded way out.
#ifndef SWITCHYARD_WORKER_AGENT_AGENT_H_
#define SWITCHYARD_WORKER_AGENT_AGENT_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/tensor.h"
#include "switchyard/v1/worker.grpc.pb.h"
#include "worker/agent/generation.h"
#include "worker/agent/worker_metrics.h"

namespace switchyard::agent {

struct AgentOptions {
  // The coordinator's gRPC address, host:port. Required.
  std::string coordinator;
  // File holding the coordinator's bearer token. Empty: calls carry no token (a coordinator
  // that checks tokens then rejects the worker: Run returns UNAUTHENTICATED).
  std::string token_file;
  // PEM root certificate(s) to verify a TLS coordinator. Empty: plain TCP.
  std::string tls_root_cert;
  // auto (cuda:0 when a GPU is visible, else the CPU) | cpu | cuda | cuda:N. With several
  // workers on one host, give each its GPU (cuda:N, or CUDA_VISIBLE_DEVICES).
  std::string device = "auto";
  // Heartbeat period (the coordinator's heartbeat_timeout is 5 s by default). > 0.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // The worker's own /metrics: -1 none, 0 any free port (Agent::metrics_port()), else the port.
  int metrics_port = -1;
  std::string metrics_bind_address = "0.0.0.0";
  // Address the Gloo transport of CPU jobs listens on and advertises to the peers.
  std::string gloo_host = "127.0.0.1";
  // Bound on the rendezvous and on every collective. > 0.
  absl::Duration comm_timeout = absl::Seconds(60);
  double peak_tflops = 989.4;  // for MFU (H100/H200 dense bf16)
  // The coordinator's --checkpoint-root and --data-root as mounted here (absolute): every path
  // of an assignment must resolve inside them (common/config/job_paths.h), whatever the assignment
  // says; defaults as the coordinator's.
  JobRoots roots;
  // "jobs/<id>": a job-scoped worker (--job). It announces the job in its Registration; the
  // coordinator refuses it when the job does not exist or is finished (Run returns NOT_FOUND /
  // FAILED_PRECONDITION naming --job: a permanent error), assigns it that job only, and sends
  // JobEnded once the job is finished, after which Run ends the generation, logs the job's final
  // state and returns OK (the process exits 0, so a Kubernetes Indexed Job completes). Empty: any
  // job, until Shutdown. Anything else is INVALID_ARGUMENT naming --job at Create.
  std::string job;
  // Unique per process; empty: "<host>:<pid>:<start time in unix ms>".
  std::string worker_id;
  absl::Duration reconnect_initial_backoff = absl::Milliseconds(100);
  absl::Duration reconnect_max_backoff = absl::Seconds(5);
  // A Stop aborts the communicators and waits this long for the training thread before it
  // reports WorkerExit(143) anyway (the thread then unwinds in the background). > 0.
  absl::Duration stop_report_after = absl::Seconds(2);
  // How long a stopped generation's thread may take to unwind before the agent gives up on the
  // process (Run returns UNAVAILABLE). >= stop_report_after.
  absl::Duration stop_grace = absl::Seconds(90);
  // Log lines (attach, assignment, exit, reconnect) go to stderr prefixed with the worker id.
  bool log = true;
};

class Agent {
 public:
  static constexpr int kMaxQueuedReports = 4096;

  // Validates the options (INVALID_ARGUMENT naming the option), reads the token file, picks the
  // device, starts the metrics exporter. Does not connect.
  static absl::StatusOr<std::unique_ptr<Agent>> Create(AgentOptions options);
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;
  // Shutdown(), then ends the generation. Run must have returned.
  ~Agent();

  // Attaches and serves until Shutdown() (OK) or an error retrying cannot fix (see above).
  // Call once.
  absl::Status Run();
  // Ends the generation (WorkerExit(143), sent if connected), closes the stream, makes Run
  // return. Any thread; idempotent.
  void Shutdown();

  const std::string& worker_id() const { return worker_id_; }
  const Device& device() const { return device_; }
  int metrics_port() const { return metrics_->port(); }
  WorkerMetrics& metrics() { return *metrics_; }
  // The generation assigned (0 when idle), as the heartbeats report it.
  int64_t generation() const { return generation_.load(); }
  // Completed sessions (streams that ended), for tests of reconnection.
  int64_t sessions() const { return sessions_.load(); }
  // The final state JobEnded named for a job-scoped worker ("" until then).
  std::string job_end_state() const;

 private:
  struct Generation {
    PreparedGeneration prepared;
    GenerationControl control;
    bool started = false;
    std::atomic<bool> exit_sent{false};  // one WorkerExit per generation
    absl::Time stop_requested_at;
    std::thread thread;
    absl::Notification done;
  };

  explicit Agent(AgentOptions options) : options_(std::move(options)) {}
  v1::WorkerMessage RegistrationMessage() const;
  // One Attach stream: returns its final status (OK when it ended for Shutdown).
  absl::Status RunSession();
  void WriterLoop(grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>* stream,
                  grpc::ClientContext* context, absl::Notification* reader_done);
  void Handle(const v1::CoordinatorMessage& msg);
  void OnAssignment(const v1::Assignment& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(gen_mu_);
  void OnStart() ABSL_EXCLUSIVE_LOCKS_REQUIRED(gen_mu_);
  // Ends the current generation, if any: aborts a running one and waits stop_report_after for
  // its thread; a thread still unwinding then moves to stopping_.
  void EndGeneration(const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(gen_mu_);
  // Joins the generation in stopping_ (up to stop_grace after its stop); false, with Fatal(),
  // when it does not end.
  bool ReapStopping() ABSL_EXCLUSIVE_LOCKS_REQUIRED(gen_mu_);
  void TrainingThread(Generation* g);
  void SendExit(const v1::Assignment& a, int code, const std::string& message);
  void Enqueue(v1::WorkerMessage msg);
  void Fatal(absl::Status status);
  void Log(const std::string& line) const;
  bool WaitShutdown(absl::Duration d);

  const AgentOptions options_;
  std::string worker_id_, host_, token_;
  Device device_;
  v1::GpuInfo gpu_;
  bool has_gpu_ = false;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  std::unique_ptr<WorkerMetrics> metrics_;
  std::atomic<int64_t> generation_{0};
  std::atomic<int64_t> sessions_{0};
  std::atomic<bool> assigned_once_{false};  // got an Assignment (of its job, when scoped)

  absl::Mutex gen_mu_;  // serialises the commands (reader thread) and Shutdown
  std::unique_ptr<Generation> gen_ ABSL_GUARDED_BY(gen_mu_);
  std::unique_ptr<Generation> stopping_ ABSL_GUARDED_BY(gen_mu_);  // stopped, still unwinding

  mutable absl::Mutex mu_;
  std::deque<v1::WorkerMessage> outbox_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  std::string job_end_state_ ABSL_GUARDED_BY(mu_);
};

// Create + Run.
absl::Status RunAgent(const AgentOptions& options);

// For switchyard-worker's main(): RunAgent with SIGTERM and SIGINT turned into Shutdown() (they
// are blocked in the calling thread and waited for on a thread of their own; call before any
// other thread is started). Returns the process exit status: 0 after a signal or, for a
// job-scoped worker, once its job is finished; 1 for a permanent error (bad options, rejected
// token, --job naming a missing or finished job), 75 (EX_TEMPFAIL: restart me) for UNAVAILABLE.
// The error is printed to stderr.
int AgentMain(const AgentOptions& options);

}  // namespace switchyard::agent

#endif  // SWITCHYARD_WORKER_AGENT_AGENT_H_
