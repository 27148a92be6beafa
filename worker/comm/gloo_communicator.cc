// File: worker/comm/gloo_communicator.cc
#include "worker/comm/gloo_communicator.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "gloo/allgather.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/alltoall.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "gloo/types.h"
#include "worker/comm/gloo_pair_signal.h"

namespace switchyard::comm {
namespace {

// Slot prefix for Send/Recv; Gloo's collectives use 0x01..0x08 (gloo/types.h).
constexpr uint8_t kSendRecvSlotPrefix = 0x40;
// Slot prefix for AllToAllV's pairwise transfers.
constexpr uint8_t kAllToAllVSlotPrefix = 0x41;

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// Gloo's rendezvous Store interface over our KvStore. Gloo expects exceptions on failure; the
// Status behind the first one is kept so Connect can return it with its code intact.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(KvStore& store, absl::Duration timeout) : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Throw(store_.Set(key, absl::string_view(data.data(), data.size())));
  }
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> v = store_.Get(key, timeout_);
    Throw(v.status());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, ToChrono(timeout_)); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const absl::Time deadline = absl::Now() + absl::Milliseconds(timeout.count());
    for (const std::string& key : keys) {
      Throw(store_.Get(key, std::max(deadline - absl::Now(), absl::ZeroDuration())).status());
    }
  }

  const absl::Status& first_error() const { return first_error_; }

 private:
  void Throw(const absl::Status& s) {
    if (s.ok()) return;
    if (first_error_.ok()) first_error_ = s;
    throw std::runtime_error(std::string(s.message()));
  }
  KvStore& store_;
  const absl::Duration timeout_;
  absl::Status first_error_;
};

// Gloo's element-wise reduction callback: c[i] = a[i] op b[i] (c may alias a or b).
template <typename T>
void ReduceTyped(ReduceOp op, void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  switch (op) {
    case ReduceOp::kSum:
      for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) out[i] = std::max(x[i], y[i]);
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) out[i] = std::min(x[i], y[i]);
      break;
  }
}

void ReduceBF16(ReduceOp op, void* c, const void* a, const void* b, size_t n) {
  BF16* out = static_cast<BF16*>(c);
  const BF16* x = static_cast<const BF16*>(a);
  const BF16* y = static_cast<const BF16*>(b);
  for (size_t i = 0; i < n; ++i) {
    const float fx = x[i].ToFloat(), fy = y[i].ToFloat();
    float r = 0;
    switch (op) {
      case ReduceOp::kSum:
        r = fx + fy;
        break;
      case ReduceOp::kMax:
        r = std::max(fx, fy);
        break;
      case ReduceOp::kMin:
        r = std::min(fx, fy);
        break;
    }
    out[i] = BF16::FromFloat(r);
  }
}

// c = a op b for `n` elements of `dtype` (a reducible dtype).
void Reduce(DType dtype, ReduceOp op, void* c, const void* a, const void* b, size_t n) {
  switch (dtype) {
    case DType::kF32:
      return ReduceTyped<float>(op, c, a, b, n);
    case DType::kF64:
      return ReduceTyped<double>(op, c, a, b, n);
    case DType::kI32:
      return ReduceTyped<int32_t>(op, c, a, b, n);
    case DType::kI64:
      return ReduceTyped<int64_t>(op, c, a, b, n);
    case DType::kBF16:
      return ReduceBF16(op, c, a, b, n);
    default:
      return;
  }
}

template <typename T>
void RunAllreduce(const std::shared_ptr<gloo::Context>& ctx, std::chrono::milliseconds timeout,
                  uint32_t tag, const Tensor& in, const Tensor& out, DType dtype, ReduceOp op) {
  gloo::AllreduceOptions opts(ctx);
  const size_t n = static_cast<size_t>(out.numel());
  if (in.data != out.data) opts.setInput(static_cast<T*>(in.data), n);
  opts.setOutput(static_cast<T*>(out.data), n);
  opts.setReduceFunction([dtype, op](void* c, const void* a, const void* b, size_t k) {
    Reduce(dtype, op, c, a, b, k);
  });
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::allreduce(opts);
}

}  // namespace

GlooCommunicator::GlooCommunicator(std::string name, int rank, int size, GlooOptions options,
                                   std::shared_ptr<KvStore> store,
                                   std::shared_ptr<gloo::transport::Device> device,
                                   std::shared_ptr<gloo::Context> context,
                                   std::vector<int> world_ranks)
    : name_(std::move(name)),
      rank_(rank),
      size_(size),
      options_(std::move(options)),
      store_(std::move(store)),
      device_(std::move(device)),
      context_(std::move(context)),
      world_ranks_(std::move(world_ranks)) {}

