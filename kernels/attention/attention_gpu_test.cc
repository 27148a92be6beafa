// CUDA attention against the CPU reference: fresh random inputs, poisoned outputs (and scratch),
// tolerance 1e-2 for bf16 (tensor-core kernels and cuDNN) and 1e-5 for f32 (SIMT kernels)
// (DESIGN.md). bf16 runs every pairing of the two backends (native and cuDNN forward, each with
// native and cuDNN backward: the lse of one must drive the other),
// forward (o, lse) and backward (dq, dk, dv): D = 64 and 128, a one-token sequence, ragged tiles
// (S = 37, 200, 1000), GQA groups, several sequences, S = 2048 and 4096 (bf16 only, few heads:
// the reference is O(S^2) per head). Also: bitwise-deterministic backward, and a change to a
// future key/value leaves earlier rows and other sequences bitwise unchanged (causal mask).
// The bottom-right causal mode (kv_seq_len > seq_len, context parallelism): the native kernels
// (bf16 tensor-core, f32 SIMT) and cuDNN against the CPU reference, at CP chunk shapes and ragged
// ones; and, bitwise, a change to a key leaves the query rows that do not see it (row < key - off)
// and the other sequence unchanged, and the backward is deterministic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/attention_cudnn.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

using testing::ExpectClose;
using testing::Poisoned;
using testing::Upload;

Buffer Host(DType dt, std::vector<int64_t> shape) {
  return Buffer::ForTensor(dt, std::move(shape), Device::Cpu()).value();
}

constexpr AttentionSettings kNative{AttentionBackend::kNative, true};
constexpr AttentionSettings kCudnn{AttentionBackend::kCudnn, true};
constexpr AttentionSettings kCudnnAtomic{AttentionBackend::kCudnn, false};  // the default

// Restores the default settings when a test ends.
struct SettingsGuard {
  ~SettingsGuard() { SetAttentionSettings(AttentionSettings{}); }
};

// One attention problem on the host: B sequences of `s` queries against `skv` keys each (skv == s
// is the ordinary causal mask: the seq_len-only overloads forward to kv_seq_len = seq_len), fresh
// random inputs, and (after RunReference) the CPU reference's outputs.
struct HostProblem {
  int64_t s = 0, skv = 0;
  float scale = 0;
  std::vector<int64_t> qs, ks, ls;  // shapes of q (o, dq, d_o), k (v, dk, dv), lse (delta)
  Buffer q, k, v, d_o;
  Buffer o, lse, delta, dq, dk, dv;
};

HostProblem RandomProblem(DType dt, int64_t b, int64_t s, int64_t skv, int64_t hq, int64_t hkv,
                          int64_t d, std::mt19937_64& rng) {
  HostProblem p;
  p.s = s;
  p.skv = skv;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.qs = {b * s, hq, d};
  p.ks = {b * skv, hkv, d};
  p.ls = {b, hq, s};
  p.q = Host(dt, p.qs);
  p.k = Host(dt, p.ks);
  p.v = Host(dt, p.ks);
  p.d_o = Host(dt, p.qs);
  for (Buffer* x : {&p.q, &p.k, &p.v, &p.d_o}) testing::FillRandom(x->View(), rng);
  return p;
}

// The fp64 CPU reference's forward and backward into p.o .. p.dv.
absl::Status RunReference(HostProblem& p) {
  const Stream cpu = Stream::Cpu();
  const DType dt = p.q.View().dtype;
  p.o = Host(dt, p.qs);
  p.lse = Host(DType::kF32, p.ls);
  p.delta = Host(DType::kF32, p.ls);
  p.dq = Host(dt, p.qs);
  p.dk = Host(dt, p.ks);
  p.dv = Host(dt, p.ks);
  absl::Status st = AttentionForward(cpu, p.q.View(), p.k.View(), p.v.View(), p.s, p.skv, p.scale,
                                     p.o.View(), p.lse.View());
  if (!st.ok()) return st;
  return AttentionBackward(cpu, p.q.View(), p.k.View(), p.v.View(), p.o.View(), p.lse.View(),
                           p.d_o.View(), p.s, p.skv, p.scale, p.delta.View(), p.dq.View(),
                           p.dk.View(), p.dv.View());
}

