#include "coordinator/api/server.h"

#include <arpa/inet.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status.h"
#include "coordinator/api/decode_errors.h"
#include "data/corpus.h"

namespace switchyard::api {
namespace {

constexpr const char* kApiServices[] = {"", "switchyard.v1.JobService",
                                        "switchyard.v1.PlanService"};
constexpr const char* kWorkerServices[] = {"switchyard.v1.WorkerService",
                                           "switchyard.v1.RendezvousService",
                                           "switchyard.v1.WorkerAdminService"};

absl::StatusOr<std::string> ReadFile(const std::string& option, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(option, ": cannot read ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty())
    return absl::InvalidArgumentError(absl::StrCat(option, ": ", path, " is empty"));
  return text.str();
}

absl::Status CheckPort(const char* option, int port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(option, ": ", port, " is not in [0, 65535]"));
  }
  return absl::OkStatus();
}

// A port that is free on `host` now: bind port 0, read it back, close.
absl::StatusOr<int> ProbeFreePort(const std::string& host) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (host.empty() || inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
  }
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::UnavailableError("grpc-port: socket() failed probing for a free port");
  socklen_t len = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  if (!ok) return absl::UnavailableError(absl::StrCat("grpc-port: no free port on ", host));
  return static_cast<int>(ntohs(addr.sin_port));
}

// The host part of the default advertise address.
std::string AdvertisedHost(const std::string& host) {
  if (!host.empty() && host != "0.0.0.0" && host != "::" && host != "[::]") return host;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') return name;
  return "127.0.0.1";
}

