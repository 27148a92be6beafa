// File: worker/comm/nccl_communicator.cc
#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::comm {
namespace {

// Polling backoff: spin (yield) briefly, then sleep in short steps, so small collectives return
// quickly and long ones do not burn a core.
class Backoff {
 public:
  void Pause() {
    if (++polls_ < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(polls_ < 1024 ? 20 : 200));
    }
  }

 private:
  int polls_ = 0;
};

// The NCCL type of each reduction dtype (internal::IsReducible).
constexpr std::pair<DType, ncclDataType_t> kNcclReductionTypes[] = {{DType::kF32, ncclFloat32},
                                                                    {DType::kF64, ncclFloat64},
                                                                    {DType::kBF16, ncclBfloat16},
                                                                    {DType::kI32, ncclInt32},
                                                                    {DType::kI64, ncclInt64}};

// Callers have checked internal::CheckReducible(dtype).
ncclDataType_t ToNcclType(DType dtype) {
  for (const auto& [d, type] : kNcclReductionTypes) {
    if (d == dtype) return type;
  }
  assert(false && "ToNcclType: not a reduction dtype");
  return ncclFloat32;
}

ncclRedOp_t ToNcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kSum:
    default:
      return ncclSum;
  }
}

// Byte pointer to element `offset` of `t`.
char* At(const Tensor& t, int64_t offset) {
  return static_cast<char*>(t.data) + offset * static_cast<int64_t>(DTypeSize(t.dtype));
}

// Polls the asynchronous state of `comm` (and of `parent`, when given) until both are
// ncclSuccess, an NCCL error (returned), or `deadline` (DEADLINE_EXCEEDED naming `where`).
absl::Status PollReady(const std::string& where, ncclComm_t comm, ncclComm_t parent,
                       absl::Time deadline, absl::Duration timeout) {
  Backoff backoff;
  for (;;) {
    bool done = true;
    for (ncclComm_t c : {comm, parent}) {
      if (c == nullptr) continue;
      ncclResult_t state = ncclSuccess;
      SY_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(c, &state));
      if (state == ncclInProgress) {
        done = false;
      } else if (state != ncclSuccess) {
        return Annotate(NcclErrorToStatus(state, "ncclCommGetAsyncError state", __FILE__, __LINE__),
                        where);
      }
    }
    if (done) return absl::OkStatus();
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(where, ": not ready within the timeout ", absl::FormatDuration(timeout)));
    }
    backoff.Pause();
  }
}

void FreeDevice(void* p) {
  if (p != nullptr) (void)cudaFree(p);
}

// Synchronize leaves a timeout to the watchdog (which names the oldest stuck operation, the more
// useful one) unless the watchdog is late by this much.
constexpr absl::Duration kSynchronizeGrace = absl::Milliseconds(200);

}  // namespace

absl::StatusOr<bool> BlockingFromEnvironment(bool fallback) {
  const char* value = std::getenv("SWITCHYARD_NCCL_BLOCKING");
  if (value == nullptr || value[0] == '\0') return fallback;
  const absl::string_view v(value);
  if (v == "1") return true;
  if (v == "0") return false;
  return absl::InvalidArgumentError(
      absl::StrCat("environment variable SWITCHYARD_NCCL_BLOCKING='", v,
                   "' must be 1 (blocking NCCL calls), 0 (non-blocking) or unset "
                   "(NcclOptions::blocking)"));
}

// ---------------------------------------------------------------------------------------------
// Creation and teardown.

