// switchyard-worker: one process per GPU (or one CPU process) that executes a coordinator's plan.
//
// Modes (exactly one):
//   --self-check   print the version and the compute backend found (CUDA devices with their
//                  properties and library versions, or "CPU only" and why), exit 0.
//   --standalone --config job.yaml
//                  train the job in this one process (worker/train/trainer.h) on --device
//                  (auto: cuda:0 when a GPU is visible, else the CPU); --steps N stops after N
//                  steps; --init-from-hf DIR / --export-hf DIR import and export HuggingFace
//                  Mixtral / Qwen3-MoE checkpoints. Exit 0 when training completes, 1 on an error
//                  (the message names the field or file).
//   --eval --load DIR --config job.yaml
//                  print the validation loss of a checkpoint (worker/train/trainer.h,
//                  RunEvaluation): DIR is a training.save directory (its latest step), one of its
//                  step_<N> directories, or a HuggingFace directory (config.json: ImportHfModel);
//                  the loss over training.eval_iters (default 100) global batches of the valid
//                  share of data.split (default "969,30,1") of the spec's dataset, the number the
//                  training run's log line shows for those weights. With --rank/--world-size/
//                  --rendezvous (our checkpoints only) the ranks evaluate together. Exit 0, or 1
//                  with the error.
//   --rank R --world-size W --rendezvous DIR --config job.yaml
//                  run rank R of a W-process job (data, tensor, context, expert and
//                  expert-tensor parallelism: parallel.tensor_model_parallel_size,
//                  context_parallel_size, expert_model_parallel_size and
//                  expert_tensor_parallel_size of the spec; world_size must be W or unset). The
//                  ranks meet through a file key-value store in DIR (a directory every rank can
//                  reach; use a fresh one per run). --device auto picks cuda:(R mod GPUs) and NCCL
//                  when GPUs are visible, else the CPU and Gloo over TCP (--gloo-host, default
//                  127.0.0.1). Rank 0 prints the log; every rank exits 1 with the error when the
//                  job fails (a lost peer included: --comm-timeout bounds every collective).
//                  --steps, checkpoints (training.save/load, resharded on resume) as standalone.
//                  --async-save (standalone and multi-process) writes checkpoints in a background
//                  thread (worker/train/trainer.h, TrainerOptions::async_save).
//   --coordinator host:port [--token-file F] [--tls-root-cert PEM] [--metrics-port P]
//   [--metrics-bind-address A] [--checkpoint-root DIR] [--data-root DIR] [--job jobs/<id>]
//                  the worker agent (worker/agent/agent.h, proto/switchyard/v1/WORKER_PROTOCOL.md):
//                  attach to the coordinator, run the generations it assigns (their paths must
//                  resolve inside the two roots, common/config/job_paths.h), report steps; exit 0
//                  after SIGTERM/SIGINT or, with --job, once that job is finished; 1 for a
//                  permanent error (bad options, rejected token, --job naming a missing or
//                  finished job), 75 when the process must be restarted.
// Without a mode the usage goes to stderr and the exit status is 2. Flags may be spelled with '-'
// or '_' (--self-check == --self_check).
#include <cuda_runtime.h>
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "common/command_line.h"
#include "common/config/config.h"
#include "common/version.h"
#include "kernels/runtime/stream.h"
#include "worker/agent/agent.h"
#include "worker/comm/kv_store.h"
#include "worker/comm/peer_monitor.h"
#include "worker/self_check.h"
#include "worker/train/process_groups.h"
#include "worker/train/trainer.h"

ABSL_FLAG(bool, self_check, false,
          "Print the version and the compute backend found (CUDA devices or CPU only), then exit.");
ABSL_FLAG(bool, standalone, false, "Train the job of --config in this process.");
ABSL_FLAG(bool, eval, false,
          "Print the validation loss of the checkpoint --load names on the valid split of "
          "--config's dataset (training.eval_iters global batches), then exit.");
ABSL_FLAG(std::string, load, "",
          "With --eval: a checkpoint directory (its latest step), one of its step_<N> "
          "directories, or a HuggingFace Mixtral/Qwen3-MoE directory (one process).");
ABSL_FLAG(std::string, eval_tokens_out, "",
          "With --eval (one process): also write the token windows it scored to this file, "
          "int32 little-endian [samples, seq_length + 1] (inputs are [:, :-1], targets [:, 1:]), "
          "so another implementation can score the same tokens (tools/hf_eval_check.py).");