void SetServing(grpc::Server* server, bool serving, bool workers) {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health == nullptr) return;
  for (const char* service : kApiServices) health->SetServingStatus(service, serving);
  if (!workers) return;
  for (const char* service : kWorkerServices) health->SetServingStatus(service, serving);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Create(
    const ServerOptions& options) {
  if (options.store_path.empty()) return absl::InvalidArgumentError("store: must be set");
  if (options.token_file.empty()) return absl::InvalidArgumentError("token-file: must be set");
  SY_RETURN_IF_ERROR(CheckPort("grpc-port", options.grpc_port));
  SY_RETURN_IF_ERROR(CheckPort("http-port", options.http_port));
  if (options.health_port != -1) SY_RETURN_IF_ERROR(CheckPort("health-port", options.health_port));
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("tls-cert, tls-key: give both or neither");
  }

  if (options.workers && options.worker_token_file.empty()) {
    return absl::InvalidArgumentError(
        "worker-token-file: must be set when workers are served (workers authenticate with "
        "their own token, distinct from the API token; --noworkers serves the API only)");
  }
  if (!options.store_backup.empty()) {
    if (options.store_backup == options.store_path) {
      return absl::InvalidArgumentError("store-backup: must not be the store itself (--store)");
    }
    if (options.store_backup_interval <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("store-backup-interval (",
                       absl::FormatDuration(options.store_backup_interval), ") must be > 0"));
    }
  }

  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  CoordinatorServer* server = s.get();
  s->metrics_ = std::make_unique<metrics::CoordinatorMetrics>();
  s->audit_ = std::make_unique<AuthAudit>(s->metrics_->registry().get());
  SY_ASSIGN_OR_RETURN(s->auth_, TokenAuth::FromFile(options.token_file, kUserRole));
  s->auth_->SetAudit(s->audit_.get());
  // A worker token given without the worker side is still read and checked: the API then names
  // it WRONG_ROLE when a worker token is presented, and a shared token is refused either way.
  if (options.workers || !options.worker_token_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenAuth>> worker_auth =
        TokenAuth::FromFile(options.worker_token_file, kWorkerRole);
    if (!worker_auth.ok()) {
      return absl::Status(worker_auth.status().code(),
                          absl::StrCat("worker-token-file: ", worker_auth.status().message()));
    }
    s->worker_auth_ = *std::move(worker_auth);
    if (s->worker_auth_->SameToken(*s->auth_)) {
      return absl::InvalidArgumentError(
          "worker-token-file: holds the same token as token-file; the worker token must be "
          "distinct from the API token");
    }
    s->worker_auth_->SetAudit(s->audit_.get());
    s->worker_auth_->SetOtherRole(s->auth_.get());
    s->auth_->SetOtherRole(s->worker_auth_.get());
  }
  store::StoreOptions store_options;
  store_options.create_if_missing = options.create_store;
  store_options.max_page_count = options.store_max_page_count;
  store_options.on_corruption = [server](const absl::Status&) { server->OnStoreCorruption(); };
  SY_ASSIGN_OR_RETURN(s->store_, store::Store::Open(options.store_path, store_options));
  jobs::CoordinatorContext context;
  context.checkpoint_root = options.checkpoint_root;
  context.queue_quotas = options.queue_quotas;
  if (absl::StatusOr<CorpusInfo> corpus = FindDefaultCorpus(); corpus.ok()) {
    context.default_vocab_size = corpus->vocab_size;
    SY_LOG(INFO) << "default corpus \"" << corpus->name << "\" in " << corpus->dir
                 << ": jobs without data.data_path get model.vocab_size " << corpus->vocab_size;
  } else {
    SY_LOG(INFO) << "no default corpus (" << corpus.status().message()
                 << "): jobs reading it must set model.vocab_size";
  }
  s->registry_ = std::make_unique<jobs::JobRegistry>(s->store_.get(), context);
  metrics::CoordinatorMetrics* metrics = s->metrics_.get();
  s->hub_ = std::make_unique<jobs::JobHub>(
      s->registry_.get(),
      [metrics](const v1::Job& job, absl::string_view reason) {
        metrics->CountTransition(job.state(), reason);
      },
      options.checkpoint_root,
      /*make_job_directories=*/options.workers);
  jobs::JobHub* hub = s->hub_.get();
  s->metrics_->SetJobCounter([hub]() -> absl::StatusOr<std::map<v1::Job::State, int64_t>> {
    std::map<v1::Job::State, int64_t> counts;
    v1::ListJobsRequest request;
    request.set_page_size(jobs::kMaxPageSize);
    do {
      SY_ASSIGN_OR_RETURN(v1::ListJobsResponse page, hub->ListJobs(request));
      for (const v1::Job& job : page.jobs()) ++counts[job.state()];
      request.set_page_token(page.next_page_token());
    } while (!request.page_token().empty());
    return counts;
  });
  // The scheduler's last pass (scheduler.h "Queues"); nothing before its first one.
  s->metrics_->SetQueueCounter([hub]() {
    std::vector<metrics::QueueGauges> out;
    for (const jobs::JobHub::QueueUsage& u : hub->QueueState()) {
      out.push_back({u.queue, u.quota, u.workers_in_use, u.pending});
    }
    return out;
  });
  int grpc_port = options.grpc_port;
  jobs::StepHub* steps = nullptr;
  if (options.workers) {
    if (options.checkpoint_root.empty()) {
      return absl::InvalidArgumentError("checkpoint-root: must be set when workers are served");
    }
    for (const auto& [flag, root] :
         {std::pair<const char*, const std::string*>{"checkpoint-root", &options.checkpoint_root},
          {"data-root", &options.data_root}}) {
      if (root->empty() || root->front() != '/') {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, " (\"", *root, "\"): must be an absolute path"));
      }
    }
    if (grpc_port == 0) {
      SY_ASSIGN_OR_RETURN(grpc_port, ProbeFreePort(options.host));
    }
    s->advertise_address_ = options.advertise_address.empty()
                                ? absl::StrCat(AdvertisedHost(options.host), ":", grpc_port)
                                : options.advertise_address;
    api::WorkerPlaneOptions plane_options = options.worker_options;
    plane_options.scheduler.checkpoint_root = options.checkpoint_root;
    plane_options.scheduler.data_root = options.data_root;
    plane_options.scheduler.rendezvous_address = s->advertise_address_;
    SY_ASSIGN_OR_RETURN(s->plane_, api::WorkerPlane::Create(s->store_.get(), hub,
                                                            s->worker_auth_.get(), plane_options));
    steps = s->plane_->steps();
    cluster::WorkerRegistry* registry = s->plane_->registry();
    s->metrics_->SetWorkerCounter([registry]() -> int64_t {
      return registry->CountInState(cluster::WorkerState::kIdle) +
             registry->CountInState(cluster::WorkerState::kBusy);
    });
  }
  s->job_service_ = std::make_unique<JobServiceImpl>(hub, s->auth_.get(), metrics, steps);
  s->plan_service_ = std::make_unique<PlanServiceImpl>(s->auth_.get(), metrics, context, hub);
  const cluster::WorkerRegistry* registry = s->plane_ != nullptr ? s->plane_->registry() : nullptr;
  if (registry != nullptr) {
    s->worker_admin_service_ =
        std::make_unique<WorkerAdminServiceImpl>(s->auth_.get(), metrics, registry);
  }

  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (!options.tls_cert_file.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    SY_ASSIGN_OR_RETURN(pair.cert_chain, ReadFile("tls-cert", options.tls_cert_file));
    SY_ASSIGN_OR_RETURN(pair.private_key, ReadFile("tls-key", options.tls_key_file));
    ssl.pem_key_cert_pairs.push_back(std::move(pair));
    credentials = grpc::SslServerCredentials(ssl);
    s->tls_ = true;
  } else {
    credentials = grpc::InsecureServerCredentials();
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(options.host, ":", grpc_port);
  // gRPC sets SO_REUSEPORT by default, which would let a second coordinator bind the same port
  // and split the traffic; refuse instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(address, credentials, &s->grpc_port_);
  builder.experimental().SetInterceptorCreators(DecodeErrorInterceptors());
  builder.RegisterService(s->job_service_.get());
  builder.RegisterService(s->plan_service_.get());
  if (s->worker_admin_service_ != nullptr) {
    builder.RegisterService(s->worker_admin_service_.get());
  }
  if (s->plane_ != nullptr) s->plane_->RegisterServices(&builder);
  s->grpc_server_ = builder.BuildAndStart();
  if (s->grpc_server_ == nullptr || s->grpc_port_ == 0) {
    s->grpc_server_.reset();
    return absl::UnavailableError(absl::StrCat("grpc: cannot listen on ", address));
  }
  if (s->plane_ != nullptr) SY_RETURN_IF_ERROR(s->plane_->Start());
  SetServing(s->grpc_server_.get(), true, s->plane_ != nullptr);
  if (options.health_port != -1) {
    // Its own server (the default health service is per server): no API service is registered,
    // so nothing but Health answers here, in plaintext even when the main port serves TLS.
    grpc::ServerBuilder health_builder;
    const std::string health_address = absl::StrCat(options.host, ":", options.health_port);
    health_builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    health_builder.AddListeningPort(health_address, grpc::InsecureServerCredentials(),
                                    &s->health_port_);
    s->health_server_ = health_builder.BuildAndStart();
    if (s->health_server_ == nullptr || s->health_port_ == 0) {
      s->health_server_.reset();
      return absl::UnavailableError(absl::StrCat("health-port: cannot listen on ", health_address));
    }
    SetServing(s->health_server_.get(), true, s->plane_ != nullptr);
  }
  {
    absl::MutexLock lock(&s->health_mu_);
    s->health_targets_ = {s->grpc_server_.get()};
    if (s->health_server_ != nullptr) s->health_targets_.push_back(s->health_server_.get());
    if (s->store_corrupt_) {
      for (grpc::Server* target : s->health_targets_) {
        SetServing(target, false, s->plane_ != nullptr);
      }
    }
  }

  SY_ASSIGN_OR_RETURN(
      s->rest_, RestGateway::Create(hub, s->auth_.get(), metrics, options.host, options.http_port,
                                    options.tls_cert_file, options.tls_key_file, steps, registry,
                                    options.http_limits));
  if (!options.store_backup.empty()) {
    s->store_backup_ = options.store_backup;
    s->backup_thread_ = std::thread(&CoordinatorServer::BackupLoop, server, options.store_backup,
                                    options.store_backup_interval);
  }
  return s;
}