NcclCommunicator::NcclCommunicator(std::string name, int rank, int size, int device,
                                   NcclOptions options, std::shared_ptr<void> owned_stream,
                                   cudaStream_t stream, ncclComm_t comm, void* scratch)
    : name_(std::move(name)),
      rank_(rank),
      size_(size),
      device_(device),
      options_(options),
      owned_stream_(std::move(owned_stream)),
      stream_(stream),
      scratch_(scratch),
      comm_(comm) {
  // The watchdog follows the operations of the non-blocking mode only (see the header).
  if (!options_.blocking) watchdog_ = std::thread([this] { WatchdogLoop(); });
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    std::shared_ptr<KvStore> store, int rank, int size, int device, cudaStream_t stream,
    const NcclOptions& options, std::string name) {
  SY_RETURN_IF_ERROR(internal::CheckCreateArgs("NcclCommunicator", store != nullptr, name, rank,
                                               size, options.timeout));
  const std::string where =
      internal::Where(name, rank, size, absl::StrCat("Create on cuda:", device));
  // Read once here; sub-groups inherit the resolved options.
  NcclOptions resolved = options;
  {
    absl::StatusOr<bool> blocking = BlockingFromEnvironment(options.blocking);
    if (!blocking.ok()) return Annotate(blocking.status(), where);
    resolved.blocking = *blocking;
  }
  int device_count = 0;
  SY_RETURN_IF_ERROR(Annotate(
      [&]() -> absl::Status {
        SY_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&device_count));
        return absl::OkStatus();
      }(),
      where));
  if (device < 0 || device >= device_count) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": device ", device, " must be in [0, ", device_count, ")"));
  }
  const absl::Time deadline = absl::Now() + options.timeout;

  // Stream (owned when none was given) and the Barrier scratch word.
  std::shared_ptr<void> owned_stream;
  void* scratch = nullptr;
  ncclComm_t comm = nullptr;
  absl::Status status = [&]() -> absl::Status {
    SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    if (stream == nullptr) {
      cudaStream_t s = nullptr;
      SY_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      owned_stream = std::shared_ptr<void>(
          s, [](void* p) { (void)cudaStreamDestroy(static_cast<cudaStream_t>(p)); });
      stream = s;
    }
    SY_CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch, sizeof(int32_t)));
    SY_CUDA_RETURN_IF_ERROR(cudaMemset(scratch, 0, sizeof(int32_t)));

    // Rendezvous on the unique id.
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    const std::string key = absl::StrCat("nccl/", name, "/unique_id");
    if (rank == 0) {
      SY_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
      SY_RETURN_IF_ERROR(store->Set(key, absl::string_view(id.internal, sizeof(id.internal))));
    } else {
      SY_ASSIGN_OR_RETURN(std::string value,
                          store->Get(key, std::max(deadline - absl::Now(), absl::ZeroDuration())));
      if (value.size() != sizeof(id.internal)) {
        return absl::InvalidArgumentError(absl::StrCat("store key '", key, "' holds ", value.size(),
                                                       " bytes, expected ", sizeof(id.internal),
                                                       " (ncclUniqueId)"));
      }
      std::memcpy(id.internal, value.data(), value.size());
    }

    // Non-blocking init, polled within the timeout.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    SY_NCCL_RETURN_IF_ERROR(ncclCommInitRankConfig(&comm, size, id, rank, &config));
    if (comm == nullptr) return absl::InternalError("ncclCommInitRankConfig returned no comm");
    return PollReady("init", comm, nullptr, deadline, options.timeout);
  }();
  if (!status.ok()) {
    if (comm != nullptr) (void)ncclCommAbort(comm);
    FreeDevice(scratch);
    return Annotate(status, where);
  }
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(
      std::move(name), rank, size, device, resolved, owned_stream, stream, comm, scratch));
}

