// File: worker/model/ep_dispatcher_gpu_test.cc
//
// The CUDA paths of AllToAllDispatcher and AllGatherDispatcher on real GPUs: one forked process
// per GPU (W = 2, and W = 4 when at least 4 GPUs are visible), each with an NcclCommunicator
// created on the SAME non-blocking stream that the phases run on (the dispatchers' stream
// contract), rendezvous through a FileKvStore in TEST_TMPDIR. Skips with fewer than 2 GPUs.
//
// The parent never touches CUDA (a process that forks after CUDA is initialised cannot use CUDA in
// the child), so instead of SY_REQUIRE_GPU() in the parent, the GPU count comes from a probe
// child (as in worker/comm/nccl_communicator_gpu_test.cc) and the test skips (GTEST_SKIP) below 2.
//
// Every child generates the WHOLE global batch from one seed (drawn by the parent from
// std::random_device and printed), runs two micro-batches (seed, seed + 1) through the same
// dispatcher, and checks, for f32 and bf16 activations:
//   identity experts (expert_out = expert_x, d_expert_x = d_expert_out, d_prob = prob), k = 2 or 3:
//     the round trip returns the input exactly: out[t] = kept(t) * x[t] and dx[t] = kept(t) *
//     dout[t] bit for bit (sums of at most 3 equal values, exact in fp32 and for bf16 inputs),
//     d_topk_probs[t, s] = probs[t, s] for kept slots and 0 for dropped ones;
//   prob-applying experts (ep_fork.h's): out, dx within DESIGN.md's tolerance (f32 1e-5, bf16
//     1e-2) of the CPU LocalDispatcher on this rank's tokens (fp64 slot sums on the CPU vs fp32 on
//     CUDA), d_topk_probs too;
//   both: the expert side (tokens_per_expert, expert_x, expert_probs, d_expert_out rows) equals
//     LocalDispatcher's on the rank-ordered concatenated global batch bit for bit (pure data
//     movement), uneven loads, a dead expert that receives no token from any rank.
// Outputs (out, dx, d_topk_probs) are poisoned with 0xFF bytes (NaN) before each run; the expert
// rows past sum(tokens_per_expert) are NaN when handed back, so reading them would show.
// Children report through their exit code and print the failing check and their evidence.
#include <cuda_runtime.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"
#include "worker/comm/kv_store.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/testing/forked_ranks.h"
#include "worker/model/allgather_dispatcher.h"
#include "worker/model/alltoall_dispatcher.h"
#include "worker/model/dispatcher.h"
#include "worker/model/testing/ep_fork.h"

