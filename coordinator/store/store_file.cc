// File: coordinator/store/store_file.cc
#include "coordinator/store/store_file.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/status.h"

namespace switchyard::store::internal {
namespace {

// The store's file as SQLite knows it (absolute), for messages.
std::string FileOf(sqlite3* db) {
  const char* file = db != nullptr ? sqlite3_db_filename(db, "main") : nullptr;
  return file != nullptr && file[0] != '\0' ? file : "(unknown file)";
}

}  // namespace

absl::Status SqliteError(sqlite3* db, int rc, absl::string_view what) {
  const std::string file = FileOf(db);
  const char* detail = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  SY_LOG(WARNING) << "store " << file << ": " << what << " failed: " << detail << " (code " << rc
                  << ")";
  const std::string store = absl::StrCat("store \"", file, "\"");
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(
          absl::StrCat(store, " is locked by another writer; retry later (reason: STORE_BUSY)"));
    case SQLITE_FULL:
      return absl::ResourceExhaustedError(
          absl::StrCat(store,
                       " is full (no space on its disk, or its size limit): nothing was "
                       "written (reason: STORE_FULL)"));
    case SQLITE_NOMEM:
      return absl::ResourceExhaustedError(
          absl::StrCat(store, ": SQLite is out of memory (reason: STORE_NO_MEMORY)"));
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(absl::StrCat(store, " is corrupt (", sqlite3_errstr(rc),
                                              "); restore it from a backup (reason: "
                                              "STORE_CORRUPT)"));
    case SQLITE_CONSTRAINT:
      // SQLite's message names the constraint or the trigger's text, never the statement.
      return absl::FailedPreconditionError(absl::StrCat(store, ": ", detail));
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
      return absl::FailedPreconditionError(absl::StrCat(store, ": ", sqlite3_errstr(rc)));
    case SQLITE_IOERR:
      return absl::UnavailableError(absl::StrCat(store, ": disk I/O error (", sqlite3_errstr(rc),
                                                 ") (reason: STORE_IO_ERROR)"));
    default:
      return absl::InternalError(
          absl::StrCat(store, ": ", sqlite3_errstr(rc), " (SQLite code ", rc, ")"));
  }
}

namespace {

// The first bytes of every SQLite 3 database file.
constexpr char kSqliteMagic[] = "SQLite format 3";  // 16 bytes with its NUL
constexpr size_t kHeaderBytes = 100;

uint32_t BigEndian(const unsigned char* p, int n) {
  uint32_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

absl::StatusOr<bool> PrepareFile(const std::string& path, bool create) {
  const std::string store = absl::StrCat("store \"", path, "\"");
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      return absl::FailedPreconditionError(
          absl::StrCat(store, ": cannot stat: ", std::strerror(errno)));
    }
    if (!create) {
      return absl::NotFoundError(
          absl::StrCat(store,
                       " does not exist; refusing to start on a new, empty store without "
                       "--create-store (or restore the file from a backup)"));
    }
    return true;
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(store, " is not a regular file"));
  }
  if (st.st_size == 0) {
    return absl::DataLossError(absl::StrCat(
        store,
        " is empty (0 bytes): it holds no jobs; refusing to start on it (restore it from a "
        "backup, or remove it and pass --create-store to start a new store)"));
  }
  unsigned char header[kHeaderBytes] = {};
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::FailedPreconditionError(absl::StrCat(store, ": cannot read"));
    in.read(reinterpret_cast<char*>(header), sizeof(header));
    if (in.gcount() < static_cast<std::streamsize>(sizeof(header)) ||
        std::memcmp(header, kSqliteMagic, sizeof(kSqliteMagic)) != 0) {
      return absl::DataLossError(
          absl::StrCat(store, " is not a SQLite database (", st.st_size,
                       " bytes without the SQLite header); refusing to start on it"));
    }
  }
  // Header fields (https://www.sqlite.org/fileformat.html §1.3): page size at 16 (1 = 65536),
  // change counter at 24, size in pages at 28, valid when the counter at 92 equals the one at 24.
  int64_t page_size = BigEndian(header + 16, 2);
  if (page_size == 1) page_size = 65536;
  const uint32_t pages = BigEndian(header + 28, 4);
  const bool pages_valid = BigEndian(header + 24, 4) == BigEndian(header + 92, 4);
  if (page_size < 512 || (page_size & (page_size - 1)) != 0) {
    return absl::DataLossError(
        absl::StrCat(store, " is corrupt: its header gives page size ", page_size));
  }
  // With a non-empty write-ahead log beside it, a checkpoint interrupted by a crash can leave the
  // file shorter than its (already rewritten) header says; SQLite finishes it from the log, and
  // quick_check then judges the result.
  struct stat wal {};
  const bool has_wal = stat((path + "-wal").c_str(), &wal) == 0 && wal.st_size > 0;
  if (!has_wal && (st.st_size % page_size != 0 ||
                   (pages_valid && pages > 0 && st.st_size < pages * page_size))) {
    return absl::DataLossError(absl::StrCat(store, " is truncated: ", st.st_size,
                                            " bytes, but its header says ", pages, " pages of ",
                                            page_size, " bytes; restore it from a backup"));
  }
  for (const char* suffix : {"", "-wal", "-shm"}) {
    const std::string file = path + suffix;
    struct stat f {};
    if (stat(file.c_str(), &f) == 0 && (f.st_mode & 077) != 0) {
      if (chmod(file.c_str(), 0600) != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat(store, ": ", file,
                         " is readable by others and chmod 0600 failed: ", std::strerror(errno)));
      }
      SY_LOG(WARNING) << "store " << file << " was mode " << std::oct << (f.st_mode & 0777)
                      << std::dec << "; changed to 0600 (it holds every job spec)";
    }
  }
  return false;
}