GlooCommunicator::~GlooCommunicator() = default;

absl::StatusOr<std::shared_ptr<gloo::Context>> GlooCommunicator::Connect(
    const std::string& name, int rank, int size, const GlooOptions& options, KvStore& store,
    std::shared_ptr<gloo::transport::Device> device) {
  const std::string where = absl::StrCat("group '", name, "' rank ", rank, "/", size, " connect");
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(ToChrono(options.timeout));
  GlooStoreAdapter adapter(store, options.timeout);
  try {
    context->connectFullMesh(adapter, device);
  } catch (const std::exception& e) {
    if (!adapter.first_error().ok()) return Annotate(adapter.first_error(), where);
    return absl::UnavailableError(absl::StrCat(where, ": ", e.what()));
  }
  return std::shared_ptr<gloo::Context>(std::move(context));
}

namespace {

// Gloo's TCP pairs write with writev: a write to a peer that reset the connection raises
// SIGPIPE, whose default action kills the process, where every failure must come back as a
// Status. Ignore it, as Python (hence PyTorch's ProcessGroupGloo) always does, unless the program
// installed a handler of its own. Checked on every Create (a forked child may have reset it).
void IgnoreSigpipeUnlessHandled() {
  struct sigaction current = {};
  if (sigaction(SIGPIPE, nullptr, &current) != 0) return;
  if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_DFL) {
    struct sigaction ignore = {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, nullptr);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    std::shared_ptr<KvStore> store, int rank, int size, const GlooOptions& options,
    std::string name) {
  IgnoreSigpipeUnlessHandled();
  SY_RETURN_IF_ERROR(internal::CheckCreateArgs("GlooCommunicator", store != nullptr, name, rank,
                                               size, options.timeout));
  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("GlooCommunicator '", name, "': TCP device on '",
                                               options.hostname, "': ", e.what()));
  }
  PrefixedKvStore scoped(store, absl::StrCat("gloo/", name));
  SY_ASSIGN_OR_RETURN(std::shared_ptr<gloo::Context> context,
                      Connect(name, rank, size, options, scoped, device));
  std::vector<int> world_ranks(size);
  for (int r = 0; r < size; ++r) world_ranks[r] = r;
  return std::unique_ptr<GlooCommunicator>(
      new GlooCommunicator(std::move(name), rank, size, options, std::move(store),
                           std::move(device), std::move(context), std::move(world_ranks)));
}

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::CreateSubgroup(
    const std::vector<int>& world_ranks, const std::string& name) const {
  const std::string group_name = absl::StrCat(name, internal::MembersString(world_ranks));
  const std::string where = absl::StrCat(Where("CreateSubgroup"), " '", group_name, "'");
  SY_RETURN_IF_ERROR(Usable("CreateSubgroup"));
  SY_ASSIGN_OR_RETURN(const int my_rank, internal::SubgroupRank(where, world_ranks, rank_, size_));
  if (my_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": this rank ", rank_, " is not a member"));
  }
  const int group_size = static_cast<int>(world_ranks.size());
  PrefixedKvStore scoped(store_, absl::StrCat("gloo/", name_, "/", group_name));
  SY_ASSIGN_OR_RETURN(std::shared_ptr<gloo::Context> context,
                      Connect(group_name, my_rank, group_size, options_, scoped, device_));
  std::vector<int> members(group_size);
  for (int i = 0; i < group_size; ++i) members[i] = world_ranks_[world_ranks[i]];
  return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(
      group_name, my_rank, group_size, options_, store_, device_, std::move(context), members));
}

std::string GlooCommunicator::Where(absl::string_view op) const {
  return internal::Where(name_, rank_, size_, op);
}

absl::Status GlooCommunicator::Usable(const char* op) const {
  if (aborted_.load()) return absl::AbortedError(absl::StrCat(Where(op), ": aborted"));
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return internal::BrokenError(Where(op), broken_);
  return absl::OkStatus();
}

absl::StatusOr<std::string> GlooCommunicator::CheckReduction(const char* op, const Tensor& in,
                                                             const Tensor& out) const {
  SY_RETURN_IF_ERROR(Usable(op));
  std::string where = Where(op);
  SY_RETURN_IF_ERROR(CheckCpu(op, {&in, &out}));
  SY_RETURN_IF_ERROR(internal::CheckSameDType(where, in, out));
  SY_RETURN_IF_ERROR(internal::CheckReducible(where, in.dtype));
  return where;
}

