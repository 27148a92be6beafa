// main of the end-to-end tests: argv[1] is the switchyard-coordinator binary, argv[2] the
// switchyard-worker binary, argv[3] (optional) syctl (Bazel passes their runfiles paths).
#include <cstdio>

#include "gtest/gtest.h"
#include "tests/e2e/e2e_cluster.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <switchyard-coordinator> <switchyard-worker>\n", argv[0]);
    return 2;
  }
  switchyard::e2e::g_coordinator = argv[1];
  switchyard::e2e::g_worker = argv[2];
  if (argc > 3) switchyard::e2e::g_syctl = argv[3];
  return RUN_ALL_TESTS();
}
