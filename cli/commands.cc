#include "cli/commands.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cli/follow.h"
#include "cli/megatron_args.h"
#include "common/config.h"

namespace switchyard::cli {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

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

// Exactly one positional: the job. Returns 0 or the exit code.
int OneJob(const std::string& verb, const Parsed& p, std::string* name) {
  if (p.positional.size() != 1) {
    return UsageError(absl::StrCat(verb, " takes one job (jobs/ID or ID), got ",
                                   p.positional.size(), " arguments"));
  }
  *name = JobName(p.positional[0]);
  return kExitOk;
}

void PrintJob(const v1::Job& job, Output output, bool detail) {
  switch (output) {
    case Output::kName:
      std::printf("%s\n", job.name().c_str());
      break;
    case Output::kTable:
      std::fputs(detail ? JobDetail(job).c_str() : JobsTable({job}).c_str(), stdout);
      break;
    default:
      std::fputs(Structured(job, output).c_str(), stdout);
  }
}

std::unique_ptr<Client> Connect(const Globals& g, int* exit_code) {
  return Client::Create(g.client, exit_code);
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
                              {"--alternatives", nullptr, true}},
                             &p)) {
    return rc;
  }
  if (!p.positional.empty()) return UsageError("plan takes no positional arguments");
  // Defaults: one node of 8 H100 SXM (80 GiB, NVLink 450 GB/s per GPU, 400 Gb/s InfiniBand per
  // GPU, 989 dense bf16 TFLOP/s). Flags are checked before the spec file is read.
  int64_t gpus = 0, gpus_per_node = 8, alternatives = 5;
  double memory_gib = 80, intra = 450, inter = 50, tflops = 989;
  if (int rc = IntFlag("plan", p, "--gpus", 1, &gpus)) return rc;
  if (int rc = IntFlag("plan", p, "--gpus-per-node", 1, &gpus_per_node)) return rc;
  if (int rc = IntFlag("plan", p, "--alternatives", 0, &alternatives)) return rc;
  if (int rc = DoubleFlag("plan", p, "--gpu-memory-gib", &memory_gib)) return rc;
  if (int rc = DoubleFlag("plan", p, "--intra-node-gbps", &intra)) return rc;
  if (int rc = DoubleFlag("plan", p, "--inter-node-gbps", &inter)) return rc;
  if (int rc = DoubleFlag("plan", p, "--peak-tflops", &tflops)) return rc;
  v1::PlanRequest request;
  if (int rc = BuildSpec("plan", p, request.mutable_spec())) return rc;
  if (gpus == 0) {
    gpus = request.spec().parallel().has_world_size() ? request.spec().parallel().world_size() : 8;
  }
  v1::Cluster* cluster = request.mutable_cluster();
  cluster->set_num_gpus(static_cast<int32_t>(std::min<int64_t>(gpus, 1 << 30)));
  cluster->set_gpu_memory_bytes(memory_gib * kGiB);
  cluster->set_gpus_per_node(static_cast<int32_t>(std::min<int64_t>(gpus_per_node, 1 << 30)));
  cluster->set_intra_node_bandwidth_bytes_per_second(intra * 1e9);
  cluster->set_inter_node_bandwidth_bytes_per_second(inter * 1e9);
  cluster->set_peak_flops(tflops * 1e12);

  int rc = 0;
  auto client = Connect(g, &rc);
  if (!client) return rc;
  v1::Plan plan;
  auto context = client->Context();
  grpc::Status status = client->plans().Plan(context.get(), request, &plan);
  if (!status.ok()) return client->Fail("plan", status);
  if (g.output == Output::kTable) {
    std::fputs(PlanTable(plan, cluster->gpu_memory_bytes(), static_cast<int>(alternatives)).c_str(),
               stdout);
  } else if (g.output == Output::kName) {
    std::printf("%s\n", MappingText(plan.best().mapping()).c_str());
  } else {
    std::fputs(Structured(plan, g.output).c_str(), stdout);
  }
  return kExitOk;
}

int SubmitCommand(const Globals& g, const Args& args) {
  Parsed p;
  if (int rc = ParseVerbArgs("submit", args,
                             {{"--file", "-f", true},
                              {"--megatron-args", nullptr, true},
                              {"--name", nullptr, true},
                              {"--request-id", nullptr, true},
                              {"--wait", nullptr, false}},
                             &p)) {
    return rc;
  }
  if (!p.positional.empty()) return UsageError("submit takes no positional arguments");
  v1::CreateJobRequest request;
  if (int rc = BuildSpec("submit", p, request.mutable_spec())) return rc;
  if (p.Has("--name")) request.mutable_spec()->set_display_name(p.Get("--name"));
  request.set_request_id(p.Get("--request-id"));

  int rc = 0;
  auto client = Connect(g, &rc);
  if (!client) return rc;
  v1::Job job;
  auto context = client->Context();
  grpc::Status status = client->jobs().CreateJob(context.get(), request, &job);
  if (!status.ok()) return client->Fail("submit", status);
  PrintJob(job, g.output, /*detail=*/false);
  std::fflush(stdout);
  if (!p.Has("--wait")) return kExitOk;
  return FollowJob(*client, g.output, "submit", job.name(), job.spec().training().train_iters());
}

