// File: coordinator/api/worker_plane.cc
#include "coordinator/api/worker_plane.h"

#include <utility>

namespace switchyard::api {

absl::StatusOr<std::unique_ptr<WorkerPlane>> WorkerPlane::Create(store::Store* store,
                                                                 jobs::JobHub* hub,
                                                                 const api::TokenAuth* auth,
                                                                 WorkerPlaneOptions options) {
  std::unique_ptr<WorkerPlane> plane(new WorkerPlane());
  WorkerPlane* p = plane.get();
  // The monitor thread may fire before the scheduler and service exist: it reads the targets,
  // which are set below before any worker can attach (the services are not registered yet).
  options.registry.on_lost = [p](const cluster::WorkerInfo& worker, const std::string& why) {
    if (p->lost_target_ != nullptr) p->lost_target_->OnLost(worker, why);
    if (p->kick_target_ != nullptr) p->kick_target_->Kick(worker.id, why);
  };
  absl::StatusOr<std::unique_ptr<cluster::WorkerRegistry>> registry =
      cluster::WorkerRegistry::Create(store, std::move(options.registry));
  if (!registry.ok()) return registry.status();
  plane->registry_ = *std::move(registry);
  absl::StatusOr<std::unique_ptr<jobs::Scheduler>> scheduler =
      jobs::Scheduler::Create(hub, plane->registry_.get(), &plane->rendezvous_, &plane->steps_,
                              std::move(options.scheduler));
  if (!scheduler.ok()) return scheduler.status();
  plane->scheduler_ = *std::move(scheduler);
  plane->worker_service_ = std::make_unique<WorkerServiceImpl>(
      plane->registry_.get(), plane->scheduler_.get(), auth, hub, options.service);
  plane->rendezvous_service_ =
      std::make_unique<RendezvousServiceImpl>(&plane->rendezvous_, auth, plane->registry_.get());
  plane->scheduler_->SetSink(plane->worker_service_.get());
  plane->lost_target_ = plane->scheduler_.get();
  plane->kick_target_ = plane->worker_service_.get();
  return plane;
}

WorkerPlane::~WorkerPlane() {
  Shutdown();
  // The registry's monitor may still call on_lost until it is destroyed: stop it first.
  registry_.reset();
}

void WorkerPlane::RegisterServices(grpc::ServerBuilder* builder) {
  builder->RegisterService(worker_service_.get());
  builder->RegisterService(rendezvous_service_.get());
}

absl::Status WorkerPlane::Start() { return scheduler_->Start(); }

void WorkerPlane::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  scheduler_->Stop();
  registry_->StopMonitor();
  worker_service_->Shutdown();
}

}  // namespace switchyard::api
