// File: worker/comm/kv_store_test.cc
#include "worker/comm/kv_store.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace switchyard::comm {
namespace {

std::string TmpDir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  return std::string(t ? t : "/tmp") + "/kv_store_test_" + name;
}

void ExerciseStore(KvStore& store) {
  ASSERT_TRUE(store.Set("a/b", std::string("x\0y", 3)).ok());
  absl::StatusOr<std::string> v = store.Get("a/b", absl::Seconds(1));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, std::string("x\0y", 3));
  EXPECT_TRUE(*store.Check("a/b"));
  EXPECT_FALSE(*store.Check("a/c"));

  // A missing key times out with DEADLINE_EXCEEDED naming the key.
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> missing = store.Get("never.set", absl::Milliseconds(100));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "never.set")) << missing.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));

  // A key set later by another thread wakes the reader.
  std::thread writer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(store.Set("late", "v").ok());
  });
  absl::StatusOr<std::string> late = store.Get("late", absl::Seconds(5));
  writer.join();
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(*late, "v");

  // Counters: every increment gets a distinct value; WaitForCount is a barrier.
  EXPECT_EQ(*store.Count("ctr"), 0);
  std::vector<std::thread> threads;
  std::vector<int64_t> got(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { got[i] = *store.Increment("ctr"); });
  }
  for (auto& t : threads) t.join();
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_TRUE(store.WaitForCount("ctr", 4, absl::Seconds(1)).ok());
  absl::Status short_count = store.WaitForCount("ctr", 5, absl::Milliseconds(50));
  EXPECT_EQ(short_count.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(short_count.message(), "ctr")) << short_count;
}

TEST(InMemoryKvStoreTest, SetGetTimeoutCounters) {
  InMemoryKvStore store;
  ExerciseStore(store);
}

TEST(FileKvStoreTest, SetGetTimeoutCounters) {
  absl::StatusOr<std::unique_ptr<FileKvStore>> store = FileKvStore::Create(TmpDir("basic/sub"));
  ASSERT_TRUE(store.ok()) << store.status();
  ExerciseStore(**store);
}

TEST(FileKvStoreTest, RejectsEmptyDir) {
  EXPECT_EQ(FileKvStore::Create("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PrefixedKvStoreTest, ScopesKeys) {
  auto base = std::make_shared<InMemoryKvStore>();
  PrefixedKvStore job1(base, "job1/gen0");
  PrefixedKvStore job2(base, "job2/gen0");
  ASSERT_TRUE(job1.Set("k", "one").ok());
  EXPECT_FALSE(*job2.Check("k"));
  EXPECT_EQ(*base->Get("job1/gen0/k", absl::Seconds(1)), "one");
  absl::StatusOr<std::string> missing = job2.Get("k", absl::Milliseconds(20));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "job2/gen0/k"));
  ExerciseStore(job2);
}

}  // namespace
}  // namespace switchyard::comm
