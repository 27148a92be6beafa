// File: coordinator/api/worker_test_util.cc
#include "coordinator/api/worker_test_util.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace switchyard::api::testing {

v1::JobSpec SmallSpec(int min_workers, int max_workers, int max_restarts) {
  v1::JobSpec spec;
  spec.set_display_name("fake-workers");
  v1::ModelConfig* m = spec.mutable_model();
  m->set_num_layers(2);
  m->set_hidden_size(256);
  m->set_num_attention_heads(4);
  m->set_ffn_hidden_size(1024);
  m->set_vocab_size(1024);
  m->set_seq_length(128);
  m->set_num_experts(12);
  m->set_moe_router_topk(2);
  m->set_moe_ffn_hidden_size(256);
  m->set_moe_token_dispatcher_type("alltoall");
  spec.mutable_training()->set_train_iters(10);
  spec.mutable_training()->set_micro_batch_size(1);
  spec.mutable_training()->set_global_batch_size(12);
  spec.mutable_data()->set_mock_data(true);
  spec.set_min_workers(min_workers);
  spec.set_max_workers(max_workers);
  spec.set_max_restarts(max_restarts);
  return spec;
}

WorkerPlaneOptions FastOptions(const std::string& checkpoint_root) {
  WorkerPlaneOptions options;
  options.registry.heartbeat_timeout = absl::Seconds(1);
  options.registry.monitor_interval = absl::Milliseconds(100);
  options.registry.persist_interval = absl::Seconds(2);
  options.scheduler.checkpoint_root = checkpoint_root;
  options.scheduler.rendezvous_address = "coordinator.test:7070";
  options.scheduler.tick = absl::Milliseconds(20);
  options.scheduler.rescan_interval = absl::Milliseconds(500);
  options.scheduler.stop_timeout = absl::Seconds(3);
  options.scheduler.adopt_grace = absl::Seconds(3);
  return options;
}

std::unique_ptr<Harness> Harness::Start(const std::string& store_name, bool fresh,
                                        WorkerPlaneOptions options,
                                        std::map<std::string, int32_t> queue_quotas) {
  std::unique_ptr<Harness> h(new Harness());
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path =
      fresh ? FreshPath(store_name) : absl::StrCat(dir != nullptr ? dir : "/tmp", "/", store_name);
  if (options.scheduler.checkpoint_root.empty()) {
    options = FastOptions(absl::StrCat(dir != nullptr ? dir : "/tmp", "/checkpoints"));
  }
  auto store = store::Store::Open(path);
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return nullptr;
  h->store_ = *std::move(store);
  jobs::CoordinatorContext context;
  context.checkpoint_root = options.scheduler.checkpoint_root;
  context.queue_quotas = std::move(queue_quotas);
  h->registry_ = std::make_unique<jobs::JobRegistry>(h->store_.get(), context);
  h->hub_ = std::make_unique<jobs::JobHub>(h->registry_.get());
  auto auth = api::TokenAuth::FromToken(kWorkerToken, api::kWorkerRole);
  EXPECT_TRUE(auth.ok()) << auth.status();
  h->auth_ = *std::move(auth);
  auto plane = WorkerPlane::Create(h->store_.get(), h->hub_.get(), h->auth_.get(), options);
  EXPECT_TRUE(plane.ok()) << plane.status();
  if (!plane.ok()) return nullptr;
  h->plane_ = *std::move(plane);
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &h->port_);
  h->plane_->RegisterServices(&builder);
  h->server_ = builder.BuildAndStart();
  EXPECT_NE(h->server_, nullptr);
  EXPECT_GT(h->port_, 0);
  absl::Status started = h->plane_->Start();
  EXPECT_TRUE(started.ok()) << started;
  return h;
}

Harness::~Harness() { Stop(); }

void Harness::Stop() {
  if (stopped_) return;
  stopped_ = true;
  plane_->Shutdown();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server_->Wait();
}

std::string Harness::address() const { return absl::StrCat("127.0.0.1:", port_); }

std::string Harness::Submit(const v1::JobSpec& spec) {
  v1::CreateJobRequest request;
  *request.mutable_spec() = spec;
  absl::StatusOr<v1::Job> job = hub_->CreateJob(request);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? job->name() : "";
}