NcclCommunicator::~NcclCommunicator() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
  ncclComm_t comm = nullptr;
  bool healthy = false;
  {
    absl::MutexLock lock(&mu_);
    comm = comm_;
    comm_ = nullptr;
    healthy = broken_.ok() && !aborted_.load();
  }
  (void)cudaSetDevice(device_);
  if (comm != nullptr) {
    bool finalized = false;
    if (healthy) {
      const ncclResult_t r = ncclCommFinalize(comm);
      if (r == ncclSuccess || r == ncclInProgress) {
        finalized =
            PollReady("finalize", comm, nullptr, absl::Now() + options_.timeout, options_.timeout)
                .ok();
      }
    }
    if (finalized) {
      (void)ncclCommDestroy(comm);
    } else {
      (void)ncclCommAbort(comm);
    }
  }
  FreeDevice(scratch_);
  // Events still pending on the stream are released by CUDA once they complete.
  absl::MutexLock lock(&mu_);
  DropPending();
  for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
  free_events_.clear();
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::CreateSubgroup(
    const std::vector<int>& world_ranks, const std::string& name) {
  const char* kOp = "CreateSubgroup";
  const std::string group_name = absl::StrCat(name, internal::MembersString(world_ranks));
  const std::string where = absl::StrCat(Where(kOp), " '", group_name, "'");
  SY_RETURN_IF_ERROR(Usable(kOp));
  SY_ASSIGN_OR_RETURN(const int my_rank, internal::SubgroupRank(where, world_ranks, rank_, size_));
  if (!world_ranks.empty() && my_rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": this rank ", rank_, " is not a member (pass an empty list to join no group)"));
  }
  const int color = world_ranks.empty() ? NCCL_SPLIT_NOCOLOR
                                        : *std::min_element(world_ranks.begin(), world_ranks.end());
  const int group_size = static_cast<int>(world_ranks.size());

  SY_RETURN_IF_ERROR(Begin(kOp));
  absl::Cleanup end = [this] { End(); };
  ncclComm_t parent = nullptr;
  {
    absl::MutexLock lock(&mu_);
    parent = comm_;
  }
  void* scratch = nullptr;
  ncclComm_t child = nullptr;
  absl::Status status = [&]() -> absl::Status {
    if (group_size > 0) {
      SY_CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch, sizeof(int32_t)));
      SY_CUDA_RETURN_IF_ERROR(cudaMemset(scratch, 0, sizeof(int32_t)));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    SY_NCCL_RETURN_IF_ERROR(ncclCommSplit(parent, color, my_rank, &child, &config));
    return PollReady("ncclCommSplit", child, parent, absl::Now() + options_.timeout,
                     options_.timeout);
  }();
  if (!status.ok()) {
    if (child != nullptr) (void)ncclCommAbort(child);
    FreeDevice(scratch);
    // Peers are likely stuck in the split too: the parent is unusable.
    return Fail(absl::StrCat(kOp, " '", group_name, "'"), status);
  }
  if (group_size == 0) {
    if (child != nullptr) (void)ncclCommAbort(child);
    return std::unique_ptr<NcclCommunicator>();
  }
  int nccl_rank = -1, nccl_size = -1;
  absl::Status check = [&]() -> absl::Status {
    if (child == nullptr) return absl::InternalError("ncclCommSplit returned no communicator");
    SY_NCCL_RETURN_IF_ERROR(ncclCommUserRank(child, &nccl_rank));
    SY_NCCL_RETURN_IF_ERROR(ncclCommCount(child, &nccl_size));
    if (nccl_rank != my_rank || nccl_size != group_size) {
      return absl::InternalError(absl::StrCat("NCCL made rank ", nccl_rank, "/", nccl_size,
                                              " but world_ranks give ", my_rank, "/", group_size,
                                              ": the ranks passed inconsistent member lists"));
    }
    return absl::OkStatus();
  }();
  if (!check.ok()) {
    if (child != nullptr) (void)ncclCommAbort(child);
    FreeDevice(scratch);
    return Annotate(check, where);
  }
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(
      group_name, my_rank, group_size, device_, options_, owned_stream_, stream_, child, scratch));
}

// ---------------------------------------------------------------------------------------------
// State, waiting, failure.

std::string NcclCommunicator::Where(absl::string_view op) const {
  return internal::Where(name_, rank_, size_, op);
}

absl::Status NcclCommunicator::Usable(absl::string_view op) const {
  absl::MutexLock lock(&mu_);
  return UsableLocked(op);
}

absl::Status NcclCommunicator::UsableLocked(absl::string_view op) const {
  if (aborted_.load()) return absl::AbortedError(absl::StrCat(Where(op), ": aborted"));
  if (!broken_.ok()) return internal::BrokenError(Where(op), broken_);
  if (comm_ == nullptr) {
    return absl::AbortedError(absl::StrCat(Where(op), ": NCCL communicator is gone"));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::CheckCuda(absl::string_view op,
                                         std::initializer_list<const Tensor*> tensors) const {
  for (const Tensor* t : tensors) {
    if (t->numel() == 0) continue;
    if (t->device != Device::Cuda(device_)) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(op), ": NCCL needs tensors on cuda:", device_, ", got ", t->DebugString()));
    }
    if (t->data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(op), ": tensor ", t->DebugString(), " has null data"));
    }
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::CheckReduction(absl::string_view op, const Tensor& in,
                                              const Tensor& out) const {
  SY_RETURN_IF_ERROR(Usable(op));
  const std::string where = Where(op);
  SY_RETURN_IF_ERROR(internal::CheckSameDType(where, in, out));
  return internal::CheckReducible(where, in.dtype);
}

absl::Status NcclCommunicator::Begin(absl::string_view op) {
  {
    absl::MutexLock lock(&mu_);
    SY_RETURN_IF_ERROR(UsableLocked(op));
    in_flight_ = true;
  }
  const cudaError_t err = cudaSetDevice(device_);
  if (err != cudaSuccess) {
    End();
    return Annotate(CudaErrorToStatus(err, "cudaSetDevice(device_)", __FILE__, __LINE__),
                    Where(op));
  }
  return absl::OkStatus();
}

