// CPU tests of causal GQA attention: the fp64 reference against a naive S x S formula written
// out here, an fp64 central finite-difference check of the backward, causality and sequence
// isolation, the bottom-right causal mode (q_len < kv_len, context parallelism) against the last
// rows of a square problem, and argument validation.
#include "kernels/attention/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention/attention_cudnn.h"
#include "kernels/runtime/buffer.h"
#include "kernels/testing/gpu.h"

namespace switchyard::kernels {
namespace {

struct Shape {
  int64_t b, s, hq, hkv, d;
  int64_t t() const { return b * s; }
};

Buffer Make(DType dt, std::vector<int64_t> shape) {
  return Buffer::ForTensor(dt, std::move(shape), Device::Cpu()).value();
}

struct Problem {
  Shape sh;
  float scale;
  Buffer q, k, v, o, lse;
  Problem(Shape s, DType dt, std::mt19937_64& rng)
      : sh(s),
        scale(1.0f / std::sqrt(static_cast<float>(s.d))),
        q(Make(dt, {s.t(), s.hq, s.d})),
        k(Make(dt, {s.t(), s.hkv, s.d})),
        v(Make(dt, {s.t(), s.hkv, s.d})),
        o(Make(dt, {s.t(), s.hq, s.d})),
        lse(Make(dt == DType::kF64 ? DType::kF64 : DType::kF32, {s.b, s.hq, s.s})) {
    testing::FillRandom(q.View(), rng);
    testing::FillRandom(k.View(), rng);
    testing::FillRandom(v.View(), rng);
  }
  absl::Status Forward() {
    return AttentionForward(Stream::Cpu(), q.View(), k.View(), v.View(), sh.s, scale, o.View(),
                            lse.View());
  }
};

std::vector<double> ToDouble(const Tensor& t) {
  std::vector<double> out(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = LoadAsDouble(t, i);
  return out;
}

// Naive reference: full masked S x S scores per (sequence, head), softmax, P V.
void NaiveForward(const Shape& sh, double scale, const std::vector<double>& q,
                  const std::vector<double>& k, const std::vector<double>& v,
                  std::vector<double>* o, std::vector<double>* lse) {
  o->assign(sh.t() * sh.hq * sh.d, 0.0);
  lse->assign(sh.b * sh.hq * sh.s, 0.0);
  const double kNegInf = -std::numeric_limits<double>::infinity();
  for (int64_t b = 0; b < sh.b; ++b) {
    for (int64_t h = 0; h < sh.hq; ++h) {
      const int64_t g = h * sh.hkv / sh.hq;
      std::vector<double> s(sh.s * sh.s, kNegInf);
      for (int64_t i = 0; i < sh.s; ++i) {
        for (int64_t j = 0; j < sh.s; ++j) {
          if (j > i) continue;
          double dot = 0;
          for (int64_t x = 0; x < sh.d; ++x) {
            dot += q[((b * sh.s + i) * sh.hq + h) * sh.d + x] *
                   k[((b * sh.s + j) * sh.hkv + g) * sh.d + x];
          }
          s[i * sh.s + j] = scale * dot;
        }
      }
      for (int64_t i = 0; i < sh.s; ++i) {
        double m = kNegInf, z = 0;
        for (int64_t j = 0; j < sh.s; ++j) m = std::max(m, s[i * sh.s + j]);
        for (int64_t j = 0; j < sh.s; ++j) z += std::exp(s[i * sh.s + j] - m);
        (*lse)[(b * sh.hq + h) * sh.s + i] = m + std::log(z);
        for (int64_t j = 0; j < sh.s; ++j) {
          const double p = std::exp(s[i * sh.s + j] - m) / z;
          for (int64_t x = 0; x < sh.d; ++x) {
            (*o)[((b * sh.s + i) * sh.hq + h) * sh.d + x] +=
                p * v[((b * sh.s + j) * sh.hkv + g) * sh.d + x];
          }
        }
      }
    }
  }
}

double MaxAbsDiff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

TEST(AttentionTest, ForwardMatchesNaiveFormula) {
  std::mt19937_64 rng(std::random_device{}());
  for (const Shape sh :
       {Shape{2, 7, 4, 2, 8}, Shape{1, 1, 1, 1, 4}, Shape{3, 5, 6, 1, 3}, Shape{1, 9, 2, 2, 16}}) {
    for (DType dt : {DType::kF64, DType::kF32, DType::kBF16}) {
      Problem p(sh, dt, rng);
      ASSERT_TRUE(p.Forward().ok());
      std::vector<double> o, lse;
      NaiveForward(sh, p.scale, ToDouble(p.q.View()), ToDouble(p.k.View()), ToDouble(p.v.View()),
                   &o, &lse);
      const double tol = dt == DType::kF64 ? 1e-12 : dt == DType::kF32 ? 1e-5 : 1e-2;
      std::vector<float> of(o.begin(), o.end()), lf(lse.begin(), lse.end());
      const double err_o = testing::RelativeError(testing::ToFloatVector(p.o.View()), of);
      const double err_l = testing::RelativeError(testing::ToFloatVector(p.lse.View()), lf);
      const double abs_o = MaxAbsDiff(ToDouble(p.o.View()), o);
      std::printf(
          "B=%lld S=%lld Hq=%lld Hkv=%lld D=%lld %s: o rel %.3g (max abs %.3g), lse rel "
          "%.3g (tol %.0e)\n",
          (long long)sh.b, (long long)sh.s, (long long)sh.hq, (long long)sh.hkv, (long long)sh.d,
          DTypeName(dt), err_o, abs_o, err_l, tol);
      EXPECT_LT(err_o, tol);
      EXPECT_LT(err_l, tol);
      if (dt == DType::kF64) {
        EXPECT_LT(abs_o, 1e-12);
      }
    }
  }
}

TEST(AttentionTest, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(std::random_device{}());
  const Shape sh{2, 5, 4, 2, 4};
  Problem p(sh, DType::kF64, rng);
  ASSERT_TRUE(p.Forward().ok());
  // Loss = sum(w * o), so dLoss/do = w.
  Buffer w = Make(DType::kF64, {sh.t(), sh.hq, sh.d});
  testing::FillRandom(w.View(), rng);
  Buffer delta = Make(DType::kF64, {sh.b, sh.hq, sh.s});
  Buffer dq = Make(DType::kF64, {sh.t(), sh.hq, sh.d});
  Buffer dk = Make(DType::kF64, {sh.t(), sh.hkv, sh.d});
  Buffer dv = Make(DType::kF64, {sh.t(), sh.hkv, sh.d});
  ASSERT_TRUE(AttentionBackward(Stream::Cpu(), p.q.View(), p.k.View(), p.v.View(), p.o.View(),
                                p.lse.View(), w.View(), sh.s, p.scale, delta.View(), dq.View(),
                                dk.View(), dv.View())
                  .ok());
  const double* wd = w.View().as<double>();
  auto loss = [&]() {
    EXPECT_TRUE(p.Forward().ok());
    const double* od = p.o.View().as<double>();
    double l = 0;
    for (int64_t i = 0; i < p.o.View().numel(); ++i) l += wd[i] * od[i];
    return l;
  };
  // delta must equal rowsum(dO * o) of the forward output.
  {
    double max_err = 0;
    const double* od = p.o.View().as<double>();
    for (int64_t t = 0; t < sh.t(); ++t) {
      for (int64_t h = 0; h < sh.hq; ++h) {
        double s = 0;
        for (int64_t x = 0; x < sh.d; ++x)
          s += wd[(t * sh.hq + h) * sh.d + x] * od[(t * sh.hq + h) * sh.d + x];
        const int64_t b = t / sh.s, i = t % sh.s;
        max_err =
            std::max(max_err, std::abs(s - delta.View().as<double>()[(b * sh.hq + h) * sh.s + i]));
      }
    }
    std::printf("delta vs rowsum(dO * o): max abs err %.3g (tol 1e-12)\n", max_err);
    EXPECT_LT(max_err, 1e-12);
  }
  constexpr double kEps = 1e-6, kTol = 1e-7;
  for (auto [name, x, g] :
       {std::tuple{"dq", &p.q, &dq}, std::tuple{"dk", &p.k, &dk}, std::tuple{"dv", &p.v, &dv}}) {
    double* xd = x->View().template as<double>();
    const double* gd = g->View().template as<double>();
    double max_err = 0, max_grad = 0;
    for (int64_t i = 0; i < x->View().numel(); ++i) {
      const double x0 = xd[i];
      xd[i] = x0 + kEps;
      const double lp = loss();
      xd[i] = x0 - kEps;
      const double lm = loss();
      xd[i] = x0;
      const double fd = (lp - lm) / (2 * kEps);
      max_err = std::max(max_err, std::abs(fd - gd[i]));
      max_grad = std::max(max_grad, std::abs(gd[i]));
    }
    std::printf("%s: max |fd - analytic| %.3g (max |grad| %.3g, tol %.0e)\n", name, max_err,
                max_grad, kTol);
    EXPECT_LT(max_err, kTol) << name;
    EXPECT_GT(max_grad, 1e-3) << name;
  }
}

TEST(AttentionTest, CausalAndSequencesIndependent) {
  std::mt19937_64 rng(std::random_device{}());
  const Shape sh{2, 6, 4, 2, 8};
  Problem p(sh, DType::kF64, rng);
  ASSERT_TRUE(p.Forward().ok());
  const std::vector<double> before = ToDouble(p.o.View());
  constexpr int64_t kChanged = 3;  // token 3 of sequence 0
  for (Buffer* b : {&p.q, &p.k, &p.v}) {
    const Tensor t = b->View();
    const int64_t row = t.dim(1) * t.dim(2);
    for (int64_t x = 0; x < row; ++x) t.as<double>()[kChanged * row + x] += 1.5;
  }
  ASSERT_TRUE(p.Forward().ok());
  const std::vector<double> after = ToDouble(p.o.View());
  const int64_t row = sh.hq * sh.d;
  for (int64_t t = 0; t < sh.t(); ++t) {
    const bool may_change = t >= kChanged && t < sh.s;
    double diff = 0;
    for (int64_t x = 0; x < row; ++x)
      diff = std::max(diff, std::abs(after[t * row + x] - before[t * row + x]));
    if (may_change) {
      EXPECT_GT(diff, 0.0) << "token " << t;
    } else {
      EXPECT_EQ(diff, 0.0) << "token " << t << " changed although it cannot see token " << kChanged;
    }
  }
}

// Bottom-right causal mode: S queries that are the LAST S positions of a Skv-long sequence. The
// brute-force reference is the square problem over the whole Skv-long sequence (the naive formula
// above for the forward, the square backward with d_o zero on the first Skv - S rows): its last S
// rows of o, lse, dq, and all of dk, dv must be what the bottom-right call returns.
TEST(AttentionTest, BottomRightMatchesTheLastRowsOfTheSquareProblem) {
  std::mt19937_64 rng(std::random_device{}());
  struct Case {
    int64_t b, s, skv, hq, hkv, d;
  };
  for (const Case c : {Case{2, 3, 8, 4, 2, 8}, Case{1, 4, 4, 2, 1, 4}, Case{3, 2, 10, 6, 3, 5},
                       Case{1, 1, 7, 2, 2, 16}}) {
    const Shape full{c.b, c.skv, c.hq, c.hkv, c.d};
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    const int64_t off = c.skv - c.s;
    Buffer qf = Make(DType::kF64, {c.b * c.skv, c.hq, c.d});
    Buffer k = Make(DType::kF64, {c.b * c.skv, c.hkv, c.d});
    Buffer v = Make(DType::kF64, {c.b * c.skv, c.hkv, c.d});
    Buffer dof = Make(DType::kF64, {c.b * c.skv, c.hq, c.d});
    testing::FillRandom(qf.View(), rng);
    testing::FillRandom(k.View(), rng);
    testing::FillRandom(v.View(), rng);
    testing::FillRandom(dof.View(), rng);
    // The queries of the bottom-right call: rows [off, skv) of every sequence; d_o likewise, and
    // zero on the other rows of the square problem (so they add nothing to dk, dv).
    const int64_t row = c.hq * c.d;
    Buffer q = Make(DType::kF64, {c.b * c.s, c.hq, c.d});
    Buffer d_o = Make(DType::kF64, {c.b * c.s, c.hq, c.d});
    for (int64_t b = 0; b < c.b; ++b) {
      for (int64_t i = 0; i < c.skv; ++i) {
        for (int64_t x = 0; x < row; ++x) {
          const int64_t f = (b * c.skv + i) * row + x;
          if (i < off) {
            dof.View().as<double>()[f] = 0.0;
          } else {
            const int64_t l = (b * c.s + i - off) * row + x;
            q.View().as<double>()[l] = qf.View().as<double>()[f];
            d_o.View().as<double>()[l] = dof.View().as<double>()[f];
          }
        }
      }
    }
    // Brute force: the naive square formula, and the square backward.
    std::vector<double> o_ref, lse_ref;
    NaiveForward(full, scale, ToDouble(qf.View()), ToDouble(k.View()), ToDouble(v.View()), &o_ref,
                 &lse_ref);
    Buffer of = Make(DType::kF64, {c.b * c.skv, c.hq, c.d});
    Buffer lsef = Make(DType::kF64, {c.b, c.hq, c.skv}),
           deltaf = Make(DType::kF64, {c.b, c.hq, c.skv});
    Buffer dqf = Make(DType::kF64, {c.b * c.skv, c.hq, c.d});
    Buffer dkf = Make(DType::kF64, {c.b * c.skv, c.hkv, c.d});
    Buffer dvf = Make(DType::kF64, {c.b * c.skv, c.hkv, c.d});
    ASSERT_TRUE(AttentionForward(Stream::Cpu(), qf.View(), k.View(), v.View(), c.skv, scale,
                                 of.View(), lsef.View())
                    .ok());
    ASSERT_TRUE(AttentionBackward(Stream::Cpu(), qf.View(), k.View(), v.View(), of.View(),
                                  lsef.View(), dof.View(), c.skv, scale, deltaf.View(), dqf.View(),
                                  dkf.View(), dvf.View())
                    .ok());

    // Bottom-right, outputs poisoned first.
    Buffer o = Make(DType::kF64, {c.b * c.s, c.hq, c.d}), lse = Make(DType::kF64, {c.b, c.hq, c.s});
    Buffer delta = Make(DType::kF64, {c.b, c.hq, c.s});
    Buffer dq = Make(DType::kF64, {c.b * c.s, c.hq, c.d});
    Buffer dk = Make(DType::kF64, {c.b * c.skv, c.hkv, c.d});
    Buffer dv = Make(DType::kF64, {c.b * c.skv, c.hkv, c.d});
    for (Buffer* t : {&o, &lse, &dq, &dk, &dv}) {
      for (int64_t i = 0; i < t->View().numel(); ++i) t->View().as<double>()[i] = 1e30;
    }
    ASSERT_TRUE(AttentionForward(Stream::Cpu(), q.View(), k.View(), v.View(), c.s, c.skv, scale,
                                 o.View(), lse.View())
                    .ok());
    ASSERT_TRUE(AttentionBackward(Stream::Cpu(), q.View(), k.View(), v.View(), o.View(), lse.View(),
                                  d_o.View(), c.s, c.skv, scale, delta.View(), dq.View(), dk.View(),
                                  dv.View())
                    .ok());
    // NaN-safe: a NaN difference (an output left unwritten or poisoned) counts as infinite.
    double worst = 0;
    auto diff = [&worst](double a, double b) {
      const double e = std::abs(a - b);
      worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(worst, e);
    };
    for (int64_t b = 0; b < c.b; ++b) {
      for (int64_t i = 0; i < c.s; ++i) {
        for (int64_t x = 0; x < row; ++x) {
          const int64_t l = (b * c.s + i) * row + x, f = (b * c.skv + i + off) * row + x;
          diff(o.View().as<double>()[l], o_ref[f]);
          diff(dq.View().as<double>()[l], dqf.View().as<double>()[f]);
        }
        for (int64_t h = 0; h < c.hq; ++h) {
          diff(lse.View().as<double>()[(b * c.hq + h) * c.s + i],
               lse_ref[(b * c.hq + h) * c.skv + i + off]);
        }
      }
    }
    for (int64_t i = 0; i < dk.View().numel(); ++i) {
      diff(dk.View().as<double>()[i], dkf.View().as<double>()[i]);
      diff(dv.View().as<double>()[i], dvf.View().as<double>()[i]);
    }
    std::printf("bottom-right B=%lld S=%lld Skv=%lld Hq=%lld Hkv=%lld D=%lld: max |diff| %.2e\n",
                (long long)c.b, (long long)c.s, (long long)c.skv, (long long)c.hq, (long long)c.hkv,
                (long long)c.d, worst);
    EXPECT_LE(worst, 1e-12);
  }
  // kv_seq_len < seq_len, and k rows that do not match B·Skv, are rejected.
  std::mt19937_64 r2(3);
  Problem p(Shape{2, 4, 4, 2, 4}, DType::kF32, r2);
  EXPECT_EQ(AttentionForward(Stream::Cpu(), p.q.View(), p.k.View(), p.v.View(), 4, 2, p.scale,
                             p.o.View(), p.lse.View())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AttentionForward(Stream::Cpu(), p.q.View(), p.k.View(), p.v.View(), 4, 6, p.scale,
                             p.o.View(), p.lse.View())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AttentionTest, RejectsBadArguments) {
  std::mt19937_64 rng(1);
  Problem p(Shape{2, 4, 3, 2, 4}, DType::kF32, rng);  // Hq % Hkv != 0
  EXPECT_EQ(p.Forward().code(), absl::StatusCode::kInvalidArgument);
  Problem ok(Shape{2, 4, 4, 2, 4}, DType::kF32, rng);
  EXPECT_EQ(AttentionForward(Stream::Cpu(), ok.q.View(), ok.k.View(), ok.v.View(), 3, ok.scale,
                             ok.o.View(), ok.lse.View())
                .code(),
            absl::StatusCode::kInvalidArgument);  // seq_len does not divide T
  Buffer bad_lse = Make(DType::kF32, {2, 4, 5});
  EXPECT_EQ(AttentionForward(Stream::Cpu(), ok.q.View(), ok.k.View(), ok.v.View(), 4, ok.scale,
                             ok.o.View(), bad_lse.View())
                .code(),
            absl::StatusCode::kInvalidArgument);
  Buffer bad_o = Make(DType::kBF16, {8, 4, 4});
  EXPECT_EQ(AttentionForward(Stream::Cpu(), ok.q.View(), ok.k.View(), ok.v.View(), 4, ok.scale,
                             bad_o.View(), ok.lse.View())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ok.Forward().ok());
}

TEST(AttentionBackendTest, SettingsFromEnvironment) {
  unsetenv("SWITCHYARD_ATTENTION_BACKEND");
  unsetenv("SWITCHYARD_ATTENTION_DETERMINISTIC");
  absl::StatusOr<AttentionSettings> s = AttentionSettingsFromEnvironment();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->backend, AttentionBackend::kAuto);
  EXPECT_FALSE(s->deterministic);

  setenv("SWITCHYARD_ATTENTION_BACKEND", "native", 1);
  setenv("SWITCHYARD_ATTENTION_DETERMINISTIC", "1", 1);
  s = AttentionSettingsFromEnvironment();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->backend, AttentionBackend::kNative);
  EXPECT_TRUE(s->deterministic);

  setenv("SWITCHYARD_ATTENTION_BACKEND", "flash", 1);
  s = AttentionSettingsFromEnvironment();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("SWITCHYARD_ATTENTION_BACKEND"), std::string::npos)
      << s.status();
  EXPECT_NE(s.status().message().find("auto, cudnn, native"), std::string::npos) << s.status();
  std::printf("bad backend: %s\n", std::string(s.status().message()).c_str());