// A problem's inputs on the GPU and its GPU outputs, poisoned until a run writes them.
struct GpuRun {
  explicit GpuRun(const HostProblem& p)
      : q(Upload(p.q)),
        k(Upload(p.k)),
        v(Upload(p.v)),
        d_o(Upload(p.d_o)),
        o(Poisoned(p.q.View().dtype, p.qs)),
        lse(Poisoned(DType::kF32, p.ls)),
        delta(Poisoned(DType::kF32, p.ls)) {
    PoisonGradients(p);
  }
  // Fresh poisoned dq, dk, dv (a second backward on the same forward).
  void PoisonGradients(const HostProblem& p) {
    const DType dt = p.q.View().dtype;
    dq = Poisoned(dt, p.qs);
    dk = Poisoned(dt, p.ks);
    dv = Poisoned(dt, p.ks);
  }
  // On the GPU with the current AttentionSettings. The backward consumes the GPU's own o and lse
  // (as training does). Neither synchronizes.
  absl::Status Forward(const HostProblem& p) {
    return AttentionForward(Stream{Device::Cuda(0), nullptr}, q.View(), k.View(), v.View(), p.s,
                            p.skv, p.scale, o.View(), lse.View());
  }
  absl::Status Backward(const HostProblem& p) {
    return AttentionBackward(Stream{Device::Cuda(0), nullptr}, q.View(), k.View(), v.View(),
                             o.View(), lse.View(), d_o.View(), p.s, p.skv, p.scale, delta.View(),
                             dq.View(), dk.View(), dv.View());
  }
  // Every output against the CPU reference within `tol`; delta only when `with_delta` (it is
  // scratch: only the native backward leaves rowsum(dO * O) in it).
  void ExpectMatches(const HostProblem& p, double tol, bool with_delta) const {
    ExpectClose(o.View(), p.o.View(), tol, "o");
    ExpectClose(lse.View(), p.lse.View(), tol, "lse");
    if (with_delta) ExpectClose(delta.View(), p.delta.View(), tol, "delta");
    ExpectClose(dq.View(), p.dq.View(), tol, "dq");
    ExpectClose(dk.View(), p.dk.View(), tol, "dk");
    ExpectClose(dv.View(), p.dv.View(), tol, "dv");
  }

  Buffer q, k, v, d_o;
  Buffer o, lse, delta, dq, dk, dv;
};

// Elements [from, to) of a and b are equal (bf16 outputs widen to float exactly).
bool SameRange(const std::vector<float>& a, const std::vector<float>& b, size_t from, size_t to) {
  return std::equal(a.begin() + from, a.begin() + to, b.begin() + from);
}

// Replaces key and value row `row` (of the flattened [B * Skv] rows) with fresh random values.
void PerturbKeyValueRow(Buffer& k, Buffer& v, int64_t row, std::mt19937_64& rng) {
  const Tensor kt = k.View();
  const int64_t hkv = kt.shape[1], d = kt.shape[2];
  Buffer noise = Host(kt.dtype, {1, hkv, d});
  const size_t row_bytes = static_cast<size_t>(hkv * d) * DTypeSize(kt.dtype);
  for (Buffer* x : {&k, &v}) {
    testing::FillRandom(noise.View(), rng);
    std::memcpy(static_cast<char*>(x->View().data) + row * row_bytes, noise.View().data, row_bytes);
  }
}

TEST(AttentionGpuTest, CudnnLoads) {
  SY_REQUIRE_GPU();
  absl::StatusOr<std::string> loaded = internal::LoadCudnn();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::printf("%s; default backend: %s\n", loaded->c_str(), DescribeAttentionBackend().c_str());
}

