// CPU embedding lookup against naive loops; the backward as the fp64 adjoint of the forward;
// repeated and unused ids, T = 1, and argument errors; the vocabulary-parallel lookup and
// backward at TP = 1, 2, 4 against the whole table (rows summed over the ranks).
#include "kernels/embedding/embedding.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace switchyard::kernels {
namespace {

template <typename T>
Tensor View(std::vector<T>& v, DType dt, std::vector<int64_t> shape) {
  return Tensor(dt, std::move(shape), Device::Cpu(), v.data());
}

std::vector<double> Normal(int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> dist;
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

std::vector<int32_t> Ids(int64_t t_n, int64_t v_n, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(v_n - 1));
  std::vector<int32_t> ids(t_n);
  for (int32_t& id : ids) id = dist(rng);
  return ids;
}

const Tensor kNoWorkspace;

TEST(EmbeddingTest, ForwardMatchesNaive) {
  std::mt19937_64 rng(1);
  for (auto [t_n, v_n, h_n] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {1, 10, 8}, {37, 5, 13}, {64, 1000, 32}}) {
    std::vector<int32_t> ids = Ids(t_n, v_n, rng);
    std::vector<double> table = Normal(v_n * h_n, rng);
    std::vector<float> table32(table.begin(), table.end());
    std::vector<double> out(t_n * h_n, NAN);
    std::vector<float> out32(t_n * h_n, NAN);
    ASSERT_TRUE(EmbeddingForward(Stream::Cpu(), View(ids, DType::kI32, {t_n}),
                                 View(table, DType::kF64, {v_n, h_n}),
                                 View(out, DType::kF64, {t_n, h_n}))
                    .ok());
    ASSERT_TRUE(EmbeddingForward(Stream::Cpu(), View(ids, DType::kI32, {t_n}),
                                 View(table32, DType::kF32, {v_n, h_n}),
                                 View(out32, DType::kF32, {t_n, h_n}))
                    .ok());
    for (int64_t t = 0; t < t_n; ++t) {
      for (int64_t h = 0; h < h_n; ++h) {
        ASSERT_EQ(out[t * h_n + h], table[ids[t] * h_n + h]) << t << "," << h;
        ASSERT_EQ(out32[t * h_n + h], table32[ids[t] * h_n + h]) << t << "," << h;
      }
    }
  }
}

// Naive backward: dense fp64 accumulation token by token.
std::vector<double> NaiveBackward(const std::vector<int32_t>& ids, const std::vector<double>& dout,
                                  std::vector<double> dtable, int64_t h_n) {
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int64_t h = 0; h < h_n; ++h) dtable[ids[t] * h_n + h] += dout[t * h_n + h];
  }
  return dtable;
}

