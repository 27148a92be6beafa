// switchyard-coordinator: the Switchyard control plane (JobService, PlanService, REST gateway,
// health, reflection, /metrics) over one SQLite store.
//
//   switchyard-coordinator --store FILE --grpc-port P --http-port Q --token-file F
//                          --worker-token-file W [--create-store]
//                          [--store-backup FILE [--store-backup-interval 10m]]
//                          [--host ADDR] [--tls-cert PEM --tls-key PEM] [--health-port H]
//                          [--checkpoint-root DIR] [--data-root DIR]
//                          [--advertise-address HOST:PORT] [--require-job-scoped-workers]
//                          [--noworkers]
//
// Port 0 picks a free port. Once both servers listen, one line goes to stdout (and is flushed) so
// scripts and tests can read the ports; it shows the addresses bound (with the default --host
// 0.0.0.0: grpc=0.0.0.0:50051 http=0.0.0.0:8080, every interface):
//
//   switchyard-coordinator listening grpc=127.0.0.1:41234 http=127.0.0.1:41235 tls=false
//
// (with --health-port, " health=HOST:H" comes before " tls=").
//
// SIGTERM or SIGINT shut down gracefully: health goes NOT_SERVING, watch streams end, calls in
// flight get up to --shutdown-grace seconds, then the process exits.
//
// --token-file holds the user (API) token, --worker-token-file the workers' token
// (coordinator/api/auth.h): each side accepts only its own. --worker-token-file is required
// unless --noworkers: there is no fallback to one shared token, since then any API user could
// act as a worker (attach, read and write rendezvous keys).
//
// The store must exist unless --create-store is given; a missing, empty (0 bytes), truncated,
// non-SQLite or corrupt store is refused with a message naming the file and the problem (see
// coordinator/store/store.h). --create-store creates a missing file only, never replaces one.
//
// Exit status: 0 after a signal-initiated shutdown, --help (-h) or --version; 1 when the
// coordinator cannot start (store, token file, TLS files, a port in use); 2 for a usage error
// (unknown flag, missing required flag, positional arguments). Flags may be spelled with '-' or
// '_'.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/command_line.h"
#include "common/logging.h"
#include "common/version.h"
#include "coordinator/api/server.h"
#include "coordinator/jobs/resolve_spec.h"

ABSL_FLAG(std::string, store, "", "SQLite store file; must exist unless --create-store. Required.");
ABSL_FLAG(bool, create_store, false,
          "Create --store (empty, mode 0600) if it does not exist; an existing file is never "
          "replaced.");
ABSL_FLAG(std::string, store_backup, "",
          "Back the store up to this file (atomically) at start, every --store-backup-interval "
          "and at shutdown; restore by starting with --store on it.");
ABSL_FLAG(absl::Duration, store_backup_interval, absl::Minutes(10),
          "Time between store backups (e.g. 30s, 10m, 1h).");
ABSL_FLAG(std::string, host, "0.0.0.0", "Address both servers listen on.");
ABSL_FLAG(int, grpc_port, 50051, "gRPC port (0: pick a free one).");
ABSL_FLAG(int, http_port, 8080, "REST and /metrics port (0: pick a free one).");
ABSL_FLAG(std::string, token_file, "", "File holding the API (user) bearer token. Required.");
ABSL_FLAG(std::string, worker_token_file, "",
          "File holding the workers' bearer token, distinct from the API token. Required unless "
          "--noworkers.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain: serve gRPC and REST over TLS only (with --tls-key).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert.");
ABSL_FLAG(int, health_port, -1,
          "Also serve grpc.health.v1.Health alone, in plaintext, on this port (0: a free one; -1: "
          "off): for Kubernetes' native gRPC probes, which cannot speak TLS, with --tls-cert.");
ABSL_FLAG(int, http_max_connections_per_client, 16,
          "REST port: open connections one client address may hold; more get 503 at once. Raise "
          "it behind a proxy or NAT that hides client addresses.");
ABSL_FLAG(double, shutdown_grace, 5.0, "Seconds calls in flight get after SIGTERM/SIGINT.");
ABSL_FLAG(std::string, checkpoint_root, "/checkpoints",
          "Directory (shared with the workers) where jobs checkpoint, <root>/jobs/<id> per job; "
          "training.save and training.load are relative to it (common/config/job_paths.h).");
ABSL_FLAG(std::string, data_root, "/data",
          "Read-only directory (the same path on the workers) that data.data_path and "
          "data.tokenizer_model are relative to.");