v1::Job Harness::WaitForState(const std::string& name, v1::Job::State state,
                              absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  v1::Job job;
  while (true) {
    absl::StatusOr<v1::Job> read = hub_->GetJob(name);
    if (read.ok()) job = *read;
    if ((read.ok() && read->state() == state) || absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(v1::Job::State_Name(job.state()), v1::Job::State_Name(state))
      << name << " failure_reason: " << job.failure_reason();
  return job;
}

std::shared_ptr<grpc::Channel> MakeChannel(int port, int channel_id) {
  grpc::ChannelArguments args;
  // Distinct arguments give distinct connections (no subchannel sharing).
  args.SetInt("switchyard.test_channel_id", channel_id);
  return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials(), args);
}

FakeWorker::FakeWorker(std::shared_ptr<grpc::Channel> channel, std::string id, std::string host)
    : channel_(std::move(channel)),
      stub_(v1::WorkerService::NewStub(channel_)),
      id_(std::move(id)),
      host_(std::move(host)) {}

FakeWorker::~FakeWorker() {
  bool ended;
  {
    absl::MutexLock lock(&mu_);
    ended = ended_;
  }
  if (stream_ != nullptr && !ended) context_.TryCancel();
  if (reader_.joinable()) reader_.join();
}

void FakeWorker::set_assignment(const v1::Assignment& assignment) {
  absl::MutexLock lock(&mu_);
  assignment_ = assignment;
}

void FakeWorker::Attach(const char* token, bool register_first) {
  if (token != nullptr) context_.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  attach_started_ = absl::Now();
  stream_ = stub_->Attach(&context_);
  {
    absl::MutexLock lock(&mu_);
    started_ = true;
  }
  v1::WorkerMessage message;
  v1::Registration* r = message.mutable_registration();
  r->set_worker_id(id_);
  r->set_host(host_);
  r->set_version("fake-0");
  r->set_job(scope_);
  if (register_first) Write(message);
  reader_ = std::thread([this] { ReadLoop(); });
}

void FakeWorker::Write(const v1::WorkerMessage& message) {
  absl::MutexLock lock(&write_mu_);
  if (writes_done_ || stream_ == nullptr) return;
  stream_->Write(message);
}

void FakeWorker::SendRaw(const v1::WorkerMessage& message) { Write(message); }

void FakeWorker::Heartbeat() {
  v1::WorkerMessage message;
  {
    absl::MutexLock lock(&mu_);
    message.mutable_heartbeat()->set_generation(assignment_ ? assignment_->generation() : 0);
  }
  Write(message);
}

void FakeWorker::SendStep(int64_t step, double loss, std::optional<double> validation_loss) {
  v1::WorkerMessage message;
  {
    absl::MutexLock lock(&mu_);
    if (!assignment_) return;
    v1::StepReport* report = message.mutable_step();
    report->set_job(assignment_->job());
    report->set_generation(assignment_->generation());
    report->set_rank(assignment_->rank());
    report->mutable_metrics()->set_step(step);
    report->mutable_metrics()->set_loss(loss);
    if (validation_loss.has_value()) {
      report->mutable_metrics()->set_validation_loss(*validation_loss);
      report->mutable_metrics()->set_validation_perplexity(std::exp(*validation_loss));
    }
  }
  Write(message);
}

void FakeWorker::SendExit(int32_t code, const std::string& text) {
  v1::WorkerMessage message;
  {
    absl::MutexLock lock(&mu_);
    if (!assignment_) return;
    v1::WorkerExit* exit = message.mutable_exit();
    exit->set_job(assignment_->job());
    exit->set_generation(assignment_->generation());
    exit->set_exit_code(code);
    exit->set_message(text);
    assignment_.reset();
  }
  Write(message);
}

void FakeWorker::ReadLoop() {
  v1::CoordinatorMessage message;
  while (stream_->Read(&message)) {
    bool ack = false;
    {
      absl::MutexLock lock(&mu_);
      if (message.has_assignment()) assignment_ = message.assignment();
      if (message.has_stop() && assignment_ && ack_stop_) ack = true;
      inbox_.push_back({message, absl::Now()});
      history_.push_back({message, absl::Now()});
    }
    if (ack) SendExit(143, "stopped on request");
  }
  grpc::Status status;
  {
    absl::MutexLock lock(&write_mu_);
    writes_done_ = true;
    status = stream_->Finish();
  }
  absl::MutexLock lock(&mu_);
  ended_ = true;
  end_status_ = status;
}

grpc::Status FakeWorker::Close() {
  {
    absl::MutexLock lock(&write_mu_);
    if (!writes_done_) {
      writes_done_ = true;
      stream_->WritesDone();
    }
  }
  std::optional<grpc::Status> status = WaitForEnd();
  return status ? *status : grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no end");
}

std::optional<FakeWorker::Received> FakeWorker::WaitFor(v1::CoordinatorMessage::MsgCase kind,
                                                        absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (true) {
    while (!inbox_.empty()) {
      Received r = std::move(inbox_.front());
      inbox_.pop_front();
      if (r.message.msg_case() == kind) return r;
    }
    if (ended_) return std::nullopt;
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !inbox_.empty() || ended_; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) return std::nullopt;
  }
}

std::optional<grpc::Status> FakeWorker::WaitForEnd(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&ended_), timeout)) return std::nullopt;
  return end_status_;
}

std::vector<FakeWorker::Received> FakeWorker::History() const {
  absl::MutexLock lock(&mu_);
  return history_;
}

int FakeWorker::CountReceived(v1::CoordinatorMessage::MsgCase kind) const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const Received& r : history_) n += r.message.msg_case() == kind ? 1 : 0;
  return n;
}

std::optional<v1::Assignment> FakeWorker::assignment() const {
  absl::MutexLock lock(&mu_);
  return assignment_;
}

HeartbeatTicker::HeartbeatTicker(std::vector<FakeWorker*> workers, absl::Duration interval)
    : workers_(std::move(workers)), interval_(interval) {
  thread_ = std::thread([this] {
    while (true) {
      std::vector<FakeWorker*> workers;
      {
        absl::MutexLock lock(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(&stop_), interval_);
        if (stop_) return;
        workers = workers_;
      }
      for (FakeWorker* w : workers) {
        if (w->heartbeating()) w->Heartbeat();
      }
    }
  });
}

HeartbeatTicker::~HeartbeatTicker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void HeartbeatTicker::Add(FakeWorker* worker) {
  absl::MutexLock lock(&mu_);
  workers_.push_back(worker);
}

}  // namespace switchyard::api::testing