TEST(AttentionGpuTest, MatchesCpuReference) {
  SY_REQUIRE_GPU();
  SettingsGuard guard;
  std::mt19937_64 rng(std::random_device{}());
  struct Case {
    int64_t b, s, hq, hkv, d;
  };
  const Case cases[] = {{1, 1, 1, 1, 64},     {2, 37, 4, 2, 64},    {1, 37, 2, 2, 128},
                        {1, 200, 4, 1, 128},  {2, 200, 2, 2, 64},   {1, 512, 8, 2, 128},
                        {2, 1000, 4, 2, 64},  {1, 1000, 2, 1, 128}, {1, 2048, 4, 4, 64},
                        {1, 2048, 4, 2, 128}, {1, 4096, 2, 1, 128}};
  for (const Case& c : cases) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      if (dt == DType::kF32 && c.s > 1000) continue;  // the SIMT f32 path: keep the test short
      const double tol = dt == DType::kBF16 ? 1e-2 : 1e-5;
      std::printf("Attention B=%lld S=%lld Hq=%lld Hkv=%lld D=%lld %s\n", (long long)c.b,
                  (long long)c.s, (long long)c.hq, (long long)c.hkv, (long long)c.d, DTypeName(dt));
      HostProblem p = RandomProblem(dt, c.b, c.s, c.s, c.hq, c.hkv, c.d, rng);
      ASSERT_TRUE(RunReference(p).ok());
      const std::vector<std::pair<AttentionSettings, AttentionSettings>> pairs =
          dt == DType::kBF16
              ? std::vector<std::pair<AttentionSettings, AttentionSettings>>{{kNative, kNative},
                                                                             {kCudnn, kCudnn},
                                                                             {kCudnnAtomic,
                                                                              kCudnnAtomic},
                                                                             {kCudnn, kNative},
                                                                             {kNative, kCudnn}}
              : std::vector<std::pair<AttentionSettings, AttentionSettings>>{{kNative, kNative}};
      for (const auto& [fwd, bwd] : pairs) {
        std::printf(
            "  forward %s, backward %s%s\n", AttentionBackendName(fwd.backend),
            AttentionBackendName(bwd.backend),
            bwd.backend == AttentionBackend::kCudnn && !bwd.deterministic ? " (atomic dQ)" : "");
        GpuRun g(p);
        SetAttentionSettings(fwd);
        absl::Status st = g.Forward(p);
        if (fwd.backend == AttentionBackend::kCudnn && absl::IsFailedPrecondition(st) &&
            c.s < 512) {
          // cuDNN may decline a small or odd shape (auto then runs the native kernels); the
          // model's shapes (S >= 512, D = 128, GQA) must run on it.
          std::printf("  cuDNN declined this case: %s\n", std::string(st.message()).c_str());
          continue;
        }
        ASSERT_TRUE(st.ok()) << st;
        SetAttentionSettings(bwd);
        st = g.Backward(p);
        if (bwd.backend == AttentionBackend::kCudnn && absl::IsFailedPrecondition(st) &&
            c.s < 512) {
          std::printf("  cuDNN declined this case: %s\n", std::string(st.message()).c_str());
          continue;
        }
        ASSERT_TRUE(st.ok()) << st;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        g.ExpectMatches(p, tol, /*with_delta=*/bwd.backend == AttentionBackend::kNative);
      }
      SetAttentionSettings(AttentionSettings{});
    }
  }
}

