// File: worker/agent/generation.h
//
// One generation of a job on this worker, as the agent (agent.h) runs it on its training thread:
//
//   PrepareGeneration(assignment, device, roots)
//                                   on Assignment: checks the assignment and the spec (the
//                                   worker validates before the Start, WORKER_PROTOCOL.md), that
//                                   its paths resolve inside the worker's own roots, and fixes the
//                                   parallel sizes; nothing is started.
//   RunGeneration(prepared, env, control)
//                                   on Start, on the training thread: rendezvous through the
//                                   coordinator (RendezvousKvStore, keys scoped by job and
//                                   generation), process groups (Gloo on the CPU, NCCL on a GPU;
//                                   none for world 1), the paths re-checked against the roots
//                                   just before anything is opened, a Trainer, resume (below),
//                                   then steps until training.train_iters
//                                   or a stop, reporting every step through env.on_step,
//                                   checkpointing every training.save_interval steps, on
//                                   CheckpointNow, and at the end.
//   GenerationControl               the agent's handle on a running generation: Stop aborts the
//                                   communicators (and a rendezvous still waiting), CheckpointNow
//                                   asks for a save after the current step. Any thread.
//
// Paths (common/config/job_paths.h): the coordinator sends absolute paths under its
// --checkpoint-root and --data-root; the worker does not trust them. training.save and
// training.load must resolve (symlinks followed) inside roots.checkpoint_root, the data paths (and
// their .bin/.idx) and data.tokenizer_model inside roots.data_root; otherwise the generation is
// refused with INVALID_ARGUMENT naming the field (WorkerExit 1) before a file is opened or created.
//
// Resume: worker/train/resume.h (the one rule, shared with standalone runs): the job's own
// checkpoints (training.save) win, else training.load must load, else from scratch. Generation 1
// finding a checkpoint in its own directory is FAILED_PRECONDITION naming it: that checkpoint is
// an earlier job's with the same id (a store created anew over an old checkpoint volume).
//
// CheckpointNow is collective (Trainer::Save gathers the state), but the message reaches the
// ranks between different steps; so after every step the ranks all-reduce (max) "has a request"
// over the world group, and all save after the same step. A rank whose request came in after
// that agreement saves once more later (harmless: same format, a newer step).
#ifndef SWITCHYARD_WORKER_AGENT_GENERATION_H_
#define SWITCHYARD_WORKER_AGENT_GENERATION_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/config/job_paths.h"
#include "common/model/parallel_state.h"
#include "common/tensor.h"
#include "switchyard/v1/metrics.pb.h"
#include "switchyard/v1/worker.pb.h"
#include "worker/agent/rendezvous_kv_store.h"
#include "worker/train/process_groups.h"
#include "worker/train/trainer.h"