namespace switchyard::model {
namespace {

using ep_test::Batch;
using ep_test::Config;
using ep_test::Result;
using kernels::Buffer;

#define CHILD_CUDA(expr)                                                                     \
  do {                                                                                       \
    const cudaError_t e_ = (expr);                                                           \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "rank %d: %s:%d: %s: %s\n", comm::testing::ChildRank(), __FILE__, \
                   __LINE__, #expr, cudaGetErrorString(e_));                                 \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

enum class Kind { kAllToAll, kAllGather };
const char* KindName(Kind k) { return k == Kind::kAllToAll ? "alltoall" : "allgather"; }

// Rounds v to the nearest bf16 when dtype is bf16 (the values the device holds).
float Round(DType dtype, float v) {
  return dtype == DType::kBF16 ? BF16::FromFloat(v).ToFloat() : v;
}

// A device buffer of `shape` holding `host` converted to `dtype` (f32, bf16 or i32 as float
// values). Synchronises the device so the data is there for any stream.
absl::StatusOr<Buffer> Upload(const std::vector<float>& host, DType dtype,
                              std::vector<int64_t> shape, int device) {
  SY_ASSIGN_OR_RETURN(Buffer b, Buffer::ForTensor(dtype, shape, Device::Cuda(device)));
  const Tensor view = b.View();
  std::vector<uint8_t> bytes(view.bytes());
  for (size_t i = 0; i < host.size() && i < static_cast<size_t>(view.numel()); ++i) {
    if (dtype == DType::kBF16) {
      reinterpret_cast<BF16*>(bytes.data())[i] = BF16::FromFloat(host[i]);
    } else if (dtype == DType::kI32) {
      reinterpret_cast<int32_t*>(bytes.data())[i] = static_cast<int32_t>(host[i]);
    } else {
      reinterpret_cast<float*>(bytes.data())[i] = host[i];
    }
  }
  if (!bytes.empty()) {
    SY_RETURN_IF_ERROR(
        kernels::CopyTensor(Tensor(dtype, view.shape, Device::Cpu(), bytes.data()), view));
  }
  if (cudaDeviceSynchronize() != cudaSuccess) return absl::InternalError("cudaDeviceSynchronize");
  return b;
}

absl::StatusOr<Buffer> Poisoned(DType dtype, std::vector<int64_t> shape, int device) {
  SY_ASSIGN_OR_RETURN(Buffer b, Buffer::ForTensor(dtype, shape, Device::Cuda(device)));
  SY_RETURN_IF_ERROR(kernels::FillBytes(b.View(), 0xFF));
  return b;
}

// The first `n` elements of a device tensor (f32, bf16 or i32) as floats. The caller has
// synchronised the stream that wrote it.
absl::StatusOr<std::vector<float>> Download(const Tensor& t, int64_t n) {
  if (n > t.numel()) return absl::InternalError("Download: n > numel");
  std::vector<uint8_t> bytes(n * DTypeSize(t.dtype));
  if (n > 0) {
    SY_RETURN_IF_ERROR(kernels::CopyTensor(Tensor(t.dtype, {n}, t.device, t.data),
                                           Tensor(t.dtype, {n}, Device::Cpu(), bytes.data())));
  }
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) {
    if (t.dtype == DType::kBF16) {
      out[i] = reinterpret_cast<const BF16*>(bytes.data())[i].ToFloat();
    } else if (t.dtype == DType::kI32) {
      out[i] = static_cast<float>(reinterpret_cast<const int32_t*>(bytes.data())[i]);
    } else {
      out[i] = reinterpret_cast<const float*>(bytes.data())[i];
    }
  }
  return out;
}

absl::Status Sync(const Stream& stream) {
  const cudaError_t e = cudaStreamSynchronize(stream.cuda_stream);
  if (e != cudaSuccess) return absl::InternalError(cudaGetErrorString(e));
  return absl::OkStatus();
}

// One forward + backward micro-batch of `b` through the six CUDA phases. Experts run on the host
// (identity, or ep_fork.h's prob-applying ones), their outputs rounded to `dtype`.
absl::Status RunStepCuda(TokenDispatcher& d, const Stream& stream, const Batch& b, const Config& c,
                         DType dtype, bool apply_probs, Result* res) {
  const int dev = stream.device.index;
  const int64_t t = b.t, h = c.hidden, k = c.topk;
  std::vector<float> idx(b.idx.begin(), b.idx.end());
  SY_ASSIGN_OR_RETURN(Buffer x, Upload(b.x, dtype, {t, h}, dev));
  SY_ASSIGN_OR_RETURN(Buffer topk_idx, Upload(idx, DType::kI32, {t, k}, dev));
  SY_ASSIGN_OR_RETURN(Buffer topk_probs, Upload(b.probs, DType::kF32, {t, k}, dev));
  SY_ASSIGN_OR_RETURN(Buffer dout, Upload(b.dout, dtype, {t, h}, dev));
  SY_ASSIGN_OR_RETURN(Buffer out, Poisoned(dtype, {t, h}, dev));
  SY_ASSIGN_OR_RETURN(Buffer dx, Poisoned(dtype, {t, h}, dev));
  SY_ASSIGN_OR_RETURN(Buffer d_topk_probs, Poisoned(DType::kF32, {t, k}, dev));

  DispatchState st;
  st.x = x.View();
  st.topk_idx = topk_idx.View();
  st.topk_probs = topk_probs.View();
  SY_RETURN_IF_ERROR(d.DispatchPreprocess(stream, &st));
  SY_RETURN_IF_ERROR(d.Dispatch(stream, &st));
  SY_RETURN_IF_ERROR(d.DispatchPostprocess(stream, &st));
  SY_RETURN_IF_ERROR(Sync(stream));
  // The alltoall dispatcher's expert side follows the counts: its capacity is known after Dispatch.
  const int64_t cap = st.expert_x.dim(0);
  if (cap != d.ExpertRowCapacity()) return absl::InternalError("expert_x rows != capacity");
  SY_ASSIGN_OR_RETURN(std::vector<float> tpe,
                      Download(st.tokens_per_expert, d.num_local_experts()));
  int64_t rows = 0;
  res->tokens_per_expert.clear();
  for (float n : tpe) {
    res->tokens_per_expert.push_back(static_cast<int32_t>(n));
    rows += static_cast<int64_t>(n);
  }
  if (rows > cap) return absl::InternalError(absl::StrCat(rows, " rows > capacity ", cap));
  SY_ASSIGN_OR_RETURN(res->expert_x, Download(st.expert_x, rows * h));
  SY_ASSIGN_OR_RETURN(res->expert_probs, Download(st.expert_probs, rows));
  const std::vector<float>& ex = res->expert_x;
  const std::vector<float>& ep = res->expert_probs;
  std::vector<float> eo(cap * h, std::nanf(""));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < h; ++j) {
      eo[i * h + j] = Round(dtype, apply_probs ? ex[i * h + j] * ep[i] : ex[i * h + j]);
    }
  }
  SY_ASSIGN_OR_RETURN(Buffer expert_out, Upload(eo, dtype, {cap, h}, dev));
  SY_RETURN_IF_ERROR(kernels::CopyTensor(expert_out.View(), st.expert_out));
  if (cudaDeviceSynchronize() != cudaSuccess) return absl::InternalError("sync expert_out");