// Same inputs twice: bitwise identical gradients (native: no atomics; cuDNN: its deterministic
// algorithm, AttentionSettings::deterministic).
TEST(AttentionGpuTest, BackwardIsDeterministic) {
  SY_REQUIRE_GPU();
  SettingsGuard guard;
  for (const AttentionSettings& settings : {kNative, kCudnn}) {
    SetAttentionSettings(settings);
    std::mt19937_64 rng(std::random_device{}());
    const HostProblem p = RandomProblem(DType::kBF16, /*b=*/2, /*s=*/100, /*skv=*/100, /*hq=*/8,
                                        /*hkv=*/2, /*d=*/128, rng);
    GpuRun g(p);
    ASSERT_TRUE(g.Forward(p).ok());
    std::vector<float> first[3];
    for (int run = 0; run < 2; ++run) {
      g.PoisonGradients(p);
      ASSERT_TRUE(g.Backward(p).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const Tensor outs[3] = {g.dq.View(), g.dk.View(), g.dv.View()};
      for (int i = 0; i < 3; ++i) {
        std::vector<float> now = testing::ToFloatVector(outs[i]);
        if (run == 0) {
          first[i] = std::move(now);
        } else {
          EXPECT_EQ(now, first[i]) << "gradient " << i << " differs between runs";
        }
      }
    }
    std::printf("%s backward deterministic over 2 runs (B=2 S=100 Hq=8 Hkv=2 D=128 bf16)\n",
                AttentionBackendName(settings.backend));
  }
}

// Changing key/value row j of sequence 0 must not change o or dq of its rows < j, nor anything of
// sequence 1 (bitwise), and must change some later row of sequence 0.
TEST(AttentionGpuTest, FutureKeysAndOtherSequencesDoNotLeak) {
  SY_REQUIRE_GPU();
  SettingsGuard guard;
  std::mt19937_64 rng(std::random_device{}());
  for (const AttentionSettings& settings : {kNative, kCudnn})
    for (int64_t d : {64, 128}) {
      SetAttentionSettings(settings);
      const int64_t b = 2, s = 300, hq = 4, hkv = 2, t_n = b * s, j = 150;
      HostProblem p = RandomProblem(DType::kBF16, b, s, s, hq, hkv, d, rng);
      std::vector<float> o_run[2], dq_run[2], dk_run[2];
      for (int run = 0; run < 2; ++run) {
        if (run == 1) PerturbKeyValueRow(p.k, p.v, j, rng);  // row j of sequence 0
        GpuRun g(p);
        ASSERT_TRUE(g.Forward(p).ok());
        ASSERT_TRUE(g.Backward(p).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        o_run[run] = testing::ToFloatVector(g.o.View());
        dq_run[run] = testing::ToFloatVector(g.dq.View());
        dk_run[run] = testing::ToFloatVector(g.dk.View());
      }
      const size_t q_row = static_cast<size_t>(hq * d), k_row = static_cast<size_t>(hkv * d);
      EXPECT_TRUE(SameRange(o_run[0], o_run[1], 0, j * q_row))
          << "o of rows before the changed key";
      EXPECT_TRUE(SameRange(dq_run[0], dq_run[1], 0, j * q_row))
          << "dq of rows before the changed key";
      EXPECT_TRUE(SameRange(o_run[0], o_run[1], s * q_row, t_n * q_row))
          << "o of the other sequence";
      EXPECT_TRUE(SameRange(dq_run[0], dq_run[1], s * q_row, t_n * q_row))
          << "dq of the other sequence";
      EXPECT_TRUE(SameRange(dk_run[0], dk_run[1], s * k_row, t_n * k_row))
          << "dk of the other sequence";
      EXPECT_FALSE(SameRange(o_run[0], o_run[1], j * q_row, s * q_row))
          << "o ignored the changed key";
      std::printf(
          "%s: causal/sequence isolation holds (B=2 S=300 Hq=4 Hkv=2 D=%lld bf16, key %lld)\n",
          AttentionBackendName(settings.backend), static_cast<long long>(d),
          static_cast<long long>(j));
    }
}

TEST(AttentionGpuTest, RejectsUnsupportedHeadDim) {
  SY_REQUIRE_GPU();
  const Stream gpu{Device::Cuda(0), nullptr};
  Buffer q = Poisoned(DType::kBF16, {4, 2, 32}), k = Poisoned(DType::kBF16, {4, 1, 32});
  Buffer lse = Poisoned(DType::kF32, {1, 2, 4});
  EXPECT_EQ(
      AttentionForward(gpu, q.View(), k.View(), k.View(), 4, 0.1f, q.View(), lse.View()).code(),
      absl::StatusCode::kInvalidArgument);
}

// Bottom-right causal mode (kv_seq_len > seq_len; context parallelism's chunks): query row i sees
// keys j <= i + (Skv - S). At CP-like shapes (a chunk of S queries against the (j+1)·S key prefix
// that ends at its own end: CP2 chunk ids 0..3, CP4 chunk 7) and at ragged ones (offsets and
// lengths that are not multiples of any tile: 37 queries against 111 keys, 100 against 300, ...)
// every CUDA path must match the fp64 CPU reference, forward (o, lse) and backward (dq, dk, dv,
// and delta on the native path), from fresh random inputs into poisoned outputs:
//   native bf16 (tensor-core kernels), tolerance 1e-2;
//   native f32 (SIMT kernels), tolerance 1e-5;
//   cuDNN bf16 (both dQ algorithms) on the tile-aligned cases, tolerance 1e-2.
TEST(AttentionGpuTest, BottomRightMatchesCpuReference) {
  SY_REQUIRE_GPU();
  SettingsGuard guard;
  std::mt19937_64 rng(std::random_device{}());
  struct Case {
    int64_t b, s, skv, hq, hkv, d;
    bool cudnn;  // cuDNN may decline ragged shapes; the native kernels must not
  };
  const Case cases[] = {
      {1, 512, 1024, 8, 2, 128, true},  // CP2, chunk 1
      {1, 512, 2048, 4, 1, 128, true},  // CP2, chunk 3 (the last), one KV head
      {2, 256, 768, 4, 2, 64, true},    // CP2, chunk 2, two sequences
      {1, 256, 2048, 4, 2, 64, true},   // CP4, chunk 7
      {1, 1024, 4096, 2, 2, 128, true},
      {1, 512, 512, 4, 2, 128, true},  // skv == s: the square mask still
      {1, 37, 111, 4, 2, 64, false},   // ragged: offset 74 is no tile multiple
      {2, 100, 300, 4, 1, 128, false},
      {1, 1, 65, 2, 1, 64, false},  // one query row sees every key
      {1, 130, 131, 2, 2, 128, false},
  };
  for (const Case& c : cases) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      const double tol = dt == DType::kBF16 ? 1e-2 : 1e-5;
      std::printf("Bottom-right attention B=%lld S=%lld Skv=%lld Hq=%lld Hkv=%lld D=%lld %s\n",
                  (long long)c.b, (long long)c.s, (long long)c.skv, (long long)c.hq,
                  (long long)c.hkv, (long long)c.d, DTypeName(dt));
      HostProblem p = RandomProblem(dt, c.b, c.s, c.skv, c.hq, c.hkv, c.d, rng);
      ASSERT_TRUE(RunReference(p).ok());
      std::vector<AttentionSettings> runs = {kNative};
      if (dt == DType::kBF16 && c.cudnn) {
        runs.push_back(kCudnn);
        runs.push_back(kCudnnAtomic);
      }
      for (const AttentionSettings& settings : runs) {
        const bool native = settings.backend == AttentionBackend::kNative;
        SCOPED_TRACE(native ? "native" : (settings.deterministic ? "cudnn" : "cudnn atomic"));
        GpuRun g(p);
        SetAttentionSettings(settings);
        absl::Status st = g.Forward(p);
        ASSERT_TRUE(st.ok()) << st;
        st = g.Backward(p);
        ASSERT_TRUE(st.ok()) << st;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        g.ExpectMatches(p, tol, /*with_delta=*/native);
      }
    }
  }
}