namespace switchyard::agent {

// An assignment checked and ready to start.
struct PreparedGeneration {
  v1::Assignment assignment;
  JobRoots roots;    // the worker's own roots, which every path of `spec` must resolve into
  v1::JobSpec spec;  // parallel.world_size and the mapping's parallel sizes as assigned
  Device device;
  ParallelDims dims;
};

// INVALID_ARGUMENT naming the field and the rule for a bad assignment (empty job, generation
// < 1, rank outside [0, world_size), a spec world size or EP, CP, ETP, TP or PP size that
// contradicts the assignment's mapping, a spec that fails ValidateJobSpec, a path of the spec
// outside `roots`: "assignment.spec.training.save (\"/etc/cron.d\") resolves to /etc/cron.d,
// outside the checkpoint root ..."); UNIMPLEMENTED for what the engine does not run
// (common/model/engine_support.h; nothing the layout rules accept today), named under
// "assignment.spec.".
absl::StatusOr<PreparedGeneration> PrepareGeneration(const v1::Assignment& assignment,
                                                     const Device& device, const JobRoots& roots);

// The WorkerExit code for how a generation ended (DESIGN.md, WORKER_PROTOCOL.md): 0 for OK;
// 1 (permanent) for INVALID_ARGUMENT, FAILED_PRECONDITION, UNIMPLEMENTED, NOT_FOUND,
// ALREADY_EXISTS, OUT_OF_RANGE, PERMISSION_DENIED, UNAUTHENTICATED, RESOURCE_EXHAUSTED and
// DATA_LOSS; 128 + the code's number (retryable) for the others: CANCELLED 129, UNKNOWN 130,
// DEADLINE_EXCEEDED 132, ABORTED 138, INTERNAL 141, UNAVAILABLE 142. 143 (stopped on request) is
// never produced here: kStoppedExitCode is the agent's to send.
int ExitCodeFor(const absl::Status& status);
inline constexpr int kStoppedExitCode = 143;

// StepMetrics of one step; expert load per MoE layer labelled with its model layer index
// (`moe_layers[l]` true for MoE layer l), summarised min / max / mean / imbalance (max / mean),
// with the full vector; validation_loss and validation_perplexity (= exp) only when the step
// evaluated (StepResult::validation_loss).
v1::StepMetrics ToStepMetrics(const train::StepResult& r, const std::vector<bool>& moe_layers);

// Shared by the agent (any thread) and the training thread of one generation.
class GenerationControl {
 public:
  // Ends the generation: marks it stopped, cancels a pending rendezvous and aborts the
  // communicators (unblocking a collective). Idempotent.
  // `reason` ("Stop: <coordinator's reason>", "worker shutting down") is kept for the exit
  // message (the first one given wins).
  void RequestStop(const std::string& reason = "");
  bool stop_requested() const { return stop_.load(); }
  std::string stop_reason();
  void RequestCheckpoint() { checkpoint_.store(true); }
  // Returns and clears the pending CheckpointNow.
  bool TakeCheckpointRequest() { return checkpoint_.exchange(false); }

  // The training thread publishes what RequestStop must abort (nullptr when gone). When a stop
  // came first, publishing aborts at once.
  void SetStore(RendezvousKvStore* store);
  void SetGroups(train::ProcessGroups* groups);

 private:
  std::atomic<bool> stop_{false};
  std::atomic<bool> checkpoint_{false};
  absl::Mutex mu_;
  std::string reason_ ABSL_GUARDED_BY(mu_);
  RendezvousKvStore* store_ ABSL_GUARDED_BY(mu_) = nullptr;
  train::ProcessGroups* groups_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// What RunGeneration needs from the agent.
struct GenerationEnv {
  // Channel to the rendezvous service (the assignment's rendezvous_address), and the token.
  std::shared_ptr<grpc::Channel> rendezvous_channel;
  std::string rendezvous_address;
  std::string token;
  std::string worker_id;  // sent with every rendezvous call
  std::string gloo_host = "127.0.0.1";
  absl::Duration comm_timeout = absl::Seconds(60);
  double peak_tflops = 989.4;
  // Called on the training thread after every optimizer step.
  std::function<void(const v1::StepMetrics&)> on_step;
  // Called on the training thread after every committed checkpoint save (the saves are
  // synchronous here), with the step it holds, its directory and whether it answered a
  // CheckpointNow; may be empty.
  std::function<void(int64_t step, const std::string& dir, bool requested)> on_saved;
  // Called with one line per event (resumed, saved, finished); may be empty.
  std::function<void(const std::string&)> log;
};

// Runs the generation on the calling thread. OK when training.train_iters is reached or when a
// stop was requested (control->stop_requested() tells which); otherwise the first error,
// annotated with the phase (rendezvous, trainer, resume, step N, save).
absl::Status RunGeneration(const PreparedGeneration& prepared, const GenerationEnv& env,
                           GenerationControl* control);

}  // namespace switchyard::agent

#endif  // SWITCHYARD_WORKER_AGENT_GENERATION_H_
