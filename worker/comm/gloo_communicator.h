// File: worker/comm/gloo_communicator.h
//
// `GlooCommunicator`: a Communicator over Gloo's TCP transport for CPU tensors, one process per
// rank. The world group rendezvouses through a KvStore (kv_store.h: a FileKvStore on a shared
// directory, or an InMemoryKvStore for threads); sub-groups (a list of world ranks, e.g. one
// group of common/model/parallel_state.h) get their own Gloo context, connected through the same
// store under a key prefix made of the group's name and members.
//
// What Gloo gives and what this class adds:
// - AllReduce: gloo::allreduce (ring). Each element is reduced in an order fixed by the group
//   size, the element count and the rank's position, so results are bitwise identical on all
//   ranks and from run to run, but a float sum is NOT the rank-ordered sum x0+x1+...; integer
//   results are exact. bf16 is reduced in fp32 with rounding to bf16 after every pairwise step.
// - ReduceScatter: Gloo has only the legacy (bound-buffer) halving-doubling class, so this uses
//   gloo::alltoall to collect every rank's chunk, then reduces locally in rank order
//   ((x0 op x1) op x2 ...): deterministic and equal to the sequential rank-ordered result. It
//   moves the same bytes as a ring reduce-scatter but needs a size()*out.numel() scratch buffer.
// - AllGather: gloo::allgather; AllGatherV: gloo::allgatherv; Broadcast: gloo::broadcast;
//   Barrier: gloo::barrier; Send/Recv: unbound buffers on a slot derived from `tag`.
// - AllToAllV: the pairwise unbound-buffer transfers of gloo::alltoallv (one send and one receive
//   per peer with a non-zero count, own chunk copied locally), waited for here one completion at
//   a time, so that an error names the peers whose data had not arrived: "...; no data yet from
//   group rank(s) 1 (world rank 3)". A stalled peer (SIGSTOP) is then named after the timeout, a
//   dead one at once (with Gloo's "Connection closed by peer <address>"); in the dead case other
//   peers whose data was still in flight may be listed too.
// - Failure: every operation runs under the context timeout (GlooOptions::timeout). A peer that
//   dies closes its TCP connections and the next operation fails at once with UNAVAILABLE; a peer
//   that hangs makes it fail with DEADLINE_EXCEEDED after the timeout. Gloo reports these as C++
//   exceptions; they are caught here and converted to Status naming the group, this rank and the
//   operation (Gloo's own message names the peer address when it knows it). The communicator is
//   then broken and every later call returns the first error. Create sets SIGPIPE to ignored
//   when the process left it at the default (Gloo writes with writev, and a write to a reset
//   connection would otherwise kill the process instead of failing the operation), as Python and
//   so PyTorch's ProcessGroupGloo always run; a handler the program installed is kept.
// - Abort: signals every pair (gloo_pair_signal.h: a collective blocked in another thread of
//   this process, e.g. on a hung peer, fails at once with ABORTED instead of at
//   GlooOptions::timeout; Gloo's closeConnections alone does not wake it), closes the context's
//   connections (peers see their pending operations fail) and makes later calls return ABORTED.
// Tensors must be CPU tensors. Ranks of a group must make the same sequence of calls.
#ifndef SWITCHYARD_WORKER_COMM_GLOO_COMMUNICATOR_H_
#define SWITCHYARD_WORKER_COMM_GLOO_COMMUNICATOR_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/kv_store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace switchyard::comm {

struct GlooOptions {
  // Address of the interface the TCP transport listens on and advertises to peers (an IP or a
  // hostname that resolves to one). Loopback is right for a single machine.
  std::string hostname = "127.0.0.1";
  // Bound on rendezvous (waiting for every member's address) and on every operation.
  absl::Duration timeout = absl::Seconds(30);
};

class GlooCommunicator final : public Communicator {
 public:
  // The world group of `size` processes; this one is `rank`. Every rank calls this with the same
  // store contents (same directory / prefix) and size. The store keeps the members' addresses
  // under "gloo/<name>/...". INVALID_ARGUMENT for a bad rank/size/timeout; DEADLINE_EXCEEDED naming
  // the missing key when a member does not show up within the timeout; UNAVAILABLE when the
  // transport cannot be created or connected.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(std::shared_ptr<KvStore> store,
                                                                  int rank, int size,
                                                                  const GlooOptions& options,
                                                                  std::string name = "world");
  ~GlooCommunicator() override;

  // A sub-group of this (world) communicator made of `world_ranks` (ranks of THIS communicator,
  // distinct, in the order that defines group ranks; this rank must be a member). Called by every
  // member, in the same order relative to other CreateSubgroup calls that share members (a
  // rendezvous blocks until all members arrive). `name` + members must be unique within the
  // store. The new group shares this one's TCP device, store and options, not its connections.
  // The name used in errors is "<name>[r0,r1,...]".
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> CreateSubgroup(
      const std::vector<int>& world_ranks, const std::string& name) const;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

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
  // Every call completes before it returns, so there is nothing to wait for: returns the broken
  // status (ABORTED after Abort()), OK otherwise.
  absl::Status Synchronize() override;
  void Abort() override;

 private:
  GlooCommunicator(std::string name, int rank, int size, GlooOptions options,
                   std::shared_ptr<KvStore> store, std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::Context> context, std::vector<int> world_ranks);
  // Connects a context of `size` members through `store` (already scoped to the group).
  static absl::StatusOr<std::shared_ptr<gloo::Context>> Connect(
      const std::string& name, int rank, int size, const GlooOptions& options, KvStore& store,
      std::shared_ptr<gloo::transport::Device> device);

  // "group 'x' rank r/n <op>"
  std::string Where(absl::string_view op) const;
  // ABORTED after Abort(), the first error once broken, OK otherwise.
  absl::Status Usable(const char* op) const;
  absl::Status CheckCpu(const char* op, std::initializer_list<const Tensor*> tensors) const;
  // The checks of AllReduce and ReduceScatter before their sizes: usable, CPU tensors of one
  // reducible dtype. Returns Where(op).
  absl::StatusOr<std::string> CheckReduction(const char* op, const Tensor& in,
                                             const Tensor& out) const;
  // Send (send = true) or Recv of `t` with `peer`, on the slot of `tag`.
  absl::Status PointToPoint(bool send, const Tensor& t, int peer, uint32_t tag);
  // Runs `body` (which calls Gloo), converting exceptions to Status and recording the first error.
  template <typename Fn>
  absl::Status Run(absl::string_view op, Fn&& body);
  uint32_t NextTag() { return next_tag_++; }
  // "no data yet from group rank(s) 1 (world rank 3), ..." for the ranks with pending[r] != 0.
  std::string PendingPeers(const std::vector<char>& pending) const;

  const std::string name_;
  const int rank_;
  const int size_;
  const GlooOptions options_;
  const std::shared_ptr<KvStore> store_;  // unscoped (the factory's store)
  const std::shared_ptr<gloo::transport::Device> device_;
  const std::shared_ptr<gloo::Context> context_;
  // World rank (of the communicator Create made) of every group rank, for error messages.
  const std::vector<int> world_ranks_;
  uint32_t next_tag_ = 0;
  std::atomic<bool> aborted_{false};
  mutable absl::Mutex mu_;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace switchyard::comm

#endif  // SWITCHYARD_WORKER_COMM_GLOO_COMMUNICATOR_H_
