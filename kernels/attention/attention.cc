// Validation, device dispatch and the fp64 CPU reference of causal GQA attention.
#include "kernels/attention/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/attention/attention_cudnn.h"

namespace switchyard::kernels {
namespace {

// s_n: query rows per sequence; kv_n: key rows per sequence (kv_n >= s_n); query i of a
// sequence sees keys j <= i + (kv_n - s_n) (bottom-right aligned causal mask).
struct Dims {
  int64_t t_n, b_n, s_n, hq, hkv, d, kv_n;
};

bool IsActivation(const Stream& stream, DType d) {
  return d == DType::kBF16 || d == DType::kF32 || (!stream.is_cuda() && d == DType::kF64);
}
bool IsStat(const Stream& stream, DType d) {
  return d == DType::kF32 || (!stream.is_cuda() && d == DType::kF64);
}

absl::StatusOr<Dims> CheckShapes(const Stream& stream, absl::string_view op, const Tensor& q,
                                 const Tensor& k, const Tensor& v, int64_t seq_len,
                                 int64_t kv_seq_len, float scale) {
  if (seq_len <= 0 || kv_seq_len < seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": seq_len (", seq_len, ") must be > 0 and <= kv_seq_len (", kv_seq_len, ")"));
  }
  if (q.rank() != 3 || k.rank() != 3 || k.shape != v.shape ||
      (q.dim(0) % seq_len == 0 && q.dim(0) / seq_len * kv_seq_len != k.dim(0)) ||
      (kv_seq_len == seq_len && q.dim(0) != k.dim(0)) || q.dim(2) != k.dim(2)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": expected q [B·S, Hq, D] and k, v [B·Skv, Hkv, D] (S = ", seq_len,
                     ", Skv = ", kv_seq_len, "), got q ", q.DebugString(), ", k ", k.DebugString(),
                     ", v ", v.DebugString()));
  }
  Dims d{q.dim(0), 0, seq_len, q.dim(1), k.dim(1), q.dim(2), kv_seq_len};
  if (d.hq <= 0 || d.hkv <= 0 || d.hq % d.hkv != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": Hq (", d.hq, ") must be a positive multiple of Hkv (", d.hkv, ")"));
  }
  if (d.d <= 0) return absl::InvalidArgumentError(absl::StrCat(op, ": head dim D must be > 0"));
  if (seq_len <= 0 || d.t_n % seq_len != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": seq_len (", seq_len, ") must be > 0 and divide T (", d.t_n, ")"));
  }
  d.b_n = d.t_n / seq_len;
  if (!std::isfinite(scale)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": scale must be finite"));
  }
  if (q.dtype != k.dtype || q.dtype != v.dtype || !IsActivation(stream, q.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": q, k, v must share a supported dtype (bf16, f32; f64 on the CPU), got ",
                     q.DebugString(), ", ", k.DebugString(), ", ", v.DebugString(), " on ",
                     stream.device.ToString()));
  }
  if (stream.is_cuda() && d.d != 64 && d.d != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": CUDA path supports head dim D in {64, 128}, got ", d.d));
  }
  return d;
}

absl::Status CheckLike(absl::string_view op, const Tensor& t, const Tensor& like,
                       absl::string_view what) {
  if (t.shape != like.shape || t.dtype != like.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, " must match ",
                                                   like.DebugString(), ", got ", t.DebugString()));
  }
  return absl::OkStatus();
}

absl::Status CheckStat(const Stream& stream, absl::string_view op, const Tensor& t, const Dims& d,
                       absl::string_view what) {
  if (t.rank() != 3 || t.dim(0) != d.b_n || t.dim(1) != d.hq || t.dim(2) != d.s_n ||
      !IsStat(stream, t.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, " must be f32 [B, Hq, S] = [",
                                                   d.b_n, ", ", d.hq, ", ", d.s_n, "], got ",
                                                   t.DebugString()));
  }
  return absl::OkStatus();
}

