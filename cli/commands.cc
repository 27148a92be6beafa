#include "cli/commands.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cli/follow.h"
#include "cli/k8s_workers.h"
#include "cli/megatron_args.h"
#include "common/config/config.h"
#include "google/protobuf/util/json_util.h"

namespace switchyard::cli {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// syctl submit: the first attempt's deadline, the retries of UNAVAILABLE / DEADLINE_EXCEEDED,
// the first backoff and the cap on a retry's (doubling) deadline.
constexpr double kSubmitTimeoutSeconds = 30;
constexpr int64_t kSubmitRetries = 5;
constexpr double kSubmitBackoffSeconds = 0.1;
constexpr double kSubmitMaxBackoffSeconds = 2;
constexpr double kSubmitMaxTimeoutSeconds = 60;

// A verb's flag: `name` and an optional short `alias` ("-f" for "--file").
struct FlagSpec {
  const char* name;
  const char* alias;
  bool takes_value;
};

struct Parsed {
  std::map<std::string, std::string> flags;  // canonical name -> value ("" for switches)
  std::vector<std::string> positional;
  bool Has(const char* name) const { return flags.count(name) > 0; }
  std::string Get(const char* name) const {
    auto it = flags.find(name);
    return it == flags.end() ? "" : it->second;
  }
};

// Parses "--name value", "--name=value", switches and positionals. Returns 0 or the exit code.
int ParseVerbArgs(const std::string& verb, const Args& args, const std::vector<FlagSpec>& specs,
                  Parsed* out) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 2 || a[0] != '-') {
      out->positional.push_back(a);
      continue;
    }
    std::string name = a;
    std::optional<std::string> value;
    if (size_t eq = a.find('='); eq != std::string::npos && absl::StartsWith(a, "--")) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
    }
    const FlagSpec* spec = nullptr;
    for (const FlagSpec& s : specs) {
      if (name == s.name || (s.alias != nullptr && name == s.alias)) spec = &s;
    }
    if (spec == nullptr) return UsageError(absl::StrCat(verb, ": unknown flag '", name, "'"));
    if (spec->takes_value && !value) {
      if (i + 1 >= args.size()) {
        return UsageError(absl::StrCat(verb, ": ", spec->name, " needs a value"));
      }
      value = args[++i];
    }
    if (!spec->takes_value && value) {
      return UsageError(absl::StrCat(verb, ": ", spec->name, " takes no value"));
    }
    out->flags[spec->name] = value.value_or("");
  }
  return kExitOk;
}

// Reads integer flag `name` into *out when present; it must be at least `min`.
int IntFlag(const std::string& verb, const Parsed& p, const char* name, int64_t min, int64_t* out) {
  if (!p.Has(name)) return kExitOk;
  const std::string v = p.Get(name);
  if (!absl::SimpleAtoi(v, out) || *out < min) {
    return UsageError(
        absl::StrCat(verb, ": ", name, " must be an integer >= ", min, ", got '", v, "'"));
  }
  return kExitOk;
}

int DoubleFlag(const std::string& verb, const Parsed& p, const char* name, double* out) {
  if (!p.Has(name)) return kExitOk;
  const std::string v = p.Get(name);
  if (!absl::SimpleAtod(v, out) || !(*out > 0)) {
    return UsageError(absl::StrCat(verb, ": ", name, " must be a positive number, got '", v, "'"));
  }
  return kExitOk;
}

// The job spec from -f FILE and/or --megatron-args (applied over the file's spec).
int BuildSpec(const std::string& verb, const Parsed& p, v1::JobSpec* spec) {
  if (!p.Has("--file") && !p.Has("--megatron-args")) {
    return UsageError(verb + ": give the job spec with -f FILE (YAML or JSON) or --megatron-args");
  }
  if (p.Has("--file")) {
    const std::string path = p.Get("--file");
    absl::StatusOr<v1::JobSpec> loaded;
    if (path == "-") {
      std::string text(std::istreambuf_iterator<char>(std::cin), {});
      loaded = ParseJobSpecYaml(text);  // JSON documents are YAML too
    } else {
      loaded = LoadJobSpecFile(path);
    }
    if (!loaded.ok()) {
      std::fprintf(stderr, "syctl %s: %s\n", verb.c_str(),
                   std::string(loaded.status().message()).c_str());
      return kExitFailure;
    }
    *spec = *std::move(loaded);
  }
  if (p.Has("--megatron-args")) {
    auto words = SplitCommandLine(p.Get("--megatron-args"));
    absl::Status s = words.ok() ? ApplyMegatronArgs(*words, spec) : words.status();
    if (!s.ok()) {
      return UsageError(absl::StrCat(verb, ": --megatron-args: ", s.message()));
    }
  }
  return kExitOk;
}