ABSL_FLAG(bool, async_save, false,
          "Write checkpoints in a background thread (Megatron's --async-save; standalone and "
          "multi-process jobs): the state is copied to the host on the step, the next save or "
          "step commits it and reports a failed write.");
ABSL_FLAG(std::string, config, "", "Job spec file (YAML or JSON) for --standalone and --eval.");
ABSL_FLAG(std::string, device, "auto", "auto | cpu | cuda | cuda:N");
ABSL_FLAG(int64_t, steps, 0, "Stop after this many steps (0: run to training.train_iters).");
ABSL_FLAG(std::string, init_from_hf, "",
          "Initialise the model from a HuggingFace Mixtral/Qwen3-MoE directory.");
ABSL_FLAG(std::string, export_hf, "", "Export the trained model as a HuggingFace directory.");
ABSL_FLAG(std::string, hf_architecture, "",
          "MixtralForCausalLM | Qwen3MoeForCausalLM for --export-hf without --init-from-hf.");
ABSL_FLAG(int, rank, -1, "This process's rank in a multi-process job (with --world-size).");
ABSL_FLAG(int, world_size, 0, "Number of processes of the job (with --rank and --rendezvous).");
ABSL_FLAG(std::string, rendezvous, "",
          "Directory of the file key-value store where the ranks meet (fresh per run).");
ABSL_FLAG(std::string, gloo_host, "127.0.0.1",
          "Address this rank's Gloo transport listens on and advertises (CPU jobs).");
ABSL_FLAG(int, comm_timeout, 60, "Seconds: bound on rendezvous and on every collective.");
ABSL_FLAG(std::string, coordinator, "",
          "Run as a worker agent of the coordinator at host:port (gRPC).");
ABSL_FLAG(std::string, token_file, "",
          "File holding the workers' bearer token (the coordinator's --worker-token-file, not "
          "the API token).");
ABSL_FLAG(std::string, tls_root_cert, "", "PEM root certificate of a TLS coordinator.");
ABSL_FLAG(int, metrics_port, -1, "Agent: serve /metrics on this port (0 any, -1 none).");
ABSL_FLAG(std::string, metrics_bind_address, "0.0.0.0",
          "Agent: the address /metrics listens on (127.0.0.1: this machine only).");
ABSL_FLAG(int, heartbeat_ms, 1000, "Agent: heartbeat period in milliseconds.");
ABSL_FLAG(std::string, checkpoint_root, "/checkpoints",
          "Agent: the coordinator's --checkpoint-root (same path here); assigned training.save "
          "and training.load must resolve inside it.");
ABSL_FLAG(std::string, data_root, "/data",
          "Agent: the coordinator's --data-root (same path here); assigned data paths and "
          "tokenizer must resolve inside it.");
ABSL_FLAG(
    std::string, job, "",
    "Agent: scope this worker to one job (jobs/<id>): the coordinator gives it that job only, "
    "and it exits 0 once the job is finished (one Kubernetes pod set per job).");
ABSL_FLAG(double, peak_tflops, 989.4, "Peak TFLOP/s of the GPU for MFU (H100/H200 dense bf16).");

