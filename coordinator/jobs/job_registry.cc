// File: coordinator/jobs/job_registry.cc
#include "coordinator/jobs/job_registry.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config/config.h"
#include "common/config/config_defaults.h"
#include "common/config/job_paths.h"
#include "common/config/validate.h"
#include "common/status.h"
#include "google/protobuf/util/message_differencer.h"

namespace switchyard::jobs {
namespace {

constexpr absl::string_view kCollection = "jobs/";
constexpr absl::string_view kTokenVersion = "p1";

void SetTimestamp(absl::Time t, google::protobuf::Timestamp* out) {
  int64_t us = absl::ToUnixMicros(t);
  int64_t seconds = us / 1000000;
  int64_t micros = us % 1000000;
  if (micros < 0) {
    micros += 1000000;
    --seconds;
  }
  out->set_seconds(seconds);
  out->set_nanos(static_cast<int32_t>(micros * 1000));
}

v1::Job ToJob(const store::JobRow& row) {
  v1::Job job;
  job.set_name(JobName(row.id));
  *job.mutable_spec() = row.spec;
  job.set_state(row.state);
  job.set_generation(row.generation);
  job.set_restart_count(row.restart_count);
  SetTimestamp(row.create_time, job.mutable_create_time());
  SetTimestamp(row.update_time, job.mutable_update_time());
  job.set_failure_reason(row.failure_reason);
  if (row.plan) *job.mutable_plan() = *row.plan;
  if (row.last_step) *job.mutable_last_step() = *row.last_step;
  if (row.last_validation) *job.mutable_last_validation() = *row.last_validation;
  if (row.last_checkpoint_step) job.set_last_checkpoint_step(*row.last_checkpoint_step);
  return job;
}

v1::JobEvent ToEvent(const store::JobEventRow& row) {
  v1::JobEvent event;
  event.set_sequence(row.sequence);
  SetTimestamp(row.time, event.mutable_time());
  event.set_state(row.state);
  event.set_generation(row.generation);
  event.set_reason(row.reason);
  event.set_message(row.message);
  return event;
}

absl::Status CheckRequestId(absl::string_view request_id) {
  bool ok = request_id.size() <= kMaxRequestIdLength;
  for (char c : request_id) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '-' || c == '_' || c == '.' || c == ':');
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("request_id (\"", absl::CHexEscape(request_id.substr(0, 64)),
                   request_id.size() > 64 ? "..." : "", "\") must be at most ", kMaxRequestIdLength,
                   " characters of A-Z, a-z, 0-9, '-', '_', '.', ':' (a UUID4 is recommended)"));
}

std::string EncodePageToken(State state, int64_t last_id) {
  return absl::WebSafeBase64Escape(absl::StrCat(kTokenVersion, ":", state, ":", last_id));
}

// The last id of the previous page; INVALID_ARGUMENT when the token is not one of ours or was
// issued for another state filter.
absl::StatusOr<int64_t> DecodePageToken(absl::string_view token, State state) {
  auto malformed = [] {
    return absl::InvalidArgumentError(
        "page_token: malformed (pass back the next_page_token of a previous ListJobs response)");
  };
  std::string text;
  if (!absl::WebSafeBase64Unescape(token, &text)) return malformed();
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  int64_t token_state = 0;
  int64_t last_id = 0;
  if (parts.size() != 3 || parts[0] != kTokenVersion || !absl::SimpleAtoi(parts[1], &token_state) ||
      !absl::SimpleAtoi(parts[2], &last_id) || last_id < 0 ||
      !v1::Job::State_IsValid(token_state)) {
    return malformed();
  }
  if (token_state != state) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_token: issued for state ", v1::Job::State_Name(static_cast<State>(token_state)),
        ", but the request has state ", v1::Job::State_Name(state),
        " (other parameters must match across pages)"));
  }
  return last_id;
}

}  // namespace

std::string JobName(int64_t id) { return absl::StrCat(kCollection, id); }

std::string JobCheckpointDir(absl::string_view checkpoint_root, int64_t id) {
  return JobDirectory(std::string(checkpoint_root), id);
}

JobRegistry::JobRegistry(store::Store* store, CoordinatorContext context)
    : store_(store), context_(std::move(context)) {}

absl::StatusOr<store::JobRow> JobRegistry::Row(absl::string_view name) {
  SY_ASSIGN_OR_RETURN(int64_t id, ParseJobName(name));
  absl::StatusOr<store::JobRow> row = store_->GetJob(id);
  if (row.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat(name, " does not exist"));
  }
  return row;
}

