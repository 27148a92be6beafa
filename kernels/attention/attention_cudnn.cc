// cuDNN fused flash attention (frontend graph API, dynamically loaded libcudnn) for causal GQA.
//
// Tensors are described to cuDNN in its [B, H, S, D] order with the strides of attention.h's
// token-major layout, so nothing is transposed or copied:
//   q, o, dO, dq  [T = B*S, Hq, D]   -> dims {B, Hq, S, D},  strides {S*Hq*D, D, Hq*D, 1}
//   k, v, dk, dv  [T, Hkv, D]        -> dims {B, Hkv, S, D}, strides {S*Hkv*D, D, Hkv*D, 1}
//   lse           [B, Hq, S] f32     -> dims {B, Hq, S, 1},  strides {Hq*S, S, 1, 1}
// One plan per (device, B, S, Hq, Hkv, D, scale, pass) is built on first use and kept for the
// life of the process with its workspace, like the cuBLAS handles of kernels/gemm: the cache, the
// per-device handles and the library handle are never freed (no teardown-order hazards at exit).
// A shape cuDNN rejects is remembered too, so the fallback costs one failed build per shape.
#include "kernels/attention/attention_cudnn.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/runtime/cuda_status.h"

// The frontend's dynamic-loading mode resolves every cuDNN backend call through this handle
// (declared `extern` by cudnn_frontend_shim.h; the program defines it).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

#include <cudnn_frontend.h>

namespace switchyard::kernels::internal {
namespace {

namespace fe = cudnn_frontend;

// Tensor uids in the variant pack.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

enum class Pass { kForward, kBackward, kBackwardDeterministic };

// s: query rows per sequence; skv: key rows (skv > s: bottom-right causal mask).
struct PlanKey {
  int device;
  int64_t b, s, hq, hkv, d;
  uint32_t scale_bits;
  Pass pass;
  int64_t skv;
  bool operator<(const PlanKey& o) const {
    return std::tie(device, b, s, hq, hkv, d, scale_bits, pass, skv) <
           std::tie(o.device, o.b, o.s, o.hq, o.hkv, o.d, o.scale_bits, o.pass, o.skv);
  }
};

struct Plan {
  absl::Status status;  // not OK: cuDNN rejected this shape (FAILED_PRECONDITION) or failed
  std::shared_ptr<fe::graph::Graph> graph;
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

struct Cache {
  std::mutex mu;
  std::map<int, cudnnHandle_t> handles;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};

Cache& GetCache() {
  static Cache* cache = new Cache();  // never destroyed: see the file comment
  return *cache;
}

// Converts a frontend error into a Status; `what` names the step.
absl::Status Check(fe::error_t e, absl::string_view what) {
  if (e.is_good()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("cuDNN attention: ", what, " failed: ", e.get_message()));
}

std::vector<int64_t> TokenMajorStrides(int64_t s, int64_t h, int64_t d) {
  return {s * h * d, d, h * d, 1};
}

std::shared_ptr<fe::graph::Tensor_attributes> Activation(fe::graph::Graph& g, const char* name,
                                                         int64_t uid, int64_t b, int64_t h,
                                                         int64_t s, int64_t d) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({b, h, s, d})
                      .set_stride(TokenMajorStrides(s, h, d))
                      .set_data_type(fe::DataType_t::BFLOAT16));
}

void MarkOutput(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid, int64_t b,
                int64_t h, int64_t s, int64_t d) {
  t->set_output(true)
      .set_uid(uid)
      .set_dim({b, h, s, d})
      .set_stride(TokenMajorStrides(s, h, d))
      .set_data_type(fe::DataType_t::BFLOAT16);
}

std::shared_ptr<fe::graph::Tensor_attributes> StatsTensor(int64_t b, int64_t hq, int64_t s) {
  auto t = std::make_shared<fe::graph::Tensor_attributes>();
  t->set_name("Stats")
      .set_uid(kStats)
      .set_dim({b, hq, s, 1})
      .set_stride({hq * s, s, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
  return t;
}

absl::Status BuildPlan(cudnnHandle_t handle, const PlanKey& key, float scale, Plan* plan) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = Activation(*g, "Q", kQ, key.b, key.hq, key.s, key.d);
  auto k = Activation(*g, "K", kK, key.b, key.hkv, key.skv, key.d);
  auto v = Activation(*g, "V", kV, key.b, key.hkv, key.skv, key.d);
  // Square problems keep the top-left causal mask they always had; q_len < kv_len (context
  // parallelism) aligns the diagonal bottom-right: query i sees keys j <= i + skv - s.
  const bool bottom_right = key.skv != key.s;
  if (key.pass == Pass::kForward) {
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("switchyard_attention_fwd")
                    .set_generate_stats(true)
                    .set_attn_scale(scale);
    if (bottom_right) {
      opts.set_causal_mask_bottom_right(true);
    } else {
      opts.set_causal_mask(true);
    }
    auto [o, stats] = g->sdpa(q, k, v, opts);
    MarkOutput(o, kO, key.b, key.hq, key.s, key.d);
    stats->set_output(true)
        .set_uid(kStats)
        .set_dim({key.b, key.hq, key.s, 1})
        .set_stride({key.hq * key.s, key.s, 1, 1})
        .set_data_type(fe::DataType_t::FLOAT);
  } else {
    auto o = Activation(*g, "O", kO, key.b, key.hq, key.s, key.d);
    auto d_o = Activation(*g, "dO", kDO, key.b, key.hq, key.s, key.d);
    auto stats = g->tensor(*StatsTensor(key.b, key.hq, key.s));
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("switchyard_attention_bwd")
                    .set_attn_scale(scale)
                    .set_deterministic_algorithm(key.pass == Pass::kBackwardDeterministic);
    if (bottom_right) {
      opts.set_causal_mask_bottom_right(true);
    } else {
      opts.set_causal_mask(true);
    }
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, opts);
    MarkOutput(dq, kDQ, key.b, key.hq, key.s, key.d);
    MarkOutput(dk, kDK, key.b, key.hkv, key.skv, key.d);
    MarkOutput(dv, kDV, key.b, key.hkv, key.skv, key.d);
  }
  SY_RETURN_IF_ERROR(Check(g->validate(), "validate"));
  SY_RETURN_IF_ERROR(Check(g->build_operation_graph(handle), "build_operation_graph"));
  SY_RETURN_IF_ERROR(Check(g->create_execution_plans({fe::HeurMode_t::A}), "execution plans"));
  SY_RETURN_IF_ERROR(Check(g->check_support(handle), "check_support"));
  SY_RETURN_IF_ERROR(Check(g->build_plans(handle), "build_plans"));
  int64_t ws = 0;
  SY_RETURN_IF_ERROR(Check(g->get_workspace_size(ws), "get_workspace_size"));
  if (ws > 0) SY_CUDA_RETURN_IF_ERROR(cudaMalloc(&plan->workspace, static_cast<size_t>(ws)));
  plan->workspace_bytes = ws;
  plan->graph = std::move(g);
  return absl::OkStatus();
}

bool Aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data) % 16 == 0; }