  SY_RETURN_IF_ERROR(d.CombinePreprocess(stream, &st));
  SY_RETURN_IF_ERROR(d.Combine(stream, &st));
  SY_RETURN_IF_ERROR(d.CombinePostprocess(stream, &st, out.View()));

  SY_RETURN_IF_ERROR(d.CombineBackward(stream, dout.View(), &st));
  SY_RETURN_IF_ERROR(Sync(stream));
  SY_ASSIGN_OR_RETURN(res->d_expert_out, Download(st.d_expert_out, rows * h));
  const std::vector<float>& dy = res->d_expert_out;
  std::vector<float> dex(cap * h, std::nanf("")), dep(cap, std::nanf(""));
  for (int64_t i = 0; i < rows; ++i) {
    double dot = 0;
    for (int64_t j = 0; j < h; ++j) {
      dex[i * h + j] = Round(dtype, apply_probs ? dy[i * h + j] * ep[i] : dy[i * h + j]);
      dot += static_cast<double>(dy[i * h + j]) * ex[i * h + j];
    }
    dep[i] = apply_probs ? static_cast<float>(dot) : ep[i];
  }
  SY_ASSIGN_OR_RETURN(Buffer d_expert_x, Upload(dex, dtype, {cap, h}, dev));
  SY_ASSIGN_OR_RETURN(Buffer d_expert_probs, Upload(dep, DType::kF32, {cap}, dev));
  SY_RETURN_IF_ERROR(kernels::CopyTensor(d_expert_x.View(), st.d_expert_x));
  SY_RETURN_IF_ERROR(kernels::CopyTensor(d_expert_probs.View(), st.d_expert_probs));
  if (cudaDeviceSynchronize() != cudaSuccess) return absl::InternalError("sync d_expert");
  SY_RETURN_IF_ERROR(d.DispatchBackward(stream, &st, dx.View(), d_topk_probs.View()));
  SY_RETURN_IF_ERROR(Sync(stream));
  SY_ASSIGN_OR_RETURN(res->out, Download(out.View(), t * h));
  SY_ASSIGN_OR_RETURN(res->dx, Download(dx.View(), t * h));
  SY_ASSIGN_OR_RETURN(res->d_topk_probs, Download(d_topk_probs.View(), t * k));
  return absl::OkStatus();
}

