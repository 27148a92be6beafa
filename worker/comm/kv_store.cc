// File: worker/comm/kv_store.cc
#include "worker/comm/kv_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "common/status.h"

namespace switchyard::comm {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path, int err) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(err)));
}

absl::Status MakeDirectories(const std::string& dir) {
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    partial = dir.substr(0, pos);
    if (partial.empty()) continue;
    if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoError("mkdir", partial, errno);
    }
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) return ErrnoError("stat", dir, errno);
  if (!S_ISDIR(st.st_mode)) return absl::FailedPreconditionError(dir + " is not a directory");
  return absl::OkStatus();
}

std::string EscapeKey(absl::string_view key) {
  std::string out;
  for (unsigned char c : key) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
        c == '-') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&out, "%%%02X", c);
    }
  }
  return out;
}

}  // namespace

absl::Status KvStore::WaitForCount(absl::string_view key, int64_t n, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(1);
  while (true) {
    absl::StatusOr<int64_t> count = Count(key);
    if (!count.ok()) return count.status();
    if (*count >= n) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(Describe(), ": counter '", key, "' reached ",
                                                      *count, " of ", n, " within ",
                                                      absl::FormatDuration(timeout)));
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(20));
  }
}

// ---- InMemoryKvStore ----

absl::Status InMemoryKvStore::Set(absl::string_view key, absl::string_view value) {
  absl::MutexLock lock(&mu_);
  values_[std::string(key)] = std::string(value);
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryKvStore::Get(absl::string_view key, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return values_.find(key) != values_.end();
  };
  const absl::Time deadline = absl::Now() + timeout;
  while (!present()) {
    if (mu_.AwaitWithDeadline(absl::Condition(&present), deadline)) break;
    if (!present()) {
      return absl::DeadlineExceededError(absl::StrCat(
          Describe(), ": key '", key, "' not set within ", absl::FormatDuration(timeout)));
    }
  }
  return values_.find(key)->second;
}

absl::StatusOr<bool> InMemoryKvStore::Check(absl::string_view key) {
  absl::MutexLock lock(&mu_);
  return values_.find(key) != values_.end();
}

absl::StatusOr<int64_t> InMemoryKvStore::Increment(absl::string_view key) {
  absl::MutexLock lock(&mu_);
  return ++counters_[std::string(key)];
}

absl::StatusOr<int64_t> InMemoryKvStore::Count(absl::string_view key) {
  absl::MutexLock lock(&mu_);
  auto it = counters_.find(key);
  return it == counters_.end() ? 0 : it->second;
}

// ---- FileKvStore ----

absl::StatusOr<std::unique_ptr<FileKvStore>> FileKvStore::Create(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("FileKvStore: dir must not be empty");
  absl::Status made = MakeDirectories(dir);
  if (!made.ok()) return Annotate(made, "FileKvStore::Create");
  return std::unique_ptr<FileKvStore>(new FileKvStore(dir));
}

std::string FileKvStore::PathOf(absl::string_view key) const {
  return absl::StrCat(dir_, "/", EscapeKey(key));
}

absl::StatusOr<std::string> FileKvStore::TryRead(absl::string_view key) const {
  const std::string path = PathOf(key);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(path);
    return ErrnoError("open", path, errno);
  }
  std::string out;
  char buf[4096];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      close(fd);
      return ErrnoError("read", path, err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

absl::Status FileKvStore::Set(absl::string_view key, absl::string_view value) {
  absl::Status s = WriteFileAtomically(PathOf(key), value);
  if (!s.ok()) return Annotate(s, absl::StrCat(Describe(), ": Set('", key, "')"));
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileKvStore::Get(absl::string_view key, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(1);
  while (true) {
    absl::StatusOr<std::string> value = TryRead(key);
    if (value.ok()) return value;
    if (!absl::IsNotFound(value.status())) {
      return Annotate(value.status(), absl::StrCat(Describe(), ": Get('", key, "')"));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          Describe(), ": key '", key, "' not set within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(20));
  }
}

absl::StatusOr<bool> FileKvStore::Check(absl::string_view key) {
  absl::StatusOr<std::string> value = TryRead(key);
  if (value.ok()) return true;
  if (absl::IsNotFound(value.status())) return false;
  return value.status();
}

absl::StatusOr<int64_t> FileKvStore::Increment(absl::string_view key) {
  const std::string base = PathOf(key);
  for (int64_t n = 1;; ++n) {
    const std::string path = absl::StrCat(base, "#", n);
    int fd = open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd >= 0) {
      close(fd);
      return n;
    }
    if (errno != EEXIST) return ErrnoError("create counter ticket", path, errno);
  }
}

absl::StatusOr<int64_t> FileKvStore::Count(absl::string_view key) {
  const std::string base = PathOf(key);
  int64_t n = 0;
  struct stat st;
  while (stat(absl::StrCat(base, "#", n + 1).c_str(), &st) == 0) ++n;
  return n;
}

// ---- PrefixedKvStore ----

std::string PrefixedKvStore::Key(absl::string_view key) const {
  return absl::StrCat(prefix_, "/", key);
}
absl::Status PrefixedKvStore::Set(absl::string_view key, absl::string_view value) {
  return base_->Set(Key(key), value);
}
absl::StatusOr<std::string> PrefixedKvStore::Get(absl::string_view key, absl::Duration timeout) {
  return base_->Get(Key(key), timeout);
}
absl::StatusOr<bool> PrefixedKvStore::Check(absl::string_view key) {
  return base_->Check(Key(key));
}
absl::StatusOr<int64_t> PrefixedKvStore::Increment(absl::string_view key) {
  return base_->Increment(Key(key));
}
absl::StatusOr<int64_t> PrefixedKvStore::Count(absl::string_view key) {
  return base_->Count(Key(key));
}
std::string PrefixedKvStore::Describe() const {
  return absl::StrCat(base_->Describe(), " (prefix '", prefix_, "')");
}

}  // namespace switchyard::comm
