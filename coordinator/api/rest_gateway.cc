#include "coordinator/api/rest_gateway.h"

#include <functional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "common/status.h"
#include "coordinator/api/api_call.h"
#include "coordinator/api/api_status.h"
#include "coordinator/api/job_service.h"
#include "coordinator/api/plan_service.h"
#include "coordinator/api/worker_admin_service.h"
#include "coordinator/jobs/resolve_spec.h"
#include "coordinator/planner/planner.h"
#include "google/protobuf/util/json_util.h"

namespace switchyard::api {
namespace {

constexpr char kJsonType[] = "application/json";

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string out;
  auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot write the response as JSON: ", std::string(status.message())));
  }
  return out;
}

void Reply(const absl::StatusOr<std::string>& json, HttpResponse* res) {
  res->content_type = kJsonType;
  if (json.ok()) {
    res->status = 200;
    res->body = *json;
  } else {
    res->status = HttpStatusOf(json.status());
    res->body = ErrorJson(json.status());
  }
}

// The canonical code of an error the HTTP layer answers itself (routing, limits, caps).
absl::Status TransportError(int http, const std::string& message) {
  switch (http) {
    case 404:
      return absl::NotFoundError(message);
    case 405:
    case 501:
      return absl::UnimplementedError(message);
    case 408:
      return absl::DeadlineExceededError(message);
    case 503:
      return absl::UnavailableError(message);
    default:  // 400, 411, 413, 431
      return absl::InvalidArgumentError(message);
  }
}

// Parses the request body as `T` (an empty body is an empty message).
template <typename T>
absl::StatusOr<T> ParseBody(const HttpRequest& req) {
  T message;
  if (req.body.empty()) return message;
  absl::Status status = ParseMessageJson(req.body, &message);
  if (!status.ok()) return Annotate(status, "request body");
  return message;
}

absl::StatusOr<v1::ListJobsRequest> ParseListQuery(const HttpRequest& req) {
  v1::ListJobsRequest request;
  for (const auto& [key, value] : req.params) {
    if (key == "state") {
      v1::Job::State state;
      if (!v1::Job::State_Parse(value, &state)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "state: \"", value, "\" is not a job state (PENDING, STARTING, RUNNING, RESTARTING, ",
            "SUCCEEDED, FAILED, CANCELLED or STATE_UNSPECIFIED)"));
      }
      request.set_state(state);
    } else if (key == "page_size") {
      int32_t size = 0;
      if (!absl::SimpleAtoi(value, &size)) {
        return absl::InvalidArgumentError(
            absl::StrCat("page_size: \"", value, "\" is not a 32-bit integer"));
      }
      request.set_page_size(size);
    } else if (key == "page_token") {
      request.set_page_token(value);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          key, ": unknown query parameter (GET /v1/jobs takes state, page_size, page_token)"));
    }
  }
  return request;
}

// DELETE /v1/jobs/{id}'s query: delete_checkpoints and allow_missing, "true" or "false".
absl::StatusOr<v1::DeleteJobRequest> ParseDeleteQuery(const HttpRequest& req) {
  v1::DeleteJobRequest request;
  request.set_name(absl::StrCat("jobs/", req.matches[1]));
  for (const auto& [key, value] : req.params) {
    if (key != "delete_checkpoints" && key != "allow_missing") {
      return absl::InvalidArgumentError(
          absl::StrCat(key,
                       ": unknown query parameter (DELETE /v1/jobs/{id} takes delete_checkpoints, "
                       "allow_missing)"));
    }
    if (value != "true" && value != "false") {
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": \"", value, "\" is not a boolean (true or false)"));
    }
    if (key == "delete_checkpoints") request.set_delete_checkpoints(value == "true");
    if (key == "allow_missing") request.set_allow_missing(value == "true");
  }
  return request;
}

}  // namespace

RestGateway::RestGateway(jobs::JobHub* hub, const TokenAuth* auth,
                         metrics::CoordinatorMetrics* metrics, jobs::StepHub* steps,
                         const cluster::WorkerRegistry* registry)
    : hub_(hub), auth_(auth), metrics_(metrics), steps_(steps), registry_(registry) {}

absl::StatusOr<std::unique_ptr<RestGateway>> RestGateway::Create(
    jobs::JobHub* hub, const TokenAuth* auth, metrics::CoordinatorMetrics* metrics,
    const std::string& host, int port, const std::string& tls_cert_file,
    const std::string& tls_key_file, jobs::StepHub* steps, const cluster::WorkerRegistry* registry,
    HttpServerOptions limits) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("http port: ", port, " is not in [0, 65535]"));
  }
  std::unique_ptr<RestGateway> gateway(new RestGateway(hub, auth, metrics, steps, registry));
  limits.tls_cert_file = tls_cert_file;
  limits.tls_key_file = tls_key_file;
  SY_ASSIGN_OR_RETURN(gateway->server_,
                      HttpServer::Create(host, port, std::move(limits), gateway->Route()));
  return gateway;
}

RestGateway::~RestGateway() { Stop(); }