namespace {

constexpr char kUsage[] =
    "executes a Switchyard plan on one GPU (or CPU).\n"
    "usage:\n"
    "  switchyard-worker --self-check   print version and backend (CUDA devices or CPU only)\n"
    "  switchyard-worker --standalone --config job.yaml [--device auto|cpu|cuda:N] [--steps N]\n"
    "                    [--init-from-hf DIR] [--export-hf DIR] [--async-save]\n"
    "                    train in this process\n"
    "  switchyard-worker --eval --load DIR --config job.yaml [--device ...]\n"
    "                    validation loss of a checkpoint (ours or HuggingFace) on the valid split\n"
    "  switchyard-worker --rank R --world-size W --rendezvous DIR --config job.yaml\n"
    "                    [--device ...] [--steps N] [--async-save]   run rank R of a W-process "
    "job\n"
    "  switchyard-worker --coordinator HOST:PORT [--token-file F] [--device ...]\n"
    "                    [--metrics-port P] [--checkpoint-root DIR] [--data-root DIR]\n"
    "                    [--job jobs/<id>]\n"
    "                    attach to a coordinator and run its jobs (with --job: that job only,\n"
    "                    exit 0 once it is finished)\n"
    "  switchyard-worker --help         list the worker's flags\n"
    "  switchyard-worker --version      print the version";

int SelfCheck() {
  std::printf("switchyard-worker %s (%s, %s)\n", switchyard::kVersion, switchyard::kBuildCompiler,
              switchyard::kBuildMode);
  absl::StatusOr<switchyard::worker::BackendInfo> info = switchyard::worker::QueryBackend();
  if (!info.ok()) {
    std::fprintf(stderr, "self-check failed: %s\n", info.status().ToString().c_str());
    return 1;
  }
  std::fputs(switchyard::worker::FormatBackend(*info).c_str(), stdout);
  return 0;
}

absl::StatusOr<switchyard::Device> ParseDevice(const std::string& name) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (name == "cpu") return switchyard::Device::Cpu();
  if (name == "auto") return count > 0 ? switchyard::Device::Cuda(0) : switchyard::Device::Cpu();
  int index = 0;
  if (name != "cuda" && !(absl::StartsWith(name, "cuda:") &&
                          absl::SimpleAtoi(name.substr(5), &index) && index >= 0)) {
    return absl::InvalidArgumentError("--device: expected auto, cpu, cuda or cuda:N, got \"" +
                                      name + "\"");
  }
  if (index >= count) {
    return absl::InvalidArgumentError("--device " + name + ": only " + std::to_string(count) +
                                      " CUDA device(s) visible");
  }
  return switchyard::Device::Cuda(index);
}

