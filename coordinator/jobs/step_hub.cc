// File: coordinator/jobs/step_hub.cc
#include "coordinator/jobs/step_hub.h"

#include <utility>

namespace switchyard::jobs {

std::optional<v1::StepMetrics> StepSubscription::Next(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || closed_; };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (queue_.empty()) return std::nullopt;
  v1::StepMetrics step = std::move(queue_.front());
  queue_.pop_front();
  return step;
}

bool StepSubscription::done() const {
  absl::MutexLock lock(&mu_);
  return closed_ && queue_.empty();
}

int64_t StepSubscription::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

void StepSubscription::Push(const v1::StepMetrics& step) {
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  if (queue_.size() >= kMaxQueuedSteps) {
    queue_.pop_front();
    ++dropped_;
  }
  queue_.push_back(step);
}

void StepSubscription::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

std::shared_ptr<StepSubscription> StepHub::Subscribe(const std::string& job) {
  auto subscription = std::make_shared<StepSubscription>();
  absl::MutexLock lock(&mu_);
  if (closed_.count(job) > 0) {
    subscription->Close();
  } else {
    subscribers_[job].push_back(subscription);
  }
  return subscription;
}

void StepHub::Publish(const std::string& job, const v1::StepMetrics& step) {
  std::vector<std::shared_ptr<StepSubscription>> live;
  {
    absl::MutexLock lock(&mu_);
    if (closed_.count(job) > 0) return;
    last_step_[job] = step;
    auto it = subscribers_.find(job);
    if (it == subscribers_.end()) return;
    std::vector<std::weak_ptr<StepSubscription>>& subs = it->second;
    std::vector<std::weak_ptr<StepSubscription>> kept;
    for (std::weak_ptr<StepSubscription>& weak : subs) {
      if (std::shared_ptr<StepSubscription> sub = weak.lock()) {
        live.push_back(sub);
        kept.push_back(std::move(weak));
      }
    }
    subs = std::move(kept);
  }
  for (const auto& sub : live) sub->Push(step);
}

void StepHub::CloseJob(const std::string& job) {
  std::vector<std::weak_ptr<StepSubscription>> subs;
  {
    absl::MutexLock lock(&mu_);
    closed_.insert(job);
    auto it = subscribers_.find(job);
    if (it != subscribers_.end()) {
      subs = std::move(it->second);
      subscribers_.erase(it);
    }
  }
  for (auto& weak : subs) {
    if (auto sub = weak.lock()) sub->Close();
  }
}

std::optional<v1::StepMetrics> StepHub::LastStep(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  auto it = last_step_.find(job);
  if (it == last_step_.end()) return std::nullopt;
  return it->second;
}

}  // namespace switchyard::jobs