void RestGateway::Stop() {
  if (server_ != nullptr) server_->Stop();
}

HttpRouter RestGateway::Route() {
  HttpRouter s;
  // Runs one API method: authentication, metrics and error mapping, then `body` produces the
  // response JSON.
  auto api = [this](const char* method,
                    std::function<absl::StatusOr<std::string>(const HttpRequest&)> body) {
    return [this, method, body = std::move(body)](const HttpRequest& req, HttpResponse* res) {
      absl::StatusOr<std::string> json;
      absl::Status status = RunApiCall(
          *auth_, metrics_, method,
          Caller(req.Header("Authorization"), absl::StrCat("http:", req.client_address)), [&] {
            json = body(req);
            return json.status();
          });
      Reply(status.ok() ? json : absl::StatusOr<std::string>(status), res);
    };
  };

  s.Handle("POST", "/v1/jobs",
           api("CreateJob", [this](const HttpRequest& req) -> absl::StatusOr<std::string> {
             SY_ASSIGN_OR_RETURN(v1::CreateJobRequest request,
                                 ParseBody<v1::CreateJobRequest>(req));
             SY_ASSIGN_OR_RETURN(v1::Job job, hub_->CreateJob(request));
             return ToJson(job);
           }));
  s.Handle("GET", "/v1/jobs",
           api("ListJobs", [this](const HttpRequest& req) -> absl::StatusOr<std::string> {
             SY_ASSIGN_OR_RETURN(v1::ListJobsRequest request, ParseListQuery(req));
             SY_ASSIGN_OR_RETURN(v1::ListJobsResponse response, hub_->ListJobs(request));
             for (v1::Job& job : *response.mutable_jobs()) AttachLastStep(steps_, &job);
             return ToJson(response);
           }));
  // GetJob and CancelJob: `action` on the job the path names, answered with the job and its last
  // step.
  auto job_action = [this, &api](
                        const char* method,
                        absl::StatusOr<v1::Job> (jobs::JobHub::*action)(absl::string_view)) {
    return api(method, [this, action](const HttpRequest& req) -> absl::StatusOr<std::string> {
      SY_ASSIGN_OR_RETURN(v1::Job job, (hub_->*action)(absl::StrCat("jobs/", req.matches[1])));
      AttachLastStep(steps_, &job);
      return ToJson(job);
    });
  };
  s.HandleRegex("GET", R"(/v1/jobs/([^/:]+))", job_action("GetJob", &jobs::JobHub::GetJob));
  s.HandleRegex("POST", R"(/v1/jobs/([^/:]+):cancel)",
                job_action("CancelJob", &jobs::JobHub::CancelJob));
  s.HandleRegex("DELETE", R"(/v1/jobs/([^/:]+))",
                api("DeleteJob", [this](const HttpRequest& req) -> absl::StatusOr<std::string> {
                  SY_ASSIGN_OR_RETURN(v1::DeleteJobRequest request, ParseDeleteQuery(req));
                  SY_RETURN_IF_ERROR(hub_->DeleteJob(request));
                  return std::string("{}");
                }));
  s.Handle("POST", "/v1/plans",
           api("Plan", [this](const HttpRequest& req) -> absl::StatusOr<std::string> {
             SY_ASSIGN_OR_RETURN(v1::PlanRequest request, ParseBody<v1::PlanRequest>(req));
             SY_ASSIGN_OR_RETURN(v1::Plan plan, PlanForUser(request, hub_->context(), hub_));
             return ToJson(plan);
           }));
  s.Handle("GET", "/v1/workers",
           api("ListWorkers", [this](const HttpRequest&) -> absl::StatusOr<std::string> {
             if (registry_ == nullptr) {
               return absl::FailedPreconditionError(
                   "the coordinator runs without its worker side (--noworkers): no workers");
             }
             return ToJson(ListAllWorkers(*registry_));
           }));
  s.Handle("GET", "/metrics", [this](const HttpRequest&, HttpResponse* res) {
    res->content_type = "text/plain; version=0.0.4; charset=utf-8";
    res->body = metrics_ != nullptr ? metrics_->Scrape() : "";
  });
  s.Handle("GET", "/healthz", [this](const HttpRequest&, HttpResponse* res) {
    const absl::Status store = hub_->StoreHealth();
    if (hub_->closed()) {
      res->status = 503;
      res->body = "shutting down\n";
    } else if (!store.ok()) {
      res->status = 503;
      res->body = absl::StrCat("store unhealthy: ", store.message(), "\n");
    } else {
      res->body = "ok\n";
    }
  });
  // Unknown routes (404), wrong methods (405 + Allow) and what the HTTP layer refuses itself
  // (400, 408, 411, 413, 431, 501, 503): the JSON error shape with the HTTP status chosen there.
  s.SetErrorRenderer([](const HttpRequest&, const std::string& message, HttpResponse* res) {
    res->content_type = kJsonType;
    res->body = ErrorJson(TransportError(res->status, message), res->status);
  });
  return s;
}

}  // namespace switchyard::api
