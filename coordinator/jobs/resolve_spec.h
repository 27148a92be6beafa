// File: coordinator/jobs/resolve_spec.h
//
// The coordinator's one validation path for job specs. CreateJob (submit), PlanService.Plan and
// the scheduler each call ResolveJobSpec, so a spec is defaulted, completed with what the
// coordinator knows, and checked the same way everywhere: a spec accepted at submit is one the
// scheduler can plan, and one the scheduler would refuse is refused at submit.
//
// Resolution, applied once, in this order:
//   1. ApplyDefaults (common/config/config_defaults.h): Megatron's defaults.
//   2. queue, when empty: kDefaultQueue (so the stored spec names its queue).
//   3. model.vocab_size, when unset and the job reads the default corpus (no data.mock_data, no
//      data.data_path): the default corpus's vocabulary, CoordinatorContext.default_vocab_size
//      (the coordinator reads its manifest at start, data/corpus.h; the worker fills the same
//      value from the same manifest, worker/train/trainer.cc).
//   4. Nothing else: paths stay as the user wrote them (relative, common/config/job_paths.h) and
//   are
//      resolved under the roots when the assigned spec is built (jobs/placement.h
//      AssignedSpec). Rules that need a checkpoint directory (save_interval) see an empty
//      training.save as the job's own directory when the coordinator has a checkpoint root.
// Rules, in this order; the first violation is INVALID_ARGUMENT naming the field and the rule:
//   a. ValidateJobSpec (common/config/validate.h): bounds (sizes, control characters), then
//      Megatron's rules.
//   b. model.vocab_size is required (the planner sizes the embedding from it).
//   c. What the workers run (common/model/engine_support.h UnsupportedJobSpec): any TP, CP, ETP,
//      PP and VPP the layout rules accept, evaluation included.
//   d. The job-path rules (common/config/job_paths.h CheckJobSpecPaths): every path relative, no
//      '..', load only another job's checkpoint by name.
//   e. The queue rules: queue is empty (the default queue) or one of the coordinator's queues;
//      priority within [-1000, 1000]; the job's minimum workers (WorkerRange) at most its
//      queue's quota (a larger gang could never be admitted).
// What the rules cannot know at submit (the world size the workers allow, memory) is the
// scheduler's and the planner's to report (a PENDING event or NO_FEASIBLE_PLAN).
//
// Thread safety: pure functions.
#ifndef SWITCHYARD_COORDINATOR_JOBS_RESOLVE_SPEC_H_
#define SWITCHYARD_COORDINATOR_JOBS_RESOLVE_SPEC_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "switchyard/v1/config.pb.h"
#include "switchyard/v1/plan.pb.h"

