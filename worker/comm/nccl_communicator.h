// File: worker/comm/nccl_communicator.h
//
// `NcclCommunicator`: a Communicator over NCCL (2.28) for CUDA tensors, one process (or thread)
// per GPU. The world group rendezvouses through a KvStore (kv_store.h): rank 0 creates the
// ncclUniqueId and publishes it under "nccl/<name>/unique_id"; the others read it with the
// timeout. Sub-groups are made with ncclCommSplit from an existing communicator.
//
// Streams: the interface has no per-call stream, so a communicator runs every operation on ONE
// stream given at creation (borrowed: the caller keeps it alive longer than the communicator and
// every sub-group made from it) or, when none is given, a non-blocking stream it creates and owns
// (shared with its sub-groups, destroyed with the last of them). Every call is host-synchronous:
// it enqueues the NCCL work and returns only once the stream has finished it, so an output may be
// read, and an input reused, as soon as the call returns. Inputs must be READY when the call is
// made: work that produces them on another stream must be synchronised (or recorded/waited) by
// the caller first; passing the compute stream as the communicator's stream makes this implicit.
//
// Waiting and failure: after enqueueing, the call polls ncclCommGetAsyncError and cudaStreamQuery
// (no blocking cudaStreamSynchronize), bounded by NcclOptions::timeout. A peer that died shows up
// as an NCCL asynchronous error (UNAVAILABLE whatever NCCL's code, with its message) or, when NCCL
// does not notice, as the timeout (DEADLINE_EXCEEDED, naming the group, this rank, the operation
// and the timeout). Either way the communicator aborts its NCCL communicator (ncclCommAbort, which
// also ends the stuck kernels) and is broken: every later call returns the first error.
//
// The communicator is created non-blocking (ncclConfig_t::blocking = 0): init and split poll
// ncclCommGetAsyncError until ncclSuccess or the timeout (then ncclCommAbort and
// DEADLINE_EXCEEDED naming the group).
//
// Abort() may be called from any thread. When no call is in flight it calls ncclCommAbort itself;
// when one is, it only raises a flag that the in-flight call's polling loop sees within about a
// millisecond, and that call (the only user of the NCCL handle at that moment) runs ncclCommAbort
// and returns ABORTED. This avoids freeing the handle under a concurrent ncclCommGetAsyncError.
//
// Operations and their NCCL mapping (counts are ELEMENTS, as in communicator.h):
// - AllReduce: ncclAllReduce (sum/max/min; f32, f64, bf16, i32, i64). In place allowed. NCCL's
//   reduction order depends on its algorithm (ring/tree) and is not the rank-ordered sum; integer
//   and exactly representable results are exact. bf16 is reduced by NCCL (fp32 arithmetic with
//   rounding to bf16 per step).
// - ReduceScatter: ncclReduceScatter (equal chunks of out.numel()).
// - AllGather: ncclAllGather. AllGatherV: ncclGroupStart + one ncclBroadcast per rank with a
//   non-zero count (root r writes out's chunk r on every rank), ncclGroupEnd.
// - AllToAllV: ncclGroupStart + ncclSend/ncclRecv per peer with a non-zero count; this rank's own
//   chunk is a cudaMemcpyAsync on the stream. in and out must not overlap.
// - Send/Recv: ncclSend/ncclRecv. NCCL has no tags: messages between a pair are matched in issue
//   order, so `tag` is only checked and reported in errors. Both calls block until the transfer
//   completes, so a Send needs its matching Recv to be posted by the peer (two ranks that both
//   Send first deadlock until the timeout).
// - Broadcast: ncclBroadcast in place. Barrier: ncclAllReduce of one int32 on a device scratch
//   word, then wait.
// Any dtype for pure data movement (moved as bytes). Tensors must be CUDA tensors on the
// communicator's device (zero-element tensors are not inspected).
#ifndef SWITCHYARD_WORKER_COMM_NCCL_COMMUNICATOR_H_
#define SWITCHYARD_WORKER_COMM_NCCL_COMMUNICATOR_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/kv_store.h"

// Opaque NCCL / CUDA handles, so this header does not need the CUDA headers.
typedef struct ncclComm* ncclComm_t;
typedef struct CUstream_st* cudaStream_t;