  setenv("SWITCHYARD_ATTENTION_BACKEND", "cudnn", 1);
  setenv("SWITCHYARD_ATTENTION_DETERMINISTIC", "yes", 1);
  s = AttentionSettingsFromEnvironment();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("SWITCHYARD_ATTENTION_DETERMINISTIC"), std::string::npos);
  unsetenv("SWITCHYARD_ATTENTION_BACKEND");
  unsetenv("SWITCHYARD_ATTENTION_DETERMINISTIC");
}

// A job's settings (model.attention_backend, training.deterministic_mode) stand unless a variable
// is set; each variable that changes a spec value overrides it and says so (one line each).
TEST(AttentionBackendTest, EnvironmentOverridesTheSpecAndSaysSo) {
  unsetenv("SWITCHYARD_ATTENTION_BACKEND");
  unsetenv("SWITCHYARD_ATTENTION_DETERMINISTIC");
  const AttentionSettings spec{AttentionBackend::kCudnn, true};
  std::vector<std::string> lines;
  absl::StatusOr<AttentionSettings> s = ResolveAttentionSettings(spec, &lines);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->backend, AttentionBackend::kCudnn);
  EXPECT_TRUE(s->deterministic);
  EXPECT_TRUE(lines.empty());

  setenv("SWITCHYARD_ATTENTION_BACKEND", "native", 1);
  setenv("SWITCHYARD_ATTENTION_DETERMINISTIC", "0", 1);
  s = ResolveAttentionSettings(spec, &lines);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->backend, AttentionBackend::kNative);
  EXPECT_FALSE(s->deterministic);
  ASSERT_EQ(lines.size(), 2u);
  for (const std::string& line : lines) std::printf("override: %s\n", line.c_str());
  EXPECT_EQ(lines[0],
            "SWITCHYARD_ATTENTION_BACKEND=native overrides model.attention_backend \"cudnn\"");
  EXPECT_EQ(lines[1],
            "SWITCHYARD_ATTENTION_DETERMINISTIC=0 overrides training.deterministic_mode (true)");

  // A variable equal to the spec's value changes nothing and logs nothing.
  lines.clear();
  setenv("SWITCHYARD_ATTENTION_BACKEND", "cudnn", 1);
  unsetenv("SWITCHYARD_ATTENTION_DETERMINISTIC");
  s = ResolveAttentionSettings(spec, &lines);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->backend, AttentionBackend::kCudnn);
  EXPECT_TRUE(s->deterministic);
  EXPECT_TRUE(lines.empty());

  setenv("SWITCHYARD_ATTENTION_BACKEND", "flash", 1);
  s = ResolveAttentionSettings(spec, &lines);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("SWITCHYARD_ATTENTION_BACKEND"), std::string::npos);
  unsetenv("SWITCHYARD_ATTENTION_BACKEND");
}