TEST(EmbeddingTest, BackwardMatchesNaiveWithRepeatedAndUnusedIds) {
  std::mt19937_64 rng(2);
  const int64_t t_n = 50, v_n = 20, h_n = 7;
  // ids 0..4 repeat ten times each; ids 5..19 never occur.
  std::vector<int32_t> ids(t_n);
  for (int64_t t = 0; t < t_n; ++t) ids[t] = static_cast<int32_t>((t * 3) % 5);
  std::vector<double> dout = Normal(t_n * h_n, rng);
  const std::vector<double> init = Normal(v_n * h_n, rng);
  for (bool accumulate : {true, false}) {
    std::vector<double> dtable = init;
    ASSERT_TRUE(EmbeddingBackward(Stream::Cpu(), View(ids, DType::kI32, {t_n}),
                                  View(dout, DType::kF64, {t_n, h_n}),
                                  View(dtable, DType::kF64, {v_n, h_n}), accumulate, kNoWorkspace)
                    .ok());
    const std::vector<double> ref =
        NaiveBackward(ids, dout, accumulate ? init : std::vector<double>(v_n * h_n, 0.0), h_n);
    double max_err = 0;
    for (int64_t i = 0; i < v_n * h_n; ++i)
      max_err = std::max(max_err, std::fabs(dtable[i] - ref[i]));
    std::printf("backward [T=%ld, V=%ld, H=%ld] accumulate=%d: max abs err %.3g (tol 1e-12)\n",
                long(t_n), long(v_n), long(h_n), int(accumulate), max_err);
    EXPECT_LT(max_err, 1e-12);
    for (int64_t i = 5 * h_n; i < v_n * h_n; ++i) {
      // Unused rows: bit-for-bit unchanged when accumulating, exactly zero when overwriting.
      ASSERT_EQ(dtable[i], accumulate ? init[i] : 0.0) << i;
    }
  }
  // f32 gradient buffer from f32 dout: rounded once from the fp64 sum.
  std::vector<float> dout32(dout.begin(), dout.end());
  std::vector<float> dtable32(v_n * h_n, 1.5f);
  ASSERT_TRUE(EmbeddingBackward(Stream::Cpu(), View(ids, DType::kI32, {t_n}),
                                View(dout32, DType::kF32, {t_n, h_n}),
                                View(dtable32, DType::kF32, {v_n, h_n}), true, kNoWorkspace)
                  .ok());
  std::vector<double> dout_rounded(dout32.begin(), dout32.end());
  const std::vector<double> ref =
      NaiveBackward(ids, dout_rounded, std::vector<double>(v_n * h_n, 1.5), h_n);
  for (int64_t i = 0; i < v_n * h_n; ++i) EXPECT_NEAR(dtable32[i], ref[i], 1e-5) << i;
}

TEST(EmbeddingTest, BackwardIsAdjointOfForward) {
  std::mt19937_64 rng(3);
  for (auto [t_n, v_n, h_n] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 10, 8}, {200, 30, 16}, {513, 1000, 5}}) {
    std::vector<int32_t> ids = Ids(t_n, v_n, rng);
    std::vector<double> table = Normal(v_n * h_n, rng);
    std::vector<double> dout = Normal(t_n * h_n, rng);
    std::vector<double> out(t_n * h_n), dtable(v_n * h_n, NAN);
    ASSERT_TRUE(EmbeddingForward(Stream::Cpu(), View(ids, DType::kI32, {t_n}),
                                 View(table, DType::kF64, {v_n, h_n}),
                                 View(out, DType::kF64, {t_n, h_n}))
                    .ok());
    ASSERT_TRUE(EmbeddingBackward(Stream::Cpu(), View(ids, DType::kI32, {t_n}),
                                  View(dout, DType::kF64, {t_n, h_n}),
                                  View(dtable, DType::kF64, {v_n, h_n}), false, kNoWorkspace)
                    .ok());
    // <E(table), dout> == <table, E^T(dout)>
    double lhs = 0, rhs = 0, scale = 0;
    for (int64_t i = 0; i < t_n * h_n; ++i) lhs += out[i] * dout[i];
    for (int64_t i = 0; i < v_n * h_n; ++i) {
      rhs += table[i] * dtable[i];
      scale += std::fabs(table[i] * dtable[i]);
    }
    const double rel = std::fabs(lhs - rhs) / scale;
    std::printf(
        "adjoint [T=%ld, V=%ld, H=%ld]: <Ex,y>=%.12g <x,E^T y>=%.12g rel %.3g (tol 1e-13)\n",
        long(t_n), long(v_n), long(h_n), lhs, rhs, rel);
    EXPECT_LT(rel, 1e-13);
  }
}

