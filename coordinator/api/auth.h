// File: coordinator/api/auth.h
//
// Bearer-token authentication of the coordinator's two kinds of callers, each with its own token:
//
//   role "user":   the API (JobService, PlanService, WorkerAdminService, the REST gateway), read
//                  from --token-file; what syctl, dashboards and people send.
//   role "worker": the worker side (WorkerService, RendezvousService), read from
//                  --worker-token-file; what switchyard-worker sends (its --token-file).
//
// Each service accepts only the token of its role: a worker token on the API and a user token on
// the worker side are both UNAUTHENTICATED with reason WRONG_ROLE (the message says which token
// was sent and which one the service needs, never the token). The coordinator refuses to start
// when both files hold the same token.
//
//   gRPC: metadata  "authorization: Bearer <token>"
//   REST: header    "Authorization: Bearer <token>"
//
// A call without the header is UNAUTHENTICATED with reason MISSING_TOKEN, one with an unknown
// token UNAUTHENTICATED with reason INVALID_TOKEN. Tokens are compared in constant time.
//
// Failed authentications go to an AuthAudit when one is attached: one WARNING log line naming the
// peer address, the method, the role and the reason (at most kAuthLogBurst lines per
// kAuthLogWindow; the lines suppressed meanwhile are counted in the next one, so a flood cannot
// fill the log), and the counter switchyard_coordinator_auth_failures_total{role,reason}.
//
// Exempt by design: grpc.health.v1.Health (Kubernetes probes carry no credentials), server
// reflection (it exposes the schema only, which is public in proto/), and GET /metrics (Prometheus
// scrapes without the API token). Everything else is checked on every call.
//
// Thread safety: configure (SetAudit, SetOtherRole) before serving; then immutable, and any
// thread may call Check. AuthAudit is thread-safe.
#ifndef SWITCHYARD_COORDINATOR_API_AUTH_H_
#define SWITCHYARD_COORDINATOR_API_AUTH_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"

namespace grpc {
class ServerContextBase;
}  // namespace grpc

namespace switchyard::api {

inline constexpr absl::string_view kMissingToken = "MISSING_TOKEN";
inline constexpr absl::string_view kInvalidToken = "INVALID_TOKEN";
inline constexpr absl::string_view kWrongRole = "WRONG_ROLE";

inline constexpr absl::string_view kUserRole = "user";
inline constexpr absl::string_view kWorkerRole = "worker";

inline constexpr absl::string_view kAuthFailuresMetric =
    "switchyard_coordinator_auth_failures_total";
inline constexpr absl::Duration kAuthLogWindow = absl::Seconds(10);
inline constexpr int kAuthLogBurst = 20;

// Who made a call: the authorization header/metadata value ("" when absent) and the peer address
// ("ipv4:127.0.0.1:5000"; "" when not known). Implicit from a string so a caller that knows only
// the header (the REST gateway) passes it as before.
struct Caller {
  Caller(std::string authorization_in)  // NOLINT(runtime/explicit)
      : authorization(std::move(authorization_in)) {}
  Caller(const char* authorization_in)  // NOLINT(runtime/explicit)
      : authorization(authorization_in) {}
  Caller(std::string authorization_in, std::string peer_in)
      : authorization(std::move(authorization_in)), peer(std::move(peer_in)) {}
  std::string authorization;
  std::string peer;
};

// The caller of a gRPC call (sync or callback API): its "authorization" metadata and peer().
Caller AuthorizationOf(const grpc::ServerContextBase& context);

// Records failed authentications: rate-limited log lines and the Prometheus counter.
class AuthAudit {
 public:
  // `registry` may be null (log only). Registers kAuthFailuresMetric on it.
  explicit AuthAudit(prometheus::Registry* registry, absl::Duration window = kAuthLogWindow,
                     int burst = kAuthLogBurst);
  AuthAudit(const AuthAudit&) = delete;
  AuthAudit& operator=(const AuthAudit&) = delete;

  void Record(absl::string_view role, absl::string_view reason, absl::string_view method,
              absl::string_view peer, absl::string_view message);

  // Totals since construction, for tests: failures seen, log lines written.
  int64_t failures() const;
  int64_t lines_logged() const;

 private:
  prometheus::Family<prometheus::Counter>* family_ = nullptr;
  const absl::Duration window_;
  const int burst_;
  mutable absl::Mutex mu_;
  absl::Time window_start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int lines_in_window_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t lines_ ABSL_GUARDED_BY(mu_) = 0;
};

class TokenAuth {
 public:
  // NOT_FOUND when the file cannot be read; INVALID_ARGUMENT naming the file when it holds no
  // token or the token has whitespace or control characters inside. `role` names the callers
  // (kUserRole, kWorkerRole) in messages, logs and the metric.
  static absl::StatusOr<std::unique_ptr<TokenAuth>> FromFile(const std::string& path,
                                                             absl::string_view role = kUserRole);
  // INVALID_ARGUMENT under the same rules as FromFile.
  static absl::StatusOr<std::unique_ptr<TokenAuth>> FromToken(absl::string_view token,
                                                              absl::string_view role = kUserRole);

  // Failures are recorded there (may be null; must outlive this).
  void SetAudit(AuthAudit* audit) { audit_ = audit; }
  // The auth of the other role (may be null; must outlive this): its token presented here is
  // WRONG_ROLE instead of INVALID_TOKEN.
  void SetOtherRole(const TokenAuth* other) { other_ = other; }

  // OK when `caller` presents this role's token; otherwise UNAUTHENTICATED with a reason, and the
  // failure is recorded with `method` and the caller's peer.
  absl::Status Check(const Caller& caller, absl::string_view method = "") const;

  const std::string& role() const { return role_; }
  // True when both hold the same token (the coordinator refuses that configuration).
  bool SameToken(const TokenAuth& other) const;

 private:
  TokenAuth(std::string token, absl::string_view role) : token_(std::move(token)), role_(role) {}
  absl::Status Verify(absl::string_view authorization) const;

  const std::string token_;
  const std::string role_;
  AuthAudit* audit_ = nullptr;
  const TokenAuth* other_ = nullptr;
};

}  // namespace switchyard::api

#endif  // SWITCHYARD_COORDINATOR_API_AUTH_H_
