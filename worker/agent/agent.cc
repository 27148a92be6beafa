#include "worker/agent/agent.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/config/job_paths.h"
#include "common/version.h"
#include "worker/agent/coordinator_channel.h"

namespace switchyard::agent {
namespace {

absl::StatusOr<Device> PickDevice(const std::string& name) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (name == "cpu") return Device::Cpu();
  if (name == "auto") return count > 0 ? Device::Cuda(0) : Device::Cpu();
  int index = 0;
  if (name != "cuda" && !(absl::StartsWith(name, "cuda:") &&
                          absl::SimpleAtoi(name.substr(5), &index) && index >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("device: expected auto, cpu, cuda or cuda:N, got \"", name, "\""));
  }
  if (index >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", name, ": only ", count, " CUDA device(s) visible"));
  }
  return Device::Cuda(index);
}

absl::StatusOr<v1::GpuInfo> QueryGpu(int index) {
  cudaDeviceProp prop;
  const cudaError_t err = cudaGetDeviceProperties(&prop, index);
  if (err != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("cudaGetDeviceProperties(", index, "): ", cudaGetErrorString(err)));
  }
  v1::GpuInfo gpu;
  gpu.set_name(prop.name);
  const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  std::string uuid = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) uuid += '-';
    absl::StrAppendFormat(&uuid, "%02x", b[i]);
  }
  gpu.set_uuid(uuid);
  gpu.set_memory_bytes(static_cast<int64_t>(prop.totalGlobalMem));
  gpu.set_compute_capability_major(prop.major);
  gpu.set_compute_capability_minor(prop.minor);
  return gpu;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Agent>> Agent::Create(AgentOptions options) {
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("coordinator: required (host:port of the coordinator)");
  }
  if (!options.job.empty()) {
    if (!ParseJobName(options.job).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--job (\"", options.job,
                       "\"): must be a job name jobs/<id>, id a positive integer (jobs/3)"));
    }
  }
  if (options.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("heartbeat_interval must be > 0");
  }
  for (const auto& [name, root] : {std::pair<const char*, const std::string*>{
                                       "checkpoint_root", &options.roots.checkpoint_root},
                                   {"data_root", &options.roots.data_root}}) {
    if (root->empty() || root->front() != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " (\"", *root, "\"): must be an absolute path"));
    }
  }
  if (options.comm_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("comm_timeout must be > 0");
  }
  if (options.stop_report_after <= absl::ZeroDuration() ||
      options.stop_grace < options.stop_report_after) {
    return absl::InvalidArgumentError("stop_report_after must be > 0 and <= stop_grace");
  }
  if (options.reconnect_initial_backoff <= absl::ZeroDuration() ||
      options.reconnect_max_backoff < options.reconnect_initial_backoff) {
    return absl::InvalidArgumentError(
        "reconnect_initial_backoff must be > 0 and <= reconnect_max_backoff");
  }
  std::unique_ptr<Agent> agent(new Agent(std::move(options)));
  const AgentOptions& o = agent->options_;
  if (!o.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(o.token_file);
    if (!token.ok()) return token.status();
    agent->token_ = *token;
  }
  absl::StatusOr<Device> device = PickDevice(o.device);
  if (!device.ok()) return device.status();
  agent->device_ = *device;
  if (device->is_cuda()) {
    absl::StatusOr<v1::GpuInfo> gpu = QueryGpu(device->index);
    if (!gpu.ok()) return gpu.status();
    agent->gpu_ = *gpu;
    agent->has_gpu_ = true;
  }
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "unknown");
  agent->host_ = host;
  agent->worker_id_ = o.worker_id.empty() ? absl::StrCat(agent->host_, ":", getpid(), ":",
                                                         absl::ToUnixMillis(absl::Now()))
                                          : o.worker_id;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      MakeCoordinatorChannel(o.coordinator, o.tls_root_cert);
  if (!channel.ok()) return channel.status();
  agent->channel_ = *channel;
  agent->stub_ = v1::WorkerService::NewStub(agent->channel_);
  absl::StatusOr<std::unique_ptr<WorkerMetrics>> metrics =
      WorkerMetrics::Create(o.metrics_bind_address, o.metrics_port);
  if (!metrics.ok()) return metrics.status();
  agent->metrics_ = std::move(*metrics);
  agent->metrics_->SetGeneration(0);
  return agent;
}

Agent::~Agent() {
  Shutdown();
  absl::MutexLock g(&gen_mu_);
  EndGeneration("worker shutting down");
  ReapStopping();
}

void Agent::Log(const std::string& line) const {
  if (options_.log)
    std::fprintf(stderr, "switchyard-worker %s: %s\n", worker_id_.c_str(), line.c_str());
}

