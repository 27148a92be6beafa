// File: cli/k8s_workers.h
//
// `syctl k8s-workers jobs/<id>`: the Kubernetes manifest of one job's workers (deploy/README.md
// "Running a job"), the model Kubeflow's PyTorchJob/MPIJob users know: pods per job.
//
// The manifest is one Indexed batch/v1 Job, parallelism = completions = WorkersNeeded(spec), one
// GPU per pod, restartPolicy OnFailure (a retryable worker exit 128-255 restarts the container).
// Each pod runs `switchyard-worker --job jobs/<id>`: the coordinator gives it that job only, and
// it exits 0 once the job is finished, which completes its index. Volumes:
//   - the checkpoint PVC mounted with subPath jobs/<id> at <checkpoint root>/jobs/<id>,
//     read-write (the coordinator creates that directory, 0700, when the job is created);
//   - if training.load names another job (jobs/3, jobs/3/step_600), that job's directory, subPath
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

// The number of workers the scheduler waits for before it starts the job, the N of its
// "WAITING_FOR_WORKERS: needs N worker(s)" event: min_workers when set, else
// parallel.world_size when set, else 1 (coordinator/jobs/placement.h WorkerRange's minimum;
// k8s_workers_test checks they agree).
int32_t WorkersNeeded(const v1::JobSpec& spec);

// "jobs/<id>" of the job whose checkpoint training.load names ("jobs/3" for "jobs/3/step_600"),
// or "" when load is empty (the job's own checkpoints). INVALID_ARGUMENT naming training.load
// when it names no job (a spec the coordinator would have refused).
absl::StatusOr<std::string> LoadedJob(const v1::JobSpec& spec);

// The manifest (YAML, one document) for `job`'s workers. INVALID_ARGUMENT naming the option for
// a namespace that is not a DNS-1123 label, an image or address with whitespace, quotes or
// control characters, a relative root; naming the job when its name is not jobs/<id>;
// FAILED_PRECONDITION when the job is finished (its workers would be refused).
absl::StatusOr<std::string> K8sWorkersManifest(const v1::Job& job,
                                               const K8sWorkersOptions& options);

}  // namespace switchyard::cli

#endif  // SWITCHYARD_CLI_K8S_WORKERS_H_