ABSL_FLAG(std::string, advertise_address, "",
          "host:port workers dial for rendezvous (default: this host name and the gRPC port).");
ABSL_FLAG(std::string, queues, "",
          "Queues and their worker quotas, NAME=WORKERS[,NAME=WORKERS...] (e.g. a=2,b=2): a job "
          "names its queue in JobSpec.queue (empty: default, which has no quota unless listed); "
          "each queue runs at most WORKERS workers at once.");
ABSL_FLAG(std::string, preemption, "on",
          "on|off: a job that waits for workers held by lower-priority jobs preempts them at an "
          "on-demand checkpoint (coordinator/jobs/scheduler.h \"Preemption\"); they return to "
          "the queue and resume from it.");
ABSL_FLAG(absl::Duration, preempt_save_timeout, absl::Seconds(60),
          "How long a preemption victim may take to save its on-demand checkpoint before it is "
          "stopped anyway (it then resumes from its last checkpoint).");
ABSL_FLAG(std::string, scale_up, "on",
          "on|off: a running job below its max_workers grows onto idle workers at an on-demand "
          "checkpoint when no job waits (coordinator/jobs/scheduler.h \"Scale-up\").");
ABSL_FLAG(absl::Duration, scale_up_delay, absl::Minutes(5),
          "A generation must have run this long before it is scaled up (hysteresis: each "
          "scale-up costs a save and a restart).");
ABSL_FLAG(bool, require_job_scoped_workers, false,
          "Refuse workers that are not scoped to a job (switchyard-worker --job jobs/<id>): every "
          "worker then runs one job only (Kubernetes: one pod set per job).");
ABSL_FLAG(bool, workers, true,
          "Serve the worker side (WorkerService, RendezvousService, scheduler); --noworkers "
          "serves the API only.");

