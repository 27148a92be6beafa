#include "worker/agent/rendezvous_kv_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "worker/agent/coordinator_channel.h"

namespace switchyard::agent {
namespace {

std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

// Codes that mean "the coordinator is not reachable right now" (restart, network blip).
bool Transient(absl::StatusCode code) { return code == absl::StatusCode::kUnavailable; }

// The coordinator answers FAILED_PRECONDITION when the generation is not running (it ended, a
// newer one started, or the job ended), and PERMISSION_DENIED when it does not count this worker
// as a rank of it (e.g. a restarted coordinator this worker has not re-registered with yet): for
// this rank both are the end of its generation, a retryable condition (ABORTED), not a permanent
// error of the job.
absl::Status Final(const absl::Status& st, absl::string_view op, absl::string_view key,
                   const std::string& where) {
  const absl::StatusCode code = st.code() == absl::StatusCode::kFailedPrecondition ||
                                        st.code() == absl::StatusCode::kPermissionDenied
                                    ? absl::StatusCode::kAborted
                                    : st.code();
  return absl::Status(code, absl::StrCat(op, " '", key, "' on the ", where, ": ", st.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RendezvousKvStore>> RendezvousKvStore::Create(
    std::shared_ptr<grpc::Channel> channel, std::string token, std::string address, std::string job,
    int64_t generation, Options options) {
  if (channel == nullptr) return absl::InvalidArgumentError("RendezvousKvStore: channel is null");
  if (job.empty()) return absl::InvalidArgumentError("RendezvousKvStore: job must not be empty");
  if (generation < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("RendezvousKvStore: generation (", generation, ") must be >= 1"));
  }
  if (options.get_slice <= absl::ZeroDuration() || options.rpc_slack <= absl::ZeroDuration() ||
      options.set_retry_for < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "RendezvousKvStore: options.get_slice and options.rpc_slack must be > 0, "
        "options.set_retry_for >= 0");
  }
  return std::unique_ptr<RendezvousKvStore>(
      new RendezvousKvStore(std::move(channel), std::move(token), std::move(address),
                            std::move(job), generation, options));
}

RendezvousKvStore::RendezvousKvStore(std::shared_ptr<grpc::Channel> channel, std::string token,
                                     std::string address, std::string job, int64_t generation,
                                     Options options)
    : stub_(v1::RendezvousService::NewStub(channel)),
      token_(std::move(token)),
      address_(std::move(address)),
      job_(std::move(job)),
      generation_(generation),
      options_(options) {}

std::string RendezvousKvStore::Describe() const {
  return absl::StrCat("rendezvous store at ", address_, " (job ", job_, ", generation ",
                      generation_, ")");
}

absl::Status RendezvousKvStore::CancelledError(absl::string_view op, absl::string_view key) const {
  return absl::CancelledError(
      absl::StrCat(op, " '", key, "' on the ", Describe(), ": the generation was stopped"));
}

template <typename Request>
Request RendezvousKvStore::NewRequest(absl::string_view key) const {
  Request request;
  request.set_job(job_);
  request.set_worker_id(options_.worker_id);
  request.set_generation(generation_);
  request.set_key(std::string(key));
  return request;
}

void RendezvousKvStore::PrepareContext(grpc::ClientContext* context, absl::Duration wait) const {
  AddBearerToken(token_, context);
  context->set_deadline(Deadline(wait + options_.rpc_slack));
}

absl::Status RendezvousKvStore::Set(absl::string_view key, absl::string_view value) {
  auto request = NewRequest<v1::RendezvousSetRequest>(key);
  request.set_value(std::string(value));
  const absl::Time give_up = absl::Now() + options_.set_retry_for;
  absl::Duration backoff = absl::Milliseconds(50);
  while (true) {
    if (cancelled()) return CancelledError("Set", key);
    grpc::ClientContext context;
    PrepareContext(&context, absl::ZeroDuration());
    v1::RendezvousSetResponse response;
    absl::Status st = FromGrpcStatus(stub_->Set(&context, request, &response));
    if (st.ok()) return st;
    if (!Transient(st.code()) || absl::Now() + backoff > give_up) {
      return Final(st, "Set", key, Describe());
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

absl::StatusOr<std::string> RendezvousKvStore::GetOnce(absl::string_view key, absl::Duration wait) {
  auto request = NewRequest<v1::RendezvousGetRequest>(key);
  request.set_timeout_ms(absl::ToInt64Milliseconds(wait));
  grpc::ClientContext context;
  PrepareContext(&context, wait);
  v1::RendezvousGetResponse response;
  absl::Status st = FromGrpcStatus(stub_->Get(&context, request, &response));
  if (!st.ok()) return st;
  return std::move(*response.mutable_value());
}

absl::StatusOr<std::string> RendezvousKvStore::Get(absl::string_view key, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + std::max(timeout, absl::ZeroDuration());
  absl::Status last;
  while (true) {
    if (cancelled()) return CancelledError("Get", key);
    const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    const absl::Duration wait = std::min(left, options_.get_slice);
    absl::StatusOr<std::string> value = GetOnce(key, wait);
    if (value.ok()) return value;
    last = value.status();
    const bool absent = last.code() == absl::StatusCode::kDeadlineExceeded ||
                        last.code() == absl::StatusCode::kNotFound;
    if (!absent && !Transient(last.code())) {
      return Final(last, "Get", key, Describe());
    }
    if (absl::Now() >= deadline) break;
    // UNAVAILABLE answers at once; do not spin on a coordinator that is down.
    if (Transient(last.code())) {
      absl::SleepFor(std::min(absl::Milliseconds(100), deadline - absl::Now()));
    }
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "key '", key, "' still absent after ", absl::FormatDuration(timeout), " on the ", Describe(),
      Transient(last.code()) ? absl::StrCat(" (", last.message(), ")") : std::string()));
}

absl::StatusOr<bool> RendezvousKvStore::Check(absl::string_view key) {
  if (cancelled()) return CancelledError("Check", key);
  absl::StatusOr<std::string> value = GetOnce(key, absl::ZeroDuration());
  if (value.ok()) return true;
  if (value.status().code() == absl::StatusCode::kDeadlineExceeded ||
      value.status().code() == absl::StatusCode::kNotFound) {
    return false;
  }
  return Final(value.status(), "Check", key, Describe());
}

absl::StatusOr<int64_t> RendezvousKvStore::Increment(absl::string_view key) {
  return absl::UnimplementedError(
      absl::StrCat("Increment '", key, "': the ", Describe(),
                   " has Set/Get only (RendezvousService), no atomic counter"));
}

absl::StatusOr<int64_t> RendezvousKvStore::Count(absl::string_view key) {
  return absl::UnimplementedError(
      absl::StrCat("Count '", key, "': the ", Describe(),
                   " has Set/Get only (RendezvousService), no atomic counter"));
}

}  // namespace switchyard::agent
