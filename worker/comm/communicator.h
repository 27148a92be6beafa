// File: worker/comm/communicator.h
//
// `Communicator`: the collectives a worker needs over one process group (a list of world ranks),
// whatever carries them: NCCL on GPU, Gloo over TCP on CPU (gloo_communicator.h), or a single
// rank (SingleRankCommunicator below, exact copies and no-ops).
//
// Conventions shared by every implementation:
// - Tensors are dense views (common/tensor.h); counts and sizes are in ELEMENTS of the flattened
//   tensor, never bytes, and the shape beyond numel() is not interpreted.
// - Reductions support f32, f64, bf16, i32, i64 (bf16 adds in fp32 and rounds to nearest even
//   after each pairwise step). Pure data movement (gathers, all-to-all, broadcast, send/recv)
//   accepts any dtype. All tensors of one call have the same dtype.
// - `in` and `out` may be the same tensor (in place) where stated; otherwise they must not
//   overlap.
// - Every rank of the group makes the same sequence of collective calls with matching sizes.
// - Errors are absl::Status whose message names the group ("group 'ep[0,1]' rank 1/2") and the
//   peer when it is known: INVALID_ARGUMENT for bad arguments (before any communication),
//   DEADLINE_EXCEEDED when a peer did not take part within the timeout, UNAVAILABLE when a peer
//   connection failed (peer died), ABORTED after Abort(). After a communication error the
//   communicator is broken: every later call returns that first error.
// - Completion (DESIGN.md "Communicator": calls are stream-ordered and do not block the host): a
//   call returns once its work is ISSUED, not necessarily complete. On the CPU (Gloo, single
//   rank) issued means done: the call returns with the result in `out`. NCCL (by default)
//   enqueues on its stream and returns at once; later work on that stream sees the result, but
//   the HOST may read an output, or reuse/free an input or output, only after Synchronize()
//   returned OK (or after waiting on a CUDA event recorded after the call, via a bounded wait
//   such as comm::WaitEvent in nccl_communicator.h). A communication failure may therefore be
//   reported by a later call or by Synchronize() instead of by the call that caused it.
// - Created by a factory returning StatusOr<std::unique_ptr<...>>; not copyable or movable; used
//   from one thread, except Abort(), which any thread may call.
#ifndef SWITCHYARD_WORKER_COMM_COMMUNICATOR_H_
#define SWITCHYARD_WORKER_COMM_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/tensor.h"

namespace switchyard::comm {

enum class ReduceOp { kSum, kMax, kMin };
const char* ReduceOpName(ReduceOp op);

class Communicator {
 public:
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  virtual ~Communicator() = default;

  // This process's rank in the group, in [0, size()).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The group's name as errors print it (e.g. "world", "ep[0,1]").
  virtual const std::string& name() const = 0;

  // out[i] = op over ranks of in[i]. in.numel() == out.numel(); in may be out.
  virtual absl::Status AllReduce(const Tensor& in, const Tensor& out, ReduceOp op) = 0;
  // in.numel() == size() * out.numel(); out = op over ranks of in's chunk number rank().
  virtual absl::Status ReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op) = 0;
  // out.numel() == size() * in.numel(); out's chunk r is rank r's in.
  virtual absl::Status AllGather(const Tensor& in, const Tensor& out) = 0;
  // counts[r] elements come from rank r (counts.size() == size(), counts[rank()] == in.numel(),
  // sum(counts) == out.numel()); out is their rank-ordered concatenation.
  virtual absl::Status AllGatherV(const Tensor& in, const Tensor& out,
                                  absl::Span<const int64_t> counts) = 0;
  // in is the concatenation of send_counts[r] elements for each rank r; out receives
  // recv_counts[r] elements from each rank r, concatenated in rank order. Both count vectors have
  // size() entries, sum to in.numel() / out.numel(), and recv_counts[r] on this rank must equal
  // send_counts[rank()] on rank r. Zero counts are allowed.
  virtual absl::Status AllToAllV(const Tensor& in, absl::Span<const int64_t> send_counts,
                                 const Tensor& out, absl::Span<const int64_t> recv_counts) = 0;
  // Point to point with `peer` (a group rank != rank()). Once the call has completed (see
  // "Completion" above) a Send's `t` may be reused and a Recv's `t` holds the data. `tag`
  // distinguishes concurrent streams of messages between the same pair; the receiver's numel must
  // equal the sender's.
  virtual absl::Status Send(const Tensor& t, int peer, uint32_t tag) = 0;
  virtual absl::Status Recv(const Tensor& t, int peer, uint32_t tag) = 0;
  // In place: every rank's t becomes root's t.
  virtual absl::Status Broadcast(const Tensor& t, int root) = 0;
  virtual absl::Status Barrier() = 0;
  // Waits until every operation issued so far on this communicator has completed, bounded by the
  // implementation's timeout, and returns the communicator's first error if it is broken
  // (ABORTED after Abort()). Not a collective: no peer takes part, so ranks may call it at
  // different points. Implementations whose calls complete before returning (Gloo, single rank)
  // only report their state.
  virtual absl::Status Synchronize() = 0;
  // Tears the group down: later calls return ABORTED; the PEERS' pending operations fail (their
  // connections to this rank close). A call blocked in another thread of THIS process returns
  // ABORTED at once: NCCL within about a millisecond; Gloo because Abort signals every pair
  // before closing the connections (gloo_pair_signal.h; closing alone leaves it waiting for the
  // group's timeout). Idempotent.
  virtual void Abort() = 0;
};