v1::WorkerMessage Agent::RegistrationMessage() const {
  v1::WorkerMessage msg;
  v1::Registration* r = msg.mutable_registration();
  r->set_worker_id(worker_id_);
  r->set_host(host_);
  if (has_gpu_) *r->mutable_gpu() = gpu_;
  r->set_version(kVersion);
  r->set_job(options_.job);
  return msg;
}

std::string Agent::job_end_state() const {
  absl::MutexLock lock(&mu_);
  return job_end_state_;
}

void Agent::Handle(const v1::CoordinatorMessage& msg) {
  if (WaitShutdown(absl::ZeroDuration())) {
    // Going away: take no new work (the stream closes once the current generation has ended).
    if (msg.has_assignment()) {
      SendExit(msg.assignment(), kStoppedExitCode, "worker shutting down");
    } else {
      Log("ignored a command: the worker is shutting down");
    }
    return;
  }
  if (msg.has_job_ended()) {
    const v1::JobEnded& ended = msg.job_ended();
    if (options_.job.empty() || ended.job() != options_.job) {
      Log(absl::StrCat("ignored JobEnded for ", ended.job(), ": this worker is ",
                       options_.job.empty() ? "not scoped to a job" : "scoped to " + options_.job));
      return;
    }
    Log(absl::StrCat("job ", ended.job(), " ended ", ended.state(),
                     ended.message().empty() ? "" : " (" + ended.message() + ")",
                     "; this worker was scoped to it (--job) and exits"));
    {
      absl::MutexLock lock(&mu_);
      job_end_state_ = ended.state();
    }
    Shutdown();  // the writer ends any generation (WorkerExit 143) and closes the stream
    return;
  }
  absl::MutexLock g(&gen_mu_);
  switch (msg.msg_case()) {
    case v1::CoordinatorMessage::kAssignment:
      if (!options_.job.empty() && msg.assignment().job() != options_.job) {
        // The coordinator never does this (scheduler.h "Job-scoped workers"): refuse, permanently.
        SendExit(msg.assignment(), 1,
                 absl::StrCat("this worker is scoped to ", options_.job, " (--job), not ",
                              msg.assignment().job()));
        break;
      }
      assigned_once_.store(true);
      OnAssignment(msg.assignment());
      break;
    case v1::CoordinatorMessage::kStart:
      OnStart();
      break;
    case v1::CoordinatorMessage::kCheckpoint:
      if (gen_ != nullptr && gen_->started && !gen_->done.HasBeenNotified()) {
        gen_->control.RequestCheckpoint();
      } else {
        Log("CheckpointNow ignored: no generation is running");
      }
      break;
    case v1::CoordinatorMessage::kStop:
      if (gen_ != nullptr && !gen_->done.HasBeenNotified()) {
        EndGeneration(absl::StrCat("Stop: ", msg.stop().reason()));
      } else {
        Log("Stop ignored: no generation is running");
      }
      break;
    default:
      Log("ignored an empty or unknown coordinator message");
  }
}

void Agent::OnAssignment(const v1::Assignment& a) {
  if (gen_ != nullptr) {
    const v1::Assignment& cur = gen_->prepared.assignment;
    if (cur.job() == a.job() && cur.generation() == a.generation() && cur.rank() == a.rank() &&
        !gen_->done.HasBeenNotified()) {
      Log(absl::StrCat("Assignment of job ", a.job(), " generation ", a.generation(),
                       " repeated: kept the current one"));
      return;
    }
    EndGeneration(absl::StrCat("new assignment: job ", a.job(), " generation ", a.generation()));
  }
  absl::StatusOr<PreparedGeneration> prepared = PrepareGeneration(a, device_, options_.roots);
  if (!prepared.ok()) {
    SendExit(a, ExitCodeFor(prepared.status()), prepared.status().ToString());
    return;
  }
  gen_ = std::make_unique<Generation>();
  gen_->prepared = std::move(*prepared);
  generation_.store(a.generation());
  metrics_->SetGeneration(a.generation());
  Log(absl::StrCat("assigned job ", a.job(), " generation ", a.generation(), " rank ", a.rank(),
                   "/", a.world_size()));
}

void Agent::OnStart() {
  if (gen_ == nullptr || gen_->started) {
    Log("Start ignored: no prepared assignment");
    return;
  }
  if (!ReapStopping()) {
    SendExit(gen_->prepared.assignment, ExitCodeFor(absl::UnavailableError("")),
             "the previous generation's training thread did not stop; restarting the worker");
    gen_->exit_sent.store(true);
    gen_.reset();
    generation_.store(0);
    return;
  }
  gen_->started = true;
  Generation* g = gen_.get();
  g->thread = std::thread([this, g] { TrainingThread(g); });
}

