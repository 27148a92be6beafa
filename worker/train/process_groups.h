// File: worker/train/process_groups.h
//
// The communicators one rank of a distributed job needs, made from a ParallelLayout
// (common/model/parallel_state.h) and a rendezvous store: the world group, then one sub-group per
// role below (Gloo over TCP for CPU ranks, NCCL for GPU ranks). Roles whose members coincide
// share one communicator (with TP = CP = PP = 1, DP×CP, TP×DP×CP and the world are the same ranks),
// so a role's pointer may equal another's; all are owned here.
//
//   tp            TP     (ParallelGroup::kTensor): the sequence-parallel all-gathers and
//                 reduce-scatters of the model, the all-reduce of TP-replicated gradients, the
//                 aux-loss counts of each micro-batch's sequence shards
//   data          DP×CP  (ParallelGroup::kDataContext): dense gradients
//   cp            CP     (kContext): the K/V all-gather and dK/dV reduce-scatter of context-
//                 parallel attention, and the aux-loss counts of each micro-batch's chunks
//   tdc           TP×DP×CP (kTensorDataContext): expert-bias and global_aux_loss token counts,
//                 loss statistics
//   expert        EP     (kExpert): the MoE dispatch all-to-alls
//   etp           ETP    (kExpertTensor): the alltoall dispatcher's all-gather / reduce-scatter
//                 around the EP all-to-all (megatron_moe.md §3.2)
//   etp_ep        ETP×EP (kExpertTensorExpert): the allgather dispatcher's gathers (§3.3)
//   expert_data   EDP    (kExpertData): expert gradients
//   expert_model  ETP×EP×PP (kExpertTensorExpertPipeline): the expert part of the global norm
//   pp            PP     (kPipeline): the stages of one model replica, in stage order (group rank
//                 = stage); the pipeline schedule's activation / gradient Send and Recv
//   grad_data, grad_expert_data: DP×CP and EDP again, as communicators of their own (never shared
//                 with another role), for the gradient reduce-scatters that a background thread
//                 runs during the backward pass; on NCCL they run on `grad_stream`, a stream of
//                 their own made here (the compute stream keeps computing meanwhile).
//
// Every NCCL communicator here runs on the compute stream given to CreateNcclProcessGroups (the
// grad_* ones on grad_stream) and returns before its collectives complete; Synchronize() below is
// the bounded host wait for all of the compute thread's groups.
//
// Creation is collective over the world: every rank calls the same factory with the same dims
// and store (scoped to the job and generation, e.g. a PrefixedKvStore). Every valid layout gets
// its groups, PP > 1 included; the trainer runs PP (its 1F1B schedule sends on `pp`), the worker
// agent and the coordinator still refuse it (common/model/engine_support.h).
#ifndef SWITCHYARD_WORKER_TRAIN_PROCESS_GROUPS_H_
#define SWITCHYARD_WORKER_TRAIN_PROCESS_GROUPS_H_

#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/parallel_state.h"
#include "kernels/runtime/stream.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/kv_store.h"
#include "worker/comm/nccl_communicator.h"

namespace switchyard::train {

struct ProcessGroups {
  ProcessGroups(ParallelLayout l, int r) : layout(std::move(l)), rank(r) {}
  ParallelLayout layout;
  int rank = 0;  // world rank
  comm::Communicator* world = nullptr;
  comm::Communicator* tp = nullptr;
  comm::Communicator* data = nullptr;
  comm::Communicator* cp = nullptr;
  comm::Communicator* tdc = nullptr;
  comm::Communicator* expert = nullptr;
  comm::Communicator* etp = nullptr;
  comm::Communicator* etp_ep = nullptr;
  comm::Communicator* expert_data = nullptr;
  comm::Communicator* expert_model = nullptr;
  comm::Communicator* pp = nullptr;
  comm::Communicator* grad_data = nullptr;
  comm::Communicator* grad_expert_data = nullptr;
  kernels::OwnedStream grad_stream;  // NCCL only (inert on Gloo); destroyed after the groups
  ~ProcessGroups();
  // Aborts every communicator (unblocks a rank stuck in a collective). Any thread.
  void AbortAll();
  // Synchronize() on every communicator the compute thread uses (all but grad_data and
  // grad_expert_data, which belong to the GradReducer's thread and are synchronised by its
  // Wait()): returns once every collective they enqueued has completed, or the first error
  // (each wait bounded by the communicators' timeout). NCCL collectives return before they
  // complete (communicator.h, "Completion"): call this before the host reads a collective's
  // result or waits on the compute stream (comm::WaitEvent's rule); on Gloo it only reports the
  // groups' state.
  absl::Status Synchronize() const;
  std::vector<std::unique_ptr<comm::Communicator>> owned;
};

// INVALID_ARGUMENT for a bad layout (the §5.2 rules, naming the field); the communicators' errors
// otherwise (DEADLINE_EXCEEDED when a peer does not show up within the options' timeout).
absl::StatusOr<std::unique_ptr<ProcessGroups>> CreateGlooProcessGroups(
    std::shared_ptr<comm::KvStore> store, int rank, const ParallelDims& dims,
    const comm::GlooOptions& options);
// One GPU per rank: `device`; `stream` is the compute stream every communicator runs on
// (NcclCommunicator's stream contract), borrowed.
absl::StatusOr<std::unique_ptr<ProcessGroups>> CreateNcclProcessGroups(
    std::shared_ptr<comm::KvStore> store, int rank, const ParallelDims& dims, int device,
    cudaStream_t stream, const comm::NcclOptions& options);

}  // namespace switchyard::train

#endif  // SWITCHYARD_WORKER_TRAIN_PROCESS_GROUPS_H_
