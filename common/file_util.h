// File: common/file_util.h
//
// Durable file writes, shared by the safetensors writer, the indexed-dataset writer and
// checkpoints: a file is written under a temporary name next to its destination, fsynced, renamed
// over the destination and the directory fsynced, so a reader sees the old file or the complete
// new one, never a torn one. And read-only mappings of whole files (MappedFile), shared by the
// safetensors and indexed-dataset readers.
#ifndef SWITCHYARD_COMMON_FILE_UTIL_H_
#define SWITCHYARD_COMMON_FILE_UTIL_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace switchyard {

// Writes all `n` bytes to `fd` (retrying short writes and EINTR); errors name `path`.
absl::Status WriteAll(int fd, const void* data, size_t n, const std::string& path);

// fsyncs the directory `dir`, making renames and creations in it durable.
absl::Status FsyncDirectory(const std::string& dir);

// The directory part of `path` ("." when it has none).
std::string DirectoryOf(const std::string& path);

// Atomically replaces `path`: `fill(fd, tmp_path)` writes the content into the temporary file
// `<path>.tmp.<pid>` (created with permission bits `mode`, less the umask), which is then
// fsynced, renamed to `path`, and its directory fsynced. On any error the temporary file is
// removed and `path` is left as it was.
absl::Status WriteFileAtomically(
    const std::string& path, const std::function<absl::Status(int fd, const std::string&)>& fill,
    mode_t mode = 0644);
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes,
                                 mode_t mode = 0644);

// A read-only private mapping (mmap) of a whole regular file, unmapped when destroyed. Movable,
// not copyable.
class MappedFile {
 public:
  // Errors name `path`: NOT_FOUND "<path>: no such file"; the errno of open, fstat or mmap
  // ("<path>: open" ...); INVALID_ARGUMENT "<path>: not a regular file" (opened non-blocking, so a
  // FIFO never hangs). An empty file has size() 0 and data() null.
  static absl::StatusOr<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const char* data() const { return static_cast<const char*>(addr_); }
  uint64_t size() const { return size_; }

 private:
  void* addr_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_FILE_UTIL_H_
