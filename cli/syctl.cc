// syctl: the Switchyard command-line client (kubectl style: `syctl <verb> [args]`).
//
// Global flags may appear anywhere on the line; the usage text below is the manual. Data goes to
// stdout, messages to stderr; exit codes are in cli/client.h (0 ok, 1 failure, 2 usage,
// 3 cannot connect / not authenticated).
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/version.h"
#include "nlohmann/json.hpp"

namespace {

using switchyard::cli::Globals;
using switchyard::cli::Output;
using switchyard::cli::UsageError;

constexpr char kUsage[] =
    R"(syctl: command-line client for the Switchyard coordinator.
usage: syctl [global flags] <verb> [args...]

verbs:
  plan -f SPEC | --megatron-args "..."   plan a job: best parallel mapping, memory and step-time
       [--gpus N] [--gpu-memory-gib M]   breakdown, top alternatives (defaults: 8 GPUs of 80 GiB,
       [--gpus-per-node G]               8 per node, --intra-node-gbps 450 --inter-node-gbps 50
       [--alternatives K]                GB/s per GPU, --peak-tflops 989; --gpus defaults to the
       [--search [--world W]] [--json]   spec's parallel.world_size when set). Without --search:
                                         the mapping the scheduler would run. --search: every
                                         mapping of W ranks (default: the spec's world_size, else
                                         --gpus) varying the parallel sizes the spec leaves unset
                                         (TP, CP, PP, ETP, EP; a size set, even to 1, stays),
                                         ranked: # MAPPING EST-MS CAL-MS MEASURED-MS EST-GIB
                                         MEASURED-GIB, the calibration line, the rejected with
                                         their rule (--alternatives K: at most K+1 rows each;
                                         default all). --json: the plan as JSON (-o json)
  submit -f SPEC | --megatron-args "..."  submit a job (both: the Megatron flags override the file)
       [--name NAME] [--request-id ID]   ID makes the submit idempotent (default: a fresh UUID per
       [--timeout S] [--retries N]       submit); UNAVAILABLE and DEADLINE_EXCEEDED are retried N
       [--wait]                          times (default 5) with the same ID, the deadline S
                                         (default 30 s) doubling each retry, so a retry returns the
                                         job an earlier attempt created; --wait follows the job as
                                         watch does and exits like it. The spec's queue and
                                         priority decide admission (the coordinator's --queues
                                         quotas); a waiting job preempts lower-priority ones at
                                         an on-demand checkpoint (they resume from it)
  get jobs/ID | ID                       show one job (last step, last validation loss, queue
                                         position and reason while it waits)
  list [--state STATE] [--page-size N]   list jobs (one page; --all follows every page), with
       [--page-token T] [--all]          each waiting job's queue position and reason
  cancel jobs/ID | ID                    cancel a job
  delete jobs/ID | ID                    delete a finished job (SUCCEEDED, FAILED, CANCELLED) and
       [--delete-checkpoints]            its events; --delete-checkpoints also removes its
       [--allow-missing]                 checkpoint directory; --allow-missing: an absent job is OK
  watch jobs/ID | ID                     follow a job's events (PREEMPTED, SCALING_UP, ...) and
                                         step metrics (val_loss / val_ppl on evaluation steps)
                                         until it ends: one line per step, or a progress bar with
                                         ETA on stderr when stderr and stdout are terminals; exit
                                         0 when the job SUCCEEDED, 1 when it ended FAILED or
                                         CANCELLED
  workers                                list the attached workers (state, job, rank, heartbeat)
  k8s-workers jobs/ID | ID               print the Kubernetes manifest of the job's workers: an
       [--image IMG] [--namespace NS]    Indexed batch/v1 Job, one pod per worker the job needs,
       [--coordinator-address A]         each `switchyard-worker --job jobs/ID` with one GPU and
       [--tls-secret S] [--job-file F]   only this job's checkpoint directory mounted (plus the
                                         one training.load names, read-only); apply it with
                                         `| kubectl apply -f -`. Defaults: switchyard:0.1.0,
                                         switchyard, switchyard-coordinator:50051; --tls-secret:
                                         mount that Secret's ca.crt for a TLS coordinator;
                                         --job-file: the job as `get -o json` prints it, offline
  version                                print the syctl version
  help                                   print this help

SPEC is a YAML or JSON job spec file (examples/quickstart.yaml; '-' reads stdin).
--megatron-args takes Megatron-LM pretrain flags in one string, e.g.
  --megatron-args "--num-layers 4 --hidden-size 128 --num-attention-heads 2 --num-experts 8
                   --moe-router-topk 2 --train-iters 100 --bf16"
Every flag that names a config.proto field is accepted (--moe-aux-loss-coeff, --data-path, ...);
an unknown flag is a usage error naming it.

global flags:
  --coordinator HOST:PORT   gRPC address (default $SYCTL_COORDINATOR, else localhost:50051)
  --token-file FILE         file holding the API bearer token (default $SYCTL_TOKEN_FILE)
  --tls-root-cert PEM       connect with TLS, trusting these roots (default $SYCTL_TLS_ROOT_CERT)
  -o, --output FORMAT       table (default; also 'text'), json, yaml, or name (resource names)

exit codes:
  0  success
  1  failure: the server answered an error (printed as 'CODE: message'), the watched job ended
     FAILED or CANCELLED, a spec file that cannot be read or parsed
  2  usage error: unknown verb or flag (Megatron flags included), bad or missing argument
  3  cannot connect or not authenticated: no token given, unreadable or empty token file,
     unreadable TLS root certificate, coordinator unreachable (UNAVAILABLE), or the token refused
     (UNAUTHENTICATED, PERMISSION_DENIED)
)";