// Loads rows of one (token, head) into a dense fp64 buffer [T][H][D].
std::vector<double> Load(const Tensor& t) {
  std::vector<double> out(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = LoadAsDouble(t, i);
  return out;
}

// The last key query row i sees (bottom-right aligned: the last query sees the last key).
int64_t LastKey(const Dims& dm, int64_t i) { return i + dm.kv_n - dm.s_n; }

// Softmax probabilities p[0..LastKey(i)] of query row (b, i, h) over the keys it sees; returns
// the logsumexp.
double SoftmaxRow(const Dims& dm, const std::vector<double>& q, const std::vector<double>& k,
                  int64_t b, int64_t i, int64_t h, double scale, std::vector<double>* p) {
  const int64_t g = h / (dm.hq / dm.hkv);
  const double* qi = &q[((b * dm.s_n + i) * dm.hq + h) * dm.d];
  double m = -std::numeric_limits<double>::infinity();
  const int64_t last = LastKey(dm, i);
  for (int64_t j = 0; j <= last; ++j) {
    const double* kj = &k[((b * dm.kv_n + j) * dm.hkv + g) * dm.d];
    double s = 0;
    for (int64_t x = 0; x < dm.d; ++x) s += qi[x] * kj[x];
    (*p)[j] = s * scale;
    m = std::max(m, (*p)[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j <= last; ++j) sum += ((*p)[j] = std::exp((*p)[j] - m));
  for (int64_t j = 0; j <= last; ++j) (*p)[j] /= sum;
  return m + std::log(sum);
}

struct SettingsState {
  std::mutex mu;
  absl::StatusOr<AttentionSettings> settings = AttentionSettings{};
};

SettingsState& State() {
  static SettingsState* state = [] {
    auto* st = new SettingsState();
    st->settings = AttentionSettingsFromEnvironment();
    return st;
  }();
  return *state;
}

// bf16 on CUDA through cuDNN when the settings allow it. Returns true in *ran when cuDNN ran (or
// failed for a reason other than "cannot run this": that error is returned).
template <typename Fn>
absl::Status TryCudnn(const AttentionSettings& s, DType dtype, Fn&& fn, bool* ran) {
  *ran = false;
  if (s.backend == AttentionBackend::kNative) return absl::OkStatus();
  if (dtype != DType::kBF16) {
    if (s.backend == AttentionBackend::kCudnn) {
      return absl::FailedPreconditionError(
          "attention backend cudnn needs bf16 tensors (set SWITCHYARD_ATTENTION_BACKEND=auto or "
          "native for f32)");
    }
    return absl::OkStatus();
  }
  absl::Status st = fn();
  if (st.ok() || s.backend == AttentionBackend::kCudnn || !absl::IsFailedPrecondition(st)) {
    *ran = true;
    return st;
  }
  return absl::OkStatus();  // auto: cuDNN cannot run this; the native kernels will
}

}  // namespace

absl::StatusOr<AttentionBackend> ParseAttentionBackend(absl::string_view name) {
  if (name == "auto") return AttentionBackend::kAuto;
  if (name == "cudnn") return AttentionBackend::kCudnn;
  if (name == "native") return AttentionBackend::kNative;
  return absl::InvalidArgumentError(
      absl::StrCat("attention backend must be one of auto, cudnn, native; got \"", name, "\""));
}

const char* AttentionBackendName(AttentionBackend backend) {
  switch (backend) {
    case AttentionBackend::kAuto:
      return "auto";
    case AttentionBackend::kCudnn:
      return "cudnn";
    case AttentionBackend::kNative:
      return "native";
  }
  return "?";
}

absl::StatusOr<AttentionSettings> AttentionSettingsFromEnvironment() {
  AttentionSettings s;
  if (const char* b = std::getenv("SWITCHYARD_ATTENTION_BACKEND"); b != nullptr && *b != 0) {
    absl::StatusOr<AttentionBackend> parsed = ParseAttentionBackend(b);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("SWITCHYARD_ATTENTION_BACKEND: ", parsed.status().message()));
    }
    s.backend = *parsed;
  }
  if (const char* d = std::getenv("SWITCHYARD_ATTENTION_DETERMINISTIC"); d != nullptr && *d) {
    const std::string v = d;
    if (v != "0" && v != "1") {
      return absl::InvalidArgumentError(
          absl::StrCat("SWITCHYARD_ATTENTION_DETERMINISTIC must be 1 or 0, got \"", v, "\""));
    }
    s.deterministic = v == "1";
  }
  return s;
}

absl::StatusOr<AttentionSettings> ResolveAttentionSettings(const AttentionSettings& from_spec,
                                                           std::vector<std::string>* overrides) {
  AttentionSettings s = from_spec;
  const char* b = std::getenv("SWITCHYARD_ATTENTION_BACKEND");
  const char* d = std::getenv("SWITCHYARD_ATTENTION_DETERMINISTIC");
  if ((b == nullptr || *b == 0) && (d == nullptr || *d == 0)) return s;
  SY_ASSIGN_OR_RETURN(const AttentionSettings env, AttentionSettingsFromEnvironment());
  if (b != nullptr && *b != 0) {
    if (env.backend != from_spec.backend) {
      overrides->push_back(absl::StrCat("SWITCHYARD_ATTENTION_BACKEND=", b,
                                        " overrides model.attention_backend \"",
                                        AttentionBackendName(from_spec.backend), "\""));
    }
    s.backend = env.backend;
  }
  if (d != nullptr && *d != 0) {
    if (env.deterministic != from_spec.deterministic) {
      overrides->push_back(absl::StrCat("SWITCHYARD_ATTENTION_DETERMINISTIC=", d,
                                        " overrides training.deterministic_mode (",
                                        from_spec.deterministic ? "true" : "false", ")"));
    }
    s.deterministic = env.deterministic;
  }
  return s;
}

