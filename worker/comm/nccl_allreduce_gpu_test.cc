// NCCL all-reduce across every visible GPU, one process per GPU, as the workers will run.
//
// The parent test (AllReduceOnEveryGpu) creates an ncclUniqueId and re-executes this binary once
// per GPU with --gtest_filter selecting the child test (DISABLED_ChildRank, so an ordinary run
// never executes it). Rank, world size, the unique id (hex) and a result-file path travel in
// environment variables; NCCL_NVLS_ENABLE=0 is forced (NVLink SHARP is off on the GPU hosts).
//
// Each child sums integers that fp32 represents exactly, so the check is exact equality:
//   fp32 (out of place, output poisoned with NaN): x_r[i] = (r + 1) * (1 + i % 1000)
//        sum = W (W + 1) / 2 * (1 + i % 1000)            (<= 36 * 1000 for W = 8)
//   int32 (in place):                              y_r[i] = (r + 1) * (i % 2001 - 1000)
// A child proves success by writing its result file (exit status 0 alone could be an empty
// gtest filter); the parent waits with a timeout, kills every child when one fails or time runs
// out, and prints the failing children's output.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/runtime/cuda_status.h"
#include "kernels/testing/gpu.h"

extern char** environ;

namespace switchyard::worker::comm {
namespace {

constexpr char kRankEnv[] = "SY_NCCL_TEST_RANK";
constexpr char kWorldEnv[] = "SY_NCCL_TEST_WORLD_SIZE";
constexpr char kIdEnv[] = "SY_NCCL_TEST_UNIQUE_ID";
constexpr char kResultEnv[] = "SY_NCCL_TEST_RESULT_FILE";
constexpr char kChildTest[] = "NcclAllReduceGpuTest.DISABLED_ChildRank";
constexpr size_t kNumElements = size_t{16} << 20;  // 64 MiB of fp32 per rank
constexpr int kTimedIterations = 5;
constexpr std::chrono::seconds kTimeout(120);

// Variables a child must not inherit: gtest/Bazel output and sharding settings that belong to the
// parent run, and the ones set per child below.
constexpr const char* kStrippedEnv[] = {
    "GTEST_OUTPUT",
    "XML_OUTPUT_FILE",
    "GTEST_FILTER",
    "GTEST_ALSO_RUN_DISABLED_TESTS",
    "GTEST_SHARD_INDEX",
    "GTEST_TOTAL_SHARDS",
    "GTEST_REPEAT",
    "TEST_SHARD_STATUS_FILE",
    "TEST_PREMATURE_EXIT_FILE",
    "NCCL_NVLS_ENABLE",
    kRankEnv,
    kWorldEnv,
    kIdEnv,
    kResultEnv,
};

std::string ToHex(const void* data, size_t n) {
  std::string out;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) absl::StrAppendFormat(&out, "%02x", p[i]);
  return out;
}

bool FromHex(const std::string& hex, void* data, size_t n) {
  if (hex.size() != 2 * n) return false;
  auto* p = static_cast<unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    unsigned v = 0;
    if (std::sscanf(hex.c_str() + 2 * i, "%2x", &v) != 1) return false;
    p[i] = static_cast<unsigned char>(v);
  }
  return true;
}

// Device allocation freed on scope exit.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  absl::Status Allocate(size_t n) {
    SY_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T)));
    return absl::OkStatus();
  }
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
};

// Waits for `stream` and surfaces asynchronous NCCL errors (a peer that died mid-collective).
absl::Status Sync(cudaStream_t stream, ncclComm_t comm) {
  SY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  ncclResult_t async_err = ncclSuccess;
  SY_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &async_err));
  SY_NCCL_RETURN_IF_ERROR(async_err);
  return absl::OkStatus();
}