absl::Status GlooCommunicator::CheckCpu(const char* op,
                                        std::initializer_list<const Tensor*> tensors) const {
  for (const Tensor* t : tensors) {
    if (t->device.is_cuda()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(op), ": Gloo needs CPU tensors, got ", t->DebugString()));
    }
  }
  return absl::OkStatus();
}

template <typename Fn>
absl::Status GlooCommunicator::Run(absl::string_view op, Fn&& body) {
  absl::Status status;
  try {
    body();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    const std::string message = absl::StrCat(Where(op), ": ", what);
    if (aborted_.load()) {
      status = absl::AbortedError(absl::StrCat(message, " (aborted)"));
    } else if (absl::StrContains(what, "imed out") || absl::StrContains(what, "imeout")) {
      status = absl::DeadlineExceededError(
          absl::StrCat(message, " (timeout ", absl::FormatDuration(options_.timeout), ")"));
    } else {
      status = absl::UnavailableError(message);
    }
  }
  absl::MutexLock lock(&mu_);
  if (broken_.ok()) broken_ = status;
  return status;
}

absl::Status GlooCommunicator::AllReduce(const Tensor& in, const Tensor& out, ReduceOp op) {
  const char* kOp = "AllReduce";
  SY_ASSIGN_OR_RETURN(const std::string where, CheckReduction(kOp, in, out));
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "in", in, in.numel()));
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "out", out, in.numel()));
  if (out.numel() == 0) return absl::OkStatus();
  if (size_ == 1) {
    internal::CopyElements(in, 0, out, 0, in.numel());
    return absl::OkStatus();
  }
  const uint32_t tag = NextTag();
  const auto timeout = ToChrono(options_.timeout);
  return Run(kOp, [&] {
    switch (DTypeSize(in.dtype)) {
      case 2:
        return RunAllreduce<uint16_t>(context_, timeout, tag, in, out, in.dtype, op);
      case 4:
        return RunAllreduce<uint32_t>(context_, timeout, tag, in, out, in.dtype, op);
      default:
        return RunAllreduce<uint64_t>(context_, timeout, tag, in, out, in.dtype, op);
    }
  });
}

absl::Status GlooCommunicator::ReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  const char* kOp = "ReduceScatter";
  SY_ASSIGN_OR_RETURN(const std::string where, CheckReduction(kOp, in, out));
  const int64_t n = out.numel();
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "out", out, n));
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "in (size() * out.numel())", in, n * size_));
  if (n == 0) return absl::OkStatus();
  if (size_ == 1) {
    internal::CopyElements(in, 0, out, 0, n);
    return absl::OkStatus();
  }
  // gathered[r] = rank r's chunk number rank_.
  const size_t es = DTypeSize(in.dtype);
  const size_t chunk_bytes = static_cast<size_t>(n) * es;
  std::vector<char> gathered(chunk_bytes * size_);
  const uint32_t tag = NextTag();
  SY_RETURN_IF_ERROR(Run(kOp, [&] {
    gloo::AlltoallOptions opts(context_);
    opts.setInput(static_cast<uint8_t*>(in.data), chunk_bytes * size_);
    opts.setOutput(reinterpret_cast<uint8_t*>(gathered.data()), chunk_bytes * size_);
    opts.setTag(tag);
    opts.setTimeout(ToChrono(options_.timeout));
    gloo::alltoall(opts);
  }));
  // Rank order: ((x0 op x1) op x2) ...; out must not alias in, so reduce into out directly.
  std::memcpy(out.data, gathered.data(), chunk_bytes);
  for (int r = 1; r < size_; ++r) {
    Reduce(in.dtype, op, out.data, out.data, gathered.data() + r * chunk_bytes,
           static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::AllGather(const Tensor& in, const Tensor& out) {
  const char* kOp = "AllGather";
  SY_RETURN_IF_ERROR(Usable(kOp));
  const std::string where = Where(kOp);
  SY_RETURN_IF_ERROR(CheckCpu(kOp, {&in, &out}));
  SY_RETURN_IF_ERROR(internal::CheckSameDType(where, in, out));
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "in", in, in.numel()));
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "out", out, in.numel() * size_));
  if (in.numel() == 0) return absl::OkStatus();
  const size_t bytes = in.bytes();
  const uint32_t tag = NextTag();
  return Run(kOp, [&] {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(static_cast<uint8_t*>(in.data), bytes);
    opts.setOutput(static_cast<uint8_t*>(out.data), bytes * size_);
    opts.setTag(tag);
    opts.setTimeout(ToChrono(options_.timeout));
    gloo::allgather(opts);
  });
}