absl::StatusOr<v1::Job> JobRegistry::CreateJob(
    const v1::CreateJobRequest& request,
    const std::function<absl::Status(int64_t id)>& before_commit) {
  SY_RETURN_IF_ERROR(CheckRequestId(request.request_id()));
  if (!request.has_spec()) return absl::InvalidArgumentError("spec: required");
  SY_ASSIGN_OR_RETURN(v1::JobSpec resolved, ResolveJobSpec(request.spec(), context_));
  store::JobRow row;
  row.spec = std::move(resolved);
  row.request_id = request.request_id();
  row.state = v1::Job::PENDING;
  store::JobEventRow created;
  created.state = v1::Job::PENDING;
  created.generation = 0;
  created.reason = "CREATED";
  created.message = row.spec.display_name().empty()
                        ? "job created"
                        : absl::StrCat("job \"", row.spec.display_name(), "\" created");
  SY_ASSIGN_OR_RETURN(store::InsertResult result, store_->InsertJob(row, created, before_commit));
  if (!result.created &&
      !google::protobuf::util::MessageDifferencer::Equals(result.job.spec, row.spec)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "request_id (\"", request.request_id(), "\") was already used for ", JobName(result.job.id),
        " with a different spec; use a new request_id for a new job"));
  }
  return ToJob(result.job);
}

absl::StatusOr<v1::Job> JobRegistry::CreateJobFromJson(absl::string_view spec_json,
                                                       absl::string_view request_id) {
  v1::CreateJobRequest request;
  SY_ASSIGN_OR_RETURN(*request.mutable_spec(), ParseJobSpecJson(spec_json));
  request.set_request_id(std::string(request_id));
  return CreateJob(request);
}

absl::StatusOr<v1::Job> JobRegistry::CreateJobFromYaml(absl::string_view spec_yaml,
                                                       absl::string_view request_id) {
  v1::CreateJobRequest request;
  SY_ASSIGN_OR_RETURN(*request.mutable_spec(), ParseJobSpecYaml(spec_yaml));
  request.set_request_id(std::string(request_id));
  return CreateJob(request);
}

absl::StatusOr<v1::Job> JobRegistry::GetJob(absl::string_view name) {
  SY_ASSIGN_OR_RETURN(store::JobRow row, Row(name));
  v1::Job job = ToJob(row);
  // Only the last event, not the log (which grows with every restart and wait reason).
  SY_ASSIGN_OR_RETURN(std::optional<store::JobEventRow> last, store_->LastJobEvent(row.id));
  if (last.has_value()) *job.mutable_last_event() = ToEvent(*last);
  return job;
}

absl::StatusOr<v1::ListJobsResponse> JobRegistry::ListJobs(const v1::ListJobsRequest& request) {
  const State state = request.state();
  if (!v1::Job::State_IsValid(state)) {
    return absl::InvalidArgumentError(
        absl::StrCat("state (", static_cast<int>(state), ") is not a Job.State"));
  }
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size (", request.page_size(), ") must be non-negative"));
  }
  int page_size = request.page_size() == 0 ? kDefaultPageSize : request.page_size();
  if (page_size > kMaxPageSize) page_size = kMaxPageSize;
  int64_t after_id = 0;
  if (request.page_token().size() > kMaxPageTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_token (", request.page_token().size(), " bytes) must be at most ", kMaxPageTokenBytes,
        " bytes (pass back the next_page_token of a previous response)"));
  }
  if (!request.page_token().empty()) {
    SY_ASSIGN_OR_RETURN(after_id, DecodePageToken(request.page_token(), state));
  }
  // One extra row says whether another page follows.
  SY_ASSIGN_OR_RETURN(std::vector<store::JobRow> rows,
                      store_->ListJobs(state, after_id, page_size + 1));
  v1::ListJobsResponse response;
  bool more = static_cast<int>(rows.size()) > page_size;
  if (more) rows.resize(page_size);
  size_t bytes = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i > 0 && bytes >= kMaxListPageBytes) {
      more = true;  // the byte budget ends the page; the next one starts after the last listed
      break;
    }
    v1::Job* job = response.add_jobs();
    *job = ToJob(rows[i]);
    bytes += job->ByteSizeLong();
  }
  if (more) {
    response.set_next_page_token(EncodePageToken(state, rows[response.jobs_size() - 1].id));
  }
  return response;
}

absl::StatusOr<v1::Job> JobRegistry::CancelJob(absl::string_view name, absl::string_view message) {
  return Transition(name, v1::Job::CANCELLED, "CANCELLED_BY_USER", message);
}

absl::StatusOr<v1::Job> JobRegistry::DeleteJob(absl::string_view name) {
  SY_ASSIGN_OR_RETURN(int64_t id, ParseJobName(name));
  absl::StatusOr<store::JobRow> row = store_->DeleteJob(id, [&](const store::JobRow& job) {
    if (IsTerminal(job.state)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        name, " is ", v1::Job::State_Name(job.state),
        ": only a finished job (SUCCEEDED, FAILED or CANCELLED) can be deleted; cancel it first"));
  });
  if (row.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat(name, " does not exist"));
  }
  if (!row.ok()) return row.status();
  return ToJob(*row);
}