namespace {

// --help: the usage line and this binary's flags (sorted) on stdout.
int Help() {
  std::printf("%s\n\nflags:\n", std::string(absl::ProgramUsageMessage()).c_str());
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::StrContains(flag->Filename(), "coordinator/main.cc")) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  for (const absl::CommandLineFlag* f : flags) {
    std::string name(f->Name());
    std::replace(name.begin(), name.end(), '_', '-');
    std::printf("  --%-20s %s (default: \"%s\")\n", name.c_str(), f->Help().c_str(),
                f->DefaultValue().c_str());
  }
  return 0;
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "switchyard-coordinator: %s\n%s\n", message.c_str(),
               std::string(absl::ProgramUsageMessage()).c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "usage: switchyard-coordinator --store FILE --grpc-port P --http-port Q --token-file F "
      "--worker-token-file W [--create-store] [--store-backup FILE] [--store-backup-interval D] "
      "[--host ADDR] [--tls-cert PEM --tls-key PEM] [--health-port H] [--checkpoint-root DIR] "
      "[--data-root DIR] "
      "[--advertise-address HOST:PORT] [--noworkers] [--shutdown-grace S]");
  absl::FlagsUsageConfig usage_config;
  usage_config.version_string = [] {
    return std::string("switchyard-coordinator ") + switchyard::kVersion + "\n";
  };
  absl::SetFlagsUsageConfig(usage_config);
  // A client's reset connection is an error for that call, never a reason to die (SIGPIPE).
  signal(SIGPIPE, SIG_IGN);

  // Block the shutdown signals before any thread starts, so every thread inherits the mask and
  // only sigwait below receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // "--grpc-port" is accepted as "--grpc_port".
  std::vector<std::string> args = switchyard::NormalizeFlagNames(argc, argv);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i) {
    if (args[i] == "--help" || args[i] == "-h" || args[i] == "--helpfull") return Help();
  }
  // ParseCommandLine exits 1 on an unknown flag; find those first so they are usage errors (2).
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i) {
    const std::string& a = args[i];
    if (a.size() < 3 || a[0] != '-' || a[1] != '-') continue;
    std::string name = a.substr(2, a.find('=') - 2);
    static const char* const kUsageFlags[] = {"help",        "helpfull",       "helpshort",
                                              "helppackage", "helpon",         "helpmatch",
                                              "version",     "only_check_args"};
    bool usage_flag = false;
    for (const char* f : kUsageFlags) usage_flag = usage_flag || name == f;
    if (!usage_flag && absl::FindCommandLineFlag(name) == nullptr &&
        !(name.rfind("no", 0) == 0 && absl::FindCommandLineFlag(name.substr(2)) != nullptr)) {
      return Usage("unknown flag --" + name);
    }
  }
  std::vector<char*> positional =
      switchyard::ParseCommandLine(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  if (positional.size() > 1) return Usage(std::string("unexpected argument ") + positional[1]);

  switchyard::api::ServerOptions options;
  options.store_path = absl::GetFlag(FLAGS_store);
  options.create_store = absl::GetFlag(FLAGS_create_store);
  options.store_backup = absl::GetFlag(FLAGS_store_backup);
  options.store_backup_interval = absl::GetFlag(FLAGS_store_backup_interval);
  options.host = absl::GetFlag(FLAGS_host);
  options.grpc_port = absl::GetFlag(FLAGS_grpc_port);
  options.http_port = absl::GetFlag(FLAGS_http_port);
  options.token_file = absl::GetFlag(FLAGS_token_file);
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.health_port = absl::GetFlag(FLAGS_health_port);
  options.http_limits.max_connections_per_client =
      absl::GetFlag(FLAGS_http_max_connections_per_client);
  options.checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  options.data_root = absl::GetFlag(FLAGS_data_root);
  options.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  options.workers = absl::GetFlag(FLAGS_workers);
  options.worker_options.service.require_job_scoped_workers =
      absl::GetFlag(FLAGS_require_job_scoped_workers);
  options.worker_token_file = absl::GetFlag(FLAGS_worker_token_file);
  const std::string preemption = absl::GetFlag(FLAGS_preemption);
  if (preemption != "on" && preemption != "off") {
    return Usage(absl::StrCat("--preemption (\"", preemption, "\") must be on or off"));
  }
  options.worker_options.scheduler.preemption = preemption == "on";
  options.worker_options.scheduler.preempt_save_timeout = absl::GetFlag(FLAGS_preempt_save_timeout);
  if (options.worker_options.scheduler.preempt_save_timeout <= absl::ZeroDuration()) {
    return Usage("--preempt-save-timeout must be positive");
  }
  const std::string scale_up = absl::GetFlag(FLAGS_scale_up);
  if (scale_up != "on" && scale_up != "off") {
    return Usage(absl::StrCat("--scale-up (\"", scale_up, "\") must be on or off"));
  }
  options.worker_options.scheduler.scale_up = scale_up == "on";
  options.worker_options.scheduler.scale_up_delay = absl::GetFlag(FLAGS_scale_up_delay);
  if (options.worker_options.scheduler.scale_up_delay < absl::ZeroDuration()) {
    return Usage("--scale-up-delay must not be negative");
  }
  absl::StatusOr<std::map<std::string, int32_t>> queues =
      switchyard::jobs::ParseQueueQuotas(absl::GetFlag(FLAGS_queues));
  if (!queues.ok()) return Usage(std::string(queues.status().message()));
  options.queue_quotas = *std::move(queues);
  if (options.store_path.empty()) return Usage("--store is required");
  if (options.token_file.empty()) return Usage("--token-file is required");
  if (options.workers && options.worker_token_file.empty()) {
    return Usage("--worker-token-file is required unless --noworkers");
  }

  auto server = switchyard::api::CoordinatorServer::Create(options);
  if (!server.ok()) {
    SY_LOG(ERROR) << "cannot start: " << server.status();
    return 1;
  }
  // The addresses actually bound (0.0.0.0 when listening on every interface), not a guess at
  // one to dial; IPv6 in brackets.
  auto host_port = [](const std::string& host, int port) {
    return absl::StrCat(absl::StrContains(host, ':') ? absl::StrCat("[", host, "]") : host, ":",
                        port);
  };
  const std::string health =
      (*server)->health_port() < 0
          ? ""
          : absl::StrCat(" health=", host_port(options.host, (*server)->health_port()));
  std::printf("switchyard-coordinator listening grpc=%s http=%s%s tls=%s\n",
              host_port(options.host, (*server)->grpc_port()).c_str(),
              host_port((*server)->http_address(), (*server)->http_port()).c_str(), health.c_str(),
              (*server)->tls() ? "true" : "false");
  std::fflush(stdout);
  SY_LOG(INFO) << "switchyard-coordinator " << switchyard::kVersion << " store "
               << options.store_path << " grpc port " << (*server)->grpc_port() << " http port "
               << (*server)->http_port();

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  SY_LOG(INFO) << "signal " << signal_number << ": shutting down";
  (*server)->Shutdown(absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace)));
  server->reset();
  SY_LOG(INFO) << "stopped";
  return 0;
}
