// File: coordinator/cluster/worker_registry.cc
#include "coordinator/cluster/worker_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace switchyard::cluster {
namespace {

store::WorkerState StoreState(WorkerState state) {
  switch (state) {
    case WorkerState::kIdle:
      return store::WorkerState::kIdle;
    case WorkerState::kBusy:
      return store::WorkerState::kAssigned;
    case WorkerState::kLost:
      return store::WorkerState::kLost;
  }
  return store::WorkerState::kLost;
}

constexpr size_t kMaxWorkerIdBytes = 256;

}  // namespace

const char* WorkerStateName(WorkerState state) {
  switch (state) {
    case WorkerState::kIdle:
      return "IDLE";
    case WorkerState::kBusy:
      return "BUSY";
    case WorkerState::kLost:
      return "LOST";
  }
  return "UNKNOWN";
}

WorkerRegistry::WorkerRegistry(store::Store* store, WorkerRegistryOptions options)
    : store_(store), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<WorkerRegistry>> WorkerRegistry::Create(
    store::Store* store, WorkerRegistryOptions options) {
  if (options.heartbeat_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("heartbeat_timeout must be positive");
  }
  if (options.monitor_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("monitor_interval must be positive");
  }
  if (options.persist_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("persist_interval must not be negative");
  }
  absl::StatusOr<std::vector<store::WorkerRow>> rows = store->ListWorkers();
  if (!rows.ok()) return rows.status();
  std::unique_ptr<WorkerRegistry> registry(new WorkerRegistry(store, std::move(options)));
  for (store::WorkerRow& row : *rows) {
    if (row.state != store::WorkerState::kLost && row.state != store::WorkerState::kDetached) {
      if (absl::Status s = store->SetWorkerState(row.id, store::WorkerState::kLost, row.job);
          !s.ok()) {
        return s;
      }
    }
    absl::MutexLock lock(&registry->mu_);
    registry->previous_[row.id] = std::move(row);
  }
  registry->monitor_ = std::thread([r = registry.get()] { r->MonitorLoop(); });
  return registry;
}

WorkerRegistry::~WorkerRegistry() { StopMonitor(); }

void WorkerRegistry::StopMonitor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (monitor_.joinable()) monitor_.join();
}

void WorkerRegistry::Persist(const std::string& id) {
  // Writes the newest in-memory state under persist_mu_, so racing changes land in order.
  absl::MutexLock persist_lock(&persist_mu_);
  WorkerInfo worker;
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(id);
    if (it == workers_.end()) return;
    worker = it->second;
  }
  absl::Status status = store_->SetWorkerState(worker.id, StoreState(worker.state), worker.job);
  if (!status.ok()) {
    SY_LOG(WARNING) << "worker " << worker.id << ": store write of state "
                    << WorkerStateName(worker.state) << " failed: " << status;
  }
}

absl::StatusOr<Registered> WorkerRegistry::Register(const v1::Registration& registration) {
  if (registration.worker_id().empty()) {
    return absl::InvalidArgumentError("registration.worker_id must not be empty");
  }
  if (registration.worker_id().size() > kMaxWorkerIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("registration.worker_id (", registration.worker_id().size(),
                     " bytes) must be at most ", kMaxWorkerIdBytes, " bytes"));
  }
  if (registration.host().empty()) {
    return absl::InvalidArgumentError("registration.host must not be empty");
  }
  const absl::Time now = absl::Now();
  Registered result;
  WorkerInfo& info = result.worker;
  info.id = registration.worker_id();
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(info.id);
    if (it != workers_.end()) {
      result.before = it->second;
      // A busy worker that re-attaches keeps its rank until the scheduler hears its generation.
      if (it->second.state == WorkerState::kBusy) {
        info.state = WorkerState::kBusy;
        info.job = it->second.job;
        info.generation = it->second.generation;
        info.rank = it->second.rank;
      }
    }
    auto prev = previous_.find(info.id);
    if (prev != previous_.end()) result.previous = prev->second;
  }
  info.host = registration.host();
  if (registration.has_gpu()) info.gpu = registration.gpu();
  info.version = registration.version();
  info.scope = registration.job();
  info.registered_at = now;
  info.last_heartbeat = now;
  info.connected = true;

  store::WorkerRow row;
  row.id = info.id;
  row.host = info.host;
  row.gpu = info.gpu;
  row.version = info.version;
  row.state = StoreState(info.state);
  row.job = info.job;
  row.last_heartbeat = now;
  if (absl::Status s = store_->UpsertWorker(row); !s.ok()) return s;

  absl::MutexLock lock(&mu_);
  workers_[info.id] = info;
  persisted_heartbeat_[info.id] = now;
  return result;
}