// The batch with x and dout rounded to `dtype` (what the device holds).
std::vector<Batch> Rounded(std::vector<Batch> all, DType dtype) {
  for (Batch& b : all) {
    for (float& v : b.x) v = Round(dtype, v);
    for (float& v : b.dout) v = Round(dtype, v);
  }
  return all;
}

// Exact equality of two float vectors; prints the first mismatch.
int ExpectSame(const char* what, const std::vector<float>& got, const std::vector<float>& want) {
  SY_CHILD_CHECK(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(got[i] == want[i])) {
      std::fprintf(stderr, "rank %d: %s: element %zu of %zu: got %.9g, want %.9g\n",
                   comm::testing::ChildRank(), what, i, got.size(), got[i], want[i]);
      return 1;
    }
  }
  return 0;
}

int ExpectClose(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                double tol, const std::string& tag) {
  SY_CHILD_CHECK(got.size() == want.size());
  const double err = got.empty() ? 0.0 : testing::RelativeError(got, want);
  std::fprintf(stderr, "rank %d: %s %s: %zu elements, rel err %.3g (tol %.0e)\n",
               comm::testing::ChildRank(), tag.c_str(), what, got.size(), err, tol);
  SY_CHILD_CHECK(err < tol);  // NaN (a poisoned element) fails too
  return 0;
}

// The identity-expert round trip of this rank's tokens: exact (see the file comment).
int CheckIdentity(const Config& c, DType dtype, const Batch& mine, const Result& got) {
  std::vector<float> want_out(mine.t * c.hidden), want_dx(mine.t * c.hidden),
      want_dp(mine.t * c.topk);
  for (int64_t t = 0; t < mine.t; ++t) {
    int kept = 0;
    for (int s = 0; s < c.topk; ++s) {
      const bool keep = mine.idx[t * c.topk + s] >= 0;
      kept += keep;
      want_dp[t * c.topk + s] = keep ? mine.probs[t * c.topk + s] : 0.0f;
    }
    for (int64_t h = 0; h < c.hidden; ++h) {
      // kept * v is rounded once (f32), then to the activation dtype, as the device's sums are.
      want_out[t * c.hidden + h] =
          Round(dtype, static_cast<float>(kept) * mine.x[t * c.hidden + h]);
      want_dx[t * c.hidden + h] =
          Round(dtype, static_cast<float>(kept) * mine.dout[t * c.hidden + h]);
    }
  }
  if (ExpectSame("round trip out == kept * x", got.out, want_out) != 0) return 1;
  if (ExpectSame("round trip dx == kept * dout", got.dx, want_dx) != 0) return 1;
  if (ExpectSame("d_topk_probs == probs (kept slots)", got.d_topk_probs, want_dp) != 0) return 1;
  return 0;
}

struct Case {
  Kind kind = Kind::kAllToAll;
  Config c;
};