// "7" -> "jobs/7"; "jobs/7" unchanged.
std::string JobName(const std::string& arg) {
  return absl::StartsWith(arg, "jobs/") ? arg : "jobs/" + arg;
}

// The arguments of get, cancel and watch: no flags, exactly one positional, the job. Returns 0 or
// the exit code.
int OneJobArgs(const std::string& verb, const Args& args, std::string* name) {
  Parsed p;
  if (int rc = ParseVerbArgs(verb, args, {}, &p)) return rc;
  if (p.positional.size() != 1) {
    return UsageError(absl::StrCat(verb, " takes one job (jobs/ID or ID), got ",
                                   p.positional.size(), " arguments"));
  }
  *name = JobName(p.positional[0]);
  return kExitOk;
}

// Prints an answer in `output`: `table` as is, `names` one per line, or the message as JSON/YAML.
void Print(const google::protobuf::Message& message, Output output, const std::string& table,
           const std::vector<std::string>& names) {
  switch (output) {
    case Output::kTable:
      std::fputs(TerminalSafeLines(table).c_str(), stdout);
      break;
    case Output::kName:
      for (const std::string& name : names) std::printf("%s\n", TerminalSafe(name).c_str());
      break;
    default:
      std::fputs(TerminalSafeLines(Structured(message, output)).c_str(), stdout);
  }
}

void PrintJob(const v1::Job& job, Output output, bool detail) {
  Print(job, output, detail ? JobDetail(job) : JobsTable({job}), {job.name()});
}

// Creates the client into *client. Returns 0 or the exit code (the reason is printed).
int Connect(const Globals& g, std::unique_ptr<Client>* client) {
  int rc = 0;
  *client = Client::Create(g.client, &rc);
  return *client ? kExitOk : rc;
}

// One unary call `stub.*method(request, response)` with the token and the default deadline.
// Returns 0, or prints the failure as "syctl <verb>: ..." and returns its exit code.
template <typename Stub, typename Request, typename Response>
int Call(const Client& client, const std::string& verb, Stub& stub,
         grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
         const Request& request, Response* response) {
  auto context = client.Context();
  grpc::Status status = (stub.*method)(context.get(), request, response);
  return status.ok() ? kExitOk : client.Fail(verb, status);
}

// A fresh idempotency key: a random (version 4) UUID.
std::string NewRequestId() {
  std::random_device random;
  uint8_t b[16];
  for (int i = 0; i < 16; i += 4) {
    const uint32_t r = random();
    for (int j = 0; j < 4; ++j) b[i + j] = static_cast<uint8_t>(r >> (8 * j));
  }
  b[6] = static_cast<uint8_t>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<uint8_t>((b[8] & 0x3f) | 0x80);  // RFC 4122 variant
  std::string out;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    absl::StrAppend(&out, absl::Hex(b[i], absl::kZeroPad2));
  }
  return out;
}