// One rank of a multi-process job: process groups from the rendezvous directory, then the
// standalone loop with them.
int Distributed() {
  const int rank = absl::GetFlag(FLAGS_rank), world = absl::GetFlag(FLAGS_world_size);
  const std::string rdzv = absl::GetFlag(FLAGS_rendezvous), path = absl::GetFlag(FLAGS_config);
  if (world < 1 || rank < 0 || rank >= world || rdzv.empty() || path.empty()) {
    std::fprintf(stderr,
                 "switchyard-worker: a multi-process job needs --rank R (0 <= R < W), "
                 "--world-size W (>= 1), --rendezvous DIR and --config job.yaml\n");
    return 2;
  }
  if (!absl::GetFlag(FLAGS_export_hf).empty() || !absl::GetFlag(FLAGS_init_from_hf).empty()) {
    std::fprintf(stderr,
                 "switchyard-worker: --export-hf / --init-from-hf work with --standalone only "
                 "(export a checkpoint of this job with a standalone worker)\n");
    return 2;
  }
  absl::StatusOr<switchyard::v1::JobSpec> spec = switchyard::LoadJobSpecFile(path);
  if (!spec.ok()) {
    std::fprintf(stderr, "switchyard-worker: rank %d: %s\n", rank,
                 spec.status().ToString().c_str());
    return 1;
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  std::string device_name = absl::GetFlag(FLAGS_device);
  if (device_name == "auto") device_name = gpus > 0 ? "cuda:" + std::to_string(rank % gpus) : "cpu";
  absl::StatusOr<switchyard::Device> device = ParseDevice(device_name);
  if (!device.ok()) {
    std::fprintf(stderr, "switchyard-worker: %s\n", device.status().ToString().c_str());
    return 2;
  }
  auto fail = [rank](const absl::Status& st) {
    std::fprintf(stderr, "switchyard-worker: rank %d: %s\n", rank, st.ToString().c_str());
    return 1;
  };
  absl::StatusOr<std::unique_ptr<switchyard::comm::FileKvStore>> store =
      switchyard::comm::FileKvStore::Create(rdzv);
  if (!store.ok()) return fail(store.status());
  std::shared_ptr<switchyard::comm::KvStore> shared(std::move(*store));
  switchyard::ParallelDims dims;
  dims.world_size = world;
  const switchyard::v1::ParallelConfig& par = spec->parallel();
  if (par.has_tensor_model_parallel_size()) {
    dims.tensor_model_parallel_size = par.tensor_model_parallel_size();
  }
  if (par.has_expert_model_parallel_size()) {
    dims.expert_model_parallel_size = par.expert_model_parallel_size();
  }
  if (par.has_context_parallel_size()) {
    dims.context_parallel_size = par.context_parallel_size();
  }
  if (par.has_expert_tensor_parallel_size()) {
    dims.expert_tensor_parallel_size = par.expert_tensor_parallel_size();
  }
  const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_comm_timeout));
  // The compute stream outlives the groups and the trainer (declared before them).
  switchyard::kernels::OwnedStream stream;
  absl::StatusOr<std::unique_ptr<switchyard::train::ProcessGroups>> groups;
  if (device->is_cuda()) {
    if (cudaSetDevice(device->index) != cudaSuccess) {
      return fail(absl::InternalError("cannot use " + device->ToString()));
    }
    absl::StatusOr<switchyard::kernels::OwnedStream> created =
        switchyard::kernels::OwnedStream::Create(*device);
    if (!created.ok()) return fail(created.status());
    stream = *std::move(created);
    switchyard::comm::NcclOptions nopt;
    nopt.timeout = timeout;
    groups = switchyard::train::CreateNcclProcessGroups(shared, rank, dims, device->index,
                                                        stream.view().cuda_stream, nopt);
  } else {
    switchyard::comm::GlooOptions gopt;
    gopt.hostname = absl::GetFlag(FLAGS_gloo_host);
    gopt.timeout = timeout;
    groups = switchyard::train::CreateGlooProcessGroups(shared, rank, dims, gopt);
  }
  if (!groups.ok()) return fail(groups.status());
  // Heartbeats through the same store: an error caused by a dead peer names it, and a peer lost
  // while this rank waits in a collective aborts the communicators instead of waiting for the
  // full timeout.
  switchyard::comm::PeerMonitorOptions mopt;
  mopt.startup_timeout = timeout;
  switchyard::train::ProcessGroups* raw_groups = groups->get();
  mopt.on_lost = [raw_groups](const std::string&) { raw_groups->AbortAll(); };
  absl::StatusOr<std::unique_ptr<switchyard::comm::PeerMonitor>> monitor =
      switchyard::comm::PeerMonitor::Create(shared, rank, world, mopt);
  if (!monitor.ok()) return fail(monitor.status());
  switchyard::train::TrainerOptions options;
  options.device = *device;
  options.peak_tflops = absl::GetFlag(FLAGS_peak_tflops);
  options.groups = groups->get();
  options.cuda_stream = stream.view().cuda_stream;
  options.async_save = absl::GetFlag(FLAGS_async_save);
  switchyard::train::StandaloneOptions standalone;
  standalone.max_steps = absl::GetFlag(FLAGS_steps);
  standalone.progress_bar = rank == 0;
  std::FILE* out = rank == 0 ? stdout : std::fopen("/dev/null", "w");
  absl::Status st;
  if (absl::GetFlag(FLAGS_eval)) {
    st =
        switchyard::train::RunEvaluation(*spec, options, {absl::GetFlag(FLAGS_load)}, out).status();
  } else {
    st = switchyard::train::RunStandalone(*spec, options, standalone, out);
  }
  if (out != stdout && out != nullptr) std::fclose(out);
  if (!st.ok()) {
    st = (*monitor)->AnnotateFailure(st);
    // Unblock the peers still inside a collective with us, then report.
    (*groups)->AbortAll();
    return fail(st);
  }
  return 0;
}

int Agent() {
  switchyard::agent::AgentOptions o;
  o.coordinator = absl::GetFlag(FLAGS_coordinator);
  o.token_file = absl::GetFlag(FLAGS_token_file);
  o.tls_root_cert = absl::GetFlag(FLAGS_tls_root_cert);
  o.device = absl::GetFlag(FLAGS_device);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.metrics_bind_address = absl::GetFlag(FLAGS_metrics_bind_address);
  o.gloo_host = absl::GetFlag(FLAGS_gloo_host);
  o.comm_timeout = absl::Seconds(absl::GetFlag(FLAGS_comm_timeout));
  o.peak_tflops = absl::GetFlag(FLAGS_peak_tflops);
  o.heartbeat_interval = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_ms));
  o.roots.checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  o.roots.data_root = absl::GetFlag(FLAGS_data_root);
  o.job = absl::GetFlag(FLAGS_job);
  return switchyard::agent::AgentMain(o);  // before any other thread starts
}

