// File: coordinator/jobs/step_hub.h
//
// Per-job fan-out of step reports for JobService.WatchJob: the scheduler publishes rank 0's
// StepMetrics of each job's current generation; every subscriber of the job gets its own queue.
// The hub also remembers each job's last step (Job.last_step, fresher than the store's copy, which
// the scheduler saves at most once a second and when the job succeeds, so it survives a restart).
//
// Contracts:
// - Subscribe(job) returns a queue that receives every step published after the call. A queue
//   holds at most kMaxQueuedSteps; when a slow reader lets it fill, the oldest step is dropped
//   and dropped() counts it (a watcher must never block the scheduler).
// - CloseJob(job) (the job ended) closes its queues: Next returns what is queued, then nullopt at
//   once. Later subscriptions to a closed job are closed from the start.
// - A subscription is released by destroying the last shared_ptr to it; the hub holds weak
//   references and forgets expired ones on the next publish.
//
// Thread safety: any thread may call any method; a subscription's Next from one reader thread.
#ifndef SWITCHYARD_COORDINATOR_WORKERS_STEP_HUB_H_
#define SWITCHYARD_COORDINATOR_WORKERS_STEP_HUB_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "switchyard/v1/metrics.pb.h"

namespace switchyard::jobs {

inline constexpr size_t kMaxQueuedSteps = 1024;

class StepSubscription {
 public:
  // The next step, waiting up to `timeout`; nullopt on timeout, or when closed and drained.
  std::optional<v1::StepMetrics> Next(absl::Duration timeout);
  // True once the job ended and the queue is drained.
  bool done() const;
  int64_t dropped() const;

 private:
  friend class StepHub;
  void Push(const v1::StepMetrics& step);
  void Close();

  mutable absl::Mutex mu_;
  std::deque<v1::StepMetrics> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

class StepHub {
 public:
  std::shared_ptr<StepSubscription> Subscribe(const std::string& job);
  void Publish(const std::string& job, const v1::StepMetrics& step);
  void CloseJob(const std::string& job);
  std::optional<v1::StepMetrics> LastStep(const std::string& job) const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::vector<std::weak_ptr<StepSubscription>>> subscribers_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, v1::StepMetrics> last_step_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> closed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace switchyard::jobs

#endif  // SWITCHYARD_COORDINATOR_WORKERS_STEP_HUB_H_