// CreateJob with `request` (its request_id set), retrying UNAVAILABLE and DEADLINE_EXCEEDED up to
// `retries` times with the same request_id, so a retry of a call that did create the job returns
// that job (never a duplicate). Attempt i (from 0) has a deadline of timeout × 2^i (at most
// kSubmitMaxTimeoutSeconds) and waits kSubmitBackoffSeconds × 2^(i-1) (at most
// kSubmitMaxBackoffSeconds) before it.
int CreateWithRetries(Client& client, const v1::CreateJobRequest& request, double timeout_seconds,
                      int64_t retries, v1::Job* job) {
  double timeout = timeout_seconds;
  double backoff = kSubmitBackoffSeconds;
  for (int64_t attempt = 0;; ++attempt) {
    auto context = client.Context(0);
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::microseconds(static_cast<int64_t>(timeout * 1e6)));
    grpc::Status status = client.jobs().CreateJob(context.get(), request, job);
    if (status.ok()) return kExitOk;
    const bool retryable = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (!retryable || attempt >= retries) {
      if (retryable) {
        std::fprintf(stderr,
                     "syctl submit: gave up after %lld attempt(s); the job may exist: submit "
                     "again with --request-id %s to get it (never a duplicate)\n",
                     static_cast<long long>(attempt + 1), request.request_id().c_str());
      }
      return client.Fail("submit", status);
    }
    std::fprintf(
        stderr, "syctl submit: %s: %s; retry %lld of %lld in %.1f s (request_id %s)\n",
        absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())).c_str(),
        status.error_message().c_str(), static_cast<long long>(attempt + 1),
        static_cast<long long>(retries), backoff, request.request_id().c_str());
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(backoff * 1e6)));
    backoff = std::min(backoff * 2, kSubmitMaxBackoffSeconds);
    timeout = std::min(timeout * 2, kSubmitMaxTimeoutSeconds);
  }
}

}  // namespace

int UsageError(const std::string& message) {
  std::fprintf(stderr, "syctl: %s\n(run 'syctl help' for usage)\n", message.c_str());
  return kExitUsage;
}

int PlanCommand(const Globals& g, const Args& args) {
  Parsed p;
  if (int rc = ParseVerbArgs("plan", args,
                             {{"--file", "-f", true},
                              {"--megatron-args", nullptr, true},
                              {"--gpus", nullptr, true},
                              {"--gpu-memory-gib", nullptr, true},
                              {"--gpus-per-node", nullptr, true},
                              {"--intra-node-gbps", nullptr, true},
                              {"--inter-node-gbps", nullptr, true},
                              {"--peak-tflops", nullptr, true},
                              {"--alternatives", nullptr, true},
                              {"--search", nullptr, false},
                              {"--world", nullptr, true},
                              {"--json", nullptr, false}},
                             &p)) {
    return rc;
  }
  if (!p.positional.empty()) return UsageError("plan takes no positional arguments");
  const bool search = p.Has("--search");
  if (p.Has("--world") && !search) {
    return UsageError(
        "plan: --world needs --search (without it the plan is the scheduler's, on up to --gpus)");
  }
  // Defaults: one node of 8 H100 SXM (80 GiB, NVLink 450 GB/s per GPU, 400 Gb/s InfiniBand per
  // GPU, 989 dense bf16 TFLOP/s). Flags are checked before the spec file is read. A search lists
  // every ranked and rejected mapping unless --alternatives caps the lists.
  int64_t gpus = 0, gpus_per_node = 8, alternatives = search ? -1 : 5, world = 0;
  double memory_gib = 80, intra = 450, inter = 50, tflops = 989;
  if (int rc = IntFlag("plan", p, "--gpus", 1, &gpus)) return rc;
  if (int rc = IntFlag("plan", p, "--world", 1, &world)) return rc;
  if (int rc = IntFlag("plan", p, "--gpus-per-node", 1, &gpus_per_node)) return rc;
  if (int rc = IntFlag("plan", p, "--alternatives", 0, &alternatives)) return rc;
  if (int rc = DoubleFlag("plan", p, "--gpu-memory-gib", &memory_gib)) return rc;
  if (int rc = DoubleFlag("plan", p, "--intra-node-gbps", &intra)) return rc;
  if (int rc = DoubleFlag("plan", p, "--inter-node-gbps", &inter)) return rc;
  if (int rc = DoubleFlag("plan", p, "--peak-tflops", &tflops)) return rc;
  v1::PlanRequest request;
  if (int rc = BuildSpec("plan", p, request.mutable_spec())) return rc;
  if (gpus == 0) {
    gpus = world > 0                                    ? world
           : request.spec().parallel().has_world_size() ? request.spec().parallel().world_size()
                                                        : 8;
  }
  // The search (plan.proto PlanSearch): the sizes the spec leaves unset, over --world ranks
  // (unset: the spec's parallel.world_size, else --gpus; the coordinator checks it).
  if (search) {
    v1::PlanSearch* s = request.mutable_search();
    if (world > 0) s->set_world_size(static_cast<int32_t>(std::min<int64_t>(world, 1 << 30)));
  }
  v1::Cluster* cluster = request.mutable_cluster();
  cluster->set_num_gpus(static_cast<int32_t>(std::min<int64_t>(gpus, 1 << 30)));
  cluster->set_gpu_memory_bytes(memory_gib * kGiB);
  cluster->set_gpus_per_node(static_cast<int32_t>(std::min<int64_t>(gpus_per_node, 1 << 30)));
  cluster->set_intra_node_bandwidth_bytes_per_second(intra * 1e9);
  cluster->set_inter_node_bandwidth_bytes_per_second(inter * 1e9);
  cluster->set_peak_flops(tflops * 1e12);

  std::unique_ptr<Client> client;
  if (int rc = Connect(g, &client)) return rc;
  v1::Plan plan;
  if (int rc =
          Call(*client, "plan", client->plans(), &v1::PlanService::Stub::Plan, request, &plan)) {
    return rc;
  }
  // -o name prints the best mapping: a plan has no resource name. --json is -o json.
  const std::string table =
      plan.has_search()
          ? SearchTable(plan, cluster->gpu_memory_bytes(),
                        alternatives < 0
                            ? std::numeric_limits<int>::max()
                            : static_cast<int>(std::min<int64_t>(alternatives + 1, 1 << 30)))
          : PlanTable(plan, cluster->gpu_memory_bytes(), static_cast<int>(alternatives));
  Print(plan, p.Has("--json") ? Output::kJson : g.output, table,
        {MappingText(plan.best().mapping())});
  return kExitOk;
}