// The bottom-right mask's boundary and isolation, bitwise (independent of the CPU reference's
// tolerance): B = 2 sequences of S = 256 queries against Skv = 768 keys (CP2, chunk 2: off = 512).
// Changing key/value row j = 600 of sequence 0 must leave o and dq of its query rows < j - off =
// 88 bitwise unchanged (row 88 is mid-tile for both kernels' 128-row and 64-key tiles, so the
// per-element mask, not a whole-tile skip, decides), leave o, dq and dk of sequence 1 bitwise
// unchanged, and change o of some row >= 88 of sequence 0. On the unchanged inputs the backward
// runs twice and must give bitwise identical dq, dk, dv (native: no atomics; cuDNN: its
// deterministic dQ algorithm). bf16, native and cuDNN, D = 64 and 128, GQA 4:2.
TEST(AttentionGpuTest, BottomRightMaskIsolatesAndIsDeterministic) {
  SY_REQUIRE_GPU();
  SettingsGuard guard;
  std::mt19937_64 rng(std::random_device{}());
  for (const AttentionSettings& settings : {kNative, kCudnn})
    for (int64_t d : {64, 128}) {
      SetAttentionSettings(settings);
      SCOPED_TRACE(absl::StrCat(AttentionBackendName(settings.backend), " D=", d));
      const int64_t b = 2, s = 256, skv = 768, off = skv - s, hq = 4, hkv = 2, j = 600;
      const int64_t first_seen = j - off;  // the first query row of sequence 0 that sees key j
      HostProblem p = RandomProblem(DType::kBF16, b, s, skv, hq, hkv, d, rng);
      std::vector<float> o_run[2], dq_run[2], dk_run[2];
      for (int run = 0; run < 2; ++run) {
        if (run == 1) PerturbKeyValueRow(p.k, p.v, j, rng);  // row j of sequence 0
        GpuRun g(p);
        absl::Status st = g.Forward(p);
        ASSERT_TRUE(st.ok()) << st;
        // Run 0: the backward twice on the same inputs (determinism); run 1: once.
        std::vector<float> grads[2][3];
        for (int rep = 0; rep < (run == 0 ? 2 : 1); ++rep) {
          g.PoisonGradients(p);
          st = g.Backward(p);
          ASSERT_TRUE(st.ok()) << st;
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          grads[rep][0] = testing::ToFloatVector(g.dq.View());
          grads[rep][1] = testing::ToFloatVector(g.dk.View());
          grads[rep][2] = testing::ToFloatVector(g.dv.View());
        }
        if (run == 0) {
          for (int i = 0; i < 3; ++i) {
            EXPECT_EQ(grads[1][i], grads[0][i]) << "gradient " << i << " differs between runs";
          }
        }
        o_run[run] = testing::ToFloatVector(g.o.View());
        dq_run[run] = std::move(grads[0][0]);
        dk_run[run] = std::move(grads[0][1]);
      }
      const size_t q_row = static_cast<size_t>(hq * d), k_row = static_cast<size_t>(hkv * d);
      EXPECT_TRUE(SameRange(o_run[0], o_run[1], 0, first_seen * q_row))
          << "o of rows that do not see the changed key";
      EXPECT_TRUE(SameRange(dq_run[0], dq_run[1], 0, first_seen * q_row))
          << "dq of rows that do not see the changed key";
      EXPECT_TRUE(SameRange(o_run[0], o_run[1], s * q_row, b * s * q_row)) << "o of sequence 1";
      EXPECT_TRUE(SameRange(dq_run[0], dq_run[1], s * q_row, b * s * q_row)) << "dq of sequence 1";
      EXPECT_TRUE(SameRange(dk_run[0], dk_run[1], skv * k_row, b * skv * k_row))
          << "dk of sequence 1";
      EXPECT_FALSE(SameRange(o_run[0], o_run[1], first_seen * q_row, s * q_row))
          << "o ignored the changed key";
      std::printf(
          "%s: bottom-right isolation and deterministic backward hold (B=2 S=256 Skv=768 Hq=4 "
          "Hkv=2 D=%lld bf16, key %lld first seen by row %lld)\n",
          AttentionBackendName(settings.backend), static_cast<long long>(d),
          static_cast<long long>(j), static_cast<long long>(first_seen));
    }
}

}  // namespace
}  // namespace switchyard::kernels