// Compares `got` to `want(i)` exactly; reports the count and the first mismatch.
template <typename T, typename Want>
absl::Status CheckExact(const char* what, const std::vector<T>& got, Want want) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(got[i] == want(i))) {  // NaN poison left in place compares unequal
      if (bad++ == 0) first = i;
    }
  }
  if (bad == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", bad, " of ", got.size(),
                                          " elements wrong; first at [", first, "]: got ",
                                          got[first], ", want ", want(first)));
}

// The child's work: one rank of a `world`-rank communicator on GPU `rank`.
absl::Status RunRank(int rank, int world, const ncclUniqueId& id, std::string* summary) {
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(rank));
  cudaStream_t stream = nullptr;
  SY_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  absl::Cleanup destroy_stream = [stream] { cudaStreamDestroy(stream); };

  ncclComm_t comm = nullptr;
  SY_NCCL_RETURN_IF_ERROR(ncclCommInitRank(&comm, world, id, rank));
  bool comm_ok = false;  // destroy cleanly on success, abort (never blocks) on any error
  absl::Cleanup release_comm = [&comm_ok, comm] {
    if (comm_ok) {
      ncclCommDestroy(comm);
    } else {
      ncclCommAbort(comm);
    }
  };

  const size_t n = kNumElements;
  const double tri = world * (world + 1) / 2.0;

  // fp32, out of place, into a NaN-poisoned output.
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>((rank + 1) * (1 + i % 1000));
  DeviceArray<float> send, recv;
  SY_RETURN_IF_ERROR(send.Allocate(n));
  SY_RETURN_IF_ERROR(recv.Allocate(n));
  SY_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(send.get(), host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  SY_CUDA_RETURN_IF_ERROR(cudaMemset(recv.get(), 0xFF, n * sizeof(float)));
  SY_NCCL_RETURN_IF_ERROR(
      ncclAllReduce(send.get(), recv.get(), n, ncclFloat, ncclSum, comm, stream));
  SY_RETURN_IF_ERROR(Sync(stream, comm));
  std::fill(host.begin(), host.end(), std::nanf(""));
  SY_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(host.data(), recv.get(), n * sizeof(float), cudaMemcpyDeviceToHost));
  SY_RETURN_IF_ERROR(CheckExact("fp32 all-reduce", host, [tri](size_t i) {
    return static_cast<float>(tri * (1 + i % 1000));
  }));
  std::vector<float>().swap(host);

  // int32, in place (negative values too).
  std::vector<int32_t> ints(n);
  for (size_t i = 0; i < n; ++i) {
    ints[i] = (rank + 1) * (static_cast<int32_t>(i % 2001) - 1000);
  }
  DeviceArray<int32_t> dints;
  SY_RETURN_IF_ERROR(dints.Allocate(n));
  SY_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(dints.get(), ints.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice));
  SY_NCCL_RETURN_IF_ERROR(
      ncclAllReduce(dints.get(), dints.get(), n, ncclInt32, ncclSum, comm, stream));
  SY_RETURN_IF_ERROR(Sync(stream, comm));
  std::fill(ints.begin(), ints.end(), INT32_MIN);
  SY_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(ints.data(), dints.get(), n * sizeof(int32_t), cudaMemcpyDeviceToHost));
  const int32_t itri = world * (world + 1) / 2;
  SY_RETURN_IF_ERROR(CheckExact("int32 all-reduce", ints, [itri](size_t i) {
    return itri * (static_cast<int32_t>(i % 2001) - 1000);
  }));

  // Evidence only (not asserted): time a few fp32 all-reduces after the warm-up above.
  cudaEvent_t start = nullptr, stop = nullptr;
  SY_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  absl::Cleanup destroy_start = [start] { cudaEventDestroy(start); };
  SY_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  absl::Cleanup destroy_stop = [stop] { cudaEventDestroy(stop); };
  SY_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
  for (int it = 0; it < kTimedIterations; ++it) {
    SY_NCCL_RETURN_IF_ERROR(
        ncclAllReduce(send.get(), recv.get(), n, ncclFloat, ncclSum, comm, stream));
  }
  SY_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
  SY_RETURN_IF_ERROR(Sync(stream, comm));
  float ms = 0;
  SY_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
  const double sec = ms / 1e3 / kTimedIterations;
  const double bytes = static_cast<double>(n) * sizeof(float);
  *summary = absl::StrFormat(
      "rank %d/%d on GPU %d: fp32 and int32 exact; %.0f MiB fp32 all-reduce %.3f ms, algbw %.1f "
      "GB/s, busbw %.1f GB/s",
      rank, world, rank, bytes / (1 << 20), sec * 1e3, bytes / sec / 1e9,
      bytes / sec / 1e9 * 2.0 * (world - 1) / world);
  comm_ok = true;
  return absl::OkStatus();
}