namespace switchyard::jobs {

// What the coordinator fills into a spec.
struct CoordinatorContext {
  // Where jobs checkpoint (<checkpoint_root>/jobs/<job id>), as the workers see it. Empty: the
  // coordinator fills no training.save, so rules needing a checkpoint directory
  // (training.save_interval) need the spec's own.
  std::string checkpoint_root;
  // The default corpus's vocabulary; 0 when the coordinator found no default corpus (a job
  // reading it must then set model.vocab_size).
  int64_t default_vocab_size = 0;
  // The coordinator's queues (--queues) and each one's worker quota: at most that many workers
  // (one GPU each) run the queue's jobs at once. kDefaultQueue always exists; unlisted, it has no
  // quota. A job naming another queue is refused.
  std::map<std::string, int32_t> queue_quotas;
};

// The queue of a spec whose JobSpec.queue is empty.
inline constexpr char kDefaultQueue[] = "default";
// JobSpec.priority must lie within [-kMaxPriority, kMaxPriority].
inline constexpr int32_t kMaxPriority = 1000;

// The queue a (stored) spec counts against: JobSpec.queue, or kDefaultQueue when empty.
std::string QueueOf(const v1::JobSpec& spec);

// The worker quota of `queue`, nullopt when it has none (an unlisted default queue).
std::optional<int32_t> QueueQuota(const CoordinatorContext& context, const std::string& queue);

// Parses the coordinator's --queues value, "NAME=WORKERS[,NAME=WORKERS...]" (e.g. "a=2,b=2";
// empty: no quotas). INVALID_ARGUMENT naming --queues and the rule: a name must be a DNS-1123
// label (lower-case letters, digits, '-', at most 63, alphanumeric at both ends), listed once;
// WORKERS a non-negative integer.
absl::StatusOr<std::map<std::string, int32_t>> ParseQueueQuotas(absl::string_view flag);

// The resolved spec (steps 1-4) if it passes the rules (a-e), else INVALID_ARGUMENT.
absl::StatusOr<v1::JobSpec> ResolveJobSpec(const v1::JobSpec& spec,
                                           const CoordinatorContext& context);

// PlanService's request as the scheduler would plan it: the spec resolved (ResolveJobSpec, no
// job id; its defaults fix every parallel size the spec leaves unset, EP included, to 1, as in
// the stored spec the scheduler plans), the spec's TP (sequence parallelism exactly when > 1),
// ETP, CP and PP (each 1 when unset; the parallelism the workers run), and
// min_workers 1 when neither it nor parallel.world_size is set (the scheduler's worker range), so
// the largest feasible world up to cluster.num_gpus is planned. `syctl plan` thus shows the
// mapping the scheduler would start on that many workers; there are no alternatives of other
// sizes to list. The cluster is the caller's.
//
// With request.search (plan.proto PlanSearch, opt-in: `syctl plan --search`), the resolved spec
// instead lets the planner rank every mapping of one world: the spec is resolved and checked as
// above, then each of TP, CP, PP, ETP and EP that request.spec leaves UNSET (field presence of the
// spec as sent, before the defaults made EP 1 and the rest 1 or TP) is cleared again, so PlanJob
// enumerates it, and the searched world (search.world_size, else the spec's parallel.world_size,
// else cluster.num_gpus capped by max_workers) is the only one planned (min_workers = max_workers
// = it when the spec sets no parallel.world_size). A size the spec
// sets, to 1 or more, stays pinned. INVALID_ARGUMENT naming the field and the rule when that world
// is not positive, differs from the spec's parallel.world_size, exceeds cluster.num_gpus, lies
// outside the spec's worker range, or is not divisible by the pinned TP * CP * PP (or, for a MoE
// model, ETP * EP * PP). `scope` (may be null) then gets the world and the sizes varied (for a
// dense model TP, CP and PP: EP is 1 and ETP = TP). The scheduler's path (PlanRequestFor) is
// untouched: it never searches.
absl::StatusOr<v1::PlanRequest> ResolvePlanRequest(const v1::PlanRequest& request,
                                                   const CoordinatorContext& context,
                                                   v1::SearchScope* scope = nullptr);

// The parallelism the workers run (jobs/placement.h PlanRequestFor and AssignedSpec, and
// ResolvePlanRequest): the spec's TP, ETP, CP and PP (1 when unset; CP and PP are planned only
// when the spec fixes them), sequence parallelism exactly when TP > 1 (Megatron requires it for
// MoE).
// One function so the planner request, the plan `syctl plan` shows and the spec the ranks get
// cannot drift apart.
void PinWorkerParallelism(v1::ParallelConfig* parallel);

// The one rule for an empty training.save: it is the job's own directory (JobDirectory, which
// AssignedSpec fills), provided the coordinator has a checkpoint root (the scheduler always has
// one, SchedulerOptions.checkpoint_root). Rules that need a checkpoint directory
// (training.save_interval, the planner's) must see it as set, so it becomes
// kJobDirectoryPlaceholder (common/config/job_paths.h) in the spec they check; a set save is
// kept. Used by ResolveJobSpec, ResolvePlanRequest and PlanRequestFor alike.
void StandInJobDirectory(bool has_checkpoint_root, v1::JobSpec* spec);

// "" when the workers run these parallel sizes (common/model/engine_support.h: every TP, CP, PP,
// VPP and ETP the layout rules accept, so today always ""); otherwise the rule text naming the
// field. ResolveJobSpec also applies UnsupportedJobSpec (the whole spec's rule; "" today).
std::string UnsupportedParallelism(const v1::ParallelConfig& parallel);

}  // namespace switchyard::jobs

#endif  // SWITCHYARD_COORDINATOR_JOBS_RESOLVE_SPEC_H_