void NcclCommunicator::End() {
  bool abort_now = false;
  {
    absl::MutexLock lock(&mu_);
    in_flight_ = false;
    // An Abort() or a watchdog failure that arrived during the call left the handle to us.
    abort_now = (aborted_.load() || !broken_.ok()) && comm_ != nullptr;
  }
  if (abort_now) AbortHandle();
}

void NcclCommunicator::AbortHandle() {
  // handle_mu_ keeps the watchdog's ncclCommGetAsyncError off a handle being aborted.
  absl::MutexLock handle_lock(&handle_mu_);
  ncclComm_t comm = nullptr;
  {
    absl::MutexLock lock(&mu_);
    comm = comm_;
    comm_ = nullptr;
  }
  if (comm != nullptr) (void)ncclCommAbort(comm);
}

void NcclCommunicator::Abort() {
  aborted_.store(true);
  {
    absl::MutexLock lock(&mu_);
    // The in-flight call aborts the handle (see the header). A call that begins after this point
    // sees aborted_ and does not touch the handle.
    if (in_flight_) return;
  }
  AbortHandle();
}

absl::Status NcclCommunicator::Fail(absl::string_view op, const absl::Status& status) {
  absl::Status recorded(
      aborted_.load() ? absl::StatusCode::kAborted : status.code(),
      absl::StrCat(Where(op), ": ", status.message(), aborted_.load() ? " (aborted)" : ""));
  {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) broken_ = recorded;
  }
  AbortHandle();
  return recorded;
}

absl::Status NcclCommunicator::Wait(absl::string_view op) {
  ncclComm_t comm = nullptr;
  {
    absl::MutexLock lock(&mu_);
    comm = comm_;
  }
  if (comm == nullptr) return Fail(op, absl::AbortedError("NCCL communicator is gone"));
  const absl::Time deadline = absl::Now() + options_.timeout;
  Backoff backoff;
  for (;;) {
    if (aborted_.load()) return Fail(op, absl::AbortedError("aborted while waiting"));
    ncclResult_t state = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
    if (query != ncclSuccess) {
      return Fail(op, NcclErrorToStatus(query, "ncclCommGetAsyncError", __FILE__, __LINE__));
    }
    if (state != ncclSuccess && state != ncclInProgress) {
      // Work that was enqueued fine and then failed is a communication failure (a lost peer or
      // link), whatever NCCL's code: UNAVAILABLE, keeping NCCL's message.
      const absl::Status nccl =
          NcclErrorToStatus(state, "NCCL asynchronous error", __FILE__, __LINE__);
      return Fail(op, absl::UnavailableError(nccl.message()));
    }
    // Only once NCCL has finished enqueueing (state ncclSuccess) does the stream hold the work.
    if (state == ncclSuccess) {
      const cudaError_t err = cudaStreamQuery(stream_);
      if (err == cudaSuccess) return absl::OkStatus();
      if (err != cudaErrorNotReady) {
        return Fail(op, CudaErrorToStatus(err, "cudaStreamQuery(stream)", __FILE__, __LINE__));
      }
    }
    if (absl::Now() > deadline) {
      return Fail(op, TimeoutError());
    }
    backoff.Pause();
  }
}

// Runs one operation: Begin, `enqueue(comm)` (NCCL/CUDA calls on stream_), then Wait (blocking
// mode: the call returns once the stream drained) or WaitEnqueued + Watch (the call returns once
// the work is on the stream and the watchdog follows it), End. An enqueue error breaks the
// communicator like a communication error (the NCCL state is unknown).
template <typename Fn>
absl::Status NcclCommunicator::Run(absl::string_view op, Fn&& enqueue) {
  SY_RETURN_IF_ERROR(Begin(op));
  absl::Cleanup end = [this] { End(); };
  ncclComm_t comm = nullptr;
  {
    absl::MutexLock lock(&mu_);
    comm = comm_;
  }
  const absl::Time deadline = absl::Now() + options_.timeout;
  absl::Status enqueued;
  {
    // NCCL does not allow two threads on one communicator at once: the watchdog's
    // ncclCommGetAsyncError (which also progresses a non-blocking communicator's async jobs)
    // must not run during the enqueue. Without this lock the first GPU run (2026-11-28) failed
    // with "ncclCommGetAsyncError failed: ... ncclAsyncJobComplete: job ... failed".
    absl::MutexLock handle_lock(&handle_mu_);
    enqueued = enqueue(comm);
  }
  if (!enqueued.ok()) return Fail(op, enqueued);
  if (options_.blocking) return Wait(op);
  SY_RETURN_IF_ERROR(WaitEnqueued(op, comm, deadline));
  return Watch(op, deadline);
}

