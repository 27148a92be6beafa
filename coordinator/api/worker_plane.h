// File: coordinator/api/worker_plane.h
//
// The coordinator's worker side in one object, for the binary and the tests: the worker
// registry, the rendezvous store and service, the step hub, the scheduler and the Attach service,
// wired together (a lost worker goes to the scheduler and has its stream ended).
//
// Use (coordinator/api/server.cc would do this next to JobService):
//   auto plane = WorkerPlane::Create(store, hub, auth, options);   // before building the server
//   plane->RegisterServices(&builder);                             // WorkerService, Rendezvous
//   server = builder.BuildAndStart();
//   plane->Start();                                                // scheduler thread
//   ... JobService.WatchJob may read plane->steps(); GetJob may fill last_step from it ...
//   plane->Shutdown(); server->Shutdown(deadline);                 // streams end UNAVAILABLE
//
// Thread safety: Create, RegisterServices, Start, Shutdown and the destructor from one owner
// thread; the accessors from any.
#ifndef SWITCHYARD_COORDINATOR_WORKERS_WORKER_PLANE_H_
#define SWITCHYARD_COORDINATOR_WORKERS_WORKER_PLANE_H_

#include <grpcpp/server_builder.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/api/auth.h"
#include "coordinator/api/rendezvous_service.h"
#include "coordinator/api/worker_service.h"
#include "coordinator/cluster/worker_registry.h"
#include "coordinator/jobs/job_hub.h"
#include "coordinator/jobs/scheduler.h"
#include "coordinator/jobs/step_hub.h"
#include "coordinator/store/store.h"

namespace switchyard::api {

struct WorkerPlaneOptions {
  cluster::WorkerRegistryOptions registry;  // its on_lost is set by the plane
  jobs::SchedulerOptions scheduler;
  WorkerServiceOptions service;
};

class WorkerPlane {
 public:
  // `store`, `hub` and `auth` (the worker token, role "worker"; may be null: no authentication)
  // must outlive the plane. The rendezvous service checks ranks against the plane's registry.
  // Errors of WorkerRegistry::Create and Scheduler::Create.
  static absl::StatusOr<std::unique_ptr<WorkerPlane>> Create(store::Store* store, jobs::JobHub* hub,
                                                             const api::TokenAuth* auth,
                                                             WorkerPlaneOptions options);
  ~WorkerPlane();  // Shutdown()
  WorkerPlane(const WorkerPlane&) = delete;
  WorkerPlane& operator=(const WorkerPlane&) = delete;

  void RegisterServices(grpc::ServerBuilder* builder);
  absl::Status Start();
  // Stops the scheduler and ends every Attach stream; idempotent. Call before the server's
  // Shutdown so it does not wait for the streams.
  void Shutdown();

  cluster::WorkerRegistry* registry() { return registry_.get(); }
  cluster::RendezvousStore* rendezvous() { return &rendezvous_; }
  jobs::StepHub* steps() { return &steps_; }
  jobs::Scheduler* scheduler() { return scheduler_.get(); }
  WorkerServiceImpl* worker_service() { return worker_service_.get(); }

 private:
  WorkerPlane() = default;

  cluster::RendezvousStore rendezvous_;
  jobs::StepHub steps_;
  // Set once the service exists; the registry's on_lost reads it.
  WorkerServiceImpl* kick_target_ = nullptr;
  jobs::Scheduler* lost_target_ = nullptr;
  std::unique_ptr<cluster::WorkerRegistry> registry_;
  std::unique_ptr<jobs::Scheduler> scheduler_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<RendezvousServiceImpl> rendezvous_service_;
  bool shut_down_ = false;
};

}  // namespace switchyard::api

#endif  // SWITCHYARD_COORDINATOR_WORKERS_WORKER_PLANE_H_
