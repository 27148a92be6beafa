// File: coordinator/api/rest_gateway.h
//
// The REST/JSON face of JobService and PlanService on its own port (common/http_server.h), written
// after the AIP-127 mapping the methods would have (ecosystem.md §2.3, "thin hand-written REST"):
//
//   POST /v1/jobs                  body CreateJobRequest          -> 200 Job
//   GET  /v1/jobs/{id}                                            -> 200 Job
//   GET  /v1/jobs?state=RUNNING&page_size=N&page_token=T          -> 200 ListJobsResponse
//   POST /v1/jobs/{id}:cancel      body ignored (AIP-136 "*")     -> 200 Job
//   DELETE /v1/jobs/{id}?delete_checkpoints=true&allow_missing=true -> 200 {} (AIP-135)
//   POST /v1/plans                 body PlanRequest               -> 200 Plan
//   GET  /metrics                  Prometheus text exposition (no token, see auth.h)
//   GET  /healthz                  "ok" while serving (no token); 503 while shutting down or
//                                  once the store found corruption (the message names the file)
//
// JSON is the proto3 JSON mapping with the proto field names (the Megatron argument names, as in
// job spec files): responses are written by MessageToJsonString with preserve_proto_field_names;
// request bodies are read by common/config/config.h's ParseMessageJson, which accepts the same
// proto3 JSON but is strict and names the field path in every error ("spec.model.hidden_size:
// expected an integer, got string") where JsonStringToMessage would not. State names in `state` are
// the enum names. Unknown query parameters are INVALID_ARGUMENT naming them.
//
// Errors: {"error": {"code": <http>, "status": "<CANONICAL_CODE>", "message": "...", "reason":
// "..."}} with the HTTP status of api_status.h (400, 401, 404, 409, 429, 500, 503, ...); unknown
// paths are 404 NOT_FOUND and a known path with another method is 405 UNIMPLEMENTED with an
// `Allow` header, both in the same shape. Every API route authenticates and records metrics
// through RunApiCall, under the same method names as gRPC.
//
// Limits (HttpServerOptions, defaults in http_server.h; the body limit here is kMaxRestBodyBytes):
// connections per client address and in total (over a cap: 503 UNAVAILABLE at once), a deadline
// on the whole request (408 DEADLINE_EXCEEDED), idle keep-alive and send timeouts, headers over
// 16 KiB 431, bodies over kMaxRestBodyBytes 413, chunked bodies 411 (send a Content-Length).
// Slow clients therefore cannot starve /healthz, /metrics or the API (issue 17).
//
// TLS: with a certificate and key the gateway serves HTTPS only; the handshake counts against
// the request deadline.
//
// Thread safety: the server's connection threads serve requests; Create/Stop from one owner
// thread.
#ifndef SWITCHYARD_COORDINATOR_API_REST_GATEWAY_H_
#define SWITCHYARD_COORDINATOR_API_REST_GATEWAY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/http_server.h"
#include "coordinator/api/auth.h"
#include "coordinator/cluster/worker_registry.h"
#include "coordinator/jobs/job_hub.h"
#include "coordinator/jobs/step_hub.h"
#include "coordinator/metrics/coordinator_metrics.h"

namespace switchyard::api {

// Request bodies larger than this are refused (413) before parsing.
inline constexpr size_t kMaxRestBodyBytes = 8 << 20;

class RestGateway {
 public:
  // Binds `host`:`port` (0: a free port) and starts serving on a background thread; HTTPS when
  // `tls_cert_file` and `tls_key_file` (PEM) are given. `hub`, `auth` and `metrics` must outlive
  // the gateway; `steps` (may be null) fills Job.last_step as JobService does. UNAVAILABLE when
  // the port cannot be bound, INVALID_ARGUMENT naming tls-cert / tls-key when OpenSSL cannot load
  // them. `limits` (its TLS fields are ignored) bounds connections, times and sizes.
  static absl::StatusOr<std::unique_ptr<RestGateway>> Create(
      jobs::JobHub* hub, const TokenAuth* auth, metrics::CoordinatorMetrics* metrics,
      const std::string& host, int port, const std::string& tls_cert_file = "",
      const std::string& tls_key_file = "", jobs::StepHub* steps = nullptr,
      const cluster::WorkerRegistry* registry = nullptr, HttpServerOptions limits = Limits());
  // The gateway's defaults: HttpServerOptions' with max_body_bytes = kMaxRestBodyBytes.
  static HttpServerOptions Limits() {
    HttpServerOptions o;
    o.max_body_bytes = kMaxRestBodyBytes;
    return o;
  }
  ~RestGateway();  // Stop()s.
  RestGateway(const RestGateway&) = delete;
  RestGateway& operator=(const RestGateway&) = delete;

  // The bound port and address ("0.0.0.0" when bound to every IPv4 interface).
  int port() const { return server_->port(); }
  const std::string& bound_address() const { return server_->bound_address(); }
  // Stops accepting, ends reading and idle connections, lets the requests in flight finish,
  // joins the threads. Idempotent.
  void Stop();

 private:
  RestGateway(jobs::JobHub* hub, const TokenAuth* auth, metrics::CoordinatorMetrics* metrics,
              jobs::StepHub* steps, const cluster::WorkerRegistry* registry);
  HttpRouter Route();

  jobs::JobHub* const hub_;
  const TokenAuth* const auth_;
  metrics::CoordinatorMetrics* const metrics_;
  jobs::StepHub* const steps_;
  const cluster::WorkerRegistry* const registry_;  // null without the worker side
  std::unique_ptr<HttpServer> server_;             // last: its threads use the members above
};

}  // namespace switchyard::api

#endif  // SWITCHYARD_COORDINATOR_API_REST_GATEWAY_H_
