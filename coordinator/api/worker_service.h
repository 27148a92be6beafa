// File: coordinator/api/worker_service.h
//
// switchyard.v1.WorkerService.Attach (WORKER_PROTOCOL.md) on gRPC's callback API: one bidi stream
// per worker, no thread per stream, so one coordinator holds thousands of attached workers.
//
// Per stream:
// - The call must carry the worker token (coordinator/api/auth.h, role "worker") when an auth is
//   given; otherwise (no token, an unknown one, the API token) it ends UNAUTHENTICATED before any
//   message is read, and the failure is logged and counted (auth.h).
// - The first WorkerMessage must be a Registration (else FAILED_PRECONDITION); a bad one
//   (WorkerRegistry::Register's rules) ends the stream INVALID_ARGUMENT naming the field. A
//   second Registration is FAILED_PRECONDITION. A message with no field set is INVALID_ARGUMENT.
// - Job scope (Registration.job, switchyard-worker --job): a malformed name is INVALID_ARGUMENT,
//   a job that does not exist NOT_FOUND, a finished one FAILED_PRECONDITION, each naming `--job`;
//   with require_job_scoped_workers a registration without a job is FAILED_PRECONDITION naming
//   --require-job-scoped-workers. The scheduler then gives a scoped worker only its job and
//   sends it JobEnded when the job finishes (scheduler.h "Job-scoped workers").
// - Every message counts as a heartbeat (WorkerRegistry::Touch); Heartbeat also records its
//   generation. StepReport and WorkerExit go to the scheduler.
// - CoordinatorMessages queued by Send are written in order, one write in flight at a time.
// - A stream that ends (the worker closed it, the connection broke, or the call was cancelled)
//   disconnects its worker; it becomes LOST only after heartbeat_timeout without a message
//   (WORKER_PROTOCOL.md), so a worker that reconnects with the same worker_id in time keeps its
//   rank. Messages sent while it has no stream wait in its per-worker queue (at most
//   kMaxPendingMessages, oldest dropped) and go out first on its next stream. A new stream
//   registering the same worker_id replaces the old one, which ends ABORTED. A worker the
//   registry marks LOST gets its stream ended UNAVAILABLE and its queue dropped by Kick, so it
//   must attach and register again to get work.
// - Shutdown ends every stream UNAVAILABLE without marking the workers LOST: their store rows
//   keep their job, so a restarted coordinator can re-adopt them (scheduler.h).
//
// Thread safety: gRPC runs the reactors on its threads; Send and Kick from any thread.
#ifndef SWITCHYARD_COORDINATOR_WORKERS_WORKER_SERVICE_H_
#define SWITCHYARD_COORDINATOR_WORKERS_WORKER_SERVICE_H_

#include <deque>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/api/auth.h"
#include "coordinator/cluster/worker_registry.h"
#include "coordinator/jobs/job_hub.h"
#include "coordinator/jobs/scheduler.h"
#include "switchyard/v1/worker.grpc.pb.h"

namespace switchyard::api {

inline constexpr size_t kMaxPendingMessages = 64;

struct WorkerServiceOptions {
  // Refuse workers that do not name a job (switchyard-coordinator --require-job-scoped-workers).
  bool require_job_scoped_workers = false;
};

class WorkerServiceImpl final : public v1::WorkerService::CallbackService, public jobs::WorkerSink {
 public:
  // The pointers must outlive the service; `auth` may be null (no authentication); `hub` may be
  // null only when no worker names a job (tests of the stream alone): a scoped registration is
  // then refused UNAVAILABLE.
  WorkerServiceImpl(cluster::WorkerRegistry* workers, jobs::Scheduler* scheduler,
                    const api::TokenAuth* auth, jobs::JobHub* hub = nullptr,
                    WorkerServiceOptions options = {});
  ~WorkerServiceImpl() override;

  grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* Attach(
      grpc::CallbackServerContext* context) override;

  bool Send(const std::string& worker_id, const v1::CoordinatorMessage& message) override;
  // Ends the worker's stream UNAVAILABLE with `why` (it was marked LOST).
  void Kick(const std::string& worker_id, const std::string& why);
  // Ends every stream UNAVAILABLE (coordinator shutdown), before the gRPC server shuts down.
  void Shutdown();

  int open_streams() const;
  bool shutting_down() const;

 private:
  class AttachReactor;
  // The job-scope rules above for a registration, before the registry sees it.
  absl::Status CheckScope(const v1::Registration& registration) const;
  // Makes `reactor` the stream of `worker_id`, ending the one it replaces.
  void Bind(const std::string& worker_id, AttachReactor* reactor);
  // Forgets `reactor` (its OnDone); true when it was still the stream of its worker.
  bool Unbind(const std::string& worker_id, AttachReactor* reactor);
  bool IsCurrent(const std::string& worker_id, const AttachReactor* reactor) const;

  cluster::WorkerRegistry* const workers_;
  jobs::Scheduler* const scheduler_;
  const api::TokenAuth* const auth_;
  jobs::JobHub* const hub_;
  const WorkerServiceOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, AttachReactor*> streams_ ABSL_GUARDED_BY(mu_);  // by worker id
  std::map<std::string, std::deque<v1::CoordinatorMessage>> pending_ ABSL_GUARDED_BY(mu_);
  int open_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace switchyard::api

#endif  // SWITCHYARD_COORDINATOR_WORKERS_WORKER_SERVICE_H_
