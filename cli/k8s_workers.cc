// File: cli/k8s_workers.cc
#include "cli/k8s_workers.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config/job_paths.h"

namespace switchyard::cli {
namespace {

// The id of "jobs/<id>" (common/config/job_paths.h's ParseJobName), or 0.
int64_t JobId(const std::string& name) { return ParseJobName(name).value_or(0); }

// Printable, no blank, no quote or backslash: safe inside a YAML double-quoted scalar as is.
bool PlainToken(const std::string& s) {
  if (s.empty()) return false;
  for (unsigned char c : s) {
    if (c <= 0x20 || c == 0x7f || c == '"' || c == '\'' || c == '\\') return false;
  }
  return true;
}

bool Dns1123Label(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-')) return false;
  }
  return s.front() != '-' && s.back() != '-';
}

absl::Status CheckOptions(const K8sWorkersOptions& o) {
  if (!Dns1123Label(o.k8s_namespace)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--namespace (\"", o.k8s_namespace,
                     "\") must be a DNS-1123 label: 1-63 of a-z, 0-9 and '-', starting and "
                     "ending with a letter or digit"));
  }
  for (const auto& [flag, value] : {std::pair<const char*, const std::string*>{"--image", &o.image},
                                    {"--coordinator-address", &o.coordinator_address},
                                    {"checkpoint root", &o.checkpoint_root},
                                    {"data root", &o.data_root}}) {
    if (!PlainToken(*value)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " (\"", *value,
                       "\") must be non-empty, without blanks, quotes, backslashes or control "
                       "characters"));
    }
  }
  if (o.coordinator_address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--coordinator-address (\"", o.coordinator_address, "\") must be HOST:PORT"));
  }
  for (const std::string* root : {&o.checkpoint_root, &o.data_root}) {
    if (root->front() != '/') {
      return absl::InvalidArgumentError(absl::StrCat("root \"", *root, "\" must be absolute"));
    }
  }
  if (!o.tls_secret.empty() && !Dns1123Label(o.tls_secret)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-secret (\"", o.tls_secret, "\") must be a DNS-1123 label"));
  }
  return absl::OkStatus();
}

std::string StripSlash(std::string s) {
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

}  // namespace

int32_t WorkersNeeded(const v1::JobSpec& spec) {
  const bool has_world = spec.parallel().has_world_size();
  const int32_t n =
      spec.has_min_workers() ? spec.min_workers() : (has_world ? spec.parallel().world_size() : 1);
  return n < 1 ? 1 : n;
}

absl::StatusOr<std::string> LoadedJob(const v1::JobSpec& spec) {
  const std::string& load = spec.training().load();
  if (load.empty()) return std::string();
  const std::vector<std::string> parts = absl::StrSplit(load, '/');
  const std::string job = parts.size() >= 2 ? absl::StrCat(parts[0], "/", parts[1]) : "";
  if (JobId(job) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.load (\"", load,
                     "\") must name a job's checkpoint: jobs/<id> or jobs/<id>/<dir>[/step_<N>]"));
  }
  return job;
}

