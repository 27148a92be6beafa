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
// it.
//
// Shutdown(deadline): health goes NOT_SERVING, WatchJob streams end UNAVAILABLE, the scheduler
// stops and the workers' Attach streams end (workers/worker_plane.h), the REST
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

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/api/auth.h"
#include "coordinator/api/job_hub.h"
#include "coordinator/api/job_service.h"
#include "coordinator/api/plan_service.h"
#include "coordinator/api/rest_gateway.h"
#include "coordinator/api/worker_admin_service.h"
#include "coordinator/jobs/job_registry.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "coordinator/store/store.h"
#include "coordinator/workers/worker_plane.h"

namespace switchyard::api {

struct ServerOptions {
  std::string store_path;  // SQLite file, created if absent
  std::string host = "0.0.0.0";
  int grpc_port = 0;  // 0: pick a free port (see grpc_port())
  int http_port = 0;  // 0: pick a free port (see http_port())
  std::string token_file;
  // Both or neither: PEM files of the server certificate (chain) and its private key.
  std::string tls_cert_file;
  std::string tls_key_file;
  // The worker side (coordinator/workers: WorkerService, RendezvousService, scheduler). Off, the
  // coordinator serves the API only (jobs stay PENDING).
  bool workers = true;
  // Where jobs checkpoint (<root>/<job id>), as the workers see it (shared storage). Required
  // with `workers`.
  std::string checkpoint_root;
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
  workers::WorkerPlaneOptions worker_options;
};

class CoordinatorServer {
 public:
  // INVALID_ARGUMENT naming the option for bad options (empty store_path or token_file, a port
  // outside [0, 65535], only one of the TLS files, an unreadable or empty token), the store's
  // errors for the store, UNAVAILABLE when a port cannot be bound; with `workers`, an empty
  // checkpoint_root is INVALID_ARGUMENT and the worker side's errors are returned. With grpc_port
  // 0 and the worker side on, the free port is found by binding a probe socket first (the
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

  JobHub* hub() { return hub_.get(); }
  // Null when ServerOptions.workers is false.
  workers::WorkerPlane* worker_plane() { return plane_.get(); }
  // The rendezvous address sent to workers ("" without the worker side).
  const std::string& advertise_address() const { return advertise_address_; }
  metrics::CoordinatorMetrics* metrics() { return metrics_.get(); }

 private:
  CoordinatorServer() = default;

  bool tls_ = false;
  bool shut_down_ = false;
  int grpc_port_ = 0;
  int health_port_ = -1;
  std::unique_ptr<TokenAuth> auth_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<jobs::JobRegistry> registry_;
  std::unique_ptr<metrics::CoordinatorMetrics> metrics_;
  std::unique_ptr<JobHub> hub_;
  std::string advertise_address_;
  // After the hub and the store (destroyed before them), before the gRPC server (destroyed after
  // it: the server holds the plane's services).
  std::unique_ptr<workers::WorkerPlane> plane_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<PlanServiceImpl> plan_service_;
  std::unique_ptr<WorkerAdminServiceImpl> worker_admin_service_;  // with the worker side only
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<grpc::Server> health_server_;  // with ServerOptions.health_port only
  std::unique_ptr<RestGateway> rest_;
};

}  // namespace switchyard::api

#endif  // SWITCHYARD_COORDINATOR_API_SERVER_H_