absl::Status CreateEmptyFile(const std::string& path) {
  for (const char* suffix : {"", "-journal", "-wal", "-shm"}) std::remove((path + suffix).c_str());
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("store \"", path, "\": cannot create: ", std::strerror(errno)));
  }
  close(fd);
  return absl::OkStatus();
}

absl::Status PublishFile(const std::string& from, const std::string& to) {
  const std::string store = absl::StrCat("store \"", to, "\"");
  const int fd = open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) != 0) {
    const int error = errno;
    if (fd >= 0) close(fd);
    return absl::UnavailableError(
        absl::StrCat(store, ": fsync of ", from, " failed: ", std::strerror(error)));
  }
  close(fd);
  // link() never replaces: a file that appeared at `to` meanwhile stays as it is.
  if (link(from.c_str(), to.c_str()) != 0) {
    const int error = errno;
    std::remove(from.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat(store, ": cannot put the new store in place (", std::strerror(error), ")"));
  }
  std::remove(from.c_str());
  // The new name is durable only once the directory is synced; a store that may vanish on a
  // crash is not reported as created.
  if (absl::Status synced = FsyncDirectory(DirectoryOf(to)); !synced.ok()) {
    return absl::UnavailableError(absl::StrCat(store, ": ", synced.message()));
  }
  return absl::OkStatus();
}

absl::Status QuickCheck(sqlite3* db, const std::string& path) {
  constexpr char kSql[] = "PRAGMA quick_check(5)";
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v2(db, kSql, -1, &stmt, nullptr);
  std::vector<std::string> problems;
  while (rc == SQLITE_OK || rc == SQLITE_ROW) {
    rc = sqlite3_step(stmt);
    if (rc != SQLITE_ROW) break;
    const unsigned char* text = sqlite3_column_text(stmt, 0);
    std::string line = text != nullptr ? reinterpret_cast<const char*>(text) : "";
    if (line != "ok") problems.push_back(std::move(line));
  }
  sqlite3_finalize(stmt);
  const std::string store = absl::StrCat("store \"", path, "\"");
  if (rc != SQLITE_DONE) {
    SY_LOG(ERROR) << "store " << path << ": quick_check failed: " << sqlite3_errmsg(db);
    return absl::DataLossError(absl::StrCat(store, " is corrupt: quick_check cannot read it (",
                                            sqlite3_errstr(rc), "); restore it from a backup"));
  }
  if (!problems.empty()) {
    SY_LOG(ERROR) << "store " << path << ": quick_check: " << absl::StrJoin(problems, "; ");
    return absl::DataLossError(absl::StrCat(store, " is corrupt: quick_check found ",
                                            absl::StrJoin(problems, "; "),
                                            "; restore it from a backup"));
  }
  return absl::OkStatus();
}

absl::StatusOr<BackupResult> BackupDatabase(sqlite3* src, const std::string& dest_path) {
  const std::string backup = absl::StrCat("store backup \"", dest_path, "\"");
  const std::string tmp = dest_path + ".tmp";
  const absl::Time start = absl::Now();
  for (const char* suffix : {"", "-journal", "-wal", "-shm"}) std::remove((tmp + suffix).c_str());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(backup, ": cannot create ", tmp, ": ", std::strerror(errno)));
  }
  close(fd);
  sqlite3* out = nullptr;
  int rc = sqlite3_open_v2(tmp.c_str(), &out, SQLITE_OPEN_READWRITE, nullptr);
  absl::Status status;
  BackupResult result;
  if (rc != SQLITE_OK) {
    status = SqliteError(out, rc, "open backup");
  } else {
    sqlite3_backup* copy = sqlite3_backup_init(out, "main", src, "main");
    if (copy == nullptr) {
      status = SqliteError(out, sqlite3_errcode(out), "backup_init");
    } else {
      rc = sqlite3_backup_step(copy, -1);
      result.pages = sqlite3_backup_pagecount(copy);
      const int finish = sqlite3_backup_finish(copy);
      if (rc != SQLITE_DONE) {
        // A damaged page is the source's: name it.
        const bool corrupt = (rc & 0xff) == SQLITE_CORRUPT || (rc & 0xff) == SQLITE_NOTADB;
        status = SqliteError(corrupt ? src : out, rc, "backup_step");
      } else if (finish != SQLITE_OK) {
        status = SqliteError(out, finish, "backup_finish");
      } else {
        // The copy is page for page the source: damage found here is the source's too.
        status = QuickCheck(out, tmp);
      }
    }
  }
  sqlite3_close_v2(out);
  if (status.ok()) {
    const int sync_fd = open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
    if (sync_fd < 0 || fsync(sync_fd) != 0) {
      status =
          absl::UnavailableError(absl::StrCat(backup, ": fsync failed: ", std::strerror(errno)));
    }
    if (sync_fd >= 0) close(sync_fd);
  }
  if (status.ok() && std::rename(tmp.c_str(), dest_path.c_str()) != 0) {
    status = absl::UnavailableError(
        absl::StrCat(backup, ": rename from ", tmp, " failed: ", std::strerror(errno)));
  }
  if (!status.ok()) {
    std::remove(tmp.c_str());
    return Annotate(status, backup);
  }
  // The rename is durable once the directory is synced: a backup that may vanish on a crash is
  // not reported as written.
  if (absl::Status synced = FsyncDirectory(DirectoryOf(dest_path)); !synced.ok()) {
    return absl::UnavailableError(absl::StrCat(backup, ": ", synced.message()));
  }
  struct stat st {};
  if (stat(dest_path.c_str(), &st) == 0) result.bytes = st.st_size;
  result.elapsed = absl::Now() - start;
  return result;
}

}  // namespace switchyard::store::internal