absl::StatusOr<std::string> K8sWorkersManifest(const v1::Job& job,
                                               const K8sWorkersOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  const int64_t id = JobId(job.name());
  if (id == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("job name \"", job.name(), "\" must be jobs/<id>, id >= 1"));
  }
  if (job.state() == v1::Job::SUCCEEDED || job.state() == v1::Job::FAILED ||
      job.state() == v1::Job::CANCELLED) {
    return absl::FailedPreconditionError(
        absl::StrCat(job.name(), " is already ", v1::Job::State_Name(job.state()),
                     ": its workers would be refused (a job-scoped worker attaches only to an "
                     "unfinished job)"));
  }
  absl::StatusOr<std::string> loaded = LoadedJob(job.spec());
  if (!loaded.ok()) return loaded.status();
  if (*loaded == job.name()) loaded->clear();  // its own directory, mounted read-write anyway
  const int32_t n = WorkersNeeded(job.spec());
  const std::string ckpt = StripSlash(options.checkpoint_root);
  const std::string data = StripSlash(options.data_root);
  const std::string own = absl::StrCat("jobs/", id);
  const std::string labels = absl::StrCat(
      "    app.kubernetes.io/name: switchyard\n"
      "    app.kubernetes.io/component: worker\n"
      "    app.kubernetes.io/instance: job-",
      id, "\n");

  std::string y;
  absl::StrAppend(
      &y, "# The workers of ", job.name(), ", generated by `syctl k8s-workers ", job.name(),
      "`\n"
      "# (deploy/README.md \"Running a job\"). Apply it after `syctl submit`:\n"
      "#   syctl k8s-workers ",
      job.name(),
      " | kubectl apply -f -\n"
      "# One pod per worker, one GPU each; every pod runs `switchyard-worker --job ",
      job.name(),
      "`, which the coordinator\n"
      "# gives this job only and which exits 0 once the job is finished (the Job then completes).\n"
      "# The checkpoint volume is mounted only at this job's directory",
      loaded->empty() ? "" : absl::StrCat(" (and ", *loaded, "'s, read-only, for training.load)"),
      ".\n");
  absl::StrAppend(&y,
                  "apiVersion: batch/v1\n"
                  "kind: Job\n"
                  "metadata:\n"
                  "  name: switchyard-job-",
                  id,
                  "-workers\n"
                  "  namespace: ",
                  options.k8s_namespace, "\n  labels:\n", labels);
  absl::StrAppend(&y,
                  "spec:\n"
                  "  completionMode: Indexed\n"
                  "  # The scheduler starts the job once this many workers are attached (the N of "
                  "its\n"
                  "  # WAITING_FOR_WORKERS event).\n"
                  "  completions: ",
                  n, "\n  parallelism: ", n,
                  "\n"
                  "  # Container restarts count here (OnFailure restarts on every non-zero exit).\n"
                  "  backoffLimit: 6\n"
                  "  ttlSecondsAfterFinished: 86400\n"
                  "  template:\n"
                  "    metadata:\n"
                  "      labels:\n");
  for (absl::string_view line : absl::StrSplit(labels, '\n', absl::SkipEmpty())) {
    absl::StrAppend(&y, "    ", line, "\n");
  }
  absl::StrAppend(&y,
                  "      annotations:\n"
                  "        # deploy/prometheus/prometheus.yml scrapes the container port named "
                  "metrics-0.\n"
                  "        prometheus.io/scrape: \"true\"\n"
                  "        prometheus.io/path: /metrics\n"
                  "    spec:\n"
                  "      restartPolicy: OnFailure\n"
                  "      # SIGTERM: the running generation ends with WorkerExit(143); a training "
                  "thread stuck in a\n"
                  "      # collective gets up to --comm-timeout to unwind.\n"
                  "      terminationGracePeriodSeconds: 120\n"
                  "      securityContext:\n"
                  "        runAsNonRoot: true\n"
                  "        runAsUser: 10001\n"
                  "        runAsGroup: 10001\n"
                  "        fsGroup: 10001\n"
                  "        seccompProfile:\n"
                  "          type: RuntimeDefault\n"
                  "      nodeSelector:\n"
                  "        nvidia.com/gpu.present: \"true\"\n"
                  "      tolerations:\n"
                  "        - key: nvidia.com/gpu\n"
                  "          operator: Exists\n"
                  "          effect: NoSchedule\n"
                  "      containers:\n"
                  "        - name: worker\n"
                  "          image: ",
                  options.image,
                  "\n"
                  "          imagePullPolicy: IfNotPresent\n"
                  "          command: [\"/usr/local/bin/switchyard-worker\"]\n"
                  "          args:\n"
                  "            - --coordinator=",
                  options.coordinator_address,
                  "\n"
                  "            - --token-file=/etc/switchyard/token/token\n"
                  "            - --job=",
                  job.name(),
                  "\n"
                  "            - --device=cuda\n"
                  "            - --metrics-port=9500\n"
                  "            - --gloo-host=$(POD_IP)\n"
                  "            - --comm-timeout=300\n"
                  "            - --heartbeat-ms=1000\n"
                  "            - --peak-tflops=989.4\n"
                  "            # The coordinator's roots at the same paths; only this job's "
                  "directories exist below\n"
                  "            # the checkpoint root here.\n"
                  "            - --checkpoint-root=",
                  ckpt, "\n            - --data-root=", data, "\n");
  if (!options.tls_secret.empty()) {
    absl::StrAppend(&y, "            - --tls-root-cert=/etc/switchyard/tls/ca.crt\n");
  }
  absl::StrAppend(&y,
                  "          env:\n"
                  "            - name: POD_IP\n"
                  "              valueFrom:\n"
                  "                fieldRef:\n"
                  "                  fieldPath: status.podIP\n"
                  "            # NVLink SHARP (multicast) off: it needs fabric/IMEX set-up that "
                  "containers do not get.\n"
                  "            - name: NCCL_NVLS_ENABLE\n"
                  "              value: \"0\"\n"
                  "            - name: NCCL_SOCKET_IFNAME\n"
                  "              value: eth0\n"
                  "            - name: NCCL_DEBUG\n"
                  "              value: WARN\n"
                  "          ports:\n"
                  "            - name: metrics-0\n"
                  "              containerPort: 9500\n"
                  "              protocol: TCP\n"
                  "          resources:\n"
                  "            requests:\n"
                  "              cpu: \"8\"\n"
                  "              memory: 64Gi\n"
                  "            limits:\n"
                  "              memory: 128Gi\n"
                  "              nvidia.com/gpu: 1\n"
                  "          # The worker writes only to its mounts (checkpoints, /dev/shm; /tmp "
                  "for libraries\n"
                  "          # that want scratch space), so the image's file system is "
                  "read-only.\n"
                  "          securityContext:\n"
                  "            allowPrivilegeEscalation: false\n"
                  "            readOnlyRootFilesystem: true\n"
                  "            capabilities:\n"
                  "              drop: [\"ALL\"]\n"
                  "          volumeMounts:\n"
                  "            - name: token\n"
                  "              mountPath: /etc/switchyard/token\n"
                  "              readOnly: true\n"
                  "            - name: dshm\n"
                  "              mountPath: /dev/shm\n"
                  "            - name: tmp\n"
                  "              mountPath: /tmp\n"
                  "            # This job's directory only (created 0700 by the coordinator at "
                  "CreateJob).\n"
                  "            - name: checkpoints\n"
                  "              mountPath: ",
                  ckpt, "/", own, "\n              subPath: ", own, "\n");
  if (!loaded->empty()) {
    absl::StrAppend(&y, "            # training.load names ", *loaded,
                    ": its directory, read-only.\n"
                    "            - name: checkpoints\n"
                    "              mountPath: ",
                    ckpt, "/", *loaded, "\n              subPath: ", *loaded,
                    "\n              readOnly: true\n");
  }
  absl::StrAppend(&y,
                  "            - name: data\n"
                  "              mountPath: ",
                  data, "\n              readOnly: true\n");
  if (!options.tls_secret.empty()) {
    absl::StrAppend(&y,
                    "            - name: tls\n"
                    "              mountPath: /etc/switchyard/tls\n"
                    "              readOnly: true\n");
  }
  absl::StrAppend(&y,
                  "      volumes:\n"
                  "        - name: token\n"
                  "          secret:\n"
                  "            secretName: switchyard-worker-token  # the workers' token\n"
                  "            defaultMode: 0440  # group-readable: fsGroup 10001 is the reader\n"
                  "        - name: dshm\n"
                  "          emptyDir:\n"
                  "            medium: Memory\n"
                  "            sizeLimit: 64Gi\n"
                  "        - name: tmp\n"
                  "          emptyDir:\n"
                  "            sizeLimit: 1Gi\n"
                  "        - name: checkpoints\n"
                  "          persistentVolumeClaim:\n"
                  "            claimName: switchyard-checkpoints\n"
                  "        - name: data\n"
                  "          persistentVolumeClaim:\n"
                  "            claimName: switchyard-data\n"
                  "            readOnly: true\n");
  if (!options.tls_secret.empty()) {
    absl::StrAppend(&y,
                    "        - name: tls\n"
                    "          secret:\n"
                    "            secretName: ",
                    options.tls_secret,
                    "\n"
                    "            defaultMode: 0440\n"
                    "            items: [{key: ca.crt, path: ca.crt}]\n");
  }
  return y;
}

}  // namespace switchyard::cli