// ---------------------------------------------------------------------------------------------
// Non-blocking mode: enqueue completion, the watchdog, Synchronize.

absl::Status NcclCommunicator::TimeoutError() const {
  return absl::DeadlineExceededError(absl::StrCat("a peer did not take part within the timeout ",
                                                  absl::FormatDuration(options_.timeout),
                                                  " (NCCL communicator aborted)"));
}

absl::Status NcclCommunicator::WaitEnqueued(absl::string_view op, ncclComm_t comm,
                                            absl::Time deadline) {
  Backoff backoff;
  for (;;) {
    if (aborted_.load()) return Fail(op, absl::AbortedError("aborted while enqueueing"));
    ncclResult_t state = ncclSuccess;
    ncclResult_t query;
    {
      absl::MutexLock handle_lock(&handle_mu_);  // one thread on the handle (see Run)
      query = ncclCommGetAsyncError(comm, &state);
    }
    if (query != ncclSuccess) {
      return Fail(op, NcclErrorToStatus(query, "ncclCommGetAsyncError", __FILE__, __LINE__));
    }
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      const absl::Status nccl =
          NcclErrorToStatus(state, "NCCL asynchronous error", __FILE__, __LINE__);
      return Fail(op, absl::UnavailableError(nccl.message()));
    }
    // Still enqueueing (e.g. connecting to a peer for the first time): that can need the peers.
    if (absl::Now() > deadline) return Fail(op, TimeoutError());
    backoff.Pause();
  }
}

absl::Status NcclCommunicator::Watch(absl::string_view op, absl::Time deadline) {
  cudaEvent_t event = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (!free_events_.empty()) {
      event = free_events_.back();
      free_events_.pop_back();
    }
  }
  if (event == nullptr) {
    const cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (err != cudaSuccess) {
      return Fail(op, CudaErrorToStatus(err, "cudaEventCreateWithFlags", __FILE__, __LINE__));
    }
  }
  const cudaError_t err = cudaEventRecord(event, stream_);
  if (err != cudaSuccess) {
    (void)cudaEventDestroy(event);
    return Fail(op, CudaErrorToStatus(err, "cudaEventRecord(event, stream)", __FILE__, __LINE__));
  }
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) {
    // The watchdog failed an earlier operation during this call: report it now (End() aborts).
    free_events_.push_back(event);
    return absl::Status(
        broken_.code(),
        absl::StrCat(Where(op), ": broken by an earlier error: ", broken_.message()));
  }
  pending_.push_back(Pending{std::string(op), event, deadline});
  return absl::OkStatus();
}

bool NcclCommunicator::WatchdogHasWork() const { return stop_ || !pending_.empty(); }

void NcclCommunicator::DropPending() {
  for (const Pending& p : pending_) free_events_.push_back(p.event);
  pending_.clear();
}

void NcclCommunicator::FailAsync(absl::string_view op, const absl::Status& status) {
  const bool aborted = aborted_.load();
  const absl::Status recorded(
      aborted ? absl::StatusCode::kAborted : status.code(),
      absl::StrCat(Where(op), ": ", status.message(), aborted ? " (aborted)" : ""));
  bool abort_now = false;
  {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) broken_ = recorded;
    // Recorded under the same lock as the in_flight_ check: a call that begins later sees
    // broken_ and does not touch the handle; one in flight aborts it in End().
    abort_now = !in_flight_;
  }
  if (abort_now) AbortHandle();
}

