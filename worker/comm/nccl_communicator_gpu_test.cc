// File: worker/comm/nccl_communicator_gpu_test.cc
//
// NcclCommunicator on real GPUs, one forked process per GPU (W = number of visible GPUs, at most
// 8), rendezvous through a FileKvStore in TEST_TMPDIR. The parent never touches CUDA: the GPU
// count comes from a probe child, and the rank children are forked before any CUDA call, so each
// child initialises CUDA itself. Skips (GTEST_SKIP) with fewer than 2 GPUs.
//
// Every collective uses small integer-valued data that every dtype (bf16 included) represents
// exactly, so checks are exact equality; outputs are poisoned (0xFF bytes) first. Children report
// through their exit code and print the failing check to stderr.
//
// Both modes of the stream contract (nccl_communicator.h): the collectives in the non-blocking
// (default) and the blocking mode; a rank joining 1 s late (non-blocking: the others' call
// returns in < 100 ms and Synchronize() waits; blocking, by option or SWITCHYARD_NCCL_BLOCKING=1:
// the call itself waits); a peer that never joins (Synchronize() fails at the timeout naming the
// group and the operation, later calls too); a killed peer.
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kernels/testing/gpu.h"
#include "worker/comm/kv_store.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/testing/forked_ranks.h"

namespace switchyard::comm {
namespace {

#define CHILD_CUDA(expr)                                                                     \
  do {                                                                                       \
    cudaError_t e_ = (expr);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "rank %d: %s:%d: %s: %s\n", comm::testing::ChildRank(), __FILE__, \
                   __LINE__, #expr, cudaGetErrorString(e_));                                 \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

// Element conversions for the exact checks (all values are small integers).
template <typename T>
T Make(double v) {
  return static_cast<T>(v);
}
template <>
BF16 Make<BF16>(double v) {
  return BF16::FromFloat(static_cast<float>(v));
}
template <typename T>
double Value(T x) {
  return static_cast<double>(x);
}
template <>
double Value<BF16>(BF16 x) {
  return x.ToFloat();
}
template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return DType::kF32;
}
template <>
constexpr DType DTypeOf<double>() {
  return DType::kF64;
}
template <>
constexpr DType DTypeOf<BF16>() {
  return DType::kBF16;
}
template <>
constexpr DType DTypeOf<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType DTypeOf<int64_t>() {
  return DType::kI64;
}

// A device array of n elements of T on the current device, freed on scope exit.
template <typename T>
class DeviceVec {
 public:
  DeviceVec() = default;
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  ~DeviceVec() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  // Allocates n elements (at least one byte) filled with 0xFF bytes.
  cudaError_t Poisoned(int64_t n, int device) {
    n_ = n;
    device_ = device;
    cudaError_t e = cudaMalloc(&ptr_, std::max<size_t>(1, n * sizeof(T)));
    if (e != cudaSuccess) return e;
    return cudaMemset(ptr_, 0xFF, std::max<size_t>(1, n * sizeof(T)));
  }
  cudaError_t Upload(const std::vector<T>& host, int device) {
    cudaError_t e = Poisoned(static_cast<int64_t>(host.size()), device);
    if (e != cudaSuccess || host.empty()) return e;
    return cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  cudaError_t Download(std::vector<T>* host) const {
    host->assign(n_, Make<T>(0));
    if (n_ == 0) return cudaSuccess;
    return cudaMemcpy(host->data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
  }
  Tensor tensor() const {
    return Tensor(DTypeOf<T>(), {n_}, Device::Cuda(device_), n_ > 0 ? ptr_ : nullptr);
  }

 private:
  T* ptr_ = nullptr;
  int64_t n_ = 0;
  int device_ = 0;
};

// Compares got[i] with want(i) exactly; prints the first mismatch.
template <typename T, typename Want>
bool Exact(const char* what, const std::vector<T>& got, Want want) {
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = Value(got[i]), w = want(static_cast<int64_t>(i));
    if (!(g == w)) {
      std::fprintf(stderr, "rank %d: %s: element %zu of %zu: got %g, want %g\n",
                   comm::testing::ChildRank(), what, i, got.size(), g, w);
      return false;
    }
  }
  return true;
}

// AllReduce of x_r[i] = (r + 1) * (i % 7 - 3) for sum, max and min (out of place, poisoned out).
template <typename T>
int CheckAllReduce(NcclCommunicator& comm, int device) {
  const int w = comm.size(), r = comm.rank();
  const int64_t n = 1000;
  std::vector<T> host(n);
  for (int64_t i = 0; i < n; ++i) host[i] = Make<T>((r + 1) * (i % 7 - 3));
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    DeviceVec<T> in, out;
    CHILD_CUDA(in.Upload(host, device));
    CHILD_CUDA(out.Poisoned(n, device));
    SY_CHILD_OK(comm.AllReduce(in.tensor(), out.tensor(), op));
    std::vector<T> got;
    SY_CHILD_OK(comm.Synchronize());  // the host reads the result next
    CHILD_CUDA(out.Download(&got));
    const std::string what =
        absl::StrCat("AllReduce ", DTypeName(DTypeOf<T>()), " ", ReduceOpName(op));
    SY_CHILD_CHECK(Exact(what.c_str(), got, [&](int64_t i) -> double {
      const double v = static_cast<double>(i % 7 - 3);
      switch (op) {
        case ReduceOp::kSum:
          return w * (w + 1) / 2.0 * v;
        case ReduceOp::kMax:
          return v >= 0 ? w * v : v;
        default:
          return v >= 0 ? v : w * v;
      }
    }));
  }
  // In place, sum.
  DeviceVec<T> io;
  CHILD_CUDA(io.Upload(host, device));
  SY_CHILD_OK(comm.AllReduce(io.tensor(), io.tensor(), ReduceOp::kSum));
  std::vector<T> got;
  SY_CHILD_OK(comm.Synchronize());  // the host reads the result next
  CHILD_CUDA(io.Download(&got));
  SY_CHILD_CHECK(Exact("AllReduce in place", got, [&](int64_t i) {
    return w * (w + 1) / 2.0 * static_cast<double>(i % 7 - 3);
  }));
  return 0;
}

int RunCollectives(const std::string& dir, int rank, int world, bool blocking) {
  auto store_or = FileKvStore::Create(dir);
  SY_CHILD_OK(store_or.status());
  std::shared_ptr<KvStore> store = std::move(store_or).value();
  NcclOptions options;
  options.timeout = absl::Seconds(60);
  options.blocking = blocking;
  auto comm_or = NcclCommunicator::Create(store, rank, world, rank, nullptr, options, "world");
  SY_CHILD_OK(comm_or.status());
  NcclCommunicator& comm = **comm_or;
  SY_CHILD_CHECK(comm.rank() == rank && comm.size() == world && comm.name() == "world");
  SY_CHILD_CHECK(comm.blocking() == blocking);
  const int dev = rank;
  const int w = world, r = rank;

  if (CheckAllReduce<float>(comm, dev) != 0) return 1;
  if (CheckAllReduce<double>(comm, dev) != 0) return 1;
  if (CheckAllReduce<BF16>(comm, dev) != 0) return 1;
  if (CheckAllReduce<int32_t>(comm, dev) != 0) return 1;
  if (CheckAllReduce<int64_t>(comm, dev) != 0) return 1;

  {  // ReduceScatter (i32 sum): in_r[j] = (r + 1) * (j % 11 - 5).
    const int64_t n = 37;
    std::vector<int32_t> host(n * w);
    for (int64_t j = 0; j < n * w; ++j) host[j] = (r + 1) * static_cast<int32_t>(j % 11 - 5);
    DeviceVec<int32_t> in, out;
    CHILD_CUDA(in.Upload(host, dev));
    CHILD_CUDA(out.Poisoned(n, dev));
    SY_CHILD_OK(comm.ReduceScatter(in.tensor(), out.tensor(), ReduceOp::kSum));
    std::vector<int32_t> got;
    SY_CHILD_OK(comm.Synchronize());  // the host reads the result next
    CHILD_CUDA(out.Download(&got));
    SY_CHILD_CHECK(Exact("ReduceScatter", got, [&](int64_t i) {
      return w * (w + 1) / 2.0 * static_cast<double>((r * n + i) % 11 - 5);
    }));
  }
  {  // AllGather (i64): in_r[i] = r * 1000 + i.
    const int64_t n = 129;
    std::vector<int64_t> host(n);
    for (int64_t i = 0; i < n; ++i) host[i] = r * 1000 + i;
    DeviceVec<int64_t> in, out;
    CHILD_CUDA(in.Upload(host, dev));
    CHILD_CUDA(out.Poisoned(n * w, dev));
    SY_CHILD_OK(comm.AllGather(in.tensor(), out.tensor()));
    std::vector<int64_t> got;
    SY_CHILD_OK(comm.Synchronize());  // the host reads the result next
    CHILD_CUDA(out.Download(&got));
    SY_CHILD_CHECK(Exact("AllGather", got, [&](int64_t j) { return (j / n) * 1000.0 + j % n; }));
  }
  {  // AllGatherV (f32): counts[c] = 3c mod 4 (rank 0 contributes nothing), values c*100 + i.
    std::vector<int64_t> counts(w);
    int64_t total = 0;
    for (int c = 0; c < w; ++c) total += counts[c] = (3 * c) % 4;
    std::vector<float> host(counts[r]);
    for (int64_t i = 0; i < counts[r]; ++i) host[i] = static_cast<float>(r * 100 + i);
    DeviceVec<float> in, out;
    CHILD_CUDA(in.Upload(host, dev));
    CHILD_CUDA(out.Poisoned(total, dev));
    SY_CHILD_OK(comm.AllGatherV(in.tensor(), out.tensor(), counts));
    std::vector<float> got;
    SY_CHILD_OK(comm.Synchronize());  // the host reads the result next
    CHILD_CUDA(out.Download(&got));
    std::vector<double> want;
    for (int c = 0; c < w; ++c) {
      for (int64_t i = 0; i < counts[c]; ++i) want.push_back(c * 100.0 + i);
    }
    SY_CHILD_CHECK(Exact("AllGatherV", got, [&](int64_t j) { return want[j]; }));
  }
  {  // AllToAllV (i32): r sends (r + 2p) % 3 elements to p: r*10000 + p*100 + k.
    std::vector<int64_t> send(w), recv(w);
    std::vector<int32_t> host;
    std::vector<double> want;
    for (int p = 0; p < w; ++p) {
      send[p] = (r + 2 * p) % 3;
      recv[p] = (p + 2 * r) % 3;
      for (int64_t k = 0; k < send[p]; ++k) host.push_back(r * 10000 + p * 100 + k);
      for (int64_t k = 0; k < recv[p]; ++k) want.push_back(p * 10000.0 + r * 100 + k);
    }
    DeviceVec<int32_t> in, out;
    CHILD_CUDA(in.Upload(host, dev));
    CHILD_CUDA(out.Poisoned(static_cast<int64_t>(want.size()), dev));
    SY_CHILD_OK(comm.AllToAllV(in.tensor(), send, out.tensor(), recv));
    std::vector<int32_t> got;
    SY_CHILD_OK(comm.Synchronize());  // the host reads the result next
    CHILD_CUDA(out.Download(&got));
    SY_CHILD_CHECK(Exact("AllToAllV", got, [&](int64_t j) { return want[j]; }));
  }
  {  // Send/Recv around a ring: even ranks send first, odd ranks receive first.
    const int64_t n = 513;
    const int next = (r + 1) % w, prev = (r + w - 1) % w;
    std::vector<int32_t> host(n);
    for (int64_t i = 0; i < n; ++i) host[i] = r * 7 + static_cast<int32_t>(i);
    DeviceVec<int32_t> sbuf, rbuf;
    CHILD_CUDA(sbuf.Upload(host, dev));
    CHILD_CUDA(rbuf.Poisoned(n, dev));
    if (r % 2 == 0) {
      SY_CHILD_OK(comm.Send(sbuf.tensor(), next, 5));
      SY_CHILD_OK(comm.Recv(rbuf.tensor(), prev, 5));
    } else {
      SY_CHILD_OK(comm.Recv(rbuf.tensor(), prev, 5));
      SY_CHILD_OK(comm.Send(sbuf.tensor(), next, 5));
    }
    std::vector<int32_t> got;
    SY_CHILD_OK(comm.Synchronize());  // the host reads the result next
    CHILD_CUDA(rbuf.Download(&got));
    SY_CHILD_CHECK(Exact("Recv", got, [&](int64_t i) { return prev * 7.0 + i; }));
  }
  {  // Broadcast from the last rank; the others start poisoned.
    const int64_t n = 300;
    const int root = w - 1;
    DeviceVec<BF16> t;
    if (r == root) {
      std::vector<BF16> host(n);
      for (int64_t i = 0; i < n; ++i) host[i] = Make<BF16>(static_cast<double>(i % 200 - 100));
      CHILD_CUDA(t.Upload(host, dev));
    } else {
      CHILD_CUDA(t.Poisoned(n, dev));
    }
    SY_CHILD_OK(comm.Broadcast(t.tensor(), root));
    std::vector<BF16> got;
    SY_CHILD_OK(comm.Synchronize());  // the host reads the result next
    CHILD_CUDA(t.Download(&got));
    SY_CHILD_CHECK(
        Exact("Broadcast", got, [](int64_t i) { return static_cast<double>(i % 200 - 100); }));
  }
  SY_CHILD_OK(comm.Barrier());
  SY_CHILD_OK(comm.Synchronize());

  // Argument errors come back before any communication and name the group.
  {
    DeviceVec<float> a;
    CHILD_CUDA(a.Poisoned(4, dev));
    DeviceVec<int32_t> b;
    CHILD_CUDA(b.Poisoned(4, dev));
    const absl::Status s = comm.AllReduce(a.tensor(), b.tensor(), ReduceOp::kSum);
    SY_CHILD_CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    SY_CHILD_CHECK(absl::StrContains(s.message(), "group 'world' rank"));
    SY_CHILD_OK(comm.Barrier());  // not broken by an argument error
    SY_CHILD_OK(comm.Synchronize());
  }

  {  // Sub-groups: by parity (NCCL split colors 0 and 1), and all ranks in reverse order.
    std::vector<int> parity;
    for (int q = r % 2; q < w; q += 2) parity.push_back(q);
    auto sub_or = comm.CreateSubgroup(parity, "parity");
    SY_CHILD_OK(sub_or.status());
    SY_CHILD_CHECK(*sub_or != nullptr);
    NcclCommunicator& sub = **sub_or;
    SY_CHILD_CHECK(sub.size() == static_cast<int>(parity.size()) && sub.rank() == r / 2);
    SY_CHILD_CHECK(absl::StartsWith(sub.name(), "parity["));
    DeviceVec<int32_t> v;
    CHILD_CUDA(v.Upload({r + 1}, dev));
    SY_CHILD_OK(sub.AllReduce(v.tensor(), v.tensor(), ReduceOp::kSum));
    std::vector<int32_t> got;
    SY_CHILD_OK(sub.Synchronize());  // the host reads the result next
    CHILD_CUDA(v.Download(&got));
    double want = 0;
    for (int q : parity) want += q + 1;
    SY_CHILD_CHECK(Exact("parity AllReduce", got, [&](int64_t) { return want; }));

    std::vector<int> reversed;
    for (int q = w - 1; q >= 0; --q) reversed.push_back(q);
    auto rev_or = comm.CreateSubgroup(reversed, "rev");
    SY_CHILD_OK(rev_or.status());
    NcclCommunicator& rev = **rev_or;
    SY_CHILD_CHECK(rev.rank() == w - 1 - r && rev.size() == w);
    DeviceVec<int32_t> mine, all;
    CHILD_CUDA(mine.Upload({r}, dev));
    CHILD_CUDA(all.Poisoned(w, dev));
    SY_CHILD_OK(rev.AllGather(mine.tensor(), all.tensor()));
    SY_CHILD_OK(rev.Synchronize());  // the host reads the result next
    CHILD_CUDA(all.Download(&got));
    SY_CHILD_CHECK(Exact("reversed AllGather", got, [&](int64_t c) { return w - 1.0 - c; }));
    SY_CHILD_OK(comm.Barrier());  // the world group still works after the splits
    SY_CHILD_OK(comm.Synchronize());
  }

  // Abort: later calls are ABORTED; idempotent.
  comm.Abort();
  comm.Abort();
  const absl::Status after = comm.Barrier();
  SY_CHILD_CHECK(after.code() == absl::StatusCode::kAborted);
  SY_CHILD_CHECK(absl::StrContains(after.message(), "group 'world'"));
  return 0;
}

// The last rank exits after a first successful collective; the others' next AllReduce (or, as it
// only enqueues, the Synchronize() after it) must fail within the timeout (plus slack) with
// UNAVAILABLE or DEADLINE_EXCEEDED naming the group, and the communicator must stay broken.
int RunKilledPeer(const std::string& dir, int rank, int world) {
  auto store_or = FileKvStore::Create(dir);
  SY_CHILD_OK(store_or.status());
  std::shared_ptr<KvStore> store = std::move(store_or).value();
  NcclOptions options;
  options.timeout = absl::Seconds(15);
  auto comm_or = NcclCommunicator::Create(store, rank, world, rank, nullptr, options, "world");
  SY_CHILD_OK(comm_or.status());
  NcclCommunicator& comm = **comm_or;
  DeviceVec<int32_t> v;
  CHILD_CUDA(v.Upload(std::vector<int32_t>(1024, 1), rank));
  SY_CHILD_OK(comm.AllReduce(v.tensor(), v.tensor(), ReduceOp::kSum));
  SY_CHILD_OK(comm.Barrier());
  SY_CHILD_OK(comm.Synchronize());
  if (rank == world - 1) {
    std::fflush(nullptr);
    _exit(0);  // dies without tearing NCCL down
  }
  const absl::Time start = absl::Now();
  // Non-blocking: the call may return OK (enqueued) and the failure show at Synchronize().
  absl::Status s = comm.AllReduce(v.tensor(), v.tensor(), ReduceOp::kSum);
  if (s.ok()) s = comm.Synchronize();
  const absl::Duration took = absl::Now() - start;
  std::fprintf(stderr, "rank %d: after peer death: %s (%s)\n", rank, s.ToString().c_str(),
               absl::FormatDuration(took).c_str());
  SY_CHILD_CHECK(s.code() == absl::StatusCode::kUnavailable ||
                 s.code() == absl::StatusCode::kDeadlineExceeded);
  SY_CHILD_CHECK(absl::StrContains(s.message(), "group 'world' rank"));
  SY_CHILD_CHECK(took < options.timeout + absl::Seconds(10));
  const absl::Status again = comm.Barrier();
  SY_CHILD_CHECK(again.code() == s.code());
  return 0;
}

// Reads SWITCHYARD_NCCL_BLOCKING in this child only (forked, so the parent is unaffected).
void SetBlockingEnv(const char* value) {
  if (value == nullptr) {
    unsetenv("SWITCHYARD_NCCL_BLOCKING");
  } else {
    setenv("SWITCHYARD_NCCL_BLOCKING", value, 1);
  }
}

// Rank 0 joins the AllReduce kDelay late. Non-blocking (default): every other rank's call returns
// in < 100 ms, before the collective can complete (an event recorded on the stream right after
// the call is still pending), Synchronize() then waits about kDelay and the data is exact.
// Blocking (NcclOptions::blocking or SWITCHYARD_NCCL_BLOCKING=1): the other ranks' call itself
// takes about kDelay and the output is exact when read right after it, before Synchronize().
constexpr absl::Duration kDelay = absl::Seconds(1);

int RunDelayedPeer(const std::string& dir, int rank, int world, bool blocking_option,
                   const char* env, bool want_blocking) {
  SetBlockingEnv(env);
  auto store_or = FileKvStore::Create(dir);
  SY_CHILD_OK(store_or.status());
  std::shared_ptr<KvStore> store = std::move(store_or).value();
  NcclOptions options;
  options.timeout = absl::Seconds(30);
  options.blocking = blocking_option;
  auto comm_or = NcclCommunicator::Create(store, rank, world, rank, nullptr, options, "world");
  SY_CHILD_OK(comm_or.status());
  NcclCommunicator& comm = **comm_or;
  SY_CHILD_CHECK(comm.blocking() == want_blocking);
  const int64_t n = 1 << 20;
  std::vector<float> host(n);
  for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>((rank + 1) * (i % 13));
  DeviceVec<float> in, out;
  CHILD_CUDA(in.Upload(host, rank));
  CHILD_CUDA(out.Poisoned(n, rank));
  // Warm-up with the same size and type: NCCL connects its peers at the first collective, which
  // can hold the enqueue itself; the timed call below must only enqueue.
  SY_CHILD_OK(comm.AllReduce(in.tensor(), out.tensor(), ReduceOp::kSum));
  SY_CHILD_OK(comm.Synchronize());
  SY_CHILD_OK(comm.Barrier());
  SY_CHILD_OK(comm.Synchronize());
  CHILD_CUDA(cudaMemset(out.tensor().data, 0xFF, n * sizeof(float)));
  CHILD_CUDA(cudaDeviceSynchronize());  // the legacy-stream memset is done before the collective

  if (rank == 0) absl::SleepFor(kDelay);
  const absl::Time start = absl::Now();
  SY_CHILD_OK(comm.AllReduce(in.tensor(), out.tensor(), ReduceOp::kSum));
  const absl::Duration call = absl::Now() - start;
  cudaEvent_t after = nullptr;
  CHILD_CUDA(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
  CHILD_CUDA(cudaEventRecord(after, comm.stream()));
  const cudaError_t pending = cudaEventQuery(after);
  if (want_blocking) {
    // The call returned only after the collective completed: the output is readable at once,
    // without Synchronize() (the copy below runs on the legacy stream, not after comm.stream()).
    std::vector<float> early;
    CHILD_CUDA(out.Download(&early));
    SY_CHILD_CHECK(Exact("blocking AllReduce read right after the call", early, [&](int64_t i) {
      return world * (world + 1) / 2.0 * static_cast<double>(i % 13);
    }));
  }
  const absl::Time sync_start = absl::Now();
  SY_CHILD_OK(comm.Synchronize());
  const absl::Duration sync = absl::Now() - sync_start;
  std::fprintf(stderr, "rank %d (%s): AllReduce call %s, Synchronize %s, event right after: %s\n",
               rank, want_blocking ? "blocking" : "non-blocking",
               absl::FormatDuration(call).c_str(), absl::FormatDuration(sync).c_str(),
               cudaGetErrorName(pending));
  if (rank != 0) {
    if (want_blocking) {
      // The call waited for rank 0 (a little slack for its clock starting before ours).
      SY_CHILD_CHECK(call >= kDelay - absl::Milliseconds(300));
    } else {
      SY_CHILD_CHECK(call < absl::Milliseconds(100));
      SY_CHILD_CHECK(pending == cudaErrorNotReady);  // the collective had not completed
      SY_CHILD_CHECK(sync >= kDelay - absl::Milliseconds(300));
    }
  }
  CHILD_CUDA(cudaEventDestroy(after));
  std::vector<float> got;
  CHILD_CUDA(out.Download(&got));
  SY_CHILD_CHECK(Exact("delayed AllReduce", got, [&](int64_t i) {
    return world * (world + 1) / 2.0 * static_cast<double>(i % 13);
  }));
  // Several operations in a row are enqueued back to back, and Synchronize covers all of them.
  if (!want_blocking) {
    for (int k = 0; k < 3; ++k) {
      SY_CHILD_OK(comm.AllReduce(out.tensor(), out.tensor(), ReduceOp::kMax));
    }
    SY_CHILD_OK(comm.Synchronize());
    CHILD_CUDA(out.Download(&got));
    SY_CHILD_CHECK(Exact("AllReduce max x3", got, [&](int64_t i) {
      return world * (world + 1) / 2.0 * static_cast<double>(i % 13);
    }));
  }
  SY_CHILD_OK(comm.Barrier());
  SY_CHILD_OK(comm.Synchronize());
  return 0;
}

// The last rank never joins the second AllReduce (it stays alive, so NCCL sees no error: only
// the deadline can end the wait). Non-blocking: the others' AllReduce returns OK at once, their
// Synchronize() fails with DEADLINE_EXCEEDED within the timeout plus a margin, naming the group,
// the rank and the operation, and the next call returns the same broken status.
constexpr absl::Duration kHangTimeout = absl::Seconds(4);

int RunPeerNeverJoins(const std::string& dir, int rank, int world) {
  auto store_or = FileKvStore::Create(dir);
  SY_CHILD_OK(store_or.status());
  std::shared_ptr<KvStore> store = std::move(store_or).value();
  NcclOptions options;
  options.timeout = kHangTimeout;
  auto comm_or = NcclCommunicator::Create(store, rank, world, rank, nullptr, options, "world");
  SY_CHILD_OK(comm_or.status());
  NcclCommunicator& comm = **comm_or;
  SY_CHILD_CHECK(!comm.blocking());
  DeviceVec<int32_t> v;
  CHILD_CUDA(v.Upload(std::vector<int32_t>(4096, 1), rank));
  SY_CHILD_OK(comm.AllReduce(v.tensor(), v.tensor(), ReduceOp::kSum));
  SY_CHILD_OK(comm.Synchronize());
  SY_CHILD_OK(comm.Barrier());
  SY_CHILD_OK(comm.Synchronize());
  if (rank == world - 1) {
    // Outlive the others' timeout without taking part, then leave without tearing NCCL down.
    absl::SleepFor(kHangTimeout + absl::Seconds(10));
    std::fflush(nullptr);
    _exit(0);
  }
  const absl::Time start = absl::Now();
  SY_CHILD_OK(comm.AllReduce(v.tensor(), v.tensor(), ReduceOp::kSum));
  const absl::Duration call = absl::Now() - start;
  const absl::Status s = comm.Synchronize();
  const absl::Duration took = absl::Now() - start;
  std::fprintf(stderr, "rank %d: call %s; Synchronize after %s: %s\n", rank,
               absl::FormatDuration(call).c_str(), absl::FormatDuration(took).c_str(),
               s.ToString().c_str());
  SY_CHILD_CHECK(call < absl::Milliseconds(100));
  SY_CHILD_CHECK(s.code() == absl::StatusCode::kDeadlineExceeded);
  SY_CHILD_CHECK(absl::StrContains(s.message(), "group 'world' rank"));
  SY_CHILD_CHECK(absl::StrContains(s.message(), "AllReduce"));
  SY_CHILD_CHECK(absl::StrContains(s.message(), "did not take part within the timeout"));
  SY_CHILD_CHECK(took >= kHangTimeout - absl::Milliseconds(100));
  SY_CHILD_CHECK(took < kHangTimeout + absl::Seconds(3));
  const absl::Status again = comm.Barrier();
  SY_CHILD_CHECK(again.code() == absl::StatusCode::kDeadlineExceeded);
  SY_CHILD_CHECK(absl::StrContains(again.message(), "AllReduce"));
  const absl::Status sync_again = comm.Synchronize();
  SY_CHILD_CHECK(sync_again.code() == absl::StatusCode::kDeadlineExceeded);
  return 0;
}

// GPU count from a probe child, so the parent itself never initialises CUDA (fork after CUDA
// init is unsupported in the child).
int ProbeGpuCount(std::string* why) {
  std::vector<int> codes = comm::testing::RunProcesses(1, absl::Seconds(60), [](int) {
    std::string reason;
    const int n = ::switchyard::testing::CudaDeviceCount(&reason);
    if (n == 0) std::fprintf(stderr, "probe: %s\n", reason.c_str());
    return std::min(n, 100);
  });
  *why = codes[0] > 100 ? absl::StrCat("probe child ended with ", codes[0]) : "";
  return codes[0] > 100 ? 0 : codes[0];
}

// Visible GPUs, at most 8; `why` explains a probe failure.
int WorldSize(std::string* why) { return std::min(ProbeGpuCount(why), 8); }

#define REQUIRE_TWO_GPUS(world, why)                                        \
  do {                                                                      \
    if ((world) < 2)                                                        \
      GTEST_SKIP() << "needs >= 2 CUDA devices, found " << (world) << (why) \
                   << ": NCCL GPU test skipped";                            \
  } while (0)

TEST(NcclCommunicatorGpuTest, EveryCollectiveExact) {
  std::string why;
  const int world = WorldSize(&why);
  REQUIRE_TWO_GPUS(world, why);
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // NVLink SHARP is off on the GPU hosts
  const std::string dir = comm::testing::UniqueStoreDir("collectives");
  const std::vector<int> codes = comm::testing::RunProcesses(
      world, absl::Seconds(300), [&](int rank) { return RunCollectives(dir, rank, world, false); });
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  std::printf("nccl communicator: %d ranks, every collective exact, sub-groups, abort OK\n", world);
}

// The same checks in the blocking mode (the pre-watchdog behaviour, NcclOptions::blocking).
TEST(NcclCommunicatorGpuTest, EveryCollectiveExactBlocking) {
  std::string why;
  const int world = WorldSize(&why);
  REQUIRE_TWO_GPUS(world, why);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  const std::string dir = comm::testing::UniqueStoreDir("collectives_blocking");
  const std::vector<int> codes = comm::testing::RunProcesses(
      world, absl::Seconds(300), [&](int rank) { return RunCollectives(dir, rank, world, true); });
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(NcclCommunicatorGpuTest, NonBlockingCallReturnsBeforeADelayedPeerJoins) {
  std::string why;
  const int world = WorldSize(&why);
  REQUIRE_TWO_GPUS(world, why);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  const std::string dir = comm::testing::UniqueStoreDir("delayed");
  const std::vector<int> codes =
      comm::testing::RunProcesses(world, absl::Seconds(120), [&](int rank) {
        return RunDelayedPeer(dir, rank, world, /*blocking_option=*/false, nullptr, false);
      });
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(NcclCommunicatorGpuTest, BlockingOptionWaitsForADelayedPeer) {
  std::string why;
  const int world = WorldSize(&why);
  REQUIRE_TWO_GPUS(world, why);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  const std::string dir = comm::testing::UniqueStoreDir("delayed_blocking");
  const std::vector<int> codes =
      comm::testing::RunProcesses(world, absl::Seconds(120), [&](int rank) {
        return RunDelayedPeer(dir, rank, world, /*blocking_option=*/true, nullptr, true);
      });
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(NcclCommunicatorGpuTest, BlockingEnvironmentOverrideWaitsForADelayedPeer) {
  std::string why;
  const int world = WorldSize(&why);
  REQUIRE_TWO_GPUS(world, why);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  const std::string dir = comm::testing::UniqueStoreDir("delayed_env");
  const std::vector<int> codes =
      comm::testing::RunProcesses(world, absl::Seconds(120), [&](int rank) {
        return RunDelayedPeer(dir, rank, world, /*blocking_option=*/false, "1", true);
      });
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(NcclCommunicatorGpuTest, PeerThatNeverJoinsFailsSynchronizeWithinTimeout) {
  std::string why;
  const int world = WorldSize(&why);
  REQUIRE_TWO_GPUS(world, why);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  const std::string dir = comm::testing::UniqueStoreDir("never_joins");
  const std::vector<int> codes = comm::testing::RunProcesses(
      world, absl::Seconds(120), [&](int rank) { return RunPeerNeverJoins(dir, rank, world); });
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(NcclCommunicatorGpuTest, KilledPeerFailsWithinTimeout) {
  std::string why;
  const int world = WorldSize(&why);
  REQUIRE_TWO_GPUS(world, why);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  const std::string dir = comm::testing::UniqueStoreDir("killed");
  const std::vector<int> codes = comm::testing::RunProcesses(
      world, absl::Seconds(120), [&](int rank) { return RunKilledPeer(dir, rank, world); });
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace switchyard::comm
