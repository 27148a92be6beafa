// File: coordinator/store/testing/raw_sqlite.h
//
// Test helper: runs SQL on a store file through a separate raw SQLite connection (to corrupt a
// page's neighbours, cap its size, read what the store wrote), bypassing coordinator/store.
#ifndef SWITCHYARD_COORDINATOR_STORE_TESTING_RAW_SQLITE_H_
#define SWITCHYARD_COORDINATOR_STORE_TESTING_RAW_SQLITE_H_

#include <string>

namespace switchyard::store::testing {

// Runs `sql` on `path` (opened read-write, never created); returns SQLite's error message, or ""
// on success. A failed open is a test failure (EXPECT).
std::string RawExec(const std::string& path, const std::string& sql);

}  // namespace switchyard::store::testing

#endif  // SWITCHYARD_COORDINATOR_STORE_TESTING_RAW_SQLITE_H_
