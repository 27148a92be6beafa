// File: coordinator/store/store_file.h
//
// The store's edge to SQLite and to the file system, below store.h (include store.h, not this):
// the one conversion of SQLite result codes into absl::Status, the checks a store file passes
// before SQLite opens it, `PRAGMA quick_check`, and the atomic online backup. Internal to
// coordinator/store.
#ifndef SWITCHYARD_COORDINATOR_STORE_STORE_FILE_H_
#define SWITCHYARD_COORDINATOR_STORE_STORE_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/store/store.h"

struct sqlite3;

namespace switchyard::store::internal {

// The one conversion of a SQLite result code into a Status (codes and reasons: store.h). `what`
// (the operation and its SQL) and SQLite's own message go to the log only: callers pass messages
// on to API clients, which must never see SQL. The message names the store file (`db`'s main
// database) and the kind of failure, with a reason (coordinator/api/api_status.h's
// " (reason: X)" convention) for the ones a client acts on.
absl::Status SqliteError(sqlite3* db, int rc, absl::string_view what);

// Checks `path` before SQLite sees it, so that the problems SQLite would paper over get a name: a
// missing file (SQLite would create an empty store; NOT_FOUND unless `create`), an empty one
// (SQLite treats 0 bytes as a new database), one that is not SQLite, one shorter than its header
// says (DATA_LOSS). Tightens an existing store's (and -wal, -shm) mode to 0600. Returns true when
// the file is missing and `create` is set: the caller creates it.
absl::StatusOr<bool> PrepareFile(const std::string& path, bool create);

// Creates `path` empty with mode 0600 (removing a leftover of an earlier attempt and its
// -journal, -wal and -shm first).
absl::Status CreateEmptyFile(const std::string& path);

// Makes the finished file `from` the store `to`: fsync, link (never replacing an existing `to`:
// FAILED_PRECONDITION), unlink `from`, fsync of the directory (common/file_util.h; its failure is
// UNAVAILABLE: the store may not survive a crash).
absl::Status PublishFile(const std::string& from, const std::string& to);

// PRAGMA quick_check (every page's b-tree structure, record formats, NOT NULL constraints; not
// index-to-table agreement) on `db`: DATA_LOSS naming `path` and the first problems found.
absl::Status QuickCheck(sqlite3* db, const std::string& path);

// Store::Backup's copy, with the caller holding `src`'s lock: SQLite's online backup of `src` into
// `dest_path`.tmp (0600), quick_check, fsync, rename over `dest_path`, fsync of the directory.
// DATA_LOSS when `src` turns out damaged; any failure leaves `dest_path` as it was.
absl::StatusOr<BackupResult> BackupDatabase(sqlite3* src, const std::string& dest_path);

}  // namespace switchyard::store::internal

#endif  // SWITCHYARD_COORDINATOR_STORE_STORE_FILE_H_
