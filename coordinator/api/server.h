// File: coordinator/api/server.h
//
// The coordinator's API process in one object: opens the store, builds the registry, the hub,
// the metrics, the gRPC server (JobService, PlanService, grpc.health.v1.Health, server
// reflection, and the worker side's WorkerService and RendezvousService with its scheduler thread)
// and the REST gateway; when a certificate and key are given both serve TLS only
// (gRPC through grpc::SslServerCredentials, REST as HTTPS). main.cc is flag
// parsing and signal handling around it; tests run it in-process on loopback.
//
// Health: the overall status ("") and each service ("switchyard.v1.JobService",
// "switchyard.v1.PlanService", and with the worker side "switchyard.v1.WorkerService",
// "switchyard.v1.RendezvousService") are SERVING from Create until Shutdown, NOT_SERVING during
// it, and NOT_SERVING for good once the store finds corruption (store.h: logged once with the
// file name; every store call then fails DATA_LOSS; /healthz answers 503 naming the file).
//
// The store: Create refuses (the store's error, naming the file) a missing store unless
// `create_store`, and an empty, truncated, non-SQLite or corrupt one always. With `store_backup`,
// a backup thread copies the store there (store.h's Backup: atomic, 0600) once at start, then
// every `store_backup_interval`, and once more after the gRPC server stopped in Shutdown; each
// copy logs one line ("store backup: ..."), a failed one logs an ERROR and leaves the previous
// backup in place. Restore: start on the backup file (--store BACKUP).
//
// Shutdown(deadline): health goes NOT_SERVING, WatchJob streams end UNAVAILABLE, the scheduler
// stops and the workers' Attach streams end (api/worker_plane.h), the REST
// gateway stops (reading and idle connections end at once, requests in flight finish), then the
// gRPC server stops accepting and waits for the calls in flight until `deadline`, cancelling the
// rest. gRPC core also waits for clients to close their connections after its GOAWAY, so with a
// client still connected Shutdown often takes until `deadline` even when no call is in flight (seen
// in coordinator_binary_test); it never takes longer. Idempotent.
//
// Thread safety: Create, Shutdown and the destructor from one owner thread; the accessors from
// any.
#ifndef SWITCHYARD_COORDINATOR_API_SERVER_H_
#define SWITCHYARD_COORDINATOR_API_SERVER_H_

#include <grpcpp/server.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "coordinator/api/auth.h"
#include "coordinator/api/job_service.h"
#include "coordinator/api/plan_service.h"
#include "coordinator/api/rest_gateway.h"
#include "coordinator/api/worker_admin_service.h"
#include "coordinator/api/worker_plane.h"
#include "coordinator/jobs/job_hub.h"
#include "coordinator/jobs/job_registry.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "coordinator/store/store.h"