absl::StatusOr<AttentionSettings> GetAttentionSettings() {
  SettingsState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.settings;
}

void SetAttentionSettings(const AttentionSettings& settings) {
  SettingsState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  st.settings = settings;
}

std::string DescribeAttentionBackend() {
  absl::StatusOr<AttentionSettings> s = GetAttentionSettings();
  if (!s.ok()) return std::string(s.status().message());
  std::string out = absl::StrCat(AttentionBackendName(s->backend),
                                 s->deterministic ? ", deterministic" : ", non-deterministic");
  if (s->backend == AttentionBackend::kNative) return absl::StrCat(out, " (native kernels)");
  absl::StatusOr<std::string> cudnn = internal::LoadCudnn();
  if (cudnn.ok()) return absl::StrCat(out, " (", *cudnn, ")");
  return absl::StrCat(out, " (native: ", cudnn.status().message(), ")");
}

namespace {

// The CUDA path of an op: `cudnn(settings)` when TryCudnn runs it (its result then stands),
// otherwise the native kernels, `native()`.
template <typename Cudnn, typename Native>
absl::Status RunOnCuda(DType dtype, Cudnn&& cudnn, Native&& native) {
  SY_ASSIGN_OR_RETURN(const AttentionSettings settings, GetAttentionSettings());
  bool ran = false;
  absl::Status st = TryCudnn(
      settings, dtype, [&] { return cudnn(settings); }, &ran);
  if (ran || !st.ok()) return st;
  return native();
}

}  // namespace

absl::Status AttentionForward(const Stream& stream, const Tensor& q, const Tensor& k,
                              const Tensor& v, int64_t seq_len, float scale, const Tensor& o,
                              const Tensor& lse) {
  return AttentionForward(stream, q, k, v, seq_len, seq_len, scale, o, lse);
}