// Runs the plan for `key` with the given variant pack on `stream`, building it first if needed.
absl::Status Run(const Stream& stream, PlanKey key, float scale,
                 std::unordered_map<int64_t, void*> pack) {
  SY_RETURN_IF_ERROR(LoadCudnn().status());
  Cache& cache = GetCache();
  std::lock_guard<std::mutex> lock(cache.mu);
  SY_CUDA_RETURN_IF_ERROR(cudaSetDevice(stream.device.index));
  try {
    auto h = cache.handles.find(key.device);
    if (h == cache.handles.end()) {
      cudnnHandle_t handle = nullptr;
      const cudnnStatus_t st = fe::detail::create_handle(&handle);
      if (st != CUDNN_STATUS_SUCCESS) {
        return absl::FailedPreconditionError(
            absl::StrCat("cuDNN attention: cudnnCreate failed with status ", static_cast<int>(st),
                         " on cuda:", key.device));
      }
      h = cache.handles.emplace(key.device, handle).first;
    }
    std::unique_ptr<Plan>& plan = cache.plans[key];
    if (plan == nullptr) {
      auto built = std::make_unique<Plan>();
      try {
        built->status = BuildPlan(h->second, key, scale, built.get());
      } catch (const std::exception& ex) {  // the frontend throws when a symbol is missing
        built->status = absl::FailedPreconditionError(
            absl::StrCat("cuDNN attention: building the plan threw: ", ex.what()));
      }
      if (built->status.ok() && built->graph == nullptr) {
        built->status = absl::InternalError("cuDNN attention: plan built without a graph");
      }
      plan = std::move(built);  // remembered either way: a rejected shape is not rebuilt
    }
    SY_RETURN_IF_ERROR(plan->status);
    const cudnnStatus_t st = fe::detail::set_stream(h->second, stream.cuda_stream);
    if (st != CUDNN_STATUS_SUCCESS) {
      return absl::InternalError(absl::StrCat("cuDNN attention: cudnnSetStream failed with status ",
                                              static_cast<int>(st)));
    }
    const fe::error_t e = plan->graph->execute(h->second, pack, plan->workspace);
    if (!e.is_good()) {
      return absl::InternalError(
          absl::StrCat("cuDNN attention: execute failed: ", fe::error_t(e).get_message()));
    }
  } catch (const std::exception& ex) {
    return absl::FailedPreconditionError(absl::StrCat("cuDNN attention: ", ex.what()));
  }
  SY_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::StatusOr<PlanKey> KeyFor(const Stream& stream, const Tensor& q, const Tensor& k,
                               int64_t seq_len, int64_t kv_seq_len, float scale, Pass pass,
                               std::initializer_list<const Tensor*> all) {
  for (const Tensor* t : all) {
    if (t->dtype != DType::kBF16 || !Aligned16(*t)) {
      return absl::FailedPreconditionError(
          "cuDNN attention: needs bf16 tensors with 16-byte aligned data");
    }
  }
  PlanKey key{
      stream.device.index, q.dim(0) / seq_len, seq_len, q.dim(1), k.dim(1), q.dim(2), 0, pass,
      kv_seq_len};
  std::memcpy(&key.scale_bits, &scale, sizeof(scale));
  return key;
}

}  // namespace