void NcclCommunicator::WatchdogLoop() {
  // Events and NCCL belong to device_; make it current for this thread's CUDA calls.
  (void)cudaSetDevice(device_);
  cudaEvent_t watched = nullptr;
  int polls = 0;
  for (;;) {
    Pending front;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &NcclCommunicator::WatchdogHasWork));
      if (stop_) return;
      if (aborted_.load() || !broken_.ok() || comm_ == nullptr) {
        // Failed or aborted: the handle is (being) aborted, which drains the stream; nothing is
        // left to watch, and every later call reports the state.
        DropPending();
        continue;
      }
      front = pending_.front();
    }
    if (front.event != watched) {
      watched = front.event;
      polls = 0;
    }
    absl::Status failure;
    {
      absl::MutexLock handle_lock(&handle_mu_);
      ncclComm_t comm = nullptr;
      {
        absl::MutexLock lock(&mu_);
        comm = comm_;
      }
      if (comm != nullptr) {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
        if (query != ncclSuccess) {
          failure = NcclErrorToStatus(query, "ncclCommGetAsyncError", __FILE__, __LINE__);
        } else if (state != ncclSuccess && state != ncclInProgress) {
          // As in Wait: enqueued work that then failed is a lost peer or link.
          failure = absl::UnavailableError(
              NcclErrorToStatus(state, "NCCL asynchronous error", __FILE__, __LINE__).message());
        }
      }
    }
    if (failure.ok()) {
      const cudaError_t err = cudaEventQuery(front.event);
      if (err == cudaSuccess) {
        // Only this thread removes entries (DropPending included), so the front is unchanged.
        absl::MutexLock lock(&mu_);
        if (!pending_.empty() && pending_.front().event == front.event) {
          free_events_.push_back(front.event);
          pending_.pop_front();
        }
        watched = nullptr;
        continue;
      }
      if (err != cudaErrorNotReady) {
        failure = CudaErrorToStatus(err, "cudaEventQuery(event)", __FILE__, __LINE__);
      } else if (absl::Now() > front.deadline) {
        failure = TimeoutError();
      }
    }
    if (!failure.ok()) {
      FailAsync(front.op, failure);
      continue;
    }
    // A quick poll at first (small collectives finish in microseconds), then a slower one: the
    // watchdog only bounds failures; Synchronize polls the events itself.
    std::this_thread::sleep_for(std::chrono::microseconds(++polls < 100 ? 50 : 500));
  }
}

absl::Status NcclCommunicator::Synchronize() {
  const char* kOp = "Synchronize";
  Backoff backoff;
  for (;;) {
    Pending last;
    {
      absl::MutexLock lock(&mu_);
      SY_RETURN_IF_ERROR(UsableLocked(kOp));
      if (pending_.empty()) return absl::OkStatus();
      last = pending_.back();
    }
    const cudaError_t err = cudaEventQuery(last.event);
    if (err == cudaSuccess) {
      // Everything enqueued so far has completed. Check NCCL's asynchronous state once more, so
      // an error the watchdog has not polled yet is not reported as success.
      absl::Status failure;
      {
        absl::MutexLock handle_lock(&handle_mu_);
        ncclComm_t comm = nullptr;
        {
          absl::MutexLock lock(&mu_);
          comm = comm_;
        }
        ncclResult_t state = ncclSuccess;
        if (comm != nullptr && ncclCommGetAsyncError(comm, &state) == ncclSuccess &&
            state != ncclSuccess && state != ncclInProgress) {
          failure = absl::UnavailableError(
              NcclErrorToStatus(state, "NCCL asynchronous error", __FILE__, __LINE__).message());
        }
      }
      if (failure.ok()) return absl::OkStatus();
      FailAsync(last.op, failure);
      continue;  // returns the recorded status
    }
    if (err != cudaErrorNotReady) {
      FailAsync(last.op, CudaErrorToStatus(err, "cudaEventQuery(event)", __FILE__, __LINE__));
      continue;
    }
    if (absl::Now() > last.deadline + kSynchronizeGrace) {
      FailAsync(last.op, TimeoutError());
      continue;
    }
    backoff.Pause();
  }
}

absl::Status WaitEvent(absl::Span<Communicator* const> comms, cudaEvent_t event,
                       absl::string_view what) {
  for (Communicator* c : comms) {
    if (c == nullptr) continue;
    // Unchanged: it already names the group, this rank and the operation that failed, and
    // callers prefix their own context (e.g. "MoE layer 7 dispatch (forward): group 'ep' ...").
    SY_RETURN_IF_ERROR(c->Synchronize());
  }
  // Every collective of `comms` enqueued before the event has completed: what is left before it
  // is local work, which cannot wait on a peer.
  const cudaError_t err = cudaEventSynchronize(event);
  if (err != cudaSuccess) {
    return Annotate(CudaErrorToStatus(err, "cudaEventSynchronize(event)", __FILE__, __LINE__),
                    what);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Operations.

absl::Status NcclCommunicator::AllReduce(const Tensor& in, const Tensor& out, ReduceOp op) {
  const char* kOp = "AllReduce";
  SY_RETURN_IF_ERROR(CheckReduction(kOp, in, out));
  const std::string where = Where(kOp);
  const ncclDataType_t type = ToNcclType(in.dtype);
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "out", out, in.numel()));
  if (out.numel() == 0) return absl::OkStatus();
  SY_RETURN_IF_ERROR(CheckCuda(kOp, {&in, &out}));
  const size_t n = static_cast<size_t>(out.numel());
  return Run(kOp, [&](ncclComm_t comm) -> absl::Status {
    SY_NCCL_RETURN_IF_ERROR(ncclAllReduce(in.data, out.data, n, type, ToNcclOp(op), comm, stream_));
    return absl::OkStatus();
  });
}