absl::Status AttentionForward(const Stream& stream, const Tensor& q, const Tensor& k,
                              const Tensor& v, int64_t seq_len, int64_t kv_seq_len, float scale,
                              const Tensor& o, const Tensor& lse) {
  constexpr absl::string_view kOp = "AttentionForward";
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&q, &k, &v, &o, &lse}));
  SY_ASSIGN_OR_RETURN(const Dims dm, CheckShapes(stream, kOp, q, k, v, seq_len, kv_seq_len, scale));
  SY_RETURN_IF_ERROR(CheckLike(kOp, o, q, "o"));
  SY_RETURN_IF_ERROR(CheckStat(stream, kOp, lse, dm, "lse"));
  if (stream.is_cuda()) {
    return RunOnCuda(
        q.dtype,
        [&](const AttentionSettings&) {
          return internal::AttentionForwardCudnn(stream, q, k, v, seq_len, kv_seq_len, scale, o,
                                                 lse);
        },
        [&] {
          return internal::AttentionForwardCuda(stream, q, k, v, seq_len, kv_seq_len, scale, o,
                                                lse);
        });
  }
  const std::vector<double> qd = Load(q), kd = Load(k), vd = Load(v);
  std::vector<double> p(dm.kv_n), acc(dm.d);
  for (int64_t b = 0; b < dm.b_n; ++b) {
    for (int64_t h = 0; h < dm.hq; ++h) {
      const int64_t g = h / (dm.hq / dm.hkv);
      for (int64_t i = 0; i < dm.s_n; ++i) {
        const double l = SoftmaxRow(dm, qd, kd, b, i, h, scale, &p);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j <= LastKey(dm, i); ++j) {
          const double* vj = &vd[((b * dm.kv_n + j) * dm.hkv + g) * dm.d];
          for (int64_t x = 0; x < dm.d; ++x) acc[x] += p[j] * vj[x];
        }
        const int64_t row = ((b * dm.s_n + i) * dm.hq + h) * dm.d;
        for (int64_t x = 0; x < dm.d; ++x) StoreFromDouble(o, row + x, acc[x]);
        StoreFromDouble(lse, (b * dm.hq + h) * dm.s_n + i, l);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status AttentionBackward(const Stream& stream, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& o, const Tensor& lse,
                               const Tensor& d_o, int64_t seq_len, float scale, const Tensor& delta,
                               const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  return AttentionBackward(stream, q, k, v, o, lse, d_o, seq_len, seq_len, scale, delta, dq, dk,
                           dv);
}

absl::Status AttentionBackward(const Stream& stream, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& o, const Tensor& lse,
                               const Tensor& d_o, int64_t seq_len, int64_t kv_seq_len, float scale,
                               const Tensor& delta, const Tensor& dq, const Tensor& dk,
                               const Tensor& dv) {
  constexpr absl::string_view kOp = "AttentionBackward";
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&q, &k, &v, &o, &lse, &d_o, &delta, &dq, &dk, &dv}));
  SY_ASSIGN_OR_RETURN(const Dims dm, CheckShapes(stream, kOp, q, k, v, seq_len, kv_seq_len, scale));
  SY_RETURN_IF_ERROR(CheckLike(kOp, o, q, "o"));
  SY_RETURN_IF_ERROR(CheckLike(kOp, d_o, q, "d_o"));
  SY_RETURN_IF_ERROR(CheckLike(kOp, dq, q, "dq"));
  SY_RETURN_IF_ERROR(CheckLike(kOp, dk, k, "dk"));
  SY_RETURN_IF_ERROR(CheckLike(kOp, dv, v, "dv"));
  SY_RETURN_IF_ERROR(CheckStat(stream, kOp, lse, dm, "lse"));
  SY_RETURN_IF_ERROR(CheckStat(stream, kOp, delta, dm, "delta"));
  if (stream.is_cuda()) {
    return RunOnCuda(
        q.dtype,
        [&](const AttentionSettings& settings) {
          return internal::AttentionBackwardCudnn(stream, q, k, v, o, lse, d_o, seq_len, kv_seq_len,
                                                  scale, settings.deterministic, dq, dk, dv);
        },
        [&] {
          return internal::AttentionBackwardCuda(stream, q, k, v, o, lse, d_o, seq_len, kv_seq_len,
                                                 scale, delta, dq, dk, dv);
        });
  }
  const std::vector<double> qd = Load(q), kd = Load(k), vd = Load(v), dod = Load(d_o);
  std::vector<double> dqd(qd.size(), 0.0), dkd(kd.size(), 0.0), dvd(vd.size(), 0.0);
  std::vector<double> p(dm.kv_n), dp(dm.kv_n);
  const int64_t d_n = dm.d;
  for (int64_t b = 0; b < dm.b_n; ++b) {
    for (int64_t h = 0; h < dm.hq; ++h) {
      const int64_t g = h / (dm.hq / dm.hkv);
      for (int64_t i = 0; i < dm.s_n; ++i) {
        SoftmaxRow(dm, qd, kd, b, i, h, scale, &p);
        const int64_t qrow = ((b * dm.s_n + i) * dm.hq + h) * d_n;
        double rowsum = 0;  // delta_i = sum_j p_ij dp_ij = rowsum(dO_i * o_i)
        const int64_t last = LastKey(dm, i);
        for (int64_t j = 0; j <= last; ++j) {
          const double* vj = &vd[((b * dm.kv_n + j) * dm.hkv + g) * d_n];
          double s = 0;
          for (int64_t x = 0; x < d_n; ++x) s += dod[qrow + x] * vj[x];
          dp[j] = s;
          rowsum += p[j] * s;
        }
        StoreFromDouble(delta, (b * dm.hq + h) * dm.s_n + i, rowsum);
        for (int64_t j = 0; j <= last; ++j) {
          const int64_t krow = ((b * dm.kv_n + j) * dm.hkv + g) * d_n;
          const double ds = p[j] * (dp[j] - rowsum) * scale;
          for (int64_t x = 0; x < d_n; ++x) {
            dqd[qrow + x] += ds * kd[krow + x];
            dkd[krow + x] += ds * qd[qrow + x];
            dvd[krow + x] += p[j] * dod[qrow + x];
          }
        }
      }
    }
  }
  for (size_t i = 0; i < dqd.size(); ++i) StoreFromDouble(dq, i, dqd[i]);
  for (size_t i = 0; i < dkd.size(); ++i) StoreFromDouble(dk, i, dkd[i]);
  for (size_t i = 0; i < dvd.size(); ++i) StoreFromDouble(dv, i, dvd[i]);
  return absl::OkStatus();
}

}  // namespace switchyard::kernels
