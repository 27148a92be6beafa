// File: coordinator/cluster/rendezvous_store.cc
#include "coordinator/cluster/rendezvous_store.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace switchyard::cluster {

absl::StatusOr<RendezvousStore::JobKeys*> RendezvousStore::Live(absl::string_view job,
                                                                int64_t generation) {
  absl::StatusOr<const JobKeys*> keys = LiveConst(job, generation);
  if (!keys.ok()) return keys.status();
  return const_cast<JobKeys*>(*keys);
}

absl::Status RendezvousStore::CheckLive(absl::string_view job, int64_t generation) const {
  absl::MutexLock lock(&mu_);
  return LiveConst(job, generation).status();
}

absl::StatusOr<const RendezvousStore::JobKeys*> RendezvousStore::LiveConst(
    absl::string_view job, int64_t generation) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(RendezvousScopeName(job, generation),
                     " is not running here: rendezvous keys exist only while a generation of "
                     "the job runs on this coordinator"));
  }
  const JobKeys& keys = it->second;
  if (!keys.open) {
    return absl::FailedPreconditionError(absl::StrCat(
        RendezvousScopeName(job, generation), " is not running (the newest generation, ",
        keys.generation, ", has ended); its keys were dropped"));
  }
  if (generation != keys.generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        RendezvousScopeName(job, generation), " is not the running generation (", keys.generation,
        ")", generation < keys.generation ? "; its keys were dropped" : ""));
  }
  return &keys;
}

absl::Status RendezvousStore::Set(const v1::RendezvousSetRequest& request) {
  if (auto status = CheckRendezvousScope(request.job(), request.generation(), request.key());
      !status.ok()) {
    return status;
  }
  if (request.value().size() > kMaxRendezvousValueBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("value (", request.value().size(), " bytes) exceeds the limit of ",
                     kMaxRendezvousValueBytes, " bytes per value (kMaxRendezvousValueBytes)"));
  }
  absl::MutexLock lock(&mu_);
  absl::StatusOr<JobKeys*> live = Live(request.job(), request.generation());
  if (!live.ok()) return live.status();
  JobKeys& keys = **live;
  auto it = keys.values.find(request.key());
  const int64_t old_bytes =
      it == keys.values.end() ? 0 : static_cast<int64_t>(it->first.size() + it->second.size());
  const int64_t new_bytes = static_cast<int64_t>(request.key().size() + request.value().size());
  if (it == keys.values.end() &&
      keys.values.size() >= static_cast<size_t>(kMaxRendezvousKeysPerGeneration)) {
    return absl::ResourceExhaustedError(
        absl::StrCat(RendezvousScopeName(request.job(), request.generation()), " already holds ",
                     kMaxRendezvousKeysPerGeneration,
                     " keys, the limit per generation "
                     "(kMaxRendezvousKeysPerGeneration); key '",
                     request.key(), "' was not stored"));
  }
  if (keys.bytes - old_bytes + new_bytes > static_cast<int64_t>(kMaxRendezvousBytesPerGeneration)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        RendezvousScopeName(request.job(), request.generation()), " holds ", keys.bytes,
        " bytes; key '", request.key(), "' (", new_bytes, " bytes) would exceed the limit of ",
        kMaxRendezvousBytesPerGeneration,
        " bytes per generation (kMaxRendezvousBytesPerGeneration); it was not stored"));
  }
  keys.bytes += new_bytes - old_bytes;
  keys.values[request.key()] = request.value();
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousStore::Get(const v1::RendezvousGetRequest& request) {
  if (auto status = CheckRendezvousScope(request.job(), request.generation(), request.key());
      !status.ok()) {
    return status;
  }
  if (request.timeout_ms() < 0 || request.timeout_ms() > kMaxRendezvousTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "timeout_ms (", request.timeout_ms(), ") must be in [0, ", kMaxRendezvousTimeoutMs, "]"));
  }
  const absl::Time deadline = absl::Now() + absl::Milliseconds(request.timeout_ms());
  absl::MutexLock lock(&mu_);
  if (absl::StatusOr<JobKeys*> live = Live(request.job(), request.generation()); !live.ok()) {
    return live.status();
  }
  // Present, or the generation ended or moved on (the job may also be dropped: the entry is gone).
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = jobs_.find(request.job());
    return it == jobs_.end() || !it->second.open || it->second.generation != request.generation() ||
           it->second.values.count(request.key()) > 0;
  };
  mu_.AwaitWithDeadline(absl::Condition(&settled), deadline);
  auto it = jobs_.find(request.job());
  if (it == jobs_.end() || !it->second.open || it->second.generation != request.generation()) {
    return absl::FailedPreconditionError(
        absl::StrCat(RendezvousScopeName(request.job(), request.generation()),
                     " was dropped while waiting for key '", request.key(),
                     "' (the generation ended, a newer one started or the job ended)"));
  }
  auto value = it->second.values.find(request.key());
  if (value == it->second.values.end()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "key '", request.key(), "' of ", RendezvousScopeName(request.job(), request.generation()),
        " was not set within ", request.timeout_ms(), " ms"));
  }
  return value->second;
}

void RendezvousStore::OpenGeneration(absl::string_view job, int64_t generation) {
  absl::MutexLock lock(&mu_);
  JobKeys& keys = jobs_[std::string(job)];
  if (generation < keys.generation) return;
  if (generation > keys.generation) {
    keys.generation = generation;
    keys.values.clear();
    keys.bytes = 0;
  }
  keys.open = true;
}

void RendezvousStore::EndGeneration(absl::string_view job, int64_t generation) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end() || it->second.generation != generation) return;
  it->second.open = false;
  it->second.values.clear();
  it->second.bytes = 0;
}

void RendezvousStore::DropJob(absl::string_view job) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it != jobs_.end()) jobs_.erase(it);
}

int RendezvousStore::KeyCount(absl::string_view job, int64_t generation) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end() || !it->second.open || it->second.generation != generation) return 0;
  return static_cast<int>(it->second.values.size());
}

RendezvousUsage RendezvousStore::Usage() const {
  absl::MutexLock lock(&mu_);
  RendezvousUsage usage;
  for (const auto& [name, keys] : jobs_) {
    if (keys.open) ++usage.open_generations;
    usage.keys += static_cast<int64_t>(keys.values.size());
    usage.bytes += keys.bytes;
  }
  return usage;
}

absl::Status CheckRendezvousScope(absl::string_view job, int64_t generation,
                                  absl::string_view key) {
  if (job.empty()) return absl::InvalidArgumentError("job must not be empty");
  if (generation < 1) {
    return absl::InvalidArgumentError(absl::StrCat("generation (", generation, ") must be >= 1"));
  }
  if (key.empty()) return absl::InvalidArgumentError("key must not be empty");
  if (key.size() > kMaxRendezvousKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("key (", key.size(), " bytes) must be at most ",
                                                   kMaxRendezvousKeyBytes, " bytes"));
  }
  return absl::OkStatus();
}

std::string RendezvousScopeName(absl::string_view job, int64_t generation) {
  return absl::StrCat(job, " generation ", generation);
}

}  // namespace switchyard::cluster