// The CPU path is the fp64 reference whatever the backend setting says.
TEST(AttentionBackendTest, CpuIgnoresBackend) {
  std::mt19937_64 rng(std::random_device{}());
  const Shape sh{1, 9, 2, 1, 8};
  Problem a(sh, DType::kF64, rng);
  Buffer o2 = Make(DType::kF64, {sh.t(), sh.hq, sh.d}), lse2 = Make(DType::kF64, {1, 2, 9});
  SetAttentionSettings({AttentionBackend::kCudnn, true});
  ASSERT_TRUE(AttentionForward(Stream::Cpu(), a.q.View(), a.k.View(), a.v.View(), sh.s, a.scale,
                               a.o.View(), a.lse.View())
                  .ok());
  SetAttentionSettings({AttentionBackend::kNative, true});
  ASSERT_TRUE(AttentionForward(Stream::Cpu(), a.q.View(), a.k.View(), a.v.View(), sh.s, a.scale,
                               o2.View(), lse2.View())
                  .ok());
  SetAttentionSettings(AttentionSettings{});
  EXPECT_EQ(testing::ToFloatVector(a.o.View()), testing::ToFloatVector(o2.View()));
}

// libcudnn is found through the loader's path (the CUDA toolkit's cuDNN 9 here) without a GPU.
TEST(AttentionBackendTest, LoadsCudnnWithoutGpu) {
  absl::StatusOr<std::string> loaded = internal::LoadCudnn();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_NE(loaded->find("cuDNN 9"), std::string::npos) << *loaded;
  const std::string described = DescribeAttentionBackend();
  std::printf("LoadCudnn: %s\nDescribeAttentionBackend: %s\n", loaded->c_str(), described.c_str());
  EXPECT_NE(described.find("cuDNN 9"), std::string::npos) << described;
}

}  // namespace
}  // namespace switchyard::kernels