absl::Status NcclCommunicator::ReduceScatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  const char* kOp = "ReduceScatter";
  SY_RETURN_IF_ERROR(CheckReduction(kOp, in, out));
  const std::string where = Where(kOp);
  const ncclDataType_t type = ToNcclType(in.dtype);
  const int64_t n = out.numel();
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "in (size() * out.numel())", in, n * size_));
  if (n == 0) return absl::OkStatus();
  SY_RETURN_IF_ERROR(CheckCuda(kOp, {&in, &out}));
  return Run(kOp, [&](ncclComm_t comm) -> absl::Status {
    SY_NCCL_RETURN_IF_ERROR(ncclReduceScatter(in.data, out.data, static_cast<size_t>(n), type,
                                              ToNcclOp(op), comm, stream_));
    return absl::OkStatus();
  });
}

absl::Status NcclCommunicator::AllGather(const Tensor& in, const Tensor& out) {
  const char* kOp = "AllGather";
  SY_RETURN_IF_ERROR(Usable(kOp));
  const std::string where = Where(kOp);
  SY_RETURN_IF_ERROR(internal::CheckSameDType(where, in, out));
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "out", out, in.numel() * size_));
  if (in.numel() == 0) return absl::OkStatus();
  SY_RETURN_IF_ERROR(CheckCuda(kOp, {&in, &out}));
  const size_t bytes = in.bytes();
  return Run(kOp, [&](ncclComm_t comm) -> absl::Status {
    SY_NCCL_RETURN_IF_ERROR(ncclAllGather(in.data, out.data, bytes, ncclInt8, comm, stream_));
    return absl::OkStatus();
  });
}

absl::Status NcclCommunicator::AllGatherV(const Tensor& in, const Tensor& out,
                                          absl::Span<const int64_t> counts) {
  const char* kOp = "AllGatherV";
  SY_RETURN_IF_ERROR(Usable(kOp));
  const std::string where = Where(kOp);
  SY_RETURN_IF_ERROR(internal::CheckSameDType(where, in, out));
  SY_ASSIGN_OR_RETURN(int64_t total, internal::CheckCounts(where, "counts", counts, size_));
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "in (counts[rank])", in, counts[rank_]));
  SY_RETURN_IF_ERROR(internal::CheckNumel(where, "out (sum of counts)", out, total));
  if (total == 0) return absl::OkStatus();
  SY_RETURN_IF_ERROR(CheckCuda(kOp, {&in, &out}));
  const size_t es = DTypeSize(in.dtype);
  return Run(kOp, [&](ncclComm_t comm) -> absl::Status {
    SY_NCCL_RETURN_IF_ERROR(ncclGroupStart());
    absl::Status status;
    int64_t offset = 0;
    for (int r = 0; r < size_ && status.ok(); ++r) {
      if (counts[r] > 0) {
        const ncclResult_t err =
            ncclBroadcast(r == rank_ ? in.data : nullptr, At(out, offset),
                          static_cast<size_t>(counts[r]) * es, ncclInt8, r, comm, stream_);
        if (err != ncclSuccess && err != ncclInProgress) {
          status = NcclErrorToStatus(err, "ncclBroadcast", __FILE__, __LINE__);
        }
      }
      offset += counts[r];
    }
    const ncclResult_t end = ncclGroupEnd();
    SY_RETURN_IF_ERROR(status);
    SY_NCCL_RETURN_IF_ERROR(end);
    return absl::OkStatus();
  });
}

