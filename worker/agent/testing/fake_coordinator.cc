#include "worker/agent/testing/fake_coordinator.h"

#include "absl/strings/str_cat.h"

namespace switchyard::agent::testing {

class FakeCoordinator::WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  explicit WorkerServiceImpl(FakeCoordinator* c) : c_(c) {}

  grpc::Status Attach(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>* stream) override {
    grpc::Status auth = c_->CheckToken(*context);
    if (!auth.ok()) return auth;
    v1::WorkerMessage first;
    if (!stream->Read(&first)) return grpc::Status::OK;
    if (!first.has_registration() || first.registration().worker_id().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "the first message must be a Registration with a worker_id");
    }
    const std::string id = first.registration().worker_id();
    {
      absl::MutexLock lock(&c_->mu_);
      WorkerRecord& w = c_->workers_[id];
      w.registration = first.registration();
      ++w.registrations;
      w.connected = true;
      c_->streams_[id] = {context, stream};
    }
    v1::WorkerMessage m;
    while (stream->Read(&m)) {
      absl::MutexLock lock(&c_->mu_);
      WorkerRecord& w = c_->workers_[id];
      if (m.has_heartbeat()) {
        ++w.heartbeats;
        ++w.heartbeats_since_last_exit;
        w.last_heartbeat_generation = m.heartbeat().generation();
      } else if (m.has_step()) {
        w.steps.push_back(m.step());
        w.steps_session.push_back(w.registrations);
      } else if (m.has_exit()) {
        w.exits.push_back(m.exit());
        w.heartbeats_since_last_exit = 0;
      }
    }
    absl::MutexLock lock(&c_->mu_);
    auto it = c_->streams_.find(id);
    if (it != c_->streams_.end() && it->second.stream == stream) {
      c_->streams_.erase(it);
      c_->workers_[id].connected = false;
    }
    return grpc::Status::OK;
  }

 private:
  FakeCoordinator* c_;
};

class FakeCoordinator::RendezvousServiceImpl final : public v1::RendezvousService::Service {
 public:
  explicit RendezvousServiceImpl(FakeCoordinator* c) : c_(c) {}

  grpc::Status Set(grpc::ServerContext* context, const v1::RendezvousSetRequest* request,
                   v1::RendezvousSetResponse*) override {
    grpc::Status auth = c_->CheckToken(*context);
    if (!auth.ok()) return auth;
    if (request->job().empty() || request->key().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "job and key are required");
    }
    absl::MutexLock lock(&c_->mu_);
    c_->kv_[{request->job(), request->generation(), request->key()}] = request->value();
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext* context, const v1::RendezvousGetRequest* request,
                   v1::RendezvousGetResponse* response) override {
    grpc::Status auth = c_->CheckToken(*context);
    if (!auth.ok()) return auth;
    const auto key = std::make_tuple(request->job(), request->generation(), request->key());
    absl::MutexLock lock(&c_->mu_);
    auto present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(c_->mu_) { return c_->kv_.count(key) > 0; };
    c_->mu_.AwaitWithTimeout(absl::Condition(&present),
                             absl::Milliseconds(std::max<int64_t>(0, request->timeout_ms())));
    auto it = c_->kv_.find(key);
    if (it == c_->kv_.end()) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          absl::StrCat("rendezvous key '", request->key(), "' of job ",
                                       request->job(), " generation ", request->generation(),
                                       " not set within ", request->timeout_ms(), " ms"));
    }
    response->set_value(it->second);
    return grpc::Status::OK;
  }

 private:
  FakeCoordinator* c_;
};

FakeCoordinator::FakeCoordinator(std::string token, const std::string& tls_cert_pem,
                                 const std::string& tls_key_pem)
    : token_(std::move(token)),
      worker_service_(std::make_unique<WorkerServiceImpl>(this)),
      rendezvous_service_(std::make_unique<RendezvousServiceImpl>(this)) {
  grpc::ServerBuilder builder;
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!tls_cert_pem.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({tls_key_pem, tls_cert_pem});
    creds = grpc::SslServerCredentials(ssl);
  }
  builder.AddListeningPort("127.0.0.1:0", creds, &port_);
  builder.RegisterService(worker_service_.get());
  builder.RegisterService(rendezvous_service_.get());
  server_ = builder.BuildAndStart();
}

FakeCoordinator::~FakeCoordinator() {
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, s] : streams_) s.context->TryCancel();
  }
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

grpc::Status FakeCoordinator::CheckToken(const grpc::ServerContext& context) {
  if (token_.empty()) return grpc::Status::OK;
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  std::string reason;
  if (it == md.end()) {
    reason = "MISSING_TOKEN: no authorization metadata";
  } else if (std::string(it->second.data(), it->second.size()) != "Bearer " + token_) {
    reason = "INVALID_TOKEN: the bearer token does not match";
  } else {
    return grpc::Status::OK;
  }
  absl::MutexLock lock(&mu_);
  ++rejected_;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, reason);
}

bool FakeCoordinator::Send(const std::string& worker_id, const v1::CoordinatorMessage& msg) {
  // Under mu_: the Attach handler cannot return (and free the stream) meanwhile.
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(worker_id);
  if (it == streams_.end()) return false;
  return it->second.stream->Write(msg);
}

void FakeCoordinator::Kick(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(worker_id);
  if (it != streams_.end()) it->second.context->TryCancel();
}

bool FakeCoordinator::WaitUntil(
    const std::function<bool(const std::map<std::string, WorkerRecord>&)>& pred,
    absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pred(workers_); };
  return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
}

std::map<std::string, WorkerRecord> FakeCoordinator::Workers() {
  absl::MutexLock lock(&mu_);
  return workers_;
}

int FakeCoordinator::rejected() const {
  absl::MutexLock lock(&mu_);
  return rejected_;
}

std::vector<std::string> FakeCoordinator::RendezvousKeys() {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> keys;
  for (const auto& [k, v] : kv_) {
    keys.push_back(absl::StrCat(std::get<0>(k), "/", std::get<1>(k), "/", std::get<2>(k)));
  }
  return keys;
}

}  // namespace switchyard::agent::testing