absl::StatusOr<std::string> LoadCudnn() {
  static const absl::StatusOr<std::string>* loaded = [] {
    const char* env = std::getenv("SWITCHYARD_CUDNN_LIBRARY");
    const std::string name = (env != nullptr && *env != '\0') ? env : "libcudnn.so.9";
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* err = dlerror();
      return new absl::StatusOr<std::string>(absl::FailedPreconditionError(absl::StrCat(
          "cuDNN is not available: dlopen(", name, ") failed: ", err ? err : "unknown error",
          " (install cuDNN 9, or set SWITCHYARD_CUDNN_LIBRARY to a libcudnn.so.9, e.g. the "
          "nvidia-cudnn-cu13 wheel's nvidia/cudnn/lib/libcudnn.so.9)")));
    }
    using GetVersion = size_t (*)();
    auto get_version = reinterpret_cast<GetVersion>(dlsym(handle, "cudnnGetVersion"));
    if (get_version == nullptr) {
      return new absl::StatusOr<std::string>(absl::FailedPreconditionError(
          absl::StrCat("cuDNN is not available: ", name, " has no cudnnGetVersion")));
    }
    const size_t version = get_version();
    if (version < 90000 || version >= 100000) {
      return new absl::StatusOr<std::string>(absl::FailedPreconditionError(absl::StrCat(
          "cuDNN is not available: ", name, " is version ", version, ", need cuDNN 9")));
    }
    // The frontend resolves its few CUDA runtime calls from a shared libcudart; name the CUDA 13
    // one so a libcudart.so.12 elsewhere on the search path is not picked (user's value wins).
    setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", "libcudart.so.13", /*overwrite=*/0);
    cudnn_frontend::cudnn_dlhandle = handle;
    return new absl::StatusOr<std::string>(absl::StrCat("cuDNN ", version, " from ", name));
  }();
  return *loaded;
}

absl::Status AttentionForwardCudnn(const Stream& stream, const Tensor& q, const Tensor& k,
                                   const Tensor& v, int64_t seq_len, int64_t kv_seq_len,
                                   float scale, const Tensor& o, const Tensor& lse) {
  SY_ASSIGN_OR_RETURN(PlanKey key, KeyFor(stream, q, k, seq_len, kv_seq_len, scale, Pass::kForward,
                                          {&q, &k, &v, &o}));
  return Run(stream, key, scale,
             {{kQ, q.data}, {kK, k.data}, {kV, v.data}, {kO, o.data}, {kStats, lse.data}});
}

absl::Status AttentionBackwardCudnn(const Stream& stream, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& o, const Tensor& lse,
                                    const Tensor& d_o, int64_t seq_len, int64_t kv_seq_len,
                                    float scale, bool deterministic, const Tensor& dq,
                                    const Tensor& dk, const Tensor& dv) {
  const Pass pass = deterministic ? Pass::kBackwardDeterministic : Pass::kBackward;
  SY_ASSIGN_OR_RETURN(PlanKey key, KeyFor(stream, q, k, seq_len, kv_seq_len, scale, pass,
                                          {&q, &k, &v, &o, &d_o, &dq, &dk, &dv}));
  return Run(stream, key, scale,
             {{kQ, q.data},
              {kK, k.data},
              {kV, v.data},
              {kO, o.data},
              {kStats, lse.data},
              {kDO, d_o.data},
              {kDQ, dq.data},
              {kDK, dk.data},
              {kDV, dv.data}});
}

}  // namespace switchyard::kernels::internal
