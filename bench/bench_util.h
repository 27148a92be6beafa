// File: bench/bench_util.h
//
// Shared helpers of the benchmark binaries: CUDA-event timing, and forking one process per rank.
#ifndef SWITCHYARD_BENCH_BENCH_UTIL_H_
#define SWITCHYARD_BENCH_BENCH_UTIL_H_

#include <cuda_runtime.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "kernels/runtime/cuda_status.h"
#include "kernels/runtime/stream.h"

namespace switchyard::bench {

// Median milliseconds of `iters` calls of `fn` (returns absl::Status; enqueues work on the legacy
// default stream), timed with CUDA events after `warmup` untimed calls.
template <typename Fn>
absl::StatusOr<double> MedianMs(Fn fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) SY_RETURN_IF_ERROR(fn());
  SY_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  std::vector<double> ms;
  int device = 0;
  SY_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  using kernels::Event;
  SY_ASSIGN_OR_RETURN(Event a, Event::Create(Device::Cuda(device), Event::Timing::kOn));
  SY_ASSIGN_OR_RETURN(Event b, Event::Create(Device::Cuda(device), Event::Timing::kOn));
  const Stream legacy{Device::Cuda(device), nullptr};
  for (int i = 0; i < iters; ++i) {
    SY_RETURN_IF_ERROR(a.Record(legacy));
    SY_RETURN_IF_ERROR(fn());
    SY_RETURN_IF_ERROR(b.Record(legacy));
    SY_RETURN_IF_ERROR(b.Synchronize());
    SY_ASSIGN_OR_RETURN(const float t, b.ElapsedMsSince(a));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Forks `n` children running body(rank) (its result is the child's exit code) and returns their
// exit codes (128 + signal when killed, 1 when the fork failed); children still running after
// `limit` are killed. The parent must not have initialised CUDA.
inline std::vector<int> ForkRanks(int n, absl::Duration limit,
                                  const std::function<int(int)>& body) {
  std::fflush(nullptr);
  std::vector<pid_t> pids(n, -1);
  std::vector<int> codes(n, -1);
  int remaining = 0;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      const int code = body(r);
      std::fflush(nullptr);
      _exit(code);
    }
    if (pid < 0) {
      std::perror("fork");
      codes[r] = 1;
      continue;
    }
    pids[r] = pid;
    ++remaining;
  }
  const absl::Time deadline = absl::Now() + limit;
  bool killed = false;
  while (remaining > 0) {
    for (int r = 0; r < n; ++r) {
      int status = 0;
      if (codes[r] == -1 && waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --remaining;
      }
    }
    if (remaining > 0 && !killed && absl::Now() > deadline) {
      for (int r = 0; r < n; ++r) {
        if (codes[r] == -1) kill(pids[r], SIGKILL);
      }
      killed = true;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return codes;
}

// Makes a fresh directory /tmp/<name>_XXXXXX where forked ranks meet and leave their results.
// Empty (after perror) when it cannot be made.
inline std::string MakeRunDirectory(const std::string& name) {
  std::string path = "/tmp/" + name + "_XXXXXX";
  if (mkdtemp(path.data()) == nullptr) {
    std::perror("mkdtemp");
    return "";
  }
  return path;
}

}  // namespace switchyard::bench

#endif  // SWITCHYARD_BENCH_BENCH_UTIL_H_
