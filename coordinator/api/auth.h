// File: coordinator/api/auth.h
//
// Bearer-token authentication shared by the gRPC services and the REST gateway. The coordinator
// reads one token from a file (--token-file; surrounding whitespace and a trailing newline are
// ignored) and every API call must carry it:
//
//   gRPC: metadata  "authorization: Bearer <token>"
//   REST: header    "Authorization: Bearer <token>"
//
// A call without the header is UNAUTHENTICATED with reason MISSING_TOKEN, one with another token
// UNAUTHENTICATED with reason INVALID_TOKEN. Tokens are compared in constant time.
//
// Exempt by design: grpc.health.v1.Health (Kubernetes probes carry no credentials), server
// reflection (it exposes the schema only, which is public in proto/), and GET /metrics (Prometheus
// scrapes without the API token). Everything else is checked on every call.
//
// Thread safety: immutable after Create; any thread may call Check.
#ifndef SWITCHYARD_COORDINATOR_API_AUTH_H_
#define SWITCHYARD_COORDINATOR_API_AUTH_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace grpc {
class ServerContext;
}

namespace switchyard::api {

inline constexpr absl::string_view kMissingToken = "MISSING_TOKEN";
inline constexpr absl::string_view kInvalidToken = "INVALID_TOKEN";

// The value of a gRPC call's "authorization" metadata ("" when absent).
std::string AuthorizationOf(const grpc::ServerContext& context);

class TokenAuth {
 public:
  // NOT_FOUND when the file cannot be read; INVALID_ARGUMENT naming the file when it holds no
  // token or the token has whitespace or control characters inside.
  static absl::StatusOr<std::unique_ptr<TokenAuth>> FromFile(const std::string& path);
  // INVALID_ARGUMENT under the same rules as FromFile.
  static absl::StatusOr<std::unique_ptr<TokenAuth>> FromToken(absl::string_view token);

  // `authorization` is the value of the authorization header/metadata, empty when absent.
  absl::Status Check(absl::string_view authorization) const;

 private:
  explicit TokenAuth(std::string token) : token_(std::move(token)) {}
  const std::string token_;
};

}  // namespace switchyard::api

#endif  // SWITCHYARD_COORDINATOR_API_AUTH_H_