std::unique_ptr<TokenDispatcher> MakeDispatcher(const Case& k, comm::NcclCommunicator* comm,
                                                int device, DType dtype, absl::Status* status) {
  int64_t max_tokens = 1;
  for (int64_t t : k.c.tokens) max_tokens = std::max(max_tokens, t);
  if (k.kind == Kind::kAllToAll) {
    auto d = AllToAllDispatcher::Create(comm, Device::Cuda(device), dtype, DType::kF32, max_tokens,
                                        k.c.hidden, k.c.num_experts, k.c.world, k.c.topk);
    *status = d.status();
    return d.ok() ? std::move(*d) : nullptr;
  }
  auto d = AllGatherDispatcher::Create(comm, Device::Cuda(device), dtype, DType::kF32, max_tokens,
                                       k.c.hidden, k.c.num_experts, k.c.world, k.c.topk);
  *status = d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

int Child(const Case& k, uint32_t seed, const std::string& dir, int rank) {
  const Config& c = k.c;
  CHILD_CUDA(cudaSetDevice(rank));
  cudaStream_t cs = nullptr;
  CHILD_CUDA(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  const Stream stream{Device::Cuda(rank), cs};
  {
    std::shared_ptr<comm::KvStore> store = comm::testing::OpenFileStore(dir);
    SY_CHILD_CHECK(store != nullptr);
    comm::NcclOptions options;
    options.timeout = absl::Seconds(60);
    auto comm_or = comm::NcclCommunicator::Create(store, rank, c.world, rank, cs, options, "ep");
    SY_CHILD_OK(comm_or.status());
    comm::NcclCommunicator* comm = comm_or->get();
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      absl::Status status;
      std::unique_ptr<TokenDispatcher> d = MakeDispatcher(k, comm, rank, dtype, &status);
      SY_CHILD_OK(status);
      // A stream other than the communicator's is refused (the ordering contract).
      DispatchState bad;
      SY_CHILD_CHECK(d->DispatchPreprocess(Stream{Device::Cuda(rank), nullptr}, &bad).code() ==
                     absl::StatusCode::kInvalidArgument);
      for (bool apply_probs : {false, true}) {
        for (int step = 0; step < 2; ++step) {
          const std::vector<Batch> all =
              Rounded(ep_test::MakeGlobal(c, seed + static_cast<uint32_t>(step)), dtype);
          const std::string tag =
              absl::StrCat(KindName(k.kind), " W=", c.world, " ", DTypeName(dtype),
                           apply_probs ? " prob-experts" : " identity-experts", " step ", step);
          Result got;
          SY_CHILD_OK(RunStepCuda(*d, stream, all[rank], c, dtype, apply_probs, &got));
          // Against LocalDispatcher on the global batch (f32 copies of the device values: the
          // expert-side rows are pure data movement, so bit-exact).
          if (ep_test::CheckExpertSide(c, all, rank, got) != 0) {
            std::fprintf(stderr, "rank %d: %s: expert side differs from LocalDispatcher\n", rank,
                         tag.c_str());
            return 1;
          }
          if (!apply_probs) {
            if (CheckIdentity(c, dtype, all[rank], got) != 0) {
              std::fprintf(stderr, "rank %d: %s: round trip not exact\n", rank, tag.c_str());
              return 1;
            }
          } else {
            absl::StatusOr<Result> ref = ep_test::RunLocal(all[rank], c);
            SY_CHILD_OK(ref.status());
            const double tol = dtype == DType::kBF16 ? 1e-2 : 1e-5;
            if (ExpectClose("out", got.out, ref->out, tol, tag) != 0) return 1;
            if (ExpectClose("dx", got.dx, ref->dx, tol, tag) != 0) return 1;
            if (ExpectClose("d_topk_probs", got.d_topk_probs, ref->d_topk_probs, tol, tag) != 0) {
              return 1;
            }
          }
          int64_t rows = 0;
          for (int32_t n : got.tokens_per_expert) rows += n;
          std::fprintf(stderr, "rank %d: %s: T=%ld H=%ld expert rows %ld: OK\n", rank, tag.c_str(),
                       static_cast<long>(all[rank].t), static_cast<long>(c.hidden),
                       static_cast<long>(rows));
        }
      }
    }
  }  // the dispatchers, then the communicator, go before the stream
  CHILD_CUDA(cudaStreamDestroy(cs));
  return 0;
}

// GPU count from a probe child, so the parent itself never initialises CUDA.
int ProbeGpuCount(std::string* why) {
  std::vector<int> codes = comm::testing::RunProcesses(1, absl::Seconds(60), [](int) {
    std::string reason;
    const int n = ::switchyard::testing::CudaDeviceCount(&reason);
    if (n == 0) std::fprintf(stderr, "probe: %s\n", reason.c_str());
    return std::min(n, 100);
  });
  *why = codes[0] > 100 ? absl::StrCat(" (probe child ended with ", codes[0], ")") : "";
  return codes[0] > 100 ? 0 : codes[0];
}

void RunRanks(Kind kind, const Config& c, const std::string& name) {
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // NVLink SHARP is off on the GPU hosts
  Case k;
  k.kind = kind;
  k.c = c;
  const uint32_t seed = std::random_device{}();
  ep_test::PrintConfig(name, c, seed);
  const std::string dir = comm::testing::UniqueStoreDir(name);
  const std::vector<int> codes = comm::testing::RunProcesses(
      c.world, absl::Seconds(240), [&](int rank) { return Child(k, seed, dir, rank); });
  for (int r = 0; r < c.world; ++r)
    EXPECT_EQ(codes[r], 0) << name << " rank " << r << " seed " << seed;
}

Config TwoRanks() {
  Config c;
  c.world = 2;
  c.num_experts = 4;
  c.topk = 2;
  c.hidden = 40;         // 16-byte rows in f32 and bf16: the vector copy paths
  c.tokens = {37, 300};  // uneven loads
  c.dead_expert = 3;     // rank 1's local expert 1 receives nothing
  return c;
}

Config FourRanks(Kind kind) {
  Config c;
  c.world = 4;
  c.num_experts = 8;
  c.topk = 3;
  c.hidden = 7;  // odd rows: the scalar copy paths
  // Rank 1 has one token (alltoall: it reaches at most 3 ranks, zero splits); the allgather
  // dispatcher also takes a rank with no token (AllGatherV with a zero count).
  c.tokens = kind == Kind::kAllToAll ? std::vector<int64_t>{9, 1, 160, 4}
                                     : std::vector<int64_t>{9, 0, 160, 4};
  c.dead_expert = 2;
  return c;
}

#define REQUIRE_GPUS(n)                                                        \
  std::string why;                                                             \
  const int gpus = ProbeGpuCount(&why);                                        \
  if (gpus < (n))                                                              \
  GTEST_SKIP() << "needs >= " << (n) << " CUDA devices, found " << gpus << why \
               << ": EP dispatcher GPU test skipped"

TEST(EpDispatcherGpuTest, AllToAllTwoRanks) {
  REQUIRE_GPUS(2);
  RunRanks(Kind::kAllToAll, TwoRanks(), "alltoall_w2");
}

TEST(EpDispatcherGpuTest, AllGatherTwoRanks) {
  REQUIRE_GPUS(2);
  RunRanks(Kind::kAllGather, TwoRanks(), "allgather_w2");
}

TEST(EpDispatcherGpuTest, AllToAllFourRanks) {
  REQUIRE_GPUS(4);
  RunRanks(Kind::kAllToAll, FourRanks(Kind::kAllToAll), "alltoall_w4");
}

TEST(EpDispatcherGpuTest, AllGatherFourRanks) {
  REQUIRE_GPUS(4);
  RunRanks(Kind::kAllGather, FourRanks(Kind::kAllGather), "allgather_w4");
}

// Never hang on NCCL (issue 15, item 5): rank 1 of 2 stops (SIGSTOP) or dies (SIGKILL) after
// DispatchPreprocess, so rank 0 is alone inside Dispatch's collectives. Rank 0's Dispatch must
// fail within the NCCL timeout (5 s) plus slack with DEADLINE_EXCEEDED or UNAVAILABLE (NCCL may
// notice a dead peer itself) prefixed "MoE layer 7 dispatch (forward): group 'ep' rank 0/2";
// NCCL cannot say which peer is missing (the PeerMonitor names it in a worker), but in a group of
// two the group names it. The NcclCommunicator aborts itself on the failure, so the process ends
// normally. Rank 0 then kills the stopped victim.
enum class Death { kKilled, kStopped };

int StallChild(Death death, const std::string& dir, int rank) {
  Config c = TwoRanks();
  CHILD_CUDA(cudaSetDevice(rank));
  cudaStream_t cs = nullptr;
  CHILD_CUDA(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  const Stream stream{Device::Cuda(rank), cs};
  const absl::Duration timeout = absl::Seconds(5);
  {
    std::shared_ptr<comm::KvStore> store = comm::testing::OpenFileStore(dir);
    SY_CHILD_CHECK(store != nullptr);
    comm::NcclOptions options;
    options.timeout = timeout;
    auto comm_or = comm::NcclCommunicator::Create(store, rank, c.world, rank, cs, options, "ep");
    SY_CHILD_OK(comm_or.status());
    int64_t max_tokens = 1;
    for (int64_t t : c.tokens) max_tokens = std::max(max_tokens, t);
    auto d = AllToAllDispatcher::Create(comm_or->get(), Device::Cuda(rank), DType::kF32,
                                        DType::kF32, max_tokens, c.hidden, c.num_experts, c.world,
                                        c.topk, nullptr, "MoE layer 7");
    SY_CHILD_OK(d.status());
    const std::vector<Batch> all = ep_test::MakeGlobal(c, 99);
    const Batch& b = all[rank];
    std::vector<float> idx(b.idx.begin(), b.idx.end());
    auto x = Upload(b.x, DType::kF32, {b.t, c.hidden}, rank);
    auto topk_idx = Upload(idx, DType::kI32, {b.t, c.topk}, rank);
    auto topk_probs = Upload(b.probs, DType::kF32, {b.t, c.topk}, rank);
    SY_CHILD_OK(x.status());
    SY_CHILD_OK(topk_idx.status());
    SY_CHILD_OK(topk_probs.status());
    DispatchState st;
    st.x = x->View();
    st.topk_idx = topk_idx->View();
    st.topk_probs = topk_probs->View();
    SY_CHILD_OK((*d)->DispatchPreprocess(stream, &st));
    if (rank == 1) {
      SY_CHILD_OK(store->Set("victim_pid", absl::StrCat(getpid())));
      SY_CHILD_OK(store->Set("died_at", absl::StrCat(absl::ToUnixNanos(absl::Now()))));
      std::fflush(nullptr);
      raise(death == Death::kKilled ? SIGKILL : SIGSTOP);
      _exit(3);
    }
    const absl::Status s = (*d)->Dispatch(stream, &st);
    absl::StatusOr<std::string> died = store->Get("died_at", absl::Seconds(5));
    SY_CHILD_OK(died.status());
    int64_t died_ns = 0;
    SY_CHILD_CHECK(absl::SimpleAtoi(*died, &died_ns));
    const double since = absl::ToDoubleSeconds(absl::Now() - absl::FromUnixNanos(died_ns));
    std::fprintf(stderr, "rank 0: Dispatch failed %.2f s after rank 1's %s (timeout %.0f s): %s\n",
                 since, death == Death::kKilled ? "SIGKILL" : "SIGSTOP",
                 absl::ToDoubleSeconds(timeout), s.ToString().c_str());
    absl::StatusOr<std::string> pid = store->Get("victim_pid", absl::Seconds(5));
    int64_t p = 0;
    if (pid.ok() && absl::SimpleAtoi(*pid, &p) && p > 0) kill(static_cast<pid_t>(p), SIGKILL);
    SY_CHILD_CHECK(s.code() == absl::StatusCode::kDeadlineExceeded ||
                   s.code() == absl::StatusCode::kUnavailable);
    SY_CHILD_CHECK(absl::StartsWith(s.message(), "MoE layer 7 dispatch (forward): group 'ep'"));
    SY_CHILD_CHECK(since < absl::ToDoubleSeconds(timeout) + 10);
  }
  CHILD_CUDA(cudaStreamDestroy(cs));
  return 0;
}

void RunStall(Death death) {
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  const std::string dir = comm::testing::UniqueStoreDir("a2a_nccl_stall");
  const std::vector<int> codes = comm::testing::RunProcesses(
      2, absl::Seconds(120), [&](int rank) { return StallChild(death, dir, rank); });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 128 + SIGKILL);
}

TEST(EpDispatcherGpuTest, AllToAllPeerStoppedInDispatchFailsWithinTheTimeout) {
  REQUIRE_GPUS(2);
  RunStall(Death::kStopped);
}

TEST(EpDispatcherGpuTest, AllToAllPeerKilledInDispatchFailsWithinTheTimeout) {
  REQUIRE_GPUS(2);
  RunStall(Death::kKilled);
}

}  // namespace
}  // namespace switchyard::model
