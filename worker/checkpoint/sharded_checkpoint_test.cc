// File: worker/checkpoint/sharded_checkpoint_test.cc
//
// Sharded checkpoints (sharded_checkpoint.h) without a model: three writer threads (one rank
// each, summing over a shared in-process all-reduce) save one global tensor cut three unrelated
// ways (rows, reordered column runs, a flat split of one shard); reads of other slices (boxes,
// reordered runs, flat ranges, f32 into f64) must give exactly the global tensor's elements,
// computed independently element by element. Also: the old whole-tensor format reads through the
// same reader; shards that miss elements are refused before a manifest is written (the previous
// step stays `latest`); a failing rank fails every rank's commit.
#include "worker/checkpoint/sharded_checkpoint.h"

#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace switchyard {
namespace {

std::string TempRoot(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  const std::string root = absl::StrCat(t ? t : "/tmp", "/", name);
  std::filesystem::remove_all(root);
  return root;
}

// Sums vectors over `n` threads (a generation-counted rendezvous).
class ThreadAllReduce {
 public:
  explicit ThreadAllReduce(int n) : n_(n) {}
  absl::Status Sum(std::vector<double>* v) {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t gen = gen_;
    if (arrived_ == 0) acc_.assign(v->size(), 0.0);
    for (size_t i = 0; i < v->size(); ++i) acc_[i] += (*v)[i];
    if (++arrived_ == n_) {
      result_ = acc_;
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen; });
    }
    *v = result_;
    return absl::OkStatus();
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t gen_ = 0;
  std::vector<double> acc_, result_;
};

// The global (row-major) index of every local element of `s` in [flat_begin, flat_end).
std::vector<int64_t> GlobalIndices(const ShardSlice& s) {
  std::vector<std::vector<int64_t>> per_dim;
  for (const auto& dim : s.runs) {
    std::vector<int64_t> idx;
    for (const DimRun& r : dim) {
      for (int64_t k = 0; k < r.length; ++k) idx.push_back(r.global_begin + k);
    }
    per_dim.push_back(idx);
  }
  std::vector<int64_t> out;
  const std::vector<int64_t> shape = s.LocalShape();
  const int64_t n = s.LocalNumel();
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t rem = flat, g = 0, gstride = 1;
    std::vector<int64_t> local(shape.size());
    for (size_t d = shape.size(); d-- > 0;) {
      local[d] = rem % shape[d];
      rem /= shape[d];
    }
    for (size_t d = shape.size(); d-- > 0;) {
      g += per_dim[d][local[d]] * gstride;
      gstride *= s.global_shape[d];
    }
    out.push_back(g);
  }
  const int64_t end = s.flat_end < 0 ? n : s.flat_end;
  return std::vector<int64_t>(out.begin() + s.flat_begin, out.begin() + end);
}

ShardSlice Slice3(std::vector<std::vector<DimRun>> runs, int64_t fb = 0, int64_t fe = -1) {
  ShardSlice s;
  s.global_shape = {6, 4, 10};
  s.runs = std::move(runs);
  s.flat_begin = fb;
  s.flat_end = fe;
  return s;
}

class ShardedCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(7);
    std::normal_distribution<float> normal;
    global_.resize(6 * 4 * 10);
    for (float& x : global_) x = normal(rng);
    // Rank 0: rows [0, 3) whole. Rank 1: rows [3, 6), columns 5..9 then 0..4 of the last dim,
    // the first 50 of its 120 local elements. Rank 2: the same slice's elements [50, 120).
    shards_ = {{Slice3({{{0, 3}}, {{0, 4}}, {{0, 10}}})},
               {Slice3({{{3, 3}}, {{0, 4}}, {{5, 5}, {0, 5}}}, 0, 50)},
               {Slice3({{{3, 3}}, {{0, 4}}, {{5, 5}, {0, 5}}}, 50, 120)}};
  }

  // Every rank's data (the global elements of its slice), then a 3-thread commit.
  std::vector<absl::StatusOr<std::string>> Save(const std::string& root, int64_t step,
                                                const std::vector<ShardSlice>& shards) {
    const int n = static_cast<int>(shards.size());
    ThreadAllReduce ar(n);
    std::vector<absl::StatusOr<std::string>> out(n, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        std::vector<float> data;
        for (int64_t g : GlobalIndices(shards[r])) data.push_back(global_[g]);
        ShardedCheckpointWriter w;
        w.AddShard(
            "w", shards[r],
            Tensor(DType::kF32, {static_cast<int64_t>(data.size())}, Device::Cpu(), data.data()));
        w.SetMetadata("step", step);
        CheckpointGroup g{r, n, [&](std::vector<double>* v) { return ar.Sum(v); }};
        out[r] = w.Commit(root, step, g);
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  void ExpectRead(const ShardedCheckpointReader& rd, const ShardSlice& target) {
    const std::vector<int64_t> idx = GlobalIndices(target);
    std::vector<double> got(idx.size(), -12345.0);  // poisoned
    const absl::Status st =
        rd.Read("w", target,
                Tensor(DType::kF64, {static_cast<int64_t>(got.size())}, Device::Cpu(), got.data()));
    ASSERT_TRUE(st.ok()) << st;
    for (size_t i = 0; i < idx.size(); ++i) {
      ASSERT_EQ(got[i], static_cast<double>(global_[idx[i]])) << "element " << i;
    }
  }

  std::vector<float> global_;
  std::vector<ShardSlice> shards_;
};

TEST_F(ShardedCheckpointTest, ReshardsAnySliceFromThreeWriters) {
  const std::string root = TempRoot("sharded_three");
  for (const auto& r : Save(root, 3, shards_)) ASSERT_TRUE(r.ok()) << r.status();
  auto rd = ShardedCheckpointReader::Load(root);
  ASSERT_TRUE(rd.ok()) << rd.status();
  EXPECT_EQ(rd->checkpoint().step(), 3);
  EXPECT_EQ(rd->checkpoint().Files().size(), 3u);  // one shard file per rank
  ASSERT_TRUE(rd->GlobalShape("w").ok());
  EXPECT_EQ(*rd->GlobalShape("w"), (std::vector<int64_t>{6, 4, 10}));
  ExpectRead(*rd, ShardSlice::Whole({6, 4, 10}));
  // A box across all three writers, runs reordered, then a flat cut of it.
  ExpectRead(*rd, Slice3({{{4, 2}, {1, 3}}, {{1, 2}}, {{7, 3}, {2, 4}}}));
  ExpectRead(*rd, Slice3({{{4, 2}, {1, 3}}, {{1, 2}}, {{7, 3}, {2, 4}}}, 7, 53));
  ExpectRead(*rd, Slice3({{{2, 2}}, {{3, 1}}, {{4, 3}}}));
  // A shape mismatch is refused naming both shapes.
  ShardSlice wrong = ShardSlice::Whole({6, 4, 11});
  std::vector<double> buf(wrong.NumElements());
  absl::Status st =
      rd->Read("w", wrong, Tensor(DType::kF64, {wrong.NumElements()}, Device::Cpu(), buf.data()));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("[6,4,10]"), std::string::npos) << st;
}

TEST_F(ShardedCheckpointTest, MissingElementsAreRefusedAndLatestStays) {
  const std::string root = TempRoot("sharded_missing");
  for (const auto& r : Save(root, 1, shards_)) ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(std::filesystem::exists(root + "/step_1/manifest.json"));
  // Rank 2's part missing: 70 elements short.
  std::vector<ShardSlice> two = {shards_[0], shards_[1]};
  const auto out = Save(root, 2, two);
  ASSERT_FALSE(out[0].ok());
  ASSERT_FALSE(out[1].ok());
  EXPECT_NE(out[0].status().message().find("hold 170 elements"), std::string::npos)
      << out[0].status();
  EXPECT_NE(out[1].status().message().find("rank 0"), std::string::npos) << out[1].status();
  EXPECT_FALSE(std::filesystem::exists(root + "/step_2"));
  auto rd = ShardedCheckpointReader::Load(root);
  ASSERT_TRUE(rd.ok()) << rd.status();
  EXPECT_EQ(rd->checkpoint().step(), 1);
}

TEST_F(ShardedCheckpointTest, OneBadRankFailsEveryRank) {
  const std::string root = TempRoot("sharded_bad_rank");
  std::vector<ShardSlice> bad = shards_;
  bad[1].runs[0] = {{5, 3}};  // rows [5, 8) of 6: invalid on rank 1 only
  const auto out = Save(root, 1, bad);
  EXPECT_EQ(out[1].status().code(), absl::StatusCode::kInvalidArgument) << out[1].status();
  EXPECT_EQ(out[0].status().code(), absl::StatusCode::kFailedPrecondition) << out[0].status();
  EXPECT_NE(out[0].status().message().find("rank 1"), std::string::npos) << out[0].status();
  EXPECT_FALSE(std::filesystem::exists(root + "/step_1"));
}

TEST_F(ShardedCheckpointTest, ReadsTheWholeTensorFormat) {
  const std::string root = TempRoot("sharded_legacy");
  CheckpointWriter w;
  w.AddTensor("model.safetensors", "w",
              Tensor(DType::kF32, {6, 4, 10}, Device::Cpu(), global_.data()));
  ASSERT_TRUE(w.Commit(root, 5).ok());
  auto rd = ShardedCheckpointReader::Load(root);
  ASSERT_TRUE(rd.ok()) << rd.status();
  ExpectRead(*rd, shards_[1]);
  ExpectRead(*rd, shards_[2]);
}

}  // namespace
}  // namespace switchyard