absl::Status GlooCommunicator::AllGatherV(const Tensor& in, const Tensor& out,
                                          absl::Span<const int64_t> counts) {
  const char* kOp = "AllGatherV";
  SY_RETURN_IF_ERROR(Usable(kOp));
  const std::string where = Where(kOp);
  SY_RETURN_IF_ERROR(CheckCpu(kOp, {&in, &out}));
  SY_RETURN_IF_ERROR(internal::CheckSameDType(where, in, out));
  SY_ASSIGN_OR_RETURN(int64_t total, internal::CheckCounts(where, "counts", counts, size_));
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "in (counts[rank])", in, counts[rank_]));
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "out (sum of counts)", out, total));
  if (total == 0) return absl::OkStatus();
  const size_t es = DTypeSize(in.dtype);
  std::vector<size_t> byte_counts(counts.size());
  for (size_t r = 0; r < counts.size(); ++r) byte_counts[r] = static_cast<size_t>(counts[r]) * es;
  const uint32_t tag = NextTag();
  return Run(kOp, [&] {
    gloo::AllgathervOptions opts(context_);
    opts.setInput(static_cast<uint8_t*>(in.data), byte_counts[rank_]);
    opts.setOutput(static_cast<uint8_t*>(out.data), byte_counts);
    opts.setTag(tag);
    opts.setTimeout(ToChrono(options_.timeout));
    gloo::allgatherv(opts);
  });
}

absl::Status GlooCommunicator::AllToAllV(const Tensor& in, absl::Span<const int64_t> send_counts,
                                         const Tensor& out, absl::Span<const int64_t> recv_counts) {
  const char* kOp = "AllToAllV";
  SY_RETURN_IF_ERROR(Usable(kOp));
  const std::string where = Where(kOp);
  SY_RETURN_IF_ERROR(CheckCpu(kOp, {&in, &out}));
  SY_ASSIGN_OR_RETURN(const auto totals, internal::CheckAllToAllV(where, in, send_counts, out,
                                                                  recv_counts, rank_, size_));
  const int64_t send_total = totals.first, recv_total = totals.second;
  const size_t es = DTypeSize(in.dtype);
  // Byte offsets of every rank's chunk on both sides.
  std::vector<size_t> send_off(size_ + 1, 0), recv_off(size_ + 1, 0);
  for (int r = 0; r < size_; ++r) {
    send_off[r + 1] = send_off[r] + static_cast<size_t>(send_counts[r]) * es;
    recv_off[r + 1] = recv_off[r] + static_cast<size_t>(recv_counts[r]) * es;
  }
  // Own chunk: a local copy.
  if (recv_counts[rank_] > 0) {
    std::memmove(static_cast<char*>(out.data) + recv_off[rank_],
                 static_cast<const char*>(in.data) + send_off[rank_],
                 recv_off[rank_ + 1] - recv_off[rank_]);
  }
  if (size_ == 1) return absl::OkStatus();
  // Gloo's unbound buffers need a non-null pointer even for zero bytes.
  uint8_t dummy = 0;
  void* in_ptr = send_total > 0 ? in.data : &dummy;
  void* out_ptr = recv_total > 0 ? out.data : &dummy;
  const uint32_t tag = NextTag();
  // Not gloo::alltoallv: the same pairwise unbound-buffer transfers (one send and one receive per
  // peer with a non-zero count; zero counts agree on both sides, so neither side posts one), but
  // waited for here one completion at a time, so that a failure can name the peers whose data had
  // not arrived (a stalled or dead peer, issue 15 "never hang"): Gloo's own message says only
  // "Timed out waiting ... for recv operation" or names a TCP address.
  // Every peer that owes data is pending before anything is posted, so that a failure while
  // posting (a peer already dead) names it too.
  std::vector<char> pending(size_, 0);
  int waits = 0;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && recv_counts[r] > 0) {
      pending[r] = 1;
      ++waits;
    }
  }
  return Run(kOp, [&] {
    auto inbuf = context_->createUnboundBuffer(in_ptr, std::max<size_t>(send_off[size_], 1));
    auto outbuf = context_->createUnboundBuffer(out_ptr, std::max<size_t>(recv_off[size_], 1));
    const uint64_t slot = gloo::Slot::build(kAllToAllVSlotPrefix, tag);
    const auto deadline = std::chrono::steady_clock::now() + ToChrono(options_.timeout);
    auto left = [&deadline] {
      return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now()),
                      std::chrono::milliseconds(1));
    };
    try {
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        if (recv_counts[r] > 0) outbuf->recv(r, slot, recv_off[r], recv_off[r + 1] - recv_off[r]);
        if (send_counts[r] > 0) inbuf->send(r, slot, send_off[r], send_off[r + 1] - send_off[r]);
      }
      for (int i = 0; i < waits; ++i) {
        int src = -1;
        if (!outbuf->waitRecv(&src, left())) throw std::runtime_error("receive aborted");
        if (src >= 0 && src < size_) pending[src] = 0;
      }
      for (int r = 0; r < size_; ++r) {
        if (r == rank_ || send_counts[r] == 0) continue;
        if (!inbuf->waitSend(left())) throw std::runtime_error("send aborted");
      }
    } catch (const std::exception& e) {
      // Keep Gloo's message (Run classifies timeouts by it) and add who had not delivered.
      throw std::runtime_error(absl::StrCat(e.what(), "; ", PendingPeers(pending)));
    }
  });
}

