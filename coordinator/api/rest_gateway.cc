#include "coordinator/api/rest_gateway.h"

#include <httplib.h>

#include <functional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/status.h"
#include "coordinator/api/api_call.h"
#include "coordinator/api/api_status.h"
#include "coordinator/api/job_service.h"
#include "coordinator/api/worker_admin_service.h"
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

void Reply(const absl::StatusOr<std::string>& json, httplib::Response& res) {
  if (json.ok()) {
    res.status = 200;
    res.set_content(*json, kJsonType);
  } else {
    res.status = HttpStatusOf(json.status());
    res.set_content(ErrorJson(json.status()), kJsonType);
  }
}

// Parses the request body as `T` (an empty body is an empty message).
template <typename T>
absl::StatusOr<T> ParseBody(const httplib::Request& req) {
  T message;
  if (req.body.empty()) return message;
  absl::Status status = ParseMessageJson(req.body, &message);
  if (!status.ok()) return Annotate(status, "request body");
  return message;
}

absl::StatusOr<v1::ListJobsRequest> ParseListQuery(const httplib::Request& req) {
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
absl::StatusOr<v1::DeleteJobRequest> ParseDeleteQuery(const httplib::Request& req) {
  v1::DeleteJobRequest request;
  request.set_name(absl::StrCat("jobs/", req.matches[1].str()));
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

RestGateway::RestGateway(JobHub* hub, const TokenAuth* auth, metrics::CoordinatorMetrics* metrics,
                         workers::StepHub* steps, const workers::WorkerRegistry* registry,
                         std::unique_ptr<httplib::Server> server)
    : hub_(hub),
      auth_(auth),
      metrics_(metrics),
      steps_(steps),
      registry_(registry),
      server_(std::move(server)) {}

absl::StatusOr<std::unique_ptr<RestGateway>> RestGateway::Create(
    JobHub* hub, const TokenAuth* auth, metrics::CoordinatorMetrics* metrics,
    const std::string& host, int port, const std::string& tls_cert_file,
    const std::string& tls_key_file, workers::StepHub* steps,
    const workers::WorkerRegistry* registry) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("http port: ", port, " is not in [0, 65535]"));
  }
  std::unique_ptr<httplib::Server> server;
  if (!tls_cert_file.empty() || !tls_key_file.empty()) {
    auto ssl = std::make_unique<httplib::SSLServer>(tls_cert_file.c_str(), tls_key_file.c_str());
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat("tls-cert, tls-key: OpenSSL cannot load ",
                                                     tls_cert_file, " and ", tls_key_file));
    }
    server = std::move(ssl);
  } else {
    server = std::make_unique<httplib::Server>();
  }
  std::unique_ptr<RestGateway> gateway(
      new RestGateway(hub, auth, metrics, steps, registry, std::move(server)));
  gateway->Route();
  httplib::Server& listener = *gateway->server_;
  if (port == 0) {
    gateway->port_ = listener.bind_to_any_port(host);
    if (gateway->port_ < 0) {
      return absl::UnavailableError(absl::StrCat("http: cannot bind a free port on ", host));
    }
  } else {
    if (!listener.bind_to_port(host, port)) {
      return absl::UnavailableError(absl::StrCat("http: cannot bind ", host, ":", port));
    }
    gateway->port_ = port;
  }
  gateway->listener_.Start(&listener);
  return gateway;
}

RestGateway::~RestGateway() { Stop(); }

void RestGateway::Stop() { listener_.Stop(); }

