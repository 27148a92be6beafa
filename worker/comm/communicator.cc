// File: worker/comm/communicator.cc
#include "worker/comm/communicator.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace switchyard::comm {

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

namespace internal {

std::string Where(absl::string_view name, int rank, int size, absl::string_view op) {
  return absl::StrCat("group '", name, "' rank ", rank, "/", size, " ", op);
}

std::string MembersString(const std::vector<int>& ranks) {
  return absl::StrCat("[", absl::StrJoin(ranks, ","), "]");
}

absl::Status CheckCreateArgs(const char* who, bool has_store, const std::string& name, int rank,
                             int size, absl::Duration timeout) {
  if (!has_store) return absl::InvalidArgumentError(absl::StrCat(who, ": store is null"));
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " '", name, "': rank ", rank, " must be in [0, size ", size, ")"));
  }
  if (timeout < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, " '", name, "': timeout ", absl::FormatDuration(timeout), " must be at least 1ms"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> SubgroupRank(const std::string& where, const std::vector<int>& world_ranks,
                                 int rank, int size) {
  int my_rank = -1;
  std::vector<bool> seen(size, false);
  for (int i = 0; i < static_cast<int>(world_ranks.size()); ++i) {
    const int r = world_ranks[i];
    if (r < 0 || r >= size || seen[r]) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": members must be distinct ranks in [0, ", size, "), got rank ", r));
    }
    seen[r] = true;
    if (r == rank) my_rank = i;
  }
  return my_rank;
}

absl::Status BrokenError(const std::string& where, const absl::Status& broken) {
  return absl::Status(broken.code(),
                      absl::StrCat(where, ": broken by an earlier error: ", broken.message()));
}

bool IsReducible(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kBF16 ||
         dtype == DType::kI32 || dtype == DType::kI64;
}

absl::Status CheckReducible(const std::string& where, DType dtype) {
  if (!IsReducible(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": dtype ", DTypeName(dtype), " cannot be reduced"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameDType(const std::string& where, const Tensor& a, const Tensor& b) {
  if (a.dtype != b.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": dtypes differ: ", a.DebugString(), " vs ", b.DebugString()));
  }
  return absl::OkStatus();
}

absl::Status CheckNumel(const std::string& where, const char* what, const Tensor& t,
                        int64_t expected) {
  if (t.numel() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", what, " ", t.DebugString(), " has ",
                                                   t.numel(), " elements, expected ", expected));
  }
  if (t.numel() > 0 && t.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", what, " has no data"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CheckCounts(const std::string& where, const char* what,
                                    absl::Span<const int64_t> counts, int size) {
  if (static_cast<int>(counts.size()) != size) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", what, " has ", counts.size(),
                                                   " entries, expected the group size ", size));
  }
  int64_t sum = 0;
  for (int64_t c : counts) {
    if (c < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", what, " [", absl::StrJoin(counts, ","), "] has a negative entry"));
    }
    sum += c;
  }
  return sum;
}

absl::Status CheckPeer(const std::string& where, int peer, int rank, int size) {
  if (peer < 0 || peer >= size || peer == rank) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": peer ", peer, " must be in [0, ", size,
                                                   ") and differ from this rank ", rank));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<int64_t, int64_t>> CheckAllToAllV(
    const std::string& where, const Tensor& in, absl::Span<const int64_t> send_counts,
    const Tensor& out, absl::Span<const int64_t> recv_counts, int rank, int size) {
  SY_RETURN_IF_ERROR(CheckSameDType(where, in, out));
  SY_ASSIGN_OR_RETURN(int64_t send_total, CheckCounts(where, "send_counts", send_counts, size));
  SY_ASSIGN_OR_RETURN(int64_t recv_total, CheckCounts(where, "recv_counts", recv_counts, size));
  SY_RETURN_IF_ERROR(CheckNumel(where, "in (sum of send_counts)", in, send_total));
  SY_RETURN_IF_ERROR(CheckNumel(where, "out (sum of recv_counts)", out, recv_total));
  if (send_counts[rank] != recv_counts[rank]) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": send_counts[", rank, "] ",
                                                   send_counts[rank], " != recv_counts[", rank,
                                                   "] ", recv_counts[rank]));
  }
  return std::make_pair(send_total, recv_total);
}

void CopyElements(const Tensor& from, int64_t from_offset, const Tensor& to, int64_t to_offset,
                  int64_t n) {
  const size_t es = DTypeSize(from.dtype);
  const char* src = static_cast<const char*>(from.data) + from_offset * es;
  char* dst = static_cast<char*>(to.data) + to_offset * es;
  if (n > 0 && src != dst) std::memmove(dst, src, static_cast<size_t>(n) * es);
}

}  // namespace internal