int SubmitCommand(const Globals& g, const Args& args) {
  Parsed p;
  if (int rc = ParseVerbArgs("submit", args,
                             {{"--file", "-f", true},
                              {"--megatron-args", nullptr, true},
                              {"--name", nullptr, true},
                              {"--request-id", nullptr, true},
                              {"--timeout", nullptr, true},
                              {"--retries", nullptr, true},
                              {"--wait", nullptr, false}},
                             &p)) {
    return rc;
  }
  if (!p.positional.empty()) return UsageError("submit takes no positional arguments");
  double timeout_seconds = kSubmitTimeoutSeconds;
  int64_t retries = kSubmitRetries;
  if (int rc = DoubleFlag("submit", p, "--timeout", &timeout_seconds)) return rc;
  if (int rc = IntFlag("submit", p, "--retries", 0, &retries)) return rc;
  if (p.Has("--request-id") && p.Get("--request-id").empty()) {
    return UsageError("submit: --request-id must not be empty");
  }
  v1::CreateJobRequest request;
  if (int rc = BuildSpec("submit", p, request.mutable_spec())) return rc;
  if (p.Has("--name")) request.mutable_spec()->set_display_name(p.Get("--name"));
  request.set_request_id(p.Has("--request-id") ? p.Get("--request-id") : NewRequestId());

  std::unique_ptr<Client> client;
  if (int rc = Connect(g, &client)) return rc;
  v1::Job job;
  if (int rc = CreateWithRetries(*client, request, timeout_seconds, retries, &job)) return rc;
  PrintJob(job, g.output, /*detail=*/false);
  std::fflush(stdout);
  if (!p.Has("--wait")) return kExitOk;
  return FollowJob(*client, g.output, "submit", job.name(), job.spec().training().train_iters());
}

int GetCommand(const Globals& g, const Args& args) {
  v1::GetJobRequest request;
  if (int rc = OneJobArgs("get", args, request.mutable_name())) return rc;
  std::unique_ptr<Client> client;
  if (int rc = Connect(g, &client)) return rc;
  v1::Job job;
  if (int rc = Call(*client, "get", client->jobs(), &v1::JobService::Stub::GetJob, request, &job)) {
    return rc;
  }
  PrintJob(job, g.output, /*detail=*/true);
  return kExitOk;
}