void RestGateway::Route() {
  httplib::Server& s = *server_;
  s.set_payload_max_length(kMaxRestBodyBytes);
  // httplib's default sets SO_REUSEPORT, which lets a second process bind the same port and take
  // part of the traffic; keep only SO_REUSEADDR (fast restarts), so a clash fails to bind.
  s.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // Stop() waits for idle keep-alive connections to time out; keep that short.
  s.set_keep_alive_timeout(kKeepAliveSeconds);

  // Runs one API method: authentication, metrics and error mapping, then `body` produces the
  // response JSON.
  auto api = [this](const char* method,
                    std::function<absl::StatusOr<std::string>(const httplib::Request&)> body) {
    return [this, method, body = std::move(body)](const httplib::Request& req,
                                                  httplib::Response& res) {
      absl::StatusOr<std::string> json;
      absl::Status status =
          RunApiCall(*auth_, metrics_, method, req.get_header_value("Authorization"), [&] {
            json = body(req);
            return json.status();
          });
      Reply(status.ok() ? json : absl::StatusOr<std::string>(status), res);
    };
  };

  s.Post("/v1/jobs",
         api("CreateJob", [this](const httplib::Request& req) -> absl::StatusOr<std::string> {
           SY_ASSIGN_OR_RETURN(v1::CreateJobRequest request, ParseBody<v1::CreateJobRequest>(req));
           SY_ASSIGN_OR_RETURN(v1::Job job, hub_->CreateJob(request));
           return ToJson(job);
         }));
  s.Get("/v1/jobs",
        api("ListJobs", [this](const httplib::Request& req) -> absl::StatusOr<std::string> {
          SY_ASSIGN_OR_RETURN(v1::ListJobsRequest request, ParseListQuery(req));
          SY_ASSIGN_OR_RETURN(v1::ListJobsResponse response, hub_->ListJobs(request));
          for (v1::Job& job : *response.mutable_jobs()) AttachLastStep(steps_, &job);
          return ToJson(response);
        }));
  s.Get(R"(/v1/jobs/([^/:]+))",
        api("GetJob", [this](const httplib::Request& req) -> absl::StatusOr<std::string> {
          SY_ASSIGN_OR_RETURN(v1::Job job,
                              hub_->GetJob(absl::StrCat("jobs/", req.matches[1].str())));
          AttachLastStep(steps_, &job);
          return ToJson(job);
        }));
  s.Post(R"(/v1/jobs/([^/:]+):cancel)",
         api("CancelJob", [this](const httplib::Request& req) -> absl::StatusOr<std::string> {
           SY_ASSIGN_OR_RETURN(v1::Job job,
                               hub_->CancelJob(absl::StrCat("jobs/", req.matches[1].str())));
           AttachLastStep(steps_, &job);
           return ToJson(job);
         }));
  s.Delete(R"(/v1/jobs/([^/:]+))",
           api("DeleteJob", [this](const httplib::Request& req) -> absl::StatusOr<std::string> {
             SY_ASSIGN_OR_RETURN(v1::DeleteJobRequest request, ParseDeleteQuery(req));
             SY_RETURN_IF_ERROR(hub_->DeleteJob(request));
             return std::string("{}");
           }));
  s.Post("/v1/plans", api("Plan", [](const httplib::Request& req) -> absl::StatusOr<std::string> {
           SY_ASSIGN_OR_RETURN(v1::PlanRequest request, ParseBody<v1::PlanRequest>(req));
           SY_ASSIGN_OR_RETURN(v1::Plan plan, planner::PlanJob(request));
           return ToJson(plan);
         }));
  s.Get("/v1/workers",
        api("ListWorkers", [this](const httplib::Request&) -> absl::StatusOr<std::string> {
          if (registry_ == nullptr) {
            return absl::FailedPreconditionError(
                "the coordinator runs without its worker side (--noworkers): no workers");
          }
          return ToJson(ListAllWorkers(*registry_));
        }));
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_ != nullptr ? metrics_->Scrape() : "",
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
    const absl::Status store = hub_->StoreHealth();
    if (hub_->closed()) {
      res.status = 503;
      res.set_content("shutting down\n", "text/plain");
    } else if (!store.ok()) {
      res.status = 503;
      res.set_content(absl::StrCat("store unhealthy: ", store.message(), "\n"), "text/plain");
    } else {
      res.set_content("ok\n", "text/plain");
    }
  });
  // Unknown routes, wrong methods, oversized bodies: the JSON error shape, unless a handler
  // already wrote a body.
  s.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        absl::Status status;
        if (res.status == 404) {
          status = absl::NotFoundError(absl::StrCat("no route for ", req.method, " ", req.path));
        } else if (res.status == 413) {
          status = absl::InvalidArgumentError(
              absl::StrCat("request body: larger than ", kMaxRestBodyBytes, " bytes"));
        } else {
          status = absl::InvalidArgumentError(
              absl::StrCat("HTTP ", res.status, " for ", req.method, " ", req.path));
        }
        const int http = res.status;
        res.set_content(ErrorJson(status, http), kJsonType);
        res.status = http;  // keep the HTTP status httplib chose (404, 413, 400, ...)
        return httplib::Server::HandlerResponse::Handled;
      }));
}

}  // namespace switchyard::api