std::string GlooCommunicator::PendingPeers(const std::vector<char>& pending) const {
  std::vector<std::string> names;
  for (int r = 0; r < size_; ++r) {
    if (pending[r]) names.push_back(absl::StrCat(r, " (world rank ", world_ranks_[r], ")"));
  }
  if (names.empty()) return "every peer's data had arrived";
  return absl::StrCat("no data yet from group rank(s) ", absl::StrJoin(names, ", "));
}

absl::Status GlooCommunicator::Send(const Tensor& t, int peer, uint32_t tag) {
  return PointToPoint(/*send=*/true, t, peer, tag);
}

absl::Status GlooCommunicator::Recv(const Tensor& t, int peer, uint32_t tag) {
  return PointToPoint(/*send=*/false, t, peer, tag);
}

absl::Status GlooCommunicator::PointToPoint(bool send, const Tensor& t, int peer, uint32_t tag) {
  const char* kOp = send ? "Send" : "Recv";
  SY_RETURN_IF_ERROR(Usable(kOp));
  const std::string peer_tag = absl::StrCat(send ? " to" : " from", " peer ", peer, " tag ", tag);
  const std::string where = absl::StrCat(Where(kOp), peer_tag);
  SY_RETURN_IF_ERROR(CheckCpu(kOp, {&t}));
  SY_RETURN_IF_ERROR(internal::CheckPeer(where, peer, rank_, size_));
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "t", t, t.numel()));
  if (t.numel() == 0) return absl::OkStatus();
  return Run(absl::StrCat(kOp, peer_tag), [&] {
    auto buf = context_->createUnboundBuffer(t.data, t.bytes());
    const uint64_t slot = gloo::Slot::build(kSendRecvSlotPrefix, tag);
    if (send) {
      buf->send(peer, slot);
      if (!buf->waitSend(ToChrono(options_.timeout))) throw std::runtime_error("send aborted");
    } else {
      buf->recv(peer, slot);
      if (!buf->waitRecv(ToChrono(options_.timeout))) throw std::runtime_error("recv aborted");
    }
  });
}

absl::Status GlooCommunicator::Broadcast(const Tensor& t, int root) {
  const char* kOp = "Broadcast";
  SY_RETURN_IF_ERROR(Usable(kOp));
  const std::string where = Where(kOp);
  SY_RETURN_IF_ERROR(CheckCpu(kOp, {&t}));
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": root ", root, " must be in [0, ", size_, ")"));
  }
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "t", t, t.numel()));
  if (t.numel() == 0 || size_ == 1) return absl::OkStatus();
  const uint32_t tag = NextTag();
  return Run(kOp, [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<uint8_t*>(t.data), t.bytes());
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(ToChrono(options_.timeout));
    gloo::broadcast(opts);
  });
}

absl::Status GlooCommunicator::Barrier() {
  const char* kOp = "Barrier";
  SY_RETURN_IF_ERROR(Usable(kOp));
  if (size_ == 1) return absl::OkStatus();
  const uint32_t tag = NextTag();
  return Run(kOp, [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(ToChrono(options_.timeout));
    gloo::barrier(opts);
  });
}

absl::Status GlooCommunicator::Synchronize() { return Usable("Synchronize"); }

void GlooCommunicator::Abort() {
  if (aborted_.exchange(true)) return;
  // Wake this process's own waiting operations first (closeConnections alone does not), then
  // close the sockets, which makes the peers' operations fail.
  SignalGlooPairs(*context_, absl::StrCat(Where("Abort"), ": aborted"));
  try {
    context_->closeConnections();
  } catch (const std::exception&) {
    // Closing is best effort: the communicator refuses further calls either way.
  }
}

}  // namespace switchyard::comm