int Version(Output output) {
  if (output == Output::kJson) {
    nlohmann::json j = {{"version", switchyard::kVersion}};
    std::printf("%s\n", j.dump().c_str());
  } else if (output == Output::kYaml) {
    std::printf("version: \"%s\"\n", switchyard::kVersion);
  } else {
    std::printf("syctl %s\n", switchyard::kVersion);
  }
  return 0;
}

// Splits "--flag=value" / "--flag value" for the global flag `name` (and `alias`) at argv[*i].
// Returns true when argv[*i] is that flag; *value gets its value (advancing *i), *missing is set
// when the value is absent.
bool GlobalFlag(int argc, char** argv, int* i, const std::string& name, const std::string& alias,
                std::string* value, bool* missing) {
  const std::string a = argv[*i];
  for (const std::string& n : {name, alias}) {
    if (n.empty()) continue;
    if (a == n) {
      if (*i + 1 >= argc) {
        *missing = true;
      } else {
        *value = argv[++*i];
      }
      return true;
    }
    if (a.rfind(n + "=", 0) == 0) {
      *value = a.substr(n.size() + 1);
      return true;
    }
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  Globals globals;
  std::vector<std::string> args;  // the verb and its arguments
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    std::string value;
    bool missing = false;
    if (GlobalFlag(argc, argv, &i, "--output", "-o", &value, &missing)) {
      if (missing) return UsageError(a + " needs a value (table, json, yaml or name)");
      if (!switchyard::cli::ParseOutput(value, &globals.output)) {
        return UsageError("unknown output format '" + value + "' (want table, json, yaml or name)");
      }
    } else if (GlobalFlag(argc, argv, &i, "--coordinator", "", &globals.client.coordinator,
                          &missing) ||
               GlobalFlag(argc, argv, &i, "--token-file", "", &globals.client.token_file,
                          &missing) ||
               GlobalFlag(argc, argv, &i, "--tls-root-cert", "", &globals.client.tls_root_cert,
                          &missing)) {
      if (missing) return UsageError(a + " needs a value");
    } else if (args.empty() && (a == "-h" || a == "--help")) {
      args.push_back("help");
    } else if (args.empty() && !a.empty() && a[0] == '-') {
      return UsageError("unknown flag '" + a + "'");
    } else {
      args.push_back(a);
    }
  }

  if (args.empty()) return UsageError("missing verb");
  const std::string verb = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (verb == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (verb == "version") {
    if (!rest.empty()) return UsageError("version takes no arguments");
    return Version(globals.output);
  }
  if (verb == "plan") return switchyard::cli::PlanCommand(globals, rest);
  if (verb == "submit") return switchyard::cli::SubmitCommand(globals, rest);
  if (verb == "get") return switchyard::cli::GetCommand(globals, rest);
  if (verb == "list") return switchyard::cli::ListCommand(globals, rest);
  if (verb == "cancel") return switchyard::cli::CancelCommand(globals, rest);
  if (verb == "delete") return switchyard::cli::DeleteCommand(globals, rest);
  if (verb == "watch") return switchyard::cli::WatchCommand(globals, rest);
  if (verb == "workers") return switchyard::cli::WorkersCommand(globals, rest);
  if (verb == "k8s-workers") return switchyard::cli::K8sWorkersCommand(globals, rest);
  return UsageError("unknown verb '" + verb + "'");
}
