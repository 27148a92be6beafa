// File: worker/agent/testing/fake_coordinator.h
//
// A small, real coordinator for the agent's tests: a gRPC server on 127.0.0.1 (an ephemeral
// port) implementing WorkerService.Attach and RendezvousService as WORKER_PROTOCOL.md says, with
// the bearer-token check of coordinator/api/auth.h (UNAUTHENTICATED "MISSING_TOKEN" /
// "INVALID_TOKEN"). It has no scheduler: the test drives the workers with Send() and reads what
// they reported. Thread-safe.
#ifndef SWITCHYARD_WORKER_AGENT_TESTING_FAKE_COORDINATOR_H_
#define SWITCHYARD_WORKER_AGENT_TESTING_FAKE_COORDINATOR_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "switchyard/v1/worker.grpc.pb.h"

namespace switchyard::agent::testing {

// What one worker (by worker_id) has sent over all its streams.
struct WorkerRecord {
  v1::Registration registration;
  int registrations = 0;  // one per (re)attached stream
  int64_t heartbeats = 0;
  int64_t last_heartbeat_generation = -1;
  std::vector<v1::StepReport> steps;
  std::vector<int> steps_session;  // registrations count when each step arrived
  std::vector<v1::WorkerExit> exits;
  int64_t heartbeats_since_last_exit = 0;
  bool connected = false;
};

class FakeCoordinator {
 public:
  // `token` empty: no authentication. With `tls_cert_pem` and `tls_key_pem` (PEM text) the
  // server speaks TLS only.
  explicit FakeCoordinator(std::string token, const std::string& tls_cert_pem = "",
                           const std::string& tls_key_pem = "");
  ~FakeCoordinator();

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  // Sends `msg` on the current stream of `worker_id`; false when it has none or the write fails.
  bool Send(const std::string& worker_id, const v1::CoordinatorMessage& msg);
  // Ends the current stream of `worker_id` from the server side (a coordinator going away).
  void Kick(const std::string& worker_id);
  // Waits until `pred(workers)` holds, up to `timeout`.
  bool WaitUntil(const std::function<bool(const std::map<std::string, WorkerRecord>&)>& pred,
                 absl::Duration timeout);
  // A copy of the records (taken under the lock): bind its parts by value, not by reference.
  std::map<std::string, WorkerRecord> Workers();
  // Number of Attach calls rejected for authentication.
  int rejected() const;
  // Rendezvous keys set so far, as "job/generation/key".
  std::vector<std::string> RendezvousKeys();

 private:
  class WorkerServiceImpl;
  class RendezvousServiceImpl;
  grpc::Status CheckToken(const grpc::ServerContext& context);

  const std::string token_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<RendezvousServiceImpl> rendezvous_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;

  mutable absl::Mutex mu_;
  std::map<std::string, WorkerRecord> workers_ ABSL_GUARDED_BY(mu_);
  struct Stream {
    grpc::ServerContext* context = nullptr;
    grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream = nullptr;
  };
  std::map<std::string, Stream> streams_ ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<std::string, int64_t, std::string>, std::string> kv_ ABSL_GUARDED_BY(mu_);
  int rejected_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace switchyard::agent::testing

#endif  // SWITCHYARD_WORKER_AGENT_TESTING_FAKE_COORDINATOR_H_