// --config's spec and --device's device for the one-process modes; 0, or the exit code (the
// reason printed): 1 for a spec that does not load, 2 for a bad --device.
int LoadSpecAndDevice(switchyard::v1::JobSpec* spec, switchyard::Device* device) {
  absl::StatusOr<switchyard::v1::JobSpec> loaded =
      switchyard::LoadJobSpecFile(absl::GetFlag(FLAGS_config));
  if (!loaded.ok()) {
    std::fprintf(stderr, "switchyard-worker: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<switchyard::Device> parsed = ParseDevice(absl::GetFlag(FLAGS_device));
  if (!parsed.ok()) {
    std::fprintf(stderr, "switchyard-worker: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  *spec = *std::move(loaded);
  *device = *parsed;
  return 0;
}

int Standalone() {
  if (absl::GetFlag(FLAGS_config).empty()) {
    std::fprintf(stderr, "switchyard-worker: --standalone needs --config job.yaml\n");
    return 2;
  }
  switchyard::v1::JobSpec spec;
  switchyard::train::TrainerOptions options;
  if (int rc = LoadSpecAndDevice(&spec, &options.device)) return rc;
  options.peak_tflops = absl::GetFlag(FLAGS_peak_tflops);
  options.async_save = absl::GetFlag(FLAGS_async_save);
  switchyard::train::StandaloneOptions standalone;
  standalone.max_steps = absl::GetFlag(FLAGS_steps);
  standalone.init_from_hf = absl::GetFlag(FLAGS_init_from_hf);
  standalone.export_hf = absl::GetFlag(FLAGS_export_hf);
  standalone.hf_architecture = absl::GetFlag(FLAGS_hf_architecture);
  absl::Status st = switchyard::train::RunStandalone(spec, options, standalone, stdout);
  if (!st.ok()) {
    std::fprintf(stderr, "switchyard-worker: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

// --eval in one process: RunEvaluation on --load's checkpoint.
int Evaluate() {
  const std::string load = absl::GetFlag(FLAGS_load);
  if (absl::GetFlag(FLAGS_config).empty() || load.empty()) {
    std::fprintf(stderr, "switchyard-worker: --eval needs --load DIR and --config job.yaml\n");
    return 2;
  }
  switchyard::v1::JobSpec spec;
  switchyard::train::TrainerOptions options;
  if (int rc = LoadSpecAndDevice(&spec, &options.device)) return rc;
  switchyard::train::EvaluationOptions evaluation;
  evaluation.load = load;
  evaluation.tokens_out = absl::GetFlag(FLAGS_eval_tokens_out);
  absl::StatusOr<double> loss = switchyard::train::RunEvaluation(spec, options, evaluation, stdout);
  if (!loss.ok()) {
    std::fprintf(stderr, "switchyard-worker: %s\n", loss.status().ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A peer's reset connection (Gloo, a metrics scrape, the coordinator) is an error to report, not
  // a reason to die: without this a write to it would kill the worker with SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  absl::SetProgramUsageMessage(kUsage);
  absl::FlagsUsageConfig usage_config;
  // --help lists the flags defined under worker/ (Abseil's default matches only <program>.cc).
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "worker/");
  };
  usage_config.version_string = [] {
    return std::string("switchyard-worker ") + switchyard::kVersion + "\n";
  };
  absl::SetFlagsUsageConfig(usage_config);
  // "--self-check" is accepted as "--self_check".
  std::vector<std::string> args = switchyard::NormalizeFlagNames(argc, argv);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  std::vector<char*> positional =
      switchyard::ParseCommandLine(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  if (positional.size() > 1) {
    std::fprintf(stderr, "switchyard-worker: unexpected argument '%s'\nswitchyard-worker: %s\n",
                 positional[1], kUsage);
    return 2;
  }
  if (absl::GetFlag(FLAGS_self_check)) return SelfCheck();
  const bool multi = absl::GetFlag(FLAGS_world_size) > 0 || absl::GetFlag(FLAGS_rank) >= 0;
  if (absl::GetFlag(FLAGS_eval) && absl::GetFlag(FLAGS_standalone)) {
    std::fprintf(stderr, "switchyard-worker: --eval and --standalone are separate modes\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_eval) && !multi) return Evaluate();
  if (absl::GetFlag(FLAGS_standalone)) return Standalone();
  if (!absl::GetFlag(FLAGS_coordinator).empty()) return Agent();
  if (multi) return Distributed();
  std::fprintf(stderr, "switchyard-worker: %s\n", kUsage);
  return 2;
}