namespace switchyard::api {

struct ServerOptions {
  std::string store_path;  // SQLite file
  // Create `store_path` (empty, mode 0600) when it does not exist (--create-store). Never
  // replaces an existing file.
  bool create_store = false;
  // Non-empty: where the backup thread writes the store's backups (--store-backup).
  std::string store_backup;
  absl::Duration store_backup_interval = absl::Minutes(10);
  // > 0: cap the store at this many pages (store.h's max_page_count); tests use it to fill it.
  int64_t store_max_page_count = 0;
  std::string host = "0.0.0.0";
  int grpc_port = 0;       // 0: pick a free port (see grpc_port())
  int http_port = 0;       // 0: pick a free port (see http_port())
  std::string token_file;  // the user (API) token
  // The worker token (auth.h, role "worker"): the only credential WorkerService and
  // RendezvousService accept. Required with `workers`; must differ from token_file's token.
  // Read (and checked) whenever set, also without `workers`.
  std::string worker_token_file;
  // Both or neither: PEM files of the server certificate (chain) and its private key.
  std::string tls_cert_file;
  std::string tls_key_file;
  // The worker side (coordinator/jobs, coordinator/cluster and the worker-side services in
  // coordinator/api: WorkerService, RendezvousService, scheduler). Off, the coordinator serves the
  // API only (jobs stay PENDING).
  bool workers = true;
  // Where jobs checkpoint (<root>/jobs/<job id>), as the workers see it (shared storage), and
  // where data.data_path and tokenizer_model are read from (read-only): every path of a job spec
  // is relative to one of them (common/config/job_paths.h). Absolute; required with `workers`. The
  // workers must be started with the same --checkpoint-root and --data-root.
  std::string checkpoint_root;
  std::string data_root = "/data";
  // The queues and their worker quotas (--queues, jobs::ParseQueueQuotas): CreateJob refuses a
  // job naming another queue, the scheduler keeps each queue within its quota
  // (coordinator/jobs/scheduler.h "Queues").
  std::map<std::string, int32_t> queue_quotas;
  // host:port the workers dial for rendezvous (sent in every Assignment). Empty: `host` (the
  // machine's host name when `host` is a wildcard) and the gRPC port.
  std::string advertise_address;
  // The REST port's connection caps, deadlines and size limits (TLS fields ignored: see above).
  HttpServerOptions http_limits = RestGateway::Limits();
  // -1: none. Otherwise (0: a free port) a second gRPC port on `host`, always plaintext, serving
  // only grpc.health.v1.Health with the statuses of the main port: for the kubelet's native gRPC
  // probes, which cannot speak TLS, when the main port serves TLS. It reveals only whether the
  // coordinator serves; it serves no API.
  int health_port = -1;
  // Timeouts of the worker registry and scheduler; checkpoint_root and rendezvous_address are
  // filled from the fields above.
  api::WorkerPlaneOptions worker_options;
};

class CoordinatorServer {
 public:
  // INVALID_ARGUMENT naming the option for bad options (empty store_path or token_file,
  // store_backup equal to store_path or a non-positive store_backup_interval, a port outside
  // [0, 65535], only one of the TLS files, an unreadable or empty token; with `workers`, an empty
  // worker_token_file or one holding the user token), the store's errors for the store,
  // UNAVAILABLE when a port cannot be bound; with `workers`, an empty or relative checkpoint_root
  // or data_root is INVALID_ARGUMENT and the worker side's errors are returned. With grpc_port 0
  // and the worker side on, the free port is found by binding a probe socket first (the
  // rendezvous address must be known before the server starts), so another process could take it
  // in between; the bind then fails with UNAVAILABLE.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Create(const ServerOptions& options);
  ~CoordinatorServer();  // Shutdown(now + 5 s) if not yet shut down.
  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  int grpc_port() const { return grpc_port_; }
  int http_port() const { return rest_->port(); }
  // The address the REST gateway is bound to, as the kernel reports it ("0.0.0.0" for all).
  const std::string& http_address() const { return rest_->bound_address(); }
  // The plaintext health-only gRPC port; -1 without ServerOptions.health_port.
  int health_port() const { return health_port_; }
  bool tls() const { return tls_; }

  void Shutdown(absl::Time deadline);

  jobs::JobHub* hub() { return hub_.get(); }
  // Null when ServerOptions.workers is false.
  api::WorkerPlane* worker_plane() { return plane_.get(); }
  // The rendezvous address sent to workers ("" without the worker side).
  const std::string& advertise_address() const { return advertise_address_; }
  metrics::CoordinatorMetrics* metrics() { return metrics_.get(); }
  // Failed authentications of both roles.
  const AuthAudit* auth_audit() const { return audit_.get(); }
  // The store's health (store.h): OK, or the DATA_LOSS that made it refuse every call.
  absl::Status StoreHealth() { return store_->Health(); }

 private:
  CoordinatorServer() = default;
  // The store's on_corruption: health NOT_SERVING (now, or as soon as the gRPC server exists).
  void OnStoreCorruption();
  // Backs up the store to `path` now, then every `interval` until Shutdown.
  void BackupLoop(const std::string& path, absl::Duration interval);
  void BackupOnce(const std::string& path);

  bool tls_ = false;
  bool shut_down_ = false;
  int grpc_port_ = 0;
  int health_port_ = -1;
  std::unique_ptr<metrics::CoordinatorMetrics> metrics_;
  std::unique_ptr<AuthAudit> audit_;        // after metrics_ (its registry)
  std::unique_ptr<TokenAuth> auth_;         // role "user"
  std::unique_ptr<TokenAuth> worker_auth_;  // role "worker"; with the worker side only
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<jobs::JobRegistry> registry_;
  std::unique_ptr<jobs::JobHub> hub_;
  std::string advertise_address_;
  // After the hub and the store (destroyed before them), before the gRPC server (destroyed after
  // it: the server holds the plane's services).
  std::unique_ptr<api::WorkerPlane> plane_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<PlanServiceImpl> plan_service_;
  std::unique_ptr<WorkerAdminServiceImpl> worker_admin_service_;  // with the worker side only
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<grpc::Server> health_server_;  // with ServerOptions.health_port only
  std::unique_ptr<RestGateway> rest_;

  absl::Mutex health_mu_;
  // The servers whose health the store's corruption turns NOT_SERVING (the main one and the
  // health port's); empty once Shutdown began.
  std::vector<grpc::Server*> health_targets_ ABSL_GUARDED_BY(health_mu_);
  bool store_corrupt_ ABSL_GUARDED_BY(health_mu_) = false;
  std::string store_backup_;
  absl::Notification stop_backups_;
  std::thread backup_thread_;  // with store_backup only
};

}  // namespace switchyard::api

#endif  // SWITCHYARD_COORDINATOR_API_SERVER_H_
