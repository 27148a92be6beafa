// File: cli/commands.h
//
// syctl's verbs. Each takes the verb's own arguments (global flags already removed by main) and
// returns the process exit code (cli/client.h lists them). Data goes to stdout in the chosen
// output format, messages to stderr. Usage errors are found before any connection is made, so a
// bad command line exits 2 even without a token or a coordinator.
#ifndef SWITCHYARD_CLI_COMMANDS_H_
#define SWITCHYARD_CLI_COMMANDS_H_

#include <string>
#include <vector>

#include "cli/client.h"
#include "cli/render.h"

namespace switchyard::cli {

struct Globals {
  ClientOptions client;
  Output output = Output::kTable;
};

using Args = std::vector<std::string>;

int PlanCommand(const Globals& globals, const Args& args);
int SubmitCommand(const Globals& globals, const Args& args);
int GetCommand(const Globals& globals, const Args& args);
int ListCommand(const Globals& globals, const Args& args);
int CancelCommand(const Globals& globals, const Args& args);
// delete jobs/ID [--delete-checkpoints] [--allow-missing]: JobService.DeleteJob (finished jobs).
int DeleteCommand(const Globals& globals, const Args& args);
int WatchCommand(const Globals& globals, const Args& args);
int WorkersCommand(const Globals& globals, const Args& args);
// k8s-workers jobs/ID [--image IMG] [--namespace NS] [--coordinator-address A] [--tls-secret S]
// [--job-file FILE]: the Kubernetes manifest of the job's workers on stdout (cli/k8s_workers.h);
// the job from the coordinator (GetJob), or from FILE (JSON as `syctl get -o json` prints it).
int K8sWorkersCommand(const Globals& globals, const Args& args);

// Prints "syctl: <message>" and a hint to run `syctl help` on stderr; returns 2.
int UsageError(const std::string& message);

}  // namespace switchyard::cli

#endif  // SWITCHYARD_CLI_COMMANDS_H_