int ListCommand(const Globals& g, const Args& args) {
  Parsed p;
  if (int rc = ParseVerbArgs("list", args,
                             {{"--state", nullptr, true},
                              {"--page-size", nullptr, true},
                              {"--page-token", nullptr, true},
                              {"--all", nullptr, false}},
                             &p)) {
    return rc;
  }
  if (!p.positional.empty() && !(p.positional.size() == 1 && p.positional[0] == "jobs")) {
    return UsageError("list takes no positional arguments (except 'jobs')");
  }
  v1::ListJobsRequest request;
  if (p.Has("--state")) {
    v1::Job::State state;
    if (!v1::Job::State_Parse(absl::AsciiStrToUpper(p.Get("--state")), &state) ||
        state == v1::Job::STATE_UNSPECIFIED) {
      return UsageError(absl::StrCat("list: --state '", p.Get("--state"),
                                     "' is not one of PENDING, STARTING, RUNNING, RESTARTING, "
                                     "SUCCEEDED, FAILED, CANCELLED"));
    }
    request.set_state(state);
  }
  int64_t page_size = 0;
  if (int rc = IntFlag("list", p, "--page-size", 1, &page_size)) return rc;
  request.set_page_size(static_cast<int32_t>(std::min<int64_t>(page_size, 1 << 30)));
  request.set_page_token(p.Get("--page-token"));

  std::unique_ptr<Client> client;
  if (int rc = Connect(g, &client)) return rc;
  v1::ListJobsResponse all;
  while (true) {
    v1::ListJobsResponse page;
    if (int rc = Call(*client, "list", client->jobs(), &v1::JobService::Stub::ListJobs, request,
                      &page)) {
      return rc;
    }
    for (v1::Job& job : *page.mutable_jobs()) *all.add_jobs() = std::move(job);
    all.set_next_page_token(page.next_page_token());
    if (!p.Has("--all") || page.next_page_token().empty()) break;
    request.set_page_token(page.next_page_token());
  }
  std::vector<std::string> names;
  for (const v1::Job& job : all.jobs()) names.push_back(job.name());
  Print(all, g.output, JobsTable({all.jobs().begin(), all.jobs().end()}), names);
  if (!all.next_page_token().empty() && g.output != Output::kJson && g.output != Output::kYaml) {
    std::fprintf(stderr, "syctl list: more jobs: --page-token %s, or --all\n",
                 all.next_page_token().c_str());
  }
  return kExitOk;
}

int CancelCommand(const Globals& g, const Args& args) {
  v1::CancelJobRequest request;
  if (int rc = OneJobArgs("cancel", args, request.mutable_name())) return rc;
  std::unique_ptr<Client> client;
  if (int rc = Connect(g, &client)) return rc;
  v1::Job job;
  if (int rc = Call(*client, "cancel", client->jobs(), &v1::JobService::Stub::CancelJob, request,
                    &job)) {
    return rc;
  }
  PrintJob(job, g.output, /*detail=*/false);
  return kExitOk;
}

int DeleteCommand(const Globals& g, const Args& args) {
  Parsed p;
  if (int rc = ParseVerbArgs(
          "delete", args,
          {{"--delete-checkpoints", nullptr, false}, {"--allow-missing", nullptr, false}}, &p)) {
    return rc;
  }
  if (p.positional.size() != 1) {
    return UsageError(absl::StrCat("delete takes one job (jobs/ID or ID), got ",
                                   p.positional.size(), " arguments"));
  }
  v1::DeleteJobRequest request;
  request.set_name(JobName(p.positional[0]));
  request.set_delete_checkpoints(p.Has("--delete-checkpoints"));
  request.set_allow_missing(p.Has("--allow-missing"));
  std::unique_ptr<Client> client;
  if (int rc = Connect(g, &client)) return rc;
  google::protobuf::Empty empty;
  if (int rc = Call(*client, "delete", client->jobs(), &v1::JobService::Stub::DeleteJob, request,
                    &empty)) {
    return rc;
  }
  switch (g.output) {
    case Output::kTable:
      std::printf("deleted %s%s\n", request.name().c_str(),
                  request.delete_checkpoints() ? " and its checkpoints" : "");
      break;
    case Output::kName:
      std::printf("%s\n", request.name().c_str());
      break;
    default:
      std::fputs(Structured(empty, g.output).c_str(), stdout);
  }
  return kExitOk;
}

