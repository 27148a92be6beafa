// File: cli/k8s_workers.h
//
// `syctl k8s-workers jobs/<id>`: the Kubernetes manifest of one job's workers (deploy/README.md
// "Running a job"), the model Kubeflow's PyTorchJob/MPIJob users know: pods per job.
//
// The manifest is one Indexed batch/v1 Job, parallelism = completions = the number of workers
// the scheduler waits for before it starts the job (the minimum of WorkerRange,
// common/config/worker_range.h: the N of its "WAITING_FOR_WORKERS: needs N worker(s)" event), one
// GPU per pod, and a podFailurePolicy (DESIGN.md: worker exit 1-127 is permanent, 128-255
// retryable): exit 1-127 of the worker container fails the whole Job at once (restarting it would
// only repeat the failure), a pod disrupted by Kubernetes (eviction, preemption) is replaced
// without counting against backoffLimit, and any other failure (exit 128-255) gets a new pod,
// up to backoffLimit. Kubernetes allows a podFailurePolicy only with restartPolicy Never, so a
// retry is a new pod rather than a container restart.
// Each pod runs `switchyard-worker --job jobs/<id>`: the coordinator gives it that job only, and
// it exits 0 once the job is finished, which completes its index. Volumes:
//   - the checkpoint PVC mounted with subPath jobs/<id> at <checkpoint root>/jobs/<id>,
//     read-write (the coordinator creates that directory, 0700, when the job is created);
//   - if training.load names another job (jobs/3, jobs/3/step_600; common/config/job_paths.h
//     LoadedJobName), that job's directory, subPath
//     jobs/3 at <checkpoint root>/jobs/3, readOnly;
//   - the data PVC at the data root, read-only; the workers' token Secret; a memory /dev/shm;
//     an emptyDir /tmp.
// Security context: uid/gid 10001 (runAsNonRoot), no privilege escalation, all capabilities
// dropped, read-only root file system (the worker writes only to its mounts).
// No pod mounts the checkpoint volume's root, so a pod can reach no other job's files, whatever
// its spec says (the worker's own path check stays as a second line).
//
// Thread safety: pure functions.
#ifndef SWITCHYARD_CLI_K8S_WORKERS_H_
#define SWITCHYARD_CLI_K8S_WORKERS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "switchyard/v1/config.pb.h"
#include "switchyard/v1/job.pb.h"

namespace switchyard::cli {

struct K8sWorkersOptions {
  std::string image = "switchyard:0.1.0";
  std::string k8s_namespace = "switchyard";
  // What the pods dial: the coordinator Service of deploy/kubernetes/coordinator.yaml.
  std::string coordinator_address = "switchyard-coordinator:50051";
  // Where the coordinator's --checkpoint-root and --data-root are mounted (the same paths as in
  // the coordinator, deploy/kubernetes/coordinator.yaml).
  std::string checkpoint_root = "/checkpoints";
  std::string data_root = "/data";
  // Non-empty: the coordinator serves TLS (deploy/kubernetes/tls); the CA of this Secret (key
  // ca.crt) is mounted and passed as --tls-root-cert.
  std::string tls_secret;
};

// The manifest (YAML, one document) for `job`'s workers. INVALID_ARGUMENT naming the option for
// a namespace that is not a DNS-1123 label, an image or address with whitespace, quotes or
// control characters, a relative root; naming the job when its name is not jobs/<id>;
// FAILED_PRECONDITION when the job is finished (its workers would be refused).
absl::StatusOr<std::string> K8sWorkersManifest(const v1::Job& job,
                                               const K8sWorkersOptions& options);

}  // namespace switchyard::cli

#endif  // SWITCHYARD_CLI_K8S_WORKERS_H_
