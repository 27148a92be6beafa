// File: coordinator/store/testing/raw_sqlite.cc
#include "coordinator/store/testing/raw_sqlite.h"

#include <sqlite3.h>

#include "gtest/gtest.h"

namespace switchyard::store::testing {

std::string RawExec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  char* error = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  std::string out = rc == SQLITE_OK ? "" : (error != nullptr ? error : "error");
  sqlite3_free(error);
  sqlite3_close(db);
  return out;
}

}  // namespace switchyard::store::testing
