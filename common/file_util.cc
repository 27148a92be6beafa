#include "common/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"

namespace switchyard {

absl::Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat(path, ": write"));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status FsyncDirectory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(dir, ": open directory to fsync"));
  const int rc = fsync(fd);
  const int err = errno;
  close(fd);
  if (rc != 0) return absl::ErrnoToStatus(err, absl::StrCat(dir, ": fsync directory"));
  return absl::OkStatus();
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

absl::Status WriteFileAtomically(
    const std::string& path, const std::function<absl::Status(int fd, const std::string&)>& fill,
    mode_t mode) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(tmp, ": open for writing"));
  absl::Status status = fill(fd, tmp);
  if (status.ok() && fsync(fd) != 0) {
    status = absl::ErrnoToStatus(errno, absl::StrCat(tmp, ": fsync"));
  }
  if (close(fd) != 0 && status.ok()) {
    status = absl::ErrnoToStatus(errno, absl::StrCat(tmp, ": close"));
  }
  if (status.ok() && rename(tmp.c_str(), path.c_str()) != 0) {
    status = absl::ErrnoToStatus(errno, absl::StrCat("rename ", tmp, " -> ", path));
  }
  if (!status.ok()) {
    unlink(tmp.c_str());
    return status;
  }
  return FsyncDirectory(DirectoryOf(path));
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes, mode_t mode) {
  return WriteFileAtomically(
      path,
      [&](int fd, const std::string& tmp) { return WriteAll(fd, bytes.data(), bytes.size(), tmp); },
      mode);
}

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not hang; it is rejected below as not a regular file.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": open"));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": fstat"));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  MappedFile file;
  file.size_ = static_cast<uint64_t>(st.st_size);
  if (file.size_ == 0) {
    close(fd);
    return file;
  }
  void* addr = mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  close(fd);
  if (addr == MAP_FAILED) return absl::ErrnoToStatus(err, absl::StrCat(path, ": mmap"));
  file.addr_ = addr;
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : addr_(std::exchange(other.addr_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (addr_ != nullptr) munmap(addr_, size_);
    addr_ = std::exchange(other.addr_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (addr_ != nullptr) munmap(addr_, size_);
}

}  // namespace switchyard