namespace switchyard::comm {

struct NcclOptions {
  // Bound on rendezvous (reading the unique id), on init/split, and on every operation.
  absl::Duration timeout = absl::Seconds(60);
};

class NcclCommunicator final : public Communicator {
 public:
  // The world group of `size` processes; this one is `rank` and drives CUDA device `device`.
  // `stream` is borrowed (must be a stream of `device` and outlive the communicator and its
  // sub-groups); nullptr makes the communicator create and own a non-blocking stream. Every rank
  // calls this with the same store contents (same directory / prefix), size and name; a stale
  // "nccl/<name>/unique_id" key from an earlier run would be read as the current one, so scope
  // the store per job/generation (PrefixedKvStore). INVALID_ARGUMENT for a bad rank/size/device/
  // timeout; DEADLINE_EXCEEDED when the unique id does not appear or init does not finish within
  // the timeout; the NCCL/CUDA error otherwise.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(std::shared_ptr<KvStore> store,
                                                                  int rank, int size, int device,
                                                                  cudaStream_t stream,
                                                                  const NcclOptions& options,
                                                                  std::string name = "world");
  // Finalizes and destroys the NCCL communicator (bounded by the timeout; aborts when broken,
  // aborted or when finalizing fails), then frees the scratch word and any owned stream.
  ~NcclCommunicator() override;

  // A sub-group via ncclCommSplit. UNLIKE GlooCommunicator::CreateSubgroup this is COLLECTIVE over
  // ALL ranks of this communicator: every rank calls it (same order relative to other collective
  // calls) with the members of the group it joins (ranks of THIS communicator, distinct, in the
  // order that defines group ranks, this rank included), the groups of all callers forming a
  // partition of any subset of ranks; a rank that joins no group passes an empty list and gets
  // OK with nullptr. color = the smallest member (identifies the group), key = this rank's
  // position in `world_ranks`. The new communicator uses the same device, stream and options; its
  // name is "<name>[r0,r1,...]". INTERNAL when NCCL's resulting rank/size disagree with
  // `world_ranks` (ranks passed inconsistent lists).
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> CreateSubgroup(
      const std::vector<int>& world_ranks, const std::string& name);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  absl::Status AllReduce(const Tensor& in, const Tensor& out, ReduceOp op) override;
  absl::Status ReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op) override;
  absl::Status AllGather(const Tensor& in, const Tensor& out) override;
  absl::Status AllGatherV(const Tensor& in, const Tensor& out,
                          absl::Span<const int64_t> counts) override;
  absl::Status AllToAllV(const Tensor& in, absl::Span<const int64_t> send_counts, const Tensor& out,
                         absl::Span<const int64_t> recv_counts) override;
  absl::Status Send(const Tensor& t, int peer, uint32_t tag) override;
  absl::Status Recv(const Tensor& t, int peer, uint32_t tag) override;
  absl::Status Broadcast(const Tensor& t, int root) override;
  absl::Status Barrier() override;
  void Abort() override;

 private:
  NcclCommunicator(std::string name, int rank, int size, int device, NcclOptions options,
                   std::shared_ptr<void> owned_stream, cudaStream_t stream, ncclComm_t comm,
                   void* scratch);

  // "group 'x' rank r/n <op>"
  std::string Where(absl::string_view op) const;
  // ABORTED after Abort(), the first error once broken, OK otherwise (no locking of the handle).
  absl::Status Usable(absl::string_view op) const;
  absl::Status CheckCuda(absl::string_view op, std::initializer_list<const Tensor*> tensors) const;
  // Starts an operation: Usable, marks it in flight (so Abort defers to it), selects the device.
  absl::Status Begin(absl::string_view op);
  // Ends the in-flight operation started by Begin (runs a deferred abort).
  void End();
  // Waits for the enqueued work (async error + stream query) within the timeout; on failure
  // records the error, aborts the NCCL communicator and returns it.
  absl::Status Wait(absl::string_view op);
  // Records `status` (annotated with Where(op)) as the first error, aborts the NCCL
  // communicator, and returns the recorded status.
  absl::Status Fail(absl::string_view op, const absl::Status& status);
  // ncclCommAbort on the handle (once); caller must be the only user of the handle.
  void AbortHandle();
  // Begin, enqueue(comm) (NCCL/CUDA calls on stream_), Wait, End.
  template <typename Fn>
  absl::Status Run(absl::string_view op, Fn&& enqueue);

  const std::string name_;
  const int rank_;
  const int size_;
  const int device_;
  const NcclOptions options_;
  const std::shared_ptr<void> owned_stream_;  // null when the stream is borrowed
  const cudaStream_t stream_;
  void* const scratch_;  // one int32 on the device, for Barrier

  std::atomic<bool> aborted_{false};
  mutable absl::Mutex mu_;
  ncclComm_t comm_ ABSL_GUARDED_BY(mu_);  // null once aborted/destroyed
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace switchyard::comm

#endif  // SWITCHYARD_WORKER_COMM_NCCL_COMMUNICATOR_H_