std::string ReadFile(const std::string& path, size_t max_tail = 0) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (max_tail > 0 && s.size() > max_tail) s = "..." + s.substr(s.size() - max_tail);
  return s;
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("signal ", WTERMSIG(status));
  return absl::StrCat("wait status ", status);
}

struct Child {
  pid_t pid = -1;
  int status = 0;
  bool done = false;
  std::string log_path;
  std::string result_path;
};

// Starts one child per rank; returns an error message (empty on success).
std::string SpawnChildren(int world, const std::string& id_hex, const std::string& dir,
                          std::vector<Child>* children) {
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len <= 0) return absl::StrCat("readlink(/proc/self/exe): ", std::strerror(errno));
  exe[len] = '\0';

  std::vector<std::string> base_env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    bool strip = false;
    for (const char* s : kStrippedEnv) strip = strip || key == s;
    if (!strip) base_env.push_back(kv);
  }
  const std::string filter = absl::StrCat("--gtest_filter=", kChildTest);
  for (int rank = 0; rank < world; ++rank) {
    Child& c = (*children)[rank];
    c.log_path = absl::StrCat(dir, "/rank", rank, ".log");
    c.result_path = absl::StrCat(dir, "/rank", rank, ".ok");
    std::vector<std::string> env = base_env;
    env.push_back(absl::StrCat(kRankEnv, "=", rank));
    env.push_back(absl::StrCat(kWorldEnv, "=", world));
    env.push_back(absl::StrCat(kIdEnv, "=", id_hex));
    env.push_back(absl::StrCat(kResultEnv, "=", c.result_path));
    env.push_back("NCCL_NVLS_ENABLE=0");
    std::vector<char*> envp;
    for (std::string& kv : env) envp.push_back(kv.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = {exe, filter, "--gtest_also_run_disabled_tests"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, c.log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    const int err = posix_spawn(&c.pid, exe, &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (err != 0) {
      c.pid = -1;
      return absl::StrCat("posix_spawn rank ", rank, ": ", std::strerror(err));
    }
  }
  return "";
}

// Reaps every started child. Kills the rest when one fails (they would block in NCCL waiting for
// it) or when `timeout` expires; returns why it killed, or "" when all ended on their own.
std::string WaitForChildren(std::vector<Child>* children, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string killed_because;
  auto kill_all = [&](const std::string& why) {
    killed_because = why;
    for (Child& c : *children) {
      if (c.pid > 0 && !c.done) kill(c.pid, SIGKILL);
    }
  };
  for (;;) {
    bool all_done = true;
    for (size_t r = 0; r < children->size(); ++r) {
      Child& c = (*children)[r];
      if (c.pid <= 0 || c.done) continue;
      const pid_t p = waitpid(c.pid, &c.status, WNOHANG);
      if (p == c.pid || (p < 0 && errno == ECHILD)) {
        if (p < 0) c.status = W_EXITCODE(255, 0);  // reaped elsewhere: count as a failure
        c.done = true;
        const bool ok = WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0;
        if (!ok && killed_because.empty()) {
          kill_all(absl::StrCat("rank ", r, " ended with ", DescribeWaitStatus(c.status)));
        }
      } else {
        all_done = false;
      }
    }
    if (all_done) return killed_because;
    if (killed_because.empty() && std::chrono::steady_clock::now() > deadline) {
      kill_all(absl::StrCat("timeout after ", timeout.count(), " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

TEST(NcclAllReduceGpuTest, AllReduceOnEveryGpu) {
  SY_REQUIRE_GPU();
  const int world = testing::CudaDeviceCount();
  int nccl_version = 0;
  ASSERT_EQ(ncclGetVersion(&nccl_version), ncclSuccess);
  ncclUniqueId id;
  const ncclResult_t id_err = ncclGetUniqueId(&id);  // also starts the bootstrap root here
  ASSERT_EQ(id_err, ncclSuccess) << ncclGetErrorString(id_err);

  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/sy_nccl_XXXXXX");
  ASSERT_NE(mkdtemp(dir.data()), nullptr) << "mkdtemp " << dir << ": " << std::strerror(errno);

  std::vector<Child> children(world);
  const std::string spawn_err = SpawnChildren(world, ToHex(&id, sizeof(id)), dir, &children);
  if (!spawn_err.empty()) {
    for (Child& c : children) {
      if (c.pid > 0) kill(c.pid, SIGKILL);
    }
  }
  const std::string killed = WaitForChildren(&children, kTimeout);
  ASSERT_TRUE(spawn_err.empty()) << spawn_err;

  int failures = 0;
  for (int r = 0; r < world; ++r) {
    const Child& c = children[r];
    const bool exited_ok = WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0;
    const bool reported = access(c.result_path.c_str(), F_OK) == 0;
    if (exited_ok && reported) {
      std::printf("%s\n", ReadFile(c.result_path).c_str());
      continue;
    }
    ++failures;
    ADD_FAILURE() << "rank " << r << ": " << DescribeWaitStatus(c.status)
                  << (reported ? "" : ", no result file") << "; its output:\n"
                  << ReadFile(c.log_path, 6000);
  }
  ASSERT_EQ(failures, 0) << (killed.empty() ? "" : "children killed: " + killed);
  std::printf("nccl all-reduce: %d ranks, %zu floats, exact sum OK, NCCL %d.%d.%d\n", world,
              kNumElements, nccl_version / 10000, nccl_version % 10000 / 100, nccl_version % 100);
}

// Child mode: runs only when re-executed by AllReduceOnEveryGpu (which also passes
// --gtest_also_run_disabled_tests); a failure exits 1 through gtest with the message in the log.
TEST(NcclAllReduceGpuTest, DISABLED_ChildRank) {
  const char* rank_s = std::getenv(kRankEnv);
  const char* world_s = std::getenv(kWorldEnv);
  const char* id_s = std::getenv(kIdEnv);
  const char* result_s = std::getenv(kResultEnv);
  if (rank_s == nullptr || world_s == nullptr || id_s == nullptr || result_s == nullptr) {
    GTEST_SKIP() << "child mode only: started by NcclAllReduceGpuTest.AllReduceOnEveryGpu";
  }
  int rank = -1, world = 0;
  ASSERT_TRUE(absl::SimpleAtoi(rank_s, &rank) && absl::SimpleAtoi(world_s, &world) && world > 0 &&
              rank >= 0 && rank < world)
      << kRankEnv << "=" << rank_s << " " << kWorldEnv << "=" << world_s;
  ncclUniqueId id;
  ASSERT_TRUE(FromHex(id_s, &id, sizeof(id))) << kIdEnv << " is not " << 2 * sizeof(id) << " hex";

  std::string summary;
  const absl::Status st = RunRank(rank, world, id, &summary);
  ASSERT_TRUE(st.ok()) << "rank " << rank << ": " << st;
  std::ofstream out(result_s);
  out << summary;
  out.close();
  ASSERT_TRUE(out.good()) << "cannot write " << result_s;
}

}  // namespace
}  // namespace switchyard::worker::comm