// A group of one. Every collective is an exact copy (or nothing, in place); Send/Recv have no
// valid peer and return INVALID_ARGUMENT; Broadcast requires root 0.
class SingleRankCommunicator final : public Communicator {
 public:
  static absl::StatusOr<std::unique_ptr<SingleRankCommunicator>> Create(
      std::string name = "single");

  int rank() const override { return 0; }
  int size() const override { return 1; }
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
  absl::Status Synchronize() override { return Check("Synchronize"); }
  void Abort() override { aborted_ = true; }

 private:
  explicit SingleRankCommunicator(std::string name) : name_(std::move(name)) {}
  std::string Where(const char* op) const;
  // ABORTED after Abort(), else OK.
  absl::Status Check(const char* op) const;
  // AllReduce and ReduceScatter, which are the same copy on one rank.
  absl::Status Reduce(const char* op, const Tensor& in, const Tensor& out);
  const std::string name_;
  bool aborted_ = false;
};

// Argument checks shared by the implementations (CPU-side, before any communication). Each
// returns INVALID_ARGUMENT whose message starts with `where` ("group 'x' rank 0/2 AllReduce").
namespace internal {
// "group 'x' rank r/n <op>": how every implementation names itself in an error.
std::string Where(absl::string_view name, int rank, int size, absl::string_view op);
// "[r0,r1,...]": the member list that subgroup names end with.
std::string MembersString(const std::vector<int>& ranks);
// The factories' rules (GlooCommunicator, NcclCommunicator; `who` is the class): a store, rank in
// [0, size), timeout >= 1ms.
absl::Status CheckCreateArgs(const char* who, bool has_store, const std::string& name, int rank,
                             int size, absl::Duration timeout);
// CreateSubgroup's member rules: distinct ranks in [0, size). Returns the position of `rank` in
// `world_ranks` (this process's rank in the subgroup), -1 when it is not a member.
absl::StatusOr<int> SubgroupRank(const std::string& where, const std::vector<int>& world_ranks,
                                 int rank, int size);
// What every call of a broken communicator returns: the first error's code, "<where>: broken by
// an earlier error: <its message>".
absl::Status BrokenError(const std::string& where, const absl::Status& broken);
// Reduction dtypes: f32, f64, bf16, i32, i64.
bool IsReducible(DType dtype);
// INVALID_ARGUMENT "<where>: dtype <d> cannot be reduced" unless IsReducible(dtype).
absl::Status CheckReducible(const std::string& where, DType dtype);
absl::Status CheckSameDType(const std::string& where, const Tensor& a, const Tensor& b);
absl::Status CheckNumel(const std::string& where, const char* what, const Tensor& t,
                        int64_t expected);
// counts: size() entries, each >= 0; returns their sum.
absl::StatusOr<int64_t> CheckCounts(const std::string& where, const char* what,
                                    absl::Span<const int64_t> counts, int size);
absl::Status CheckPeer(const std::string& where, int peer, int rank, int size);
// The argument rules of AllToAllV shared by every implementation: same dtype, one count per
// rank, element counts that match the tensors, and this rank's own chunk equal on both sides.
// Returns {sum of send_counts, sum of recv_counts}.
absl::StatusOr<std::pair<int64_t, int64_t>> CheckAllToAllV(
    const std::string& where, const Tensor& in, absl::Span<const int64_t> send_counts,
    const Tensor& out, absl::Span<const int64_t> recv_counts, int rank, int size);
// Copies `n` elements' bytes of `from` into `to` (memmove; no-op when they are the same memory).
void CopyElements(const Tensor& from, int64_t from_offset, const Tensor& to, int64_t to_offset,
                  int64_t n);
}  // namespace internal

}  // namespace switchyard::comm

#endif  // SWITCHYARD_WORKER_COMM_COMMUNICATOR_H_