int GetCommand(const Globals& g, const Args& args) {
  Parsed p;
  if (int rc = ParseVerbArgs("get", args, {}, &p)) return rc;
  std::string name;
  if (int rc = OneJob("get", p, &name)) return rc;
  int rc = 0;
  auto client = Connect(g, &rc);
  if (!client) return rc;
  v1::GetJobRequest request;
  request.set_name(name);
  v1::Job job;
  auto context = client->Context();
  grpc::Status status = client->jobs().GetJob(context.get(), request, &job);
  if (!status.ok()) return client->Fail("get", status);
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

  int rc = 0;
  auto client = Connect(g, &rc);
  if (!client) return rc;
  v1::ListJobsResponse all;
  while (true) {
    v1::ListJobsResponse page;
    auto context = client->Context();
    grpc::Status status = client->jobs().ListJobs(context.get(), request, &page);
    if (!status.ok()) return client->Fail("list", status);
    for (v1::Job& job : *page.mutable_jobs()) *all.add_jobs() = std::move(job);
    all.set_next_page_token(page.next_page_token());
    if (!p.Has("--all") || page.next_page_token().empty()) break;
    request.set_page_token(page.next_page_token());
  }
  switch (g.output) {
    case Output::kTable:
      std::fputs(JobsTable({all.jobs().begin(), all.jobs().end()}).c_str(), stdout);
      break;
    case Output::kName:
      for (const v1::Job& job : all.jobs()) std::printf("%s\n", job.name().c_str());
      break;
    default:
      std::fputs(Structured(all, g.output).c_str(), stdout);
  }
  if (!all.next_page_token().empty() && g.output != Output::kJson && g.output != Output::kYaml) {
    std::fprintf(stderr, "syctl list: more jobs: --page-token %s, or --all\n",
                 all.next_page_token().c_str());
  }
  return kExitOk;
}

int CancelCommand(const Globals& g, const Args& args) {
  Parsed p;
  if (int rc = ParseVerbArgs("cancel", args, {}, &p)) return rc;
  std::string name;
  if (int rc = OneJob("cancel", p, &name)) return rc;
  int rc = 0;
  auto client = Connect(g, &rc);
  if (!client) return rc;
  v1::CancelJobRequest request;
  request.set_name(name);
  v1::Job job;
  auto context = client->Context();
  grpc::Status status = client->jobs().CancelJob(context.get(), request, &job);
  if (!status.ok()) return client->Fail("cancel", status);
  PrintJob(job, g.output, /*detail=*/false);
  return kExitOk;
}

int WatchCommand(const Globals& g, const Args& args) {
  Parsed p;
  if (int rc = ParseVerbArgs("watch", args, {}, &p)) return rc;
  std::string name;
  if (int rc = OneJob("watch", p, &name)) return rc;
  int rc = 0;
  auto client = Connect(g, &rc);
  if (!client) return rc;
  // The job first: a missing job fails fast, and train_iters gives the progress bar its end.
  v1::GetJobRequest request;
  request.set_name(name);
  v1::Job job;
  auto context = client->Context();
  grpc::Status status = client->jobs().GetJob(context.get(), request, &job);
  if (!status.ok()) return client->Fail("watch", status);
  return FollowJob(*client, g.output, "watch", name, job.spec().training().train_iters());
}

int WorkersCommand(const Globals& g, const Args& args) {
  if (!args.empty()) return UsageError("workers takes no arguments");
  int rc = 0;
  auto client = Connect(g, &rc);
  if (!client) return rc;
  v1::ListWorkersResponse response;
  auto context = client->Context();
  grpc::Status status =
      client->workers().ListWorkers(context.get(), v1::ListWorkersRequest(), &response);
  if (!status.ok()) return client->Fail("workers", status);
  switch (g.output) {
    case Output::kTable:
      std::fputs(WorkersTable(response).c_str(), stdout);
      break;
    case Output::kName:
      for (const v1::WorkerStatus& w : response.workers())
        std::printf("%s\n", w.worker_id().c_str());
      break;
    default:
      std::fputs(Structured(response, g.output).c_str(), stdout);
  }
  return kExitOk;
}

}  // namespace switchyard::cli