absl::Status NcclCommunicator::AllToAllV(const Tensor& in, absl::Span<const int64_t> send_counts,
                                         const Tensor& out, absl::Span<const int64_t> recv_counts) {
  const char* kOp = "AllToAllV";
  SY_RETURN_IF_ERROR(Usable(kOp));
  const std::string where = Where(kOp);
  SY_ASSIGN_OR_RETURN(const auto totals, internal::CheckAllToAllV(where, in, send_counts, out,
                                                                  recv_counts, rank_, size_));
  const int64_t send_total = totals.first, recv_total = totals.second;
  if (send_total == 0 && recv_total == 0) return absl::OkStatus();
  SY_RETURN_IF_ERROR(CheckCuda(kOp, {&in, &out}));
  const size_t es = DTypeSize(in.dtype);
  return Run(kOp, [&](ncclComm_t comm) -> absl::Status {
    // This rank's own chunk: a device copy ordered on the same stream.
    int64_t send_offset = 0, recv_offset = 0;
    for (int r = 0; r < rank_; ++r) {
      send_offset += send_counts[r];
      recv_offset += recv_counts[r];
    }
    if (send_counts[rank_] > 0) {
      SY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(At(out, recv_offset), At(in, send_offset),
                                              static_cast<size_t>(send_counts[rank_]) * es,
                                              cudaMemcpyDeviceToDevice, stream_));
    }
    SY_NCCL_RETURN_IF_ERROR(ncclGroupStart());
    absl::Status status;
    send_offset = 0;
    recv_offset = 0;
    for (int r = 0; r < size_ && status.ok(); ++r) {
      if (r != rank_ && send_counts[r] > 0) {
        const ncclResult_t err =
            ncclSend(At(in, send_offset), static_cast<size_t>(send_counts[r]) * es, ncclInt8, r,
                     comm, stream_);
        if (err != ncclSuccess && err != ncclInProgress) {
          status = NcclErrorToStatus(err, "ncclSend", __FILE__, __LINE__);
        }
      }
      if (status.ok() && r != rank_ && recv_counts[r] > 0) {
        const ncclResult_t err =
            ncclRecv(At(out, recv_offset), static_cast<size_t>(recv_counts[r]) * es, ncclInt8, r,
                     comm, stream_);
        if (err != ncclSuccess && err != ncclInProgress) {
          status = NcclErrorToStatus(err, "ncclRecv", __FILE__, __LINE__);
        }
      }
      send_offset += send_counts[r];
      recv_offset += recv_counts[r];
    }
    const ncclResult_t end = ncclGroupEnd();
    SY_RETURN_IF_ERROR(status);
    SY_NCCL_RETURN_IF_ERROR(end);
    return absl::OkStatus();
  });
}

absl::Status NcclCommunicator::Send(const Tensor& t, int peer, uint32_t tag) {
  return PointToPoint(/*send=*/true, t, peer, tag);
}

absl::Status NcclCommunicator::Recv(const Tensor& t, int peer, uint32_t tag) {
  return PointToPoint(/*send=*/false, t, peer, tag);
}

absl::Status NcclCommunicator::PointToPoint(bool send, const Tensor& t, int peer, uint32_t tag) {
  const std::string op = absl::StrCat(send ? "Send to" : "Recv from", " peer ", peer, " tag ", tag);
  SY_RETURN_IF_ERROR(Usable(op));
  SY_RETURN_IF_ERROR(internal::CheckPeer(Where(op), peer, rank_, size_));
  if (t.numel() == 0) return absl::OkStatus();
  SY_RETURN_IF_ERROR(CheckCuda(op, {&t}));
  return Run(op, [&](ncclComm_t comm) -> absl::Status {
    if (send) {
      SY_NCCL_RETURN_IF_ERROR(ncclSend(t.data, t.bytes(), ncclInt8, peer, comm, stream_));
    } else {
      SY_NCCL_RETURN_IF_ERROR(ncclRecv(t.data, t.bytes(), ncclInt8, peer, comm, stream_));
    }
    return absl::OkStatus();
  });
}

absl::Status NcclCommunicator::Broadcast(const Tensor& t, int root) {
  const char* kOp = "Broadcast";
  SY_RETURN_IF_ERROR(Usable(kOp));
  const std::string where = Where(kOp);
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": root ", root, " must be in [0, ", size_, ")"));
  }
  if (t.numel() == 0 || size_ == 1) return absl::OkStatus();
  SY_RETURN_IF_ERROR(CheckCuda(kOp, {&t}));
  return Run(kOp, [&](ncclComm_t comm) -> absl::Status {
    SY_NCCL_RETURN_IF_ERROR(
        ncclBroadcast(t.data, t.data, t.bytes(), ncclInt8, root, comm, stream_));
    return absl::OkStatus();
  });
}

absl::Status NcclCommunicator::Barrier() {
  const char* kOp = "Barrier";
  SY_RETURN_IF_ERROR(Usable(kOp));
  if (size_ == 1) return absl::OkStatus();
  return Run(kOp, [&](ncclComm_t comm) -> absl::Status {
    SY_NCCL_RETURN_IF_ERROR(
        ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm, stream_));
    return absl::OkStatus();
  });
}

}  // namespace switchyard::comm