void CoordinatorServer::OnStoreCorruption() {
  absl::MutexLock lock(&health_mu_);
  store_corrupt_ = true;
  for (grpc::Server* target : health_targets_) SetServing(target, false, plane_ != nullptr);
  SY_LOG(ERROR) << "health: NOT_SERVING until the coordinator is restarted on a good store ("
                << store_->path() << ")";
}

void CoordinatorServer::BackupOnce(const std::string& path) {
  absl::StatusOr<store::BackupResult> backup = store_->Backup(path);
  if (backup.ok()) {
    SY_LOG(INFO) << "store backup: " << store_->path() << " -> " << path << ", " << backup->bytes
                 << " bytes, " << backup->pages << " pages in "
                 << absl::FormatDuration(backup->elapsed);
  } else {
    SY_LOG(ERROR) << "store backup to " << path
                  << " failed (the previous backup is kept): " << backup.status();
  }
}

void CoordinatorServer::BackupLoop(const std::string& path, absl::Duration interval) {
  do {
    BackupOnce(path);
  } while (!stop_backups_.WaitForNotificationWithTimeout(interval));
}

void CoordinatorServer::Shutdown(absl::Time deadline) {
  if (shut_down_) return;
  shut_down_ = true;
  const absl::Time start = absl::Now();
  if (grpc_server_ != nullptr) SetServing(grpc_server_.get(), false, plane_ != nullptr);
  {
    absl::MutexLock lock(&health_mu_);
    health_targets_.clear();
  }
  if (health_server_ != nullptr) SetServing(health_server_.get(), false, plane_ != nullptr);
  if (hub_ != nullptr) hub_->Close();
  if (plane_ != nullptr) plane_->Shutdown();
  if (rest_ != nullptr) rest_->Stop();
  const absl::Time rest_stopped = absl::Now();
  if (grpc_server_ != nullptr) {
    grpc_server_->Shutdown(absl::ToChronoTime(deadline));
    grpc_server_->Wait();
  }
  if (health_server_ != nullptr) {
    health_server_->Shutdown(absl::ToChronoTime(deadline));
    health_server_->Wait();
  }
  if (backup_thread_.joinable()) {
    stop_backups_.Notify();
    backup_thread_.join();
    // No API call is in flight any more: this copy has every job the coordinator accepted.
    BackupOnce(store_backup_);
  }
  if (rest_ == nullptr) return;  // Create failed: nothing was serving
  SY_LOG(INFO) << "shutdown: REST stopped in " << absl::FormatDuration(rest_stopped - start)
               << ", gRPC in " << absl::FormatDuration(absl::Now() - rest_stopped);
}

CoordinatorServer::~CoordinatorServer() { Shutdown(absl::Now() + absl::Seconds(5)); }

}  // namespace switchyard::api