void Agent::EndGeneration(const std::string& reason) {
  if (gen_ == nullptr) return;
  Generation* g = gen_.get();
  const v1::Assignment& a = g->prepared.assignment;
  if (!g->started) {
    generation_.store(0);
    metrics_->SetGeneration(0);
    if (!g->exit_sent.exchange(true)) SendExit(a, kStoppedExitCode, reason + " (before Start)");
    gen_.reset();
    return;
  }
  g->control.RequestStop(reason);
  g->stop_requested_at = absl::Now();
  if (g->done.WaitForNotificationWithTimeout(options_.stop_report_after)) {
    g->thread.join();
    gen_.reset();
    return;
  }
  // The communicators are aborted but the thread is still inside a collective that the transport
  // does not interrupt at once: report the end of the generation now, and let the thread unwind
  // in the background (ReapStopping waits for it before anything else starts).
  if (!g->exit_sent.exchange(true)) {
    generation_.store(0);
    metrics_->SetGeneration(0);
    SendExit(a, kStoppedExitCode,
             absl::StrCat(reason,
                          " (communicators aborted; the training thread is still "
                          "unwinding)"));
  }
  ReapStopping();  // at most one generation unwinds at a time
  stopping_ = std::move(gen_);
}

bool Agent::ReapStopping() {
  if (stopping_ == nullptr) return true;
  Generation* g = stopping_.get();
  const absl::Duration left = g->stop_requested_at + options_.stop_grace - absl::Now();
  if (g->done.WaitForNotificationWithTimeout(std::max(left, absl::ZeroDuration()))) {
    g->thread.join();
    stopping_.reset();
    return true;
  }
  const v1::Assignment& a = g->prepared.assignment;
  Fatal(absl::UnavailableError(absl::StrCat(
      "job ", a.job(), " generation ", a.generation(), ": the training thread did not stop within ",
      absl::FormatDuration(options_.stop_grace),
      " after aborting its communicators; the process must be restarted")));
  // The thread still uses the generation: leave both to the process exit.
  g->thread.detach();
  (void)stopping_.release();
  return false;
}

void Agent::TrainingThread(Generation* g) {
  const v1::Assignment& a = g->prepared.assignment;
  GenerationEnv env;
  env.rendezvous_address =
      a.rendezvous_address().empty() ? options_.coordinator : a.rendezvous_address();
  absl::Status st;
  if (env.rendezvous_address == options_.coordinator) {
    env.rendezvous_channel = channel_;
  } else {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        MakeCoordinatorChannel(env.rendezvous_address, options_.tls_root_cert);
    if (channel.ok()) {
      env.rendezvous_channel = *channel;
    } else {
      st = channel.status();
    }
  }
  env.token = token_;
  env.worker_id = worker_id_;
  env.gloo_host = options_.gloo_host;
  env.comm_timeout = options_.comm_timeout;
  env.peak_tflops = options_.peak_tflops;
  env.on_step = [this, g, &a](const v1::StepMetrics& m) {
    if (g->exit_sent.load()) return;  // stopped and reported: nothing more from it
    metrics_->Record(m);
    v1::WorkerMessage msg;
    v1::StepReport* r = msg.mutable_step();
    r->set_job(a.job());
    r->set_generation(a.generation());
    r->set_rank(a.rank());
    *r->mutable_metrics() = m;
    Enqueue(std::move(msg));
  };
  // Every rank reports its saves (the coordinator records rank 0's): a preemption waits for the
  // reply to its CheckpointNow before it stops the generation.
  env.on_saved = [this, g, &a](int64_t step, const std::string& dir, bool requested) {
    if (g->exit_sent.load()) return;
    v1::WorkerMessage msg;
    v1::CheckpointSaved* c = msg.mutable_checkpoint_saved();
    c->set_job(a.job());
    c->set_generation(a.generation());
    c->set_rank(a.rank());
    c->set_step(step);
    c->set_dir(dir);
    c->set_requested(requested);
    Enqueue(std::move(msg));
  };
  env.log = [this, &a](const std::string& line) {
    Log(absl::StrCat("job ", a.job(), " generation ", a.generation(), " rank ", a.rank(), ": ",
                     line));
  };
  if (st.ok()) st = RunGeneration(g->prepared, env, &g->control);
  int code = 0;
  std::string message = "finished";
  if (g->control.stop_requested()) {
    code = kStoppedExitCode;
    std::string reason = g->control.stop_reason();
    if (reason.empty()) reason = "stopped on request";
    message = st.ok() ? reason : absl::StrCat(reason, " (", st.ToString(), ")");
  } else if (!st.ok()) {
    code = ExitCodeFor(st);
    message = st.ToString();
  }
  if (!g->exit_sent.exchange(true)) {
    generation_.store(0);
    metrics_->SetGeneration(0);
    SendExit(a, code, message);
  }
  g->done.Notify();
}

}  // namespace switchyard::agent