TEST(EmbeddingTest, SingleTokenTouchesOneRow) {
  std::vector<int32_t> ids = {3};
  std::vector<float> dout = {1, 2, 3, 4};
  std::vector<float> dtable(5 * 4, 10.0f);
  ASSERT_TRUE(EmbeddingBackward(Stream::Cpu(), View(ids, DType::kI32, {1}),
                                View(dout, DType::kF32, {1, 4}), View(dtable, DType::kF32, {5, 4}),
                                true, kNoWorkspace)
                  .ok());
  for (int64_t v = 0; v < 5; ++v) {
    for (int64_t h = 0; h < 4; ++h) {
      EXPECT_EQ(dtable[v * 4 + h], v == 3 ? 10.0f + dout[h] : 10.0f);
    }
  }
}

TEST(EmbeddingTest, RejectsInvalidIdsAndShapes) {
  std::vector<int32_t> ids = {0, 7, -1};
  std::vector<float> table(5 * 4, 1.0f), out(3 * 4), dtable(5 * 4);
  const Tensor t_ids = View(ids, DType::kI32, {3});
  const Tensor t_table = View(table, DType::kF32, {5, 4});
  const Tensor t_out = View(out, DType::kF32, {3, 4});
  const Tensor t_dtable = View(dtable, DType::kF32, {5, 4});
  absl::Status s = EmbeddingForward(Stream::Cpu(), t_ids, t_table, t_out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ids[1] = 7"), std::string::npos) << s;
  s = EmbeddingBackward(Stream::Cpu(), t_ids, t_out, t_dtable, true, kNoWorkspace);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  ids = {0, 1, 4};
  EXPECT_TRUE(EmbeddingForward(Stream::Cpu(), t_ids, t_table, t_out).ok());
  // ids must be i32 [T].
  EXPECT_EQ(EmbeddingForward(Stream::Cpu(), View(ids, DType::kF32, {3}), t_table, t_out).code(),
            absl::StatusCode::kInvalidArgument);
  // out [T, H] must match ids and table.
  EXPECT_EQ(EmbeddingForward(Stream::Cpu(), t_ids, t_table, View(out, DType::kF32, {3, 3})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EmbeddingForward(Stream::Cpu(), View(ids, DType::kI32, {2}), t_table, t_out).code(),
            absl::StatusCode::kInvalidArgument);
  // out dtype must be the table's.
  std::vector<double> out64(3 * 4);
  EXPECT_EQ(
      EmbeddingForward(Stream::Cpu(), t_ids, t_table, View(out64, DType::kF64, {3, 4})).code(),
      absl::StatusCode::kInvalidArgument);
  // dtable H must match dout.
  EXPECT_EQ(EmbeddingBackward(Stream::Cpu(), t_ids, t_out, View(dtable, DType::kF32, {4, 5}), true,
                              kNoWorkspace)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Tensors on another device than the stream.
  const Tensor cuda_out(DType::kF32, {3, 4}, Device::Cuda(0), out.data());
  EXPECT_EQ(EmbeddingForward(Stream::Cpu(), t_ids, t_table, cuda_out).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(EmbeddingTest, WorkspaceBytes) {
  EXPECT_EQ(EmbeddingBackwardWorkspaceBytes(0, 0), 4);
  EXPECT_EQ(EmbeddingBackwardWorkspaceBytes(8192, 151936), 4 * (151937 + 151936 + 2 * 8192));
}

// Every TP rank's VocabShard lookup summed over the ranks is the whole-table lookup (exactly:
// one non-zero term per element); each rank's backward rows are the whole backward's rows.
TEST(EmbeddingTest, VocabShardMatchesWholeTable) {
  std::mt19937_64 rng(std::random_device{}());
  for (int tp : {1, 2, 4}) {
    const int64_t t_n = 41, v_n = 24, h_n = 5, vl = v_n / tp;
    std::vector<int32_t> ids = Ids(t_n, v_n, rng);
    ids[0] = 0;
    ids[1] = static_cast<int32_t>(v_n - 1);
    const std::vector<double> table = Normal(v_n * h_n, rng);
    const std::vector<double> dout = Normal(t_n * h_n, rng);
    const std::vector<double> init = Normal(v_n * h_n, rng);
    std::vector<double> whole(t_n * h_n, NAN), dwhole = init;
    ASSERT_TRUE(
        EmbeddingForward(Stream::Cpu(), View(ids, DType::kI32, {t_n}),
                         View(const_cast<std::vector<double>&>(table), DType::kF64, {v_n, h_n}),
                         View(whole, DType::kF64, {t_n, h_n}))
            .ok());
    ASSERT_TRUE(
        EmbeddingBackward(Stream::Cpu(), View(ids, DType::kI32, {t_n}),
                          View(const_cast<std::vector<double>&>(dout), DType::kF64, {t_n, h_n}),
                          View(dwhole, DType::kF64, {v_n, h_n}), true, kNoWorkspace)
            .ok());
    std::vector<double> sum(t_n * h_n, 0.0);
    for (int r = 0; r < tp; ++r) {
      std::vector<double> slice(table.begin() + r * vl * h_n, table.begin() + (r + 1) * vl * h_n);
      std::vector<double> out(t_n * h_n, NAN),
          dslice(init.begin() + r * vl * h_n, init.begin() + (r + 1) * vl * h_n);
      std::vector<int32_t> local(t_n, 77);
      ASSERT_TRUE(VocabShardEmbeddingForward(Stream::Cpu(), View(ids, DType::kI32, {t_n}),
                                             View(slice, DType::kF64, {vl, h_n}), r * vl, v_n,
                                             View(local, DType::kI32, {t_n}),
                                             View(out, DType::kF64, {t_n, h_n}))
                      .ok());
      for (int64_t t = 0; t < t_n; ++t) {
        const bool mine = ids[t] >= r * vl && ids[t] < (r + 1) * vl;
        ASSERT_EQ(local[t], mine ? ids[t] - r * vl : -1) << t;
        for (int64_t h = 0; h < h_n; ++h) {
          if (!mine) {
            ASSERT_EQ(out[t * h_n + h], 0.0) << "rank " << r << " token " << t;
          }
          sum[t * h_n + h] += out[t * h_n + h];
        }
      }
      ASSERT_TRUE(VocabShardEmbeddingBackward(
                      Stream::Cpu(), View(ids, DType::kI32, {t_n}),
                      View(const_cast<std::vector<double>&>(dout), DType::kF64, {t_n, h_n}),
                      View(dslice, DType::kF64, {vl, h_n}), r * vl, v_n,
                      View(local, DType::kI32, {t_n}), true, kNoWorkspace)
                      .ok());
      for (int64_t i = 0; i < vl * h_n; ++i) {
        ASSERT_EQ(dslice[i], dwhole[r * vl * h_n + i]) << "tp " << tp << " rank " << r << " " << i;
      }
    }
    EXPECT_EQ(sum, whole) << "tp " << tp;
  }
  // Errors: an id outside the whole vocabulary, a slice outside it, local_ids of another length.
  std::vector<int32_t> ids = {0, 7, 8}, local(3);
  std::vector<double> slice(4 * 2), out(3 * 2);
  auto fwd = [&](int64_t start, int64_t vocab, int64_t n_local) {
    return VocabShardEmbeddingForward(
               Stream::Cpu(), View(ids, DType::kI32, {3}), View(slice, DType::kF64, {4, 2}), start,
               vocab, View(local, DType::kI32, {n_local}), View(out, DType::kF64, {3, 2}))
        .code();
  };
  EXPECT_EQ(fwd(4, 9, 3), absl::StatusCode::kOk);
  EXPECT_EQ(fwd(4, 8, 3), absl::StatusCode::kInvalidArgument);  // id 8 outside [0, 8)
  EXPECT_EQ(fwd(6, 9, 3), absl::StatusCode::kInvalidArgument);  // [6, 10) not inside [0, 9)
  EXPECT_EQ(fwd(4, 9, 2), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace switchyard::kernels