absl::StatusOr<v1::Job> JobRegistry::Transition(absl::string_view name, State to,
                                                absl::string_view reason, absl::string_view message,
                                                const v1::Plan* plan) {
  SY_ASSIGN_OR_RETURN(int64_t id, ParseJobName(name));
  SY_RETURN_IF_ERROR(CheckReason(reason));
  if (plan != nullptr && to != v1::Job::STARTING) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": a plan goes with a transition to STARTING only"));
  }
  absl::StatusOr<store::JobRow> row =
      store_->UpdateJob(id, [&](store::JobRow& job) -> absl::StatusOr<store::JobEventRow> {
        Lifecycle before{job.state, job.generation, job.restart_count, job.failure_reason};
        // The stored spec is defaulted, so max_restarts is set; 3 mirrors the default otherwise.
        int32_t max_restarts = job.spec.has_max_restarts() ? job.spec.max_restarts() : 3;
        absl::StatusOr<TransitionResult> result =
            ApplyTransition(before, to, reason, message, max_restarts);
        if (!result.ok()) return Annotate(result.status(), name);
        job.state = result->after.state;
        job.generation = result->after.generation;
        job.restart_count = result->after.restart_count;
        job.failure_reason = result->after.failure_reason;
        if (plan != nullptr && job.state == v1::Job::STARTING) job.plan = *plan;
        store::JobEventRow event;
        event.state = job.state;
        event.generation = job.generation;
        event.reason = result->reason;
        event.message = result->message;
        return event;
      });
  if (row.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat(name, " does not exist"));
  }
  if (!row.ok()) return row.status();
  return ToJob(*row);
}

absl::StatusOr<v1::Job> JobRegistry::RecordWaitReason(absl::string_view name,
                                                      absl::string_view reason,
                                                      absl::string_view message) {
  SY_ASSIGN_OR_RETURN(int64_t id, ParseJobName(name));
  SY_RETURN_IF_ERROR(CheckReason(reason));
  absl::StatusOr<store::JobRow> row =
      store_->UpdateJob(id, [&](store::JobRow& job) -> absl::StatusOr<store::JobEventRow> {
        if (job.state != v1::Job::PENDING && job.state != v1::Job::RESTARTING) {
          return absl::FailedPreconditionError(absl::StrCat(
              name, ": a wait reason is recorded only while PENDING or RESTARTING, not ",
              v1::Job::State_Name(job.state)));
        }
        store::JobEventRow event;
        event.state = job.state;
        event.generation = job.generation;
        event.reason = std::string(reason);
        event.message = std::string(message);
        return event;
      });
  if (row.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat(name, " does not exist"));
  }
  if (!row.ok()) return row.status();
  return ToJob(*row);
}

absl::Status JobRegistry::RecordLastStep(absl::string_view name, const v1::StepMetrics& step) {
  SY_ASSIGN_OR_RETURN(int64_t id, ParseJobName(name));
  absl::Status st = store_->SetLastStep(id, step);
  if (st.code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat(name, " does not exist"));
  }
  return st;
}

absl::Status JobRegistry::RecordLastValidation(absl::string_view name,
                                               const v1::StepMetrics& step) {
  SY_ASSIGN_OR_RETURN(int64_t id, ParseJobName(name));
  absl::Status st = store_->SetLastValidation(id, step);
  if (st.code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat(name, " does not exist"));
  }
  return st;
}

absl::StatusOr<v1::Job> JobRegistry::RecordCheckpoint(absl::string_view name, int64_t step) {
  SY_ASSIGN_OR_RETURN(int64_t id, ParseJobName(name));
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step (", step, ") must be non-negative"));
  }
  absl::StatusOr<store::JobRow> row =
      store_->UpdateJob(id, [&](store::JobRow& job) -> absl::StatusOr<store::JobEventRow> {
        if (job.state != v1::Job::RUNNING) {
          return absl::FailedPreconditionError(
              absl::StrCat(name, ": a checkpoint can only be recorded while RUNNING, not ",
                           v1::Job::State_Name(job.state)));
        }
        if (job.last_checkpoint_step && step <= *job.last_checkpoint_step) {
          return absl::FailedPreconditionError(absl::StrCat(name, ": checkpoint step ", step,
                                                            " is not after the last one (",
                                                            *job.last_checkpoint_step, ")"));
        }
        job.last_checkpoint_step = step;
        store::JobEventRow event;
        event.state = job.state;
        event.generation = job.generation;
        event.reason = "CHECKPOINT_SAVED";
        event.message = absl::StrCat("checkpoint at step ", step);
        return event;
      });
  if (row.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat(name, " does not exist"));
  }
  if (!row.ok()) return row.status();
  return ToJob(*row);
}

absl::StatusOr<std::optional<int64_t>> JobRegistry::LastCheckpointStep(absl::string_view name) {
  SY_ASSIGN_OR_RETURN(store::JobRow row, Row(name));
  return row.last_checkpoint_step;
}

absl::StatusOr<std::vector<v1::JobEvent>> JobRegistry::ListEvents(absl::string_view name) {
  SY_ASSIGN_OR_RETURN(store::JobRow row, Row(name));
  SY_ASSIGN_OR_RETURN(std::vector<store::JobEventRow> rows, store_->ListJobEvents(row.id));
  std::vector<v1::JobEvent> events;
  events.reserve(rows.size());
  for (const store::JobEventRow& r : rows) events.push_back(ToEvent(r));
  return events;
}

}  // namespace switchyard::jobs