void WorkerRegistry::SetDisconnected(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it != workers_.end()) it->second.connected = false;
}

absl::Status WorkerRegistry::Touch(const std::string& id, int64_t generation) {
  const absl::Time now = absl::Now();
  bool persist = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(id);
    if (it == workers_.end()) return absl::NotFoundError(absl::StrCat("no worker ", id));
    it->second.last_heartbeat = now;
    if (generation >= 0) {
      it->second.reported_generation = generation;
      ++it->second.heartbeats;
    }
    absl::Time& persisted = persisted_heartbeat_[id];
    if (it->second.state != WorkerState::kLost && now - persisted >= options_.persist_interval) {
      persisted = now;
      persist = true;
    }
  }
  if (persist) {
    if (absl::Status s = store_->RecordHeartbeat(id); !s.ok()) {
      SY_LOG(WARNING) << "worker " << id << ": store heartbeat write failed: " << s;
    }
  }
  return absl::OkStatus();
}

absl::Status WorkerRegistry::SetBusy(const std::string& id, const std::string& job,
                                     int64_t generation, int32_t rank) {
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(id);
    if (it == workers_.end()) return absl::NotFoundError(absl::StrCat("no worker ", id));
    if (it->second.state == WorkerState::kLost) {
      return absl::FailedPreconditionError(absl::StrCat("worker ", id, " is LOST"));
    }
    it->second.state = WorkerState::kBusy;
    it->second.job = job;
    it->second.generation = generation;
    it->second.rank = rank;
  }
  Persist(id);
  return absl::OkStatus();
}

absl::Status WorkerRegistry::SetIdle(const std::string& id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(id);
    if (it == workers_.end()) return absl::NotFoundError(absl::StrCat("no worker ", id));
    if (it->second.state == WorkerState::kLost) {
      return absl::FailedPreconditionError(absl::StrCat("worker ", id, " is LOST"));
    }
    it->second.state = WorkerState::kIdle;
    it->second.job.clear();
    it->second.generation = 0;
    it->second.rank = -1;
    it->second.reported_generation = 0;  // until its next heartbeat says otherwise
  }
  Persist(id);
  return absl::OkStatus();
}

bool WorkerRegistry::MarkLost(const std::string& id, const std::string& why) {
  WorkerInfo before;
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(id);
    if (it == workers_.end() || it->second.state == WorkerState::kLost) return false;
    before = it->second;
    it->second.state = WorkerState::kLost;
  }
  Persist(id);
  SY_LOG(INFO) << "worker " << id << " LOST: " << why;
  if (options_.on_lost) options_.on_lost(before, why);
  return true;
}

void WorkerRegistry::MonitorLoop() {
  while (true) {
    std::vector<std::pair<std::string, std::string>> expired;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.monitor_interval);
      if (stopping_) return;
      const absl::Time now = absl::Now();
      for (const auto& [id, info] : workers_) {
        if (info.state != WorkerState::kLost &&
            now - info.last_heartbeat > options_.heartbeat_timeout) {
          expired.emplace_back(
              id, absl::StrCat("no message for ", absl::FormatDuration(now - info.last_heartbeat),
                               " (heartbeat_timeout ",
                               absl::FormatDuration(options_.heartbeat_timeout), ")"));
        }
      }
    }
    for (const auto& [id, why] : expired) MarkLost(id, why);
  }
}

std::optional<WorkerInfo> WorkerRegistry::Get(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return std::nullopt;
  return it->second;
}

std::vector<WorkerInfo> WorkerRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerInfo> out;
  out.reserve(workers_.size());
  for (const auto& [id, info] : workers_) out.push_back(info);
  return out;
}

std::vector<WorkerInfo> WorkerRegistry::Idle() const {
  std::vector<WorkerInfo> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, info] : workers_) {
      if (info.state == WorkerState::kIdle && info.connected) out.push_back(info);
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const WorkerInfo& a, const WorkerInfo& b) {
    return std::tie(a.host, a.id) < std::tie(b.host, b.id);
  });
  return out;
}

int WorkerRegistry::CountInState(WorkerState state) const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [id, info] : workers_) n += info.state == state ? 1 : 0;
  return n;
}

std::optional<store::WorkerRow> WorkerRegistry::PreviousRow(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = previous_.find(id);
  if (it == previous_.end()) return std::nullopt;
  return it->second;
}

std::map<std::string, std::vector<std::string>> WorkerRegistry::PreviousAssignments() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& [id, row] : previous_) {
    if (row.state == store::WorkerState::kAssigned && !row.job.empty()) out[row.job].push_back(id);
  }
  return out;
}

}  // namespace switchyard::cluster