int WatchCommand(const Globals& g, const Args& args) {
  v1::GetJobRequest request;
  if (int rc = OneJobArgs("watch", args, request.mutable_name())) return rc;
  std::unique_ptr<Client> client;
  if (int rc = Connect(g, &client)) return rc;
  // The job first: a missing job fails fast, and train_iters gives the progress bar its end.
  v1::Job job;
  if (int rc =
          Call(*client, "watch", client->jobs(), &v1::JobService::Stub::GetJob, request, &job)) {
    return rc;
  }
  return FollowJob(*client, g.output, "watch", request.name(), job.spec().training().train_iters());
}

int WorkersCommand(const Globals& g, const Args& args) {
  if (!args.empty()) return UsageError("workers takes no arguments");
  std::unique_ptr<Client> client;
  if (int rc = Connect(g, &client)) return rc;
  v1::ListWorkersResponse response;
  if (int rc =
          Call(*client, "workers", client->workers(), &v1::WorkerAdminService::Stub::ListWorkers,
               v1::ListWorkersRequest(), &response)) {
    return rc;
  }
  std::vector<std::string> ids;
  for (const v1::WorkerStatus& w : response.workers()) ids.push_back(w.worker_id());
  Print(response, g.output, WorkersTable(response), ids);
  return kExitOk;
}

int K8sWorkersCommand(const Globals& g, const Args& args) {
  Parsed p;
  if (int rc = ParseVerbArgs("k8s-workers", args,
                             {{"--image", nullptr, true},
                              {"--namespace", nullptr, true},
                              {"--coordinator-address", nullptr, true},
                              {"--tls-secret", nullptr, true},
                              {"--job-file", nullptr, true}},
                             &p)) {
    return rc;
  }
  if (p.positional.size() != 1) {
    return UsageError(absl::StrCat("k8s-workers takes one job (jobs/ID or ID), got ",
                                   p.positional.size(), " arguments"));
  }
  K8sWorkersOptions options;
  if (p.Has("--image")) options.image = p.Get("--image");
  if (p.Has("--namespace")) options.k8s_namespace = p.Get("--namespace");
  if (p.Has("--coordinator-address")) options.coordinator_address = p.Get("--coordinator-address");
  if (p.Has("--tls-secret")) options.tls_secret = p.Get("--tls-secret");
  const std::string name = JobName(p.positional[0]);
  v1::Job job;
  if (p.Has("--job-file")) {
    // The job as `syctl get -o json` prints it, read offline (no coordinator is asked).
    const std::string path = p.Get("--job-file");
    std::string text;
    if (path == "-") {
      text.assign(std::istreambuf_iterator<char>(std::cin), {});
    } else {
      std::ifstream in(path);
      if (!in) {
        std::fprintf(stderr, "syctl k8s-workers: --job-file %s: cannot read it\n", path.c_str());
        return kExitFailure;
      }
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    google::protobuf::util::JsonParseOptions json;
    json.ignore_unknown_fields = true;
    if (const auto s = google::protobuf::util::JsonStringToMessage(text, &job, json); !s.ok()) {
      std::fprintf(stderr, "syctl k8s-workers: --job-file %s: not a job in JSON: %s\n",
                   path.c_str(), s.ToString().c_str());
      return kExitFailure;
    }
    if (job.name() != name) {
      std::fprintf(stderr, "syctl k8s-workers: --job-file %s holds %s, not %s\n", path.c_str(),
                   job.name().c_str(), name.c_str());
      return kExitFailure;
    }
  } else {
    v1::GetJobRequest request;
    request.set_name(name);
    std::unique_ptr<Client> client;
    if (int rc = Connect(g, &client)) return rc;
    if (int rc = Call(*client, "k8s-workers", client->jobs(), &v1::JobService::Stub::GetJob,
                      request, &job)) {
      return rc;
    }
  }
  absl::StatusOr<std::string> manifest = K8sWorkersManifest(job, options);
  if (!manifest.ok()) {
    std::fprintf(stderr, "syctl k8s-workers: %s: %s\n",
                 absl::StatusCodeToString(manifest.status().code()).c_str(),
                 std::string(manifest.status().message()).c_str());
    return manifest.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage
                                                                          : kExitFailure;
  }
  std::fputs(manifest->c_str(), stdout);
  return kExitOk;
}

}  // namespace switchyard::cli
