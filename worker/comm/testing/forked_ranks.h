// File: worker/comm/testing/forked_ranks.h
//
// Test helpers for multi-process tests: fork one child per rank, run a body that returns an exit
// code, and collect the codes (children still running after a time limit are killed). Children
// report failures on stderr through SY_CHILD_CHECK / SY_CHILD_OK, which name the rank and return 1
// from the body. Fork before any thread or CUDA context exists in the parent.
#ifndef SWITCHYARD_WORKER_COMM_TESTING_FORKED_RANKS_H_
#define SWITCHYARD_WORKER_COMM_TESTING_FORKED_RANKS_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "worker/comm/kv_store.h"

namespace switchyard::comm::testing {

// The rank of the current child (-1 in the parent).
inline int& ChildRank() {
  static int rank = -1;
  return rank;
}

// A fresh directory name under TEST_TMPDIR (or /tmp) for one run's FileKvStore.
inline std::string UniqueStoreDir(const std::string& name) {
  static int counter = 0;
  const char* t = std::getenv("TEST_TMPDIR");
  return absl::StrCat(t ? t : "/tmp", "/", name, "_", getpid(), "_", counter++);
}

// A FileKvStore on `dir`, or nullptr (the error goes to stderr).
inline std::shared_ptr<KvStore> OpenFileStore(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<FileKvStore>> s = FileKvStore::Create(dir);
  if (!s.ok()) {
    std::fprintf(stderr, "FileKvStore %s: %s\n", dir.c_str(), s.status().ToString().c_str());
    return nullptr;
  }
  return std::shared_ptr<KvStore>(std::move(*s));
}

// Forks `world` children running body(rank) and returns their exit codes (128 + signal when
// killed). Children still running after `limit` are killed with SIGKILL.
inline std::vector<int> RunProcesses(int world, absl::Duration limit,
                                     const std::function<int(int rank)>& body) {
  std::fflush(nullptr);
  std::vector<pid_t> pids(world);
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      ChildRank() = r;
      const int code = body(r);
      std::fflush(nullptr);
      _exit(code);
    }
    pids[r] = pid;
  }
  std::vector<int> codes(world, -1);
  const absl::Time deadline = absl::Now() + limit;
  int remaining = world;
  while (remaining > 0) {
    for (int r = 0; r < world; ++r) {
      if (codes[r] != -1) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --remaining;
      }
    }
    if (remaining > 0 && absl::Now() > deadline) {
      for (int r = 0; r < world; ++r) {
        if (codes[r] == -1) kill(pids[r], SIGKILL);
      }
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return codes;
}

}  // namespace switchyard::comm::testing

#define SY_CHILD_CHECK(cond)                                                             \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "rank %d: %s:%d: check failed: %s\n",                         \
                   ::switchyard::comm::testing::ChildRank(), __FILE__, __LINE__, #cond); \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

#define SY_CHILD_OK(expr)                                                                        \
  do {                                                                                           \
    const absl::Status sy_child_status_ = (expr);                                                \
    if (!sy_child_status_.ok()) {                                                                \
      std::fprintf(stderr, "rank %d: %s:%d: %s: %s\n", ::switchyard::comm::testing::ChildRank(), \
                   __FILE__, __LINE__, #expr, sy_child_status_.ToString().c_str());              \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

#endif  // SWITCHYARD_WORKER_COMM_TESTING_FORKED_RANKS_H_
