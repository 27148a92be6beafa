// File: cli/client.h
//
// syctl's connection to the coordinator: the gRPC channel (plain or TLS), the bearer token on
// every call, and the mapping of failures to syctl's exit codes:
//
//   0  success
//   1  failure: the server answered an error (printed as "<CODE>: <message>"), a job ended FAILED
//      or CANCELLED (watch, submit --wait), a spec file that cannot be read or parsed
//   2  usage error: unknown verb or flag (Megatron flags included), bad or missing argument
//   3  cannot connect or not authenticated: no token configured, unreadable or empty token file,
//      unreadable TLS root certificate, the coordinator unreachable (UNAVAILABLE), or the server
//      answered UNAUTHENTICATED / PERMISSION_DENIED
//
// Not thread-safe: one Client per thread (syctl is single-threaded).
#ifndef SWITCHYARD_CLI_CLIENT_H_
#define SWITCHYARD_CLI_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "switchyard/v1/job.grpc.pb.h"
#include "switchyard/v1/plan.grpc.pb.h"
#include "switchyard/v1/worker.grpc.pb.h"

namespace switchyard::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitConnection = 3;

// Where and how to connect; empty fields take their environment variable or default.
struct ClientOptions {
  std::string coordinator;    // --coordinator, else $SYCTL_COORDINATOR, else localhost:50051
  std::string token_file;     // --token-file, else $SYCTL_TOKEN_FILE; required
  std::string tls_root_cert;  // --tls-root-cert, else $SYCTL_TLS_ROOT_CERT; empty: plain text
};

class Client {
 public:
  // Reads the token and the TLS root certificate and creates the channel (gRPC connects lazily,
  // on the first call). On failure prints the reason on stderr, sets *exit_code to 3 and returns
  // nullptr.
  static std::unique_ptr<Client> Create(const ClientOptions& options, int* exit_code);

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // A context carrying the token, with a deadline `seconds` from now (0: none, for streams).
  std::unique_ptr<grpc::ClientContext> Context(int seconds = 30) const;

  v1::JobService::Stub& jobs() { return *jobs_; }
  v1::PlanService::Stub& plans() { return *plans_; }
  v1::WorkerAdminService::Stub& workers() { return *workers_; }
  const std::string& target() const { return target_; }

  // Prints "syctl <verb>: <CODE>: <message>" (with a hint for connection and token failures) on
  // stderr and returns the exit code for `status` (which must not be OK).
  int Fail(const std::string& verb, const grpc::Status& status) const;

 private:
  Client() = default;

  std::string target_;
  std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::PlanService::Stub> plans_;
  std::unique_ptr<v1::WorkerAdminService::Stub> workers_;
};

}  // namespace switchyard::cli

#endif  // SWITCHYARD_CLI_CLIENT_H_
