// File: worker/agent/coordinator_channel.h
//
// How the worker reaches the coordinator: one gRPC channel (plain TCP, or TLS with a root
// certificate) and the bearer token every call carries as "authorization: Bearer <token>"
// metadata (proto/switchyard/v1/WORKER_PROTOCOL.md).
#ifndef SWITCHYARD_WORKER_AGENT_COORDINATOR_CHANNEL_H_
#define SWITCHYARD_WORKER_AGENT_COORDINATOR_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace switchyard::agent {

// A channel to `address` ("host:port"). `tls_root_cert_path` empty: plain TCP; otherwise TLS,
// verifying the server against the PEM roots in that file. INVALID_ARGUMENT for an empty
// address; NOT_FOUND naming the file when the certificate cannot be read. Does not connect.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeCoordinatorChannel(
    const std::string& address, const std::string& tls_root_cert_path);

// The token in `path` (surrounding whitespace ignored, as the coordinator reads its token file).
// NOT_FOUND naming the file when it cannot be read; INVALID_ARGUMENT when it holds no token or
// the token has whitespace or control characters inside.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Adds "authorization: Bearer <token>" to `context`; nothing when `token` is empty (the
// coordinator then rejects the call with UNAUTHENTICATED MISSING_TOKEN).
void AddBearerToken(absl::string_view token, grpc::ClientContext* context);

}  // namespace switchyard::agent

#endif  // SWITCHYARD_WORKER_AGENT_COORDINATOR_CHANNEL_H_
