// File: worker/comm/kv_store.h
//
// A small rendezvous key-value store: processes publish their addresses under a key and wait for
// each other's. Communicator factories (gloo_communicator.h) use it to connect a group.
//
//   KvStore            the interface: Set, Get (blocking with a deadline), Check, Increment.
//   InMemoryKvStore    threads of one process (tests, single-process multi-rank setups).
//   FileKvStore        a directory on a filesystem all processes see (a local tmpdir for tests, a
//                      shared volume in a pod); one file per key, written atomically, polled.
//   PrefixedKvStore    scopes every key of another store under "<prefix>/" (job, generation,
//                      group), so one directory can serve many rendezvous without collisions.
//
// Keys are written once in normal use (a rendezvous publishes, then everyone reads); a second
// Set of the same key replaces the value atomically, and readers see either the old or the new.
#ifndef SWITCHYARD_WORKER_COMM_KV_STORE_H_
#define SWITCHYARD_WORKER_COMM_KV_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace switchyard::comm {

// All methods are thread-safe. Values are arbitrary bytes.
class KvStore {
 public:
  virtual ~KvStore() = default;

  // Publishes `value` under `key` (replacing any earlier value).
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;
  // Blocks until `key` is present, then returns its value. DEADLINE_EXCEEDED naming the key (and
  // the store) when it is still absent after `timeout`.
  virtual absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) = 0;
  // Whether `key` is present now (no waiting).
  virtual absl::StatusOr<bool> Check(absl::string_view key) = 0;
  // Atomically increments the counter `key` (starting from 0) and returns the new value, so the
  // n-th caller gets n. Counters live in their own namespace: Get/Set do not see them. With
  // WaitForCount this is a store-level barrier.
  virtual absl::StatusOr<int64_t> Increment(absl::string_view key) = 0;
  // Current value of counter `key` (0 if never incremented).
  virtual absl::StatusOr<int64_t> Count(absl::string_view key) = 0;

  // Blocks until counter `key` reaches at least `n`; DEADLINE_EXCEEDED naming the key, the count
  // reached and `n` after `timeout`. Polls Count.
  absl::Status WaitForCount(absl::string_view key, int64_t n, absl::Duration timeout);

  // What the store is, for error messages ("file store /tmp/x", "in-memory store").
  virtual std::string Describe() const = 0;
};

// Threads of one process. Get waits on a condition variable, not by polling.
class InMemoryKvStore final : public KvStore {
 public:
  InMemoryKvStore() = default;
  InMemoryKvStore(const InMemoryKvStore&) = delete;
  InMemoryKvStore& operator=(const InMemoryKvStore&) = delete;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<bool> Check(absl::string_view key) override;
  absl::StatusOr<int64_t> Increment(absl::string_view key) override;
  absl::StatusOr<int64_t> Count(absl::string_view key) override;
  std::string Describe() const override { return "in-memory store"; }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string, std::less<>> values_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t, std::less<>> counters_ ABSL_GUARDED_BY(mu_);
};

// One file per key in `dir`. The file name is the key with every byte outside [A-Za-z0-9_-]
// escaped as "%XX", so keys may contain '/' and never collide with the temporary files of
// WriteFileAtomically ("<name>.tmp.<pid>"). Set writes atomically (temp file, fsync, rename), so
// a reader never sees a partial value. Get polls with backoff (1 ms growing to 20 ms).
// Increment creates "<name>#<n>" with O_CREAT|O_EXCL for n = 1, 2, ... and returns the first n it
// wins, which is atomic on local filesystems and NFSv3+. Stale files from an earlier run are
// seen as present: scope keys by a job/generation prefix (PrefixedKvStore) or use a fresh `dir`.
class FileKvStore final : public KvStore {
 public:
  // Creates `dir` (and its parents) if missing. INVALID_ARGUMENT for an empty `dir`; the errno
  // message naming the path when it cannot be created.
  static absl::StatusOr<std::unique_ptr<FileKvStore>> Create(const std::string& dir);
  FileKvStore(const FileKvStore&) = delete;
  FileKvStore& operator=(const FileKvStore&) = delete;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<bool> Check(absl::string_view key) override;
  absl::StatusOr<int64_t> Increment(absl::string_view key) override;
  absl::StatusOr<int64_t> Count(absl::string_view key) override;
  std::string Describe() const override { return "file store " + dir_; }

  const std::string& dir() const { return dir_; }

 private:
  explicit FileKvStore(std::string dir) : dir_(std::move(dir)) {}
  std::string PathOf(absl::string_view key) const;
  // Reads the file of `key`: its content, NOT_FOUND when absent, or an I/O error.
  absl::StatusOr<std::string> TryRead(absl::string_view key) const;

  const std::string dir_;
};

// Forwards to `base` with every key (values and counters) replaced by "<prefix>/<key>".
class PrefixedKvStore final : public KvStore {
 public:
  PrefixedKvStore(std::shared_ptr<KvStore> base, std::string prefix)
      : base_(std::move(base)), prefix_(std::move(prefix)) {}

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<bool> Check(absl::string_view key) override;
  absl::StatusOr<int64_t> Increment(absl::string_view key) override;
  absl::StatusOr<int64_t> Count(absl::string_view key) override;
  std::string Describe() const override;

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<KvStore>& base() const { return base_; }

 private:
  std::string Key(absl::string_view key) const;
  std::shared_ptr<KvStore> base_;
  std::string prefix_;
};

}  // namespace switchyard::comm

#endif  // SWITCHYARD_WORKER_COMM_KV_STORE_H_
