// File: coordinator/api/api_test_util.h
//
// Test helpers for the API tests: a CoordinatorServer on loopback with a fresh SQLite file and
// token file in TEST_TMPDIR, gRPC channels and contexts carrying the token, valid specs and
// clusters, and a table of invalid specs each naming the field its error must name.
#ifndef SWITCHYARD_COORDINATOR_API_API_TEST_UTIL_H_
#define SWITCHYARD_COORDINATOR_API_API_TEST_UTIL_H_

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/api/server.h"
#include "switchyard/v1/config.pb.h"
#include "switchyard/v1/plan.pb.h"

namespace switchyard::api::testing {

inline constexpr char kToken[] = "s3cr3t-token-for-tests";        // the API (user) token
inline constexpr char kWorkerToken[] = "w0rker-token-for-tests";  // the workers' token

// TEST_TMPDIR/`name` (or /tmp), with a SQLite file's -wal and -shm siblings removed.
std::string FreshPath(const std::string& name);
// Writes `text` to TEST_TMPDIR/`name` and returns the path.
std::string WriteFile(const std::string& name, const std::string& text);

// A valid MoE spec named `display_name`: common/config/validate_test_util.h's baseline (world 32)
// with TP = PP = 1, the parallelism the workers run (the baseline itself is refused at submit),
// and its paths made relative, as a coordinator requires (common/config/job_paths.h).
v1::JobSpec ValidSpec(const std::string& display_name = "api-test");
// 32 GPUs, 8 per node, 80 GiB: the baseline plans on it.
v1::Cluster Cluster32();

// One invalid spec and the text its INVALID_ARGUMENT must contain.
struct InvalidSpec {
  std::string label;
  v1::JobSpec spec;
  std::string needle;
};
// At least 50 specs, each breaking one rule of common/validate (or the parser's range checks).
std::vector<InvalidSpec> InvalidSpecs();

// A CoordinatorServer on 127.0.0.1 with free ports over FreshPath(store_name), the worker side
// on with checkpoints under TEST_TMPDIR/checkpoints; `adjust` may change the options first.
std::unique_ptr<CoordinatorServer> StartServer(
    const std::string& store_name, const std::function<void(ServerOptions&)>& adjust = {});

std::shared_ptr<grpc::Channel> Channel(int port);
// A context with "authorization: Bearer `token`" (no header when `token` is null) and a deadline
// of `seconds`.
std::unique_ptr<grpc::ClientContext> Context(const char* token = kToken, int seconds = 30);

// A unary call of `method` with `bytes` as the serialized request through a generic stub (for
// services without generated stubs here: health, or deliberately undecodable payloads); the
// response bytes go to `out`. Sends the token when `token` is set.
grpc::Status RawUnary(grpc::Channel* channel, const std::string& method, const std::string& bytes,
                      std::string* out, const char* token = nullptr);
// A serialized grpc.health.v1.HealthCheckRequest for `service`.
std::string HealthRequest(const std::string& service);
// grpc.health.v1 SERVING as a serialized HealthCheckResponse.
inline const std::string kServingResponse("\x08\x01", 2);

}  // namespace switchyard::api::testing

#endif  // SWITCHYARD_COORDINATOR_API_API_TEST_UTIL_H_