namespace {

// A copy is needed unless in and out are the same memory; copies are CPU memmoves.
absl::Status CheckCopyable(const std::string& where, const Tensor& in, const Tensor& out) {
  if (in.data != out.data && (in.device.is_cuda() || out.device.is_cuda())) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": copies need CPU tensors, got ",
                                                   in.DebugString(), " -> ", out.DebugString()));
  }
  return absl::OkStatus();
}

// What every collective of one rank does once its arguments are checked: out = in.
absl::Status CopyInToOut(const std::string& where, const Tensor& in, const Tensor& out) {
  SY_RETURN_IF_ERROR(CheckCopyable(where, in, out));
  internal::CopyElements(in, 0, out, 0, in.numel());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SingleRankCommunicator>> SingleRankCommunicator::Create(
    std::string name) {
  return std::unique_ptr<SingleRankCommunicator>(new SingleRankCommunicator(std::move(name)));
}

std::string SingleRankCommunicator::Where(const char* op) const {
  return internal::Where(name_, 0, 1, op);
}

absl::Status SingleRankCommunicator::Check(const char* op) const {
  if (aborted_) return absl::AbortedError(absl::StrCat(Where(op), ": aborted"));
  return absl::OkStatus();
}

absl::Status SingleRankCommunicator::Reduce(const char* op, const Tensor& in, const Tensor& out) {
  SY_RETURN_IF_ERROR(Check(op));
  const std::string where = Where(op);
  SY_RETURN_IF_ERROR(internal::CheckSameDType(where, in, out));
  SY_RETURN_IF_ERROR(internal::CheckReducible(where, in.dtype));
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "out", out, in.numel()));
  return CopyInToOut(where, in, out);
}

absl::Status SingleRankCommunicator::AllReduce(const Tensor& in, const Tensor& out, ReduceOp op) {
  return Reduce("AllReduce", in, out);
}

absl::Status SingleRankCommunicator::ReduceScatter(const Tensor& in, const Tensor& out,
                                                   ReduceOp op) {
  return Reduce("ReduceScatter", in, out);
}

absl::Status SingleRankCommunicator::AllGather(const Tensor& in, const Tensor& out) {
  SY_RETURN_IF_ERROR(Check("AllGather"));
  const std::string where = Where("AllGather");
  SY_RETURN_IF_ERROR(internal::CheckSameDType(where, in, out));
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "out", out, in.numel()));
  return CopyInToOut(where, in, out);
}

absl::Status SingleRankCommunicator::AllGatherV(const Tensor& in, const Tensor& out,
                                                absl::Span<const int64_t> counts) {
  SY_RETURN_IF_ERROR(Check("AllGatherV"));
  const std::string where = Where("AllGatherV");
  SY_RETURN_IF_ERROR(internal::CheckSameDType(where, in, out));
  SY_ASSIGN_OR_RETURN(int64_t total, internal::CheckCounts(where, "counts", counts, 1));
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "in", in, counts[0]));
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "out", out, total));
  return CopyInToOut(where, in, out);
}

absl::Status SingleRankCommunicator::AllToAllV(const Tensor& in,
                                               absl::Span<const int64_t> send_counts,
                                               const Tensor& out,
                                               absl::Span<const int64_t> recv_counts) {
  SY_RETURN_IF_ERROR(Check("AllToAllV"));
  const std::string where = Where("AllToAllV");
  SY_RETURN_IF_ERROR(
      internal::CheckAllToAllV(where, in, send_counts, out, recv_counts, 0, 1).status());
  return CopyInToOut(where, in, out);
}

absl::Status SingleRankCommunicator::Send(const Tensor& t, int peer, uint32_t tag) {
  SY_RETURN_IF_ERROR(Check("Send"));
  return internal::CheckPeer(Where("Send"), peer, 0, 1);
}

absl::Status SingleRankCommunicator::Recv(const Tensor& t, int peer, uint32_t tag) {
  SY_RETURN_IF_ERROR(Check("Recv"));
  return internal::CheckPeer(Where("Recv"), peer, 0, 1);
}

absl::Status SingleRankCommunicator::Broadcast(const Tensor& t, int root) {
  SY_RETURN_IF_ERROR(Check("Broadcast"));
  if (root != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where("Broadcast"), ": root ", root, " must be 0"));
  }
  return absl::OkStatus();
}

absl::Status SingleRankCommunicator::Barrier() { return Check("Barrier"); }

}  // namespace switchyard::comm
