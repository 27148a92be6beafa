// The GPT-style MoE model: layout, planning, and the forward / backward sequencing of the kernels.
#include "worker/model/gpt_model.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/qk_norm_rope.h"
#include "kernels/attention/rope.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/embedding/embedding.h"
#include "kernels/gemm/gemm.h"
#include "kernels/moe/router.h"
#include "kernels/moe/swiglu.h"
#include "kernels/norm/rmsnorm.h"
#include "kernels/runtime/cuda_status.h"
#include "worker/model/moe_layer_tensors.h"
#include "worker/model/profiling.h"
#include "worker/model/tensor_copy.h"

namespace switchyard::model {
namespace {

using kernels::Buffer;
using kernels::Gemm;

constexpr int64_t kAlign = 64;  // elements; every tensor of the flat layout starts aligned

int64_t AlignUp(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// The first `rows` rows of `t` (same trailing dims).
Tensor Rows(const Tensor& t, int64_t rows) {
  Tensor v = t;
  v.shape[0] = rows;
  return v;
}

// `t` (contiguous) viewed with another shape of at most the same element count.
Tensor Reshape(const Tensor& t, std::vector<int64_t> shape) {
  return Tensor(t.dtype, std::move(shape), t.device, t.data);
}

absl::Status ZeroAsync(const Stream& s, const Tensor& t) {
  if (t.bytes() == 0) return absl::OkStatus();
  if (!s.is_cuda()) {
    std::memset(t.data, 0, t.bytes());
    return absl::OkStatus();
  }
  SY_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(t.data, 0, t.bytes(), s.cuda_stream));
  return absl::OkStatus();
}

// The chunk copies between context parallelism's CP-ordered gather buffer and the whole
// sequences. Local rows of a CP rank: sequence bb's local chunk j (j = 0: chunk r, j = 1: chunk
// 2·CP−1−r) is rows [bb·s_loc + j·c, +c); rank r's local rows start at r·b·s_loc in `gather`; in
// `whole` that chunk is rows [bb·S + id·c, +c). `to_whole`: gather → whole (after the K/V
// all-gather), else whole → gather (before the dK/dV reduce-scatter). `row`: elements per row.
absl::Status CopyCpChunks(const Stream& s, const Tensor& gather, const Tensor& whole, int64_t cp,
                          int64_t b, int64_t s_loc, int64_t row, bool to_whole) {
  const int64_t c = s_loc / 2, seq = s_loc * cp, n_local = b * s_loc;
  for (int64_t r = 0; r < cp; ++r) {
    for (int64_t bb = 0; bb < b; ++bb) {
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t g = r * n_local + bb * s_loc + j * c;
        const int64_t w = bb * seq + kernels::CpChunkId(j, cp, r) * c;
        const Tensor in_gather = Slice(gather, g * row, {c * row});
        const Tensor in_whole = Slice(whole, w * row, {c * row});
        SY_RETURN_IF_ERROR(to_whole ? CopyAsync(s, in_gather, in_whole)
                                    : CopyAsync(s, in_whole, in_gather));
      }
    }
  }
  return absl::OkStatus();
}

uint64_t MixSeed(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Configuration and layout

absl::StatusOr<GptConfig> GptConfig::FromProto(const v1::ModelConfig& m, DType dtype) {
  // The shape and its defaults come from common/model (the one model of a job: the planner sizes
  // the same model); the worker adds numerics, initialisation and the MoE layer's options.
  SY_ASSIGN_OR_RETURN(const ModelShape s, ModelShape::FromProto(m));
  GptConfig c;
  c.dtype = dtype;
  c.num_layers = s.num_layers;
  c.hidden_size = s.hidden_size;
  c.num_heads = s.num_heads;
  c.num_kv_heads = s.num_kv_heads;
  c.head_dim = s.head_dim;
  c.ffn_hidden_size = s.ffn_hidden_size;
  c.vocab_size = s.vocab_size;
  c.seq_length = s.seq_length;
  c.qk_layernorm = s.qk_layernorm;
  c.untie_embeddings = s.untie_embeddings;
  c.moe_layers = s.moe_layers;
  c.recompute_layernorm = s.recompute_layernorm;
  c.recompute_mlp = s.recompute_mlp;
  c.norm_epsilon = m.has_norm_epsilon() ? m.norm_epsilon() : 1e-5;
  c.rotary_base = m.has_rotary_base() ? m.rotary_base() : 10000.0;
  c.init_method_std = m.has_init_method_std() ? m.init_method_std() : 0.02;
  if (!m.normalization().empty() && m.normalization() != "RMSNorm") {
    return absl::InvalidArgumentError(absl::StrCat("model.normalization: \"", m.normalization(),
                                                   "\" is not supported; use \"RMSNorm\""));
  }
  if (m.add_bias_linear()) {
    return absl::InvalidArgumentError(
        "model.add_bias_linear: linear biases are not supported (Mixtral/Qwen3/DeepSeek use "
        "none)");
  }
  if (c.num_moe_layers() > 0) {
    SY_ASSIGN_OR_RETURN(c.moe, MoELayerConfig::FromProto(m, dtype));
    c.moe.router.seq_length = c.seq_length;
    c.moe.recompute_act = s.recompute_moe_act;
    if (m.has_moe_router_bias_update_rate()) {
      c.expert_bias_update_rate = m.moe_router_bias_update_rate();
    }
  }
  SY_RETURN_IF_ERROR(c.Validate());
  return c;
}

absl::Status GptConfig::Validate() const {
  auto positive = [](const char* field, int64_t v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("model.", field, " (", v, ") must be > 0"));
  };
  SY_RETURN_IF_ERROR(positive("num_layers", num_layers));
  SY_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
  SY_RETURN_IF_ERROR(positive("num_attention_heads", num_heads));
  SY_RETURN_IF_ERROR(positive("num_query_groups", num_kv_heads));
  SY_RETURN_IF_ERROR(positive("kv_channels", head_dim));
  SY_RETURN_IF_ERROR(positive("ffn_hidden_size", ffn_hidden_size));
  SY_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  SY_RETURN_IF_ERROR(positive("seq_length", seq_length));
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.num_attention_heads (", num_heads,
                     ") must be divisible by model.num_query_groups (", num_kv_heads, ")"));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.kv_channels (", head_dim, ") must be even (RoPE rotates pairs)"));
  }
  if (!(norm_epsilon > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.norm_epsilon (", norm_epsilon, ") must be > 0"));
  }
  if (!(rotary_base > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.rotary_base (", rotary_base, ") must be > 0"));
  }
  if (static_cast<int64_t>(moe_layers.size()) != num_layers) {
    return absl::InvalidArgumentError("model: moe_layers must have one entry per layer");
  }
  if (num_moe_layers() > 0) {
    MoELayerConfig m = moe;
    if (m.hidden_size != hidden_size) {
      return absl::InvalidArgumentError("model: MoE hidden size differs from hidden_size");
    }
    SY_RETURN_IF_ERROR(m.Validate());
  }
  if (chunk_begin.size() != chunk_end.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: chunk_begin (", chunk_begin.size(), " entries) and chunk_end (",
                     chunk_end.size(), " entries) must have one entry per model chunk"));
  }
  for (size_t v = 0; v < chunk_begin.size(); ++v) {
    // Interleaved pipeline: ascending, disjoint, non-empty chunks inside the model.
    const int64_t lo = v == 0 ? 0 : chunk_end[v - 1];
    if (chunk_begin[v] < lo || chunk_end[v] <= chunk_begin[v] || chunk_end[v] > num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: pipeline stage ", pp_rank, " chunk ", v, " [", chunk_begin[v], ", ",
                       chunk_end[v], ") must be a non-empty layer range inside [", lo,
                       ", model.num_layers = ", num_layers, ") after the previous chunk"));
    }
  }
  if (pp_size < 1 || pp_rank < 0 || pp_rank >= pp_size || layer_begin < 0 ||
      layer_begin >= stage_layer_end() || stage_layer_end() > num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model: pipeline stage ", pp_rank, " of ", pp_size, " must hold a non-empty layer range [",
        layer_begin, ", ", stage_layer_end(), ") inside [0, model.num_layers = ", num_layers, ")"));
  }
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: tp_rank (", tp_rank, ") must be in [0, tp_size ", tp_size, ")"));
  }
  if (tp_size > 1) {
    // The same rules as common/config/validate.cc, for a config not made from a job spec.
    // vocab_size: the embedding and the LM head are vocabulary-parallel (rank r holds rows
    // [r·V/TP, (r+1)·V/TP)). Megatron pads V to a multiple of make_vocab_size_divisible_by·TP;
    // the job spec has no such field (and the checkpoint keeps [V, H] under today's names), so
    // V must divide by TP instead.
    const std::pair<const char*, int64_t> split[] = {
        {"num_attention_heads", num_heads},
        {"num_query_groups", num_kv_heads},
        {"ffn_hidden_size", ffn_hidden_size},
        {"seq_length", seq_length},
        {"vocab_size", vocab_size},
        // The shared expert is split over TP like the dense MLP (MoELayerConfig::sp_size).
        {"moe_shared_expert_intermediate_size", num_moe_layers() > 0 ? moe.shared_ffn_size : 0},
    };
    for (const auto& [field, v] : split) {
      if (v % tp_size != 0) {
        const std::string f = field;
        return absl::InvalidArgumentError(absl::StrCat(
            "model.", field, " (", v,
            ") must be divisible by parallel.tensor_model_parallel_size (", tp_size, ")",
            f == "seq_length"   ? " (sequence parallelism)"
            : f == "vocab_size" ? " (vocabulary-parallel embedding and LM head)"
            : f == "moe_shared_expert_intermediate_size" ? " (the shared expert is split over TP)"
                                                         : ""));
      }
    }
  }
  if (cp_size < 1 || cp_rank < 0 || cp_rank >= cp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: cp_rank (", cp_rank, ") must be in [0, cp_size ", cp_size, ")"));
  }
  if (cp_size > 1 && seq_length % (2 * cp_size * tp_size) != 0) {
    // The same rule as common/config's (2·CP·TP).
    return absl::InvalidArgumentError(
        absl::StrCat("model.seq_length (", seq_length,
                     ") must be divisible by 2 * parallel.context_parallel_size * "
                     "parallel.tensor_model_parallel_size (2 * ",
                     cp_size, " * ", tp_size, " = ", 2 * cp_size * tp_size,
                     "): causal context parallelism splits each sequence into 2 * CP chunks"));
  }
  if (dtype != DType::kBF16 && dtype != DType::kF32 && dtype != DType::kF64) {
    return absl::InvalidArgumentError(
        absl::StrCat("model dtype must be bf16, f32 or f64, got ", DTypeName(dtype)));
  }
  return absl::OkStatus();
}

int64_t GptConfig::num_moe_layers() const {
  int64_t n = 0;
  for (bool b : moe_layers) n += b;
  return n;
}

DType GptConfig::GradDType(Device /*device*/) const {
  return dtype == DType::kF64 ? DType::kF64 : DType::kF32;
}

const ParamInfo* GptParamLayout::Find(const std::string& name) const {
  for (const ParamInfo& p : params) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

GptParamLayout MakeGptParamLayout(const GptConfig& c) {
  const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_heads, hkv = c.num_kv_heads;
  const int64_t tp = c.tp_size;
  std::vector<ParamInfo> all;
  uint64_t next_seed = 0;  // definition order over the WHOLE model (pipeline stages skip some)
  // `shape` is the whole tensor; a TP-sharded one (tp_dim >= 0) keeps 1/tp of dimension tp_dim.
  auto add = [&](std::string name, std::vector<int64_t> shape, bool scaled = false, int tp_dim = -1,
                 int tp_parts = 1) {
    ParamInfo p;
    p.name = std::move(name);
    p.global_shape = shape;
    if (tp > 1 && tp_dim >= 0) {
      shape[tp_dim] /= tp;
      p.tp_dim = tp_dim;
      p.tp_parts = tp_parts;
    }
    p.shape = std::move(shape);
    p.numel = 1;
    for (int64_t s : p.shape) p.numel *= s;
    p.weight_decay = p.shape.size() >= 2;
    p.ones_init = p.shape.size() == 1;
    p.scaled_init = scaled;
    p.seed_index = next_seed++;
    if (absl::StrContains(p.name, ".moe.experts.")) {
      // shape[0] is the local expert count L; the global tensor has E rows and, with ETP, the
      // whole F (see ParamInfo).
      p.expert = true;
      p.global_shape = p.shape;
      p.global_shape[0] = c.moe.router.num_experts;
      const int64_t etp = c.moe.etp_size, f = c.moe.ffn_hidden_size, fl = c.moe.local_ffn_size();
      const int64_t l = p.shape[0], hh = c.hidden_size;
      if (etp > 1 && absl::EndsWith(p.name, ".fc1")) {
        // [L, H, 2F'] = runs of F' (gate, up alternating) of the global rows of 2F.
        p.global_shape[2] = 2 * f;
        p.shard_runs = l * hh * 2;
        p.run_pitch = f;
        p.etp_step = fl;
      } else if (etp > 1 && absl::EndsWith(p.name, ".fc2")) {
        // [L, F', H] = per expert one run of F'·H inside its F·H.
        p.global_shape[1] = f;
        p.shard_runs = l;
        p.run_pitch = f * hh;
        p.etp_step = fl * hh;
      }
      p.global_offset = ShardGlobalOffset(p, c.moe.ep_rank, c.moe.etp_rank, etp);
    }
    all.push_back(std::move(p));
  };
  // Vocabulary-parallel (TP): rank r holds rows [r·V/TP, (r+1)·V/TP) of the embedding and of the
  // LM head (megatron_parallel.md §1.7-1.8).
  add("embedding.weight", {c.vocab_size, h}, false, /*tp_dim=*/0);
  // Pipeline: this stage keeps only its tensors (below), each with the seed_index of the whole
  // model's definition order, so its initial values are one process's.
  auto keep = [&](size_t from, bool yes) {
    if (!yes) all.resize(from);
  };
  // Tied embeddings at PP > 1: the last stage holds a copy of embedding.weight as its LM head
  // (Megatron's shared embedding, megatron_parallel.md §3.7), with the first stage's initial
  // values (same seed_index); the trainer sums its gradient over the two stages every step.
  keep(0, c.first_stage() || (c.last_stage() && !c.untie_embeddings));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const size_t layer_from = all.size();
    const std::string pre = absl::StrCat("layers.", l, ".");
    add(pre + "input_norm.weight", {h});
    add(pre + "attention.q.weight", {hq * d, h}, false, /*tp_dim=*/0);
    add(pre + "attention.k.weight", {hkv * d, h}, false, /*tp_dim=*/0);
    add(pre + "attention.v.weight", {hkv * d, h}, false, /*tp_dim=*/0);
    add(pre + "attention.o.weight", {h, hq * d}, /*scaled=*/true, /*tp_dim=*/1);
    if (c.qk_layernorm) {
      add(pre + "attention.q_norm.weight", {d});
      add(pre + "attention.k_norm.weight", {d});
    }
    add(pre + "post_attention_norm.weight", {h});
    if (c.moe_layers[l]) {
      // c.moe has sp_size 1: the whole shapes. The shared expert is split over TP like the dense
      // MLP (MoELayerConfig::sp_size): fc1 [H, 2S] by columns (gate_r, up_r), fc2 [S, H] by rows.
      for (auto& [name, shape] : MoELayerTensors::ParamShapes(c.moe)) {
        const bool scaled = name == "experts.fc2" || name == "shared_expert.fc2";
        if (name == "shared_expert.fc1") {
          add(pre + "moe." + name, shape, scaled, /*tp_dim=*/1, /*tp_parts=*/2);
        } else if (name == "shared_expert.fc2") {
          add(pre + "moe." + name, shape, scaled, /*tp_dim=*/0);
        } else {
          add(pre + "moe." + name, shape, scaled);
        }
      }
    } else {
      add(pre + "mlp.fc1.weight", {2 * c.ffn_hidden_size, h}, false, /*tp_dim=*/0,
          /*tp_parts=*/2);
      add(pre + "mlp.fc2.weight", {h, c.ffn_hidden_size}, /*scaled=*/true, /*tp_dim=*/1);
    }
    keep(layer_from, c.HoldsLayer(l));
  }
  const size_t head_from = all.size();
  add("final_norm.weight", {h});
  if (c.untie_embeddings) add("output.weight", {c.vocab_size, h}, false, /*tp_dim=*/0);
  keep(head_from, c.last_stage());

  GptParamLayout layout;
  int64_t offset = 0;
  const int64_t dense_multiple = 64 * std::max<int64_t>(1, c.dense_shard_multiple);
  // Expert tensors, TP-sharded dense tensors, replicated dense decayed tensors, the rest (see
  // GptParamLayout).
  for (int pass = 0; pass < 4; ++pass) {
    for (const ParamInfo& p : all) {
      const int pass_of = p.expert ? 0 : (p.tp_sharded() ? 1 : (p.weight_decay ? 2 : 3));
      if (pass_of != pass) continue;
      ParamInfo q = p;
      q.offset = offset;
      offset += AlignUp(q.numel);
      layout.params.push_back(std::move(q));
    }
    if (pass == 0) {
      offset = RoundUp(offset, 64 * std::max<int64_t>(1, c.expert_shard_multiple));
      layout.expert_end = offset;
    }
    if (pass == 1) {
      // Its own optimizer instance shards the TP-sharded region: pad it like the dense region.
      offset = layout.expert_end + RoundUp(offset - layout.expert_end, dense_multiple);
      layout.replicated_begin = offset;
    }
    if (pass == 2) layout.decay_end = offset;
  }
  layout.total = layout.expert_end + RoundUp(offset - layout.expert_end, dense_multiple);
  return layout;
}

int64_t ShardGlobalOffset(const ParamInfo& p, int64_t ep_rank, int64_t etp_rank, int64_t etp_size) {
  if (!p.expert) return 0;
  // An EP rank's block of the global tensor holds its L experts whole: ETP shards of numel each.
  return ep_rank * p.numel * etp_size + etp_rank * p.etp_step;
}

absl::Status CopyShard(const ParamInfo& p, int64_t global_offset, const Tensor& global,
                       const Tensor& shard, bool to_global) {
  const int64_t runs = std::max<int64_t>(1, p.shard_runs), len = p.numel / runs;
  const int64_t pitch = runs > 1 ? p.run_pitch : len;
  const int64_t last = global_offset + (runs - 1) * pitch + len;
  if (global.dtype != shard.dtype || shard.numel() != p.numel || last > global.numel() ||
      global_offset < 0 || global.device.is_cuda() || shard.device.is_cuda()) {
    return absl::InternalError(absl::StrCat("CopyShard ", p.name, ": shard ", shard.DebugString(),
                                            " at ", global_offset, " does not fit global ",
                                            global.DebugString(), " (host tensors of one dtype)"));
  }
  const size_t es = DTypeSize(shard.dtype), bytes = len * es;
  char* g = static_cast<char*>(global.data);
  char* sh = static_cast<char*>(shard.data);
  for (int64_t i = 0; i < runs; ++i) {
    char* gp = g + (global_offset + i * pitch) * es;
    char* sp = sh + i * len * es;
    if (to_global) {
      std::memcpy(gp, sp, bytes);
    } else {
      std::memcpy(sp, gp, bytes);
    }
  }
  return absl::OkStatus();
}

void CopyTpShard(const ParamInfo& p, int64_t tp_size, int64_t tp_rank, int64_t elem_bytes,
                 bool to_shard, void* whole, void* shard) {
  char* w = static_cast<char*>(whole);
  char* l = static_cast<char*>(shard);
  auto copy = [&](int64_t whole_elem, int64_t shard_elem, int64_t n) {
    char* a = w + whole_elem * elem_bytes;
    char* b = l + shard_elem * elem_bytes;
    if (to_shard) {
      std::memcpy(b, a, n * elem_bytes);
    } else {
      std::memcpy(a, b, n * elem_bytes);
    }
  };
  if (!p.tp_sharded() || tp_size == 1) {
    copy(0, 0, p.numel);
    return;
  }
  // A 2-D [R, C] tensor: inner = elements after tp_dim, outer = before.
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < p.tp_dim; ++i) outer *= p.global_shape[i];
  for (size_t i = p.tp_dim + 1; i < p.global_shape.size(); ++i) inner *= p.global_shape[i];
  const int64_t dim = p.global_shape[p.tp_dim], part = dim / p.tp_parts, piece = part / tp_size;
  int64_t dst = 0;
  for (int64_t o = 0; o < outer; ++o) {
    for (int j = 0; j < p.tp_parts; ++j) {
      const int64_t first = j * part + tp_rank * piece;
      copy((o * dim + first) * inner, dst, piece * inner);
      dst += piece * inner;
    }
  }
}

ModelShape GptConfig::Shape() const {
  ModelShape s;
  s.num_layers = num_layers;
  s.hidden_size = hidden_size;
  s.num_heads = num_heads;
  s.num_kv_heads = num_kv_heads;
  s.head_dim = head_dim;
  s.ffn_hidden_size = ffn_hidden_size;
  s.vocab_size = vocab_size;
  s.seq_length = seq_length;
  s.qk_layernorm = qk_layernorm;
  s.untie_embeddings = untie_embeddings;
  s.moe_layers = moe_layers;
  s.recompute_layernorm = recompute_layernorm;
  s.recompute_mlp = recompute_mlp;
  if (num_moe_layers() > 0) {
    s.recompute_moe_act = moe.recompute_act;
    s.num_experts = moe.router.num_experts;
    s.moe_topk = moe.router.topk;
    s.moe_ffn_hidden_size = moe.ffn_hidden_size;
    s.shared_ffn_size = moe.shared_ffn_size;
    s.shared_expert_gate = moe.shared_ffn_size > 0 && moe.shared_expert_gate;
  }
  return s;
}

double GptTrainingFlopsPerToken(const GptConfig& c) { return TrainingFlopsPerToken(c.Shape()); }

int64_t GptTotalParams(const GptConfig& c) { return TotalParams(c.Shape()); }

int64_t GptActiveParams(const GptConfig& c) { return ActiveParams(c.Shape()); }

// ---------------------------------------------------------------------------------------------
// The model

struct GptModel::Layer {
  int64_t index = 0;
  int64_t resid = 0;  // its input is resid_[resid], its output resid_[resid + 1]
  bool is_moe = false;
  int64_t moe_index = -1;
  std::unique_ptr<MoELayer> moe;
  MoELayerParams mp, mg;
  MoERouterState rs;
  // Parameter and gradient views.
  Tensor w_in, wq, wk, wv, wo, w_qn, w_kn, w_post, w_fc1, w_fc2;
  Tensor g_in, gq, gk, gv, go, g_qn, g_kn, g_post, g_fc1, g_fc2;
  // Saved activations (max_tokens rows; the step views the first T).
  Tensor n1, rstd1, q_pre, k_pre, q_rstd, k_rstd, q, k, v, o, lse, mid, n2, rstd2, h, a;
};

GptModel::~GptModel() = default;

MoELayer* GptModel::moe_layer(int64_t l) const {
  for (const Layer& L : layers_) {
    if (L.index == l) return L.moe.get();
  }
  return nullptr;  // another pipeline stage's layer
}

void GptModel::SelectSlot(int k) {
  if (k == cur_slot_) return;
  std::swap(layers_, slot_layers_[cur_slot_]);
  std::swap(resid_, slot_resid_[cur_slot_]);
  std::swap(layers_, slot_layers_[k]);
  std::swap(resid_, slot_resid_[k]);
  cur_slot_ = k;
}

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::Create(const GptConfig& config, Device device,
                                                           int64_t max_micro_batch,
                                                           int64_t max_micro_batches,
                                                           const GptParallelGroups& groups) {
  SY_RETURN_IF_ERROR(config.Validate());
  if (max_micro_batch < 1 || max_micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat("GptModel: max_micro_batch (", max_micro_batch,
                                                   ") and max_micro_batches (", max_micro_batches,
                                                   ") must be >= 1"));
  }
  if (device.is_cuda() && config.dtype == DType::kF64) {
    return absl::InvalidArgumentError("GptModel: f64 runs on the CPU only");
  }
  if (config.cp_size > 1 && (groups.cp == nullptr || groups.cp->size() != config.cp_size ||
                             groups.cp->rank() != config.cp_rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptModel: context_parallel_size ", config.cp_size, " (cp_rank ",
                     config.cp_rank, ") needs the CP group of that size and rank, got ",
                     groups.cp ? absl::StrCat("'", groups.cp->name(), "' rank ", groups.cp->rank(),
                                              "/", groups.cp->size())
                               : std::string("none")));
  }
  std::unique_ptr<GptModel> m(new GptModel());
  m->config_ = config;
  m->device_ = device;
  m->layout_ = MakeGptParamLayout(config);
  m->groups_ = groups;
  if (config.tp_size > 1 && (groups.tp == nullptr || groups.tp->size() != config.tp_size ||
                             groups.tp->rank() != config.tp_rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptModel: tp_size ", config.tp_size, " (tp_rank ", config.tp_rank,
                     ") needs GptParallelGroups.tp of that size with this rank at tp_rank"));
  }
  SY_RETURN_IF_ERROR(m->Build(max_micro_batch, max_micro_batches));
  return m;
}

absl::StatusOr<Tensor> GptModel::Alloc(DType dtype, std::vector<int64_t> shape) {
  SY_ASSIGN_OR_RETURN(Buffer b, Buffer::ForTensor(dtype, std::move(shape), device_));
  SY_RETURN_IF_ERROR(kernels::FillBytes(b.View(), 0));
  Tensor t = b.View();
  buffers_.push_back(std::move(b));
  return t;
}

Tensor GptModel::P(const std::string& name) const {
  const ParamInfo* p = layout_.Find(name);
  return Slice(params_.View(), p->offset, p->shape);
}

Tensor GptModel::G(const std::string& name) const {
  const ParamInfo* p = layout_.Find(name);
  return Slice(grads_.View(), p->offset, p->shape);
}

absl::StatusOr<Tensor> GptModel::Param(const std::string& name) const {
  if (layout_.Find(name) == nullptr) {
    return absl::NotFoundError(absl::StrCat("model has no parameter \"", name, "\""));
  }
  return P(name);
}

absl::StatusOr<Tensor> GptModel::Grad(const std::string& name) const {
  if (layout_.Find(name) == nullptr) {
    return absl::NotFoundError(absl::StrCat("model has no parameter \"", name, "\""));
  }
  return G(name);
}

absl::Status GptModel::Build(int64_t max_micro_batch, int64_t max_micro_batches) {
  const GptConfig& c = config_;
  const DType dt = c.dtype, gdt = c.GradDType(device_);
  const DType stat_dt = device_.is_cuda() ? DType::kF32 : DType::kF64;
  // t: this rank's tokens of a micro-batch before the sequence shard (q/k/v, attention, the
  // dense MLP's inner activations): S / CP of each sequence under context parallelism;
  // tl: this rank's sequence shard (residual stream, norms, MoE, LM head). Heads and F are this
  // rank's TP share. tl == t without TP.
  const int64_t tp = c.tp_size;
  const int64_t t = max_micro_batch * (c.seq_length / c.cp_size), tl = t / tp, h = c.hidden_size;
  const int64_t d = c.head_dim;
  const int64_t hq = c.num_heads / tp, hkv = c.num_kv_heads / tp, f = c.ffn_hidden_size / tp;
  max_tokens_ = t;
  max_micro_ = max_micro_batches;

  SY_ASSIGN_OR_RETURN(params_, Buffer::ForTensor(dt, {layout_.total}, device_));
  SY_ASSIGN_OR_RETURN(grads_, Buffer::ForTensor(gdt, {layout_.total}, device_));
  SY_RETURN_IF_ERROR(kernels::FillBytes(params_.View(), 0));
  SY_RETURN_IF_ERROR(kernels::FillBytes(grads_.View(), 0));
  const int64_t n_moe = c.num_moe_layers();
  const int64_t e = n_moe > 0 ? c.moe.router.num_experts : 0;
  if (n_moe > 0) {
    SY_ASSIGN_OR_RETURN(expert_bias_, Buffer::ForTensor(DType::kF32, {n_moe, e}, device_));
    SY_ASSIGN_OR_RETURN(local_counts_, Buffer::ForTensor(DType::kF32, {n_moe, e}, device_));
    SY_RETURN_IF_ERROR(kernels::FillBytes(expert_bias_.View(), 0));
    SY_RETURN_IF_ERROR(kernels::FillBytes(local_counts_.View(), 0));
    num_moe_terms_ = static_cast<int64_t>(c.moe.router.aux_losses.size()) + 1;
  }

  // The MoE layers see this rank's sequence shard (MoELayerConfig::sp_size) of its local
  // sequences (S / CP under context parallelism): seq_aux_loss's B and S are this rank's.
  MoELayerConfig moe_config = c.moe;
  if (moe_config.router.seq_length > 0) moe_config.router.seq_length = c.seq_length / c.cp_size;
  if (tp > 1) {
    moe_config.sp_size = static_cast<int>(tp);
    moe_config.sp_rank = static_cast<int>(c.tp_rank);
    moe_config.router.seq_length = c.seq_length / (c.cp_size * tp);
    moe_config.router.z_loss_coeff /= static_cast<double>(tp);  // c_z / size(TP×CP), spec §1.6
    SY_ASSIGN_OR_RETURN(ag_, Alloc(dt, {t, h}));
    SY_ASSIGN_OR_RETURN(rs_, Alloc(dt, {t, h}));
    if (max_micro_batch > 1) {
      SY_ASSIGN_OR_RETURN(perm_, Alloc(dt, {t, h}));
    }
    // The whole micro-batch's ids mapped to this rank's vocabulary rows (VocabShardEmbedding*).
    SY_ASSIGN_OR_RETURN(ids_loc_, Alloc(DType::kI32, {t}));
  }
  // One set of layers (activations, MoE layers) and residual stream per in-flight micro-batch slot
  // (see "Pipeline parallelism"): a stage that is not the last has at most pp_size - pp_rank
  // micro-batches between their forward and backward.
  // Interleaved: more micro-batches are alive (the trainer's count, c.pipeline_slots).
  // The stage's layers, chunk after chunk (one chunk without VPP); each chunk's residual stream
  // x_0 .. x_n is its own stretch of the slot's resid (see "Pipeline parallelism").
  std::vector<int64_t> local;  // global layer index of each local layer
  std::vector<int64_t> resid_of;
  chunk_layer_.clear();
  chunk_resid_.clear();
  for (int64_t v = 0; v < c.num_chunks(); ++v) {
    chunk_layer_.push_back(static_cast<int64_t>(local.size()));
    chunk_resid_.push_back(static_cast<int64_t>(local.size()) + v);
    for (int64_t l = c.ChunkBegin(v); l < c.ChunkEnd(v); ++l) {
      resid_of.push_back(static_cast<int64_t>(local.size()) + v);
      local.push_back(l);
    }
  }
  chunk_layer_.push_back(static_cast<int64_t>(local.size()));
  const int64_t local_layers = static_cast<int64_t>(local.size());
  // Selective recompute (see "Selective recompute"): one scratch per role for the stage's layers
  // and slots, instead of per-layer buffers.
  if (c.recompute_layernorm) {
    SY_ASSIGN_OR_RETURN(norm_scratch_, Alloc(dt, {tl, h}));
  }
  bool stage_has_dense = false;
  for (int64_t l : local) stage_has_dense = stage_has_dense || !c.moe_layers[l];
  if (c.recompute_mlp && stage_has_dense) {
    SY_ASSIGN_OR_RETURN(mlp_h_scratch_, Alloc(dt, {t, 2 * f}));
    SY_ASSIGN_OR_RETURN(mlp_a_scratch_, Alloc(dt, {t, f}));
  }
  if (moe_config.recompute_act) {
    moe_act_scratch_ = std::make_unique<ScratchBuffer>(device_);
    shared_act_scratch_ = std::make_unique<ScratchBuffer>(device_);
  }
  // The MoE layers' backward-only buffers: one per role for every MoE layer and slot (always; the
  // layers reserve their sizes, so a stage without MoE layers allocates nothing).
  moe_grad_scratch_ = std::make_unique<MoEGradBuffers>(device_);
  const int64_t slots = c.pipeline_slots > 0 ? std::min(c.pipeline_slots, max_micro_batches)
                        : c.pp_size > 1 && !c.last_stage()
                            ? std::min(c.pp_size - c.pp_rank, max_micro_batches)
                            : 1;
  slot_layers_.resize(slots);
  slot_resid_.resize(slots);
  for (int64_t slot = 0; slot < slots; ++slot) {
    std::vector<Tensor>& resid = slot_resid_[slot];
    for (int64_t l = 0; l < local_layers + c.num_chunks(); ++l) {
      SY_ASSIGN_OR_RETURN(Tensor x, Alloc(dt, {tl, h}));
      resid.push_back(x);
    }
    std::vector<Layer>& layers = slot_layers_[slot];
    layers.resize(local_layers);
    for (int64_t i = 0; i < local_layers; ++i) {
      const int64_t l = local[i];
      Layer& L = layers[i];
      L.index = l;
      L.resid = resid_of[i];
      L.is_moe = c.moe_layers[l];
      const std::string pre = absl::StrCat("layers.", l, ".");
      auto bind = [&](const std::string& name, Tensor* w, Tensor* g) {
        *w = P(pre + name);
        *g = G(pre + name);
      };
      bind("input_norm.weight", &L.w_in, &L.g_in);
      bind("attention.q.weight", &L.wq, &L.gq);
      bind("attention.k.weight", &L.wk, &L.gk);
      bind("attention.v.weight", &L.wv, &L.gv);
      bind("attention.o.weight", &L.wo, &L.go);
      if (c.qk_layernorm) {
        bind("attention.q_norm.weight", &L.w_qn, &L.g_qn);
        bind("attention.k_norm.weight", &L.w_kn, &L.g_kn);
      }
      bind("post_attention_norm.weight", &L.w_post, &L.g_post);
      if (c.recompute_layernorm) {
        L.n1 = norm_scratch_;
      } else {
        SY_ASSIGN_OR_RETURN(L.n1, Alloc(dt, {tl, h}));
      }
      SY_ASSIGN_OR_RETURN(L.rstd1, Alloc(stat_dt == DType::kF64 ? DType::kF64 : DType::kF32, {tl}));
      if (c.qk_layernorm) {
        SY_ASSIGN_OR_RETURN(L.q_pre, Alloc(dt, {t, hq, d}));
        SY_ASSIGN_OR_RETURN(L.k_pre, Alloc(dt, {t, hkv, d}));
        SY_ASSIGN_OR_RETURN(L.q_rstd, Alloc(L.rstd1.dtype, {t * hq}));
        SY_ASSIGN_OR_RETURN(L.k_rstd, Alloc(L.rstd1.dtype, {t * hkv}));
      }
      SY_ASSIGN_OR_RETURN(L.q, Alloc(dt, {t, hq, d}));
      SY_ASSIGN_OR_RETURN(L.k, Alloc(dt, {t, hkv, d}));
      SY_ASSIGN_OR_RETURN(L.v, Alloc(dt, {t, hkv, d}));
      SY_ASSIGN_OR_RETURN(L.o, Alloc(dt, {t, hq, d}));
      SY_ASSIGN_OR_RETURN(L.lse, Alloc(L.rstd1.dtype, {t * hq}));
      SY_ASSIGN_OR_RETURN(L.mid, Alloc(dt, {tl, h}));
      if (c.recompute_layernorm) {
        L.n2 = norm_scratch_;
      } else {
        SY_ASSIGN_OR_RETURN(L.n2, Alloc(dt, {tl, h}));
      }
      SY_ASSIGN_OR_RETURN(L.rstd2, Alloc(L.rstd1.dtype, {tl}));
      if (L.is_moe) {
        // Global: the MoE layers of the earlier stages (and chunks) come first.
        L.moe_index = 0;
        for (int64_t j = 0; j < l; ++j) L.moe_index += c.moe_layers[j] ? 1 : 0;
        moe_config.layer_number = L.index;  // names the layer in its dispatcher's errors
        SY_ASSIGN_OR_RETURN(
            L.moe,
            MoELayer::Create(moe_config, device_, tl,
                             MoEParallelGroups{groups_.ep, groups_.tdc, groups_.etp, groups_.etp_ep,
                                               tp > 1 ? groups_.tp : nullptr,
                                               c.cp_size > 1 ? groups_.cp : nullptr},
                             MoEActScratch{moe_act_scratch_.get(), shared_act_scratch_.get()},
                             moe_grad_scratch_->scratch()));
        if (c.cp_size > 1) {
          SY_RETURN_IF_ERROR(
              L.moe->SetContextParallelJitter(c.cp_size, c.cp_rank, c.seq_length / c.cp_size));
        }
        // global_aux_loss: one running count for all slots of this layer (slot 0's).
        if (slot > 0) L.moe->ShareGlobalAuxCounts(slot_layers_[0][i].moe.get());
        auto slot = [&](const std::string& name, Tensor* p, Tensor* g) {
          if (layout_.Find(pre + "moe." + name) == nullptr) return;
          *p = P(pre + "moe." + name);
          *g = G(pre + "moe." + name);
        };
        slot("router.weight", &L.mp.router_weight, &L.mg.router_weight);
        slot("experts.fc1", &L.mp.fc1, &L.mg.fc1);
        slot("experts.fc2", &L.mp.fc2, &L.mg.fc2);
        slot("shared_expert.fc1", &L.mp.shared_fc1, &L.mg.shared_fc1);
        slot("shared_expert.fc2", &L.mp.shared_fc2, &L.mg.shared_fc2);
        slot("shared_expert.gate", &L.mp.shared_gate, &L.mg.shared_gate);
        L.rs.expert_bias = Slice(expert_bias_.View(), L.moe_index * e, {e});
        L.rs.local_tokens_per_expert = Slice(local_counts_.View(), L.moe_index * e, {e});
      } else {
        bind("mlp.fc1.weight", &L.w_fc1, &L.g_fc1);
        bind("mlp.fc2.weight", &L.w_fc2, &L.g_fc2);
        if (c.recompute_mlp) {
          L.h = mlp_h_scratch_;
          L.a = mlp_a_scratch_;
        } else {
          SY_ASSIGN_OR_RETURN(L.h, Alloc(dt, {t, 2 * f}));
          SY_ASSIGN_OR_RETURN(L.a, Alloc(dt, {t, f}));
        }
      }
    }
  }  // slots
  cur_slot_ = 0;
  std::swap(layers_, slot_layers_[0]);
  std::swap(resid_, slot_resid_[0]);
  const DType rdt = layers_.empty() ? DType::kF32 : layers_[0].rstd1.dtype;
  SY_ASSIGN_OR_RETURN(final_n_, Alloc(dt, {tl, h}));
  SY_ASSIGN_OR_RETURN(final_rstd_, Alloc(rdt, {tl}));
  // The LM head sees every token of the micro-batch at TP > 1 (vocabulary-parallel: the SP
  // shards are gathered, the vocabulary is split), its shard only without TP (tl == t).
  SY_ASSIGN_OR_RETURN(ce_lse_, Alloc(stat_dt, {t}));
  SY_ASSIGN_OR_RETURN(ce_num_valid_, Alloc(DType::kI32, {1}));
  SY_ASSIGN_OR_RETURN(g_, Alloc(dt, {tl, h}));
  SY_ASSIGN_OR_RETURN(dn_, Alloc(dt, {tl, h}));
  SY_ASSIGN_OR_RETURN(d_o_, Alloc(dt, {t, hq, d}));
  SY_ASSIGN_OR_RETURN(dq_, Alloc(dt, {t, hq, d}));
  SY_ASSIGN_OR_RETURN(dk_, Alloc(dt, {t, hkv, d}));
  SY_ASSIGN_OR_RETURN(dv_, Alloc(dt, {t, hkv, d}));
  SY_ASSIGN_OR_RETURN(delta_, Alloc(rdt, {t * hq}));
  if (c.cp_size > 1) {
    const int64_t whole = t * c.cp_size;  // B·S rows
    SY_ASSIGN_OR_RETURN(cp_gather_, Alloc(dt, {whole, hkv, d}));
    SY_ASSIGN_OR_RETURN(cp_k_, Alloc(dt, {whole, hkv, d}));
    SY_ASSIGN_OR_RETURN(cp_v_, Alloc(dt, {whole, hkv, d}));
    SY_ASSIGN_OR_RETURN(cp_dk_, Alloc(dt, {whole, hkv, d}));
    SY_ASSIGN_OR_RETURN(cp_dv_, Alloc(dt, {whole, hkv, d}));
    SY_ASSIGN_OR_RETURN(cp_dk_part_, Alloc(dt, {c.seq_length, hkv, d}));
    SY_ASSIGN_OR_RETURN(cp_dv_part_, Alloc(dt, {c.seq_length, hkv, d}));
  }
  if (c.num_moe_layers() < c.num_layers) {
    SY_ASSIGN_OR_RETURN(dh_, Alloc(dt, {t, 2 * f}));
    SY_ASSIGN_OR_RETURN(da_, Alloc(dt, {t, f}));
  }
  if (device_.is_cuda()) {
    // The hidden-size norms' backward; with QK-norm the QK-norm + RoPE backward (which covers its
    // per-head norm): the only per-head norm there is.
    const int64_t rms_bytes = std::max(
        kernels::RmsNormBackwardWorkspaceBytes(tl, h),
        c.qk_layernorm ? kernels::QkNormRopeBackwardWorkspaceBytes(t, hq, hkv, d) : int64_t{0});
    SY_ASSIGN_OR_RETURN(rms_ws_, Alloc(DType::kU8, {rms_bytes}));
    SY_ASSIGN_OR_RETURN(
        emb_ws_,
        Alloc(DType::kU8, {kernels::EmbeddingBackwardWorkspaceBytes(t, c.vocab_size / tp)}));
  }
  // The fused LM-head loss, only on the stage that holds the LM head (the last; with virtual
  // stages the one holding the last model chunk, GptConfig::HeadIn): one chunk of fp32 logits of
  // at most ~512 MiB (CUDA) / 64 MiB (CPU), over this rank's V/TP vocabulary rows for the whole
  // micro-batch's t tokens (tl == t without TP). Other stages leave ce_ null (Forward and
  // ForwardBackward refuse the head there). stat_ce_ is on every stage: ReadStepStats reads it
  // (zeros where no loss is computed).
  if (c.last_stage()) {
    const int64_t budget = device_.is_cuda() ? (int64_t{512} << 20) : (int64_t{64} << 20);
    const int64_t vl = c.vocab_size / tp;
    const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(t, budget / (vl * 8)));
    SY_ASSIGN_OR_RETURN(ce_, kernels::FusedLinearCrossEntropy::Create(device_, t, h, vl, chunk));
  }
  SY_ASSIGN_OR_RETURN(stat_ce_, Alloc(stat_dt, {max_micro_}));
  if (n_moe > 0) {
    SY_ASSIGN_OR_RETURN(stat_moe_losses_,
                        Alloc(c.moe.router_dtype(), {max_micro_, n_moe, num_moe_terms_}));
    SY_ASSIGN_OR_RETURN(stat_counts_, Alloc(DType::kI32, {max_micro_, n_moe, e}));
  }
  return absl::OkStatus();
}

absl::Status GptModel::InitMaster(const Stream& stream, uint64_t seed, const Tensor& master) const {
  if (master.numel() != layout_.total || master.device != device_ ||
      (master.dtype != DType::kF32 && master.dtype != DType::kF64)) {
    return absl::InvalidArgumentError(absl::StrCat("GptModel::InitMaster: master must be f32/f64 [",
                                                   layout_.total, "] on ", device_.ToString(),
                                                   ", got ", master.DebugString()));
  }
  SY_RETURN_IF_ERROR(kernels::FillBytes(master, 0));
  const double scaled_std =
      config_.init_method_std / std::sqrt(2.0 * static_cast<double>(config_.num_layers));
  for (size_t i = 0; i < layout_.params.size(); ++i) {
    const ParamInfo& p = layout_.params[i];
    const Tensor view = Slice(master, p.offset, {p.numel});
    if (p.ones_init) {
      SY_ASSIGN_OR_RETURN(Buffer ones, Buffer::ForTensor(master.dtype, {p.numel}, Device::Cpu()));
      for (int64_t j = 0; j < p.numel; ++j) StoreFromDouble(ones.View(), j, 1.0);
      SY_RETURN_IF_ERROR(kernels::CopyTensor(ones.View(), view));
      continue;
    }
    const double std = p.scaled_init ? scaled_std : config_.init_method_std;
    if (p.shard_runs > 1) {
      // An ETP shard is not contiguous in the global tensor: draw the span it covers on the host
      // (HashNormal of kernels/elementwise: the device's formula; logf/cosf may differ from the
      // device's in the last bit), keep the shard's runs. Each element still gets the value of
      // its global index, so any ETP/EP split initialises the same global tensor as one process
      // (bit for bit on the CPU). Host-side, because FillNormal draws one contiguous range.
      const int64_t span = (p.shard_runs - 1) * p.run_pitch + p.numel / p.shard_runs;
      SY_ASSIGN_OR_RETURN(Buffer drawn, Buffer::ForTensor(master.dtype, {span}, Device::Cpu()));
      SY_RETURN_IF_ERROR(kernels::FillNormal(Stream::Cpu(), drawn.View(),
                                             MixSeed(seed, p.seed_index), static_cast<float>(std),
                                             static_cast<uint64_t>(p.global_offset)));
      SY_ASSIGN_OR_RETURN(Buffer host, Buffer::ForTensor(master.dtype, {p.numel}, Device::Cpu()));
      SY_RETURN_IF_ERROR(CopyShard(p, 0, drawn.View(), host.View(), /*to_global=*/false));
      SY_RETURN_IF_ERROR(kernels::CopyTensor(host.View(), view));
      continue;
    }
    if (p.tp_sharded()) {
      // The whole tensor's values (the same on every TP size: FillNormal is counter-based and
      // equal on the CPU and the GPU), then this rank's shard of them.
      int64_t whole_numel = 1;
      for (int64_t d : p.global_shape) whole_numel *= d;
      SY_ASSIGN_OR_RETURN(Buffer whole,
                          Buffer::ForTensor(master.dtype, {whole_numel}, Device::Cpu()));
      SY_ASSIGN_OR_RETURN(Buffer shard, Buffer::ForTensor(master.dtype, {p.numel}, Device::Cpu()));
      SY_RETURN_IF_ERROR(kernels::FillNormal(
          Stream::Cpu(), whole.View(), MixSeed(seed, p.seed_index), static_cast<float>(std), 0));
      CopyTpShard(p, config_.tp_size, config_.tp_rank, DTypeSize(master.dtype), true, whole.data(),
                  shard.data());
      SY_RETURN_IF_ERROR(kernels::CopyTensor(shard.View(), view));
      continue;
    }
    SY_RETURN_IF_ERROR(kernels::FillNormal(stream, view, MixSeed(seed, p.seed_index),
                                           static_cast<float>(std),
                                           static_cast<uint64_t>(p.global_offset)));
  }
  return absl::OkStatus();
}

absl::Status GptModel::ZeroGrads(const Stream& stream, ExpertGrads experts) {
  const int64_t keep = experts == ExpertGrads::kOverwrite ? layout_.expert_end : 0;
  const Tensor all = grads_.View();
  SY_RETURN_IF_ERROR(ZeroAsync(stream, Slice(all, keep, {layout_.total - keep})));
  overwrite_expert_grads_.assign(static_cast<size_t>(config_.num_layers),
                                 experts == ExpertGrads::kOverwrite);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Forward

kernels::VocabShard GptModel::MakeVocabShard() {
  kernels::VocabShard shard;
  const int64_t vl = config_.vocab_size / config_.tp_size;
  shard.start = config_.tp_rank * vl;
  shard.vocab_size = config_.vocab_size;
  shard.all_reduce = [this](const Tensor& t, bool max) {
    return groups_.tp->AllReduce(t, t, max ? comm::ReduceOp::kMax : comm::ReduceOp::kSum);
  };
  return shard;
}

absl::Status GptModel::KeepLossOnFirstTpRank(const Stream& s, const Tensor& loss) {
  // Every TP rank computed the same loss sum of the WHOLE micro-batch; the trainer sums the
  // ranks' shares over TP×DP×CP, so TP rank 0 reports it and the others report 0.
  if (config_.tp_rank == 0) return absl::OkStatus();
  return ZeroAsync(s, loss);
}

absl::Status GptModel::GatherLogits(const Stream& s, const Tensor& normed, const Tensor& w_out,
                                    const Tensor& logits) {
  // Forward logits at TP > 1 (generation / eval, on request only): this rank's [t, V/TP]
  // columns, all-gathered over TP ([TP][t][V/TP]) and interleaved into [t, V]. The scratch is
  // allocated on first use: the training step never needs it.
  const int64_t t = normed.dim(0), tp = config_.tp_size, vl = config_.vocab_size / tp;
  const int64_t need = (tp + 1) * t * vl;
  if (logits_ws_.data() == nullptr || logits_ws_.View().dtype != logits.dtype ||
      logits_ws_.View().numel() < need) {
    SY_ASSIGN_OR_RETURN(logits_ws_, Buffer::ForTensor(logits.dtype, {need}, device_));
  }
  const Tensor ws(logits.dtype, {need}, device_, logits_ws_.data());
  const Tensor local = Slice(ws, 0, {t, vl});
  const Tensor gathered = Slice(ws, t * vl, {tp * t * vl});
  const Tensor out = logits;
  SY_RETURN_IF_ERROR(Gemm(s, normed, false, w_out, true, local));
  SY_RETURN_IF_ERROR(groups_.tp->AllGather(local, gathered));
  const size_t es = DTypeSize(logits.dtype);
  const size_t width = vl * es, src_pitch = width, dst_pitch = config_.vocab_size * es;
  for (int64_t r = 0; r < tp; ++r) {
    const char* src = static_cast<const char*>(gathered.data) + r * t * width;
    char* dst = static_cast<char*>(out.data) + r * width;
    if (s.is_cuda()) {
      SY_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, t,
                                                cudaMemcpyDefault, s.cuda_stream));
    } else {
      for (int64_t i = 0; i < t; ++i) std::memcpy(dst + i * dst_pitch, src + i * src_pitch, width);
    }
  }
  return absl::OkStatus();
}

absl::Status GptModel::GatherSeq(const Stream& s, const Tensor& local, const Tensor& whole,
                                 int64_t seq_len) {
  const int64_t tp = config_.tp_size, s_loc = seq_len / tp;
  const int64_t w = whole.numel() / whole.dim(0), b = whole.dim(0) / seq_len;
  // The all-gather concatenates the ranks' shards: [rank][sequence][position]. With one sequence
  // that is already [position]; otherwise reorder to [sequence][rank][position].
  if (b == 1) return groups_.tp->AllGather(local, whole);
  const Tensor staged = Slice(perm_, 0, {whole.numel()});
  SY_RETURN_IF_ERROR(groups_.tp->AllGather(local, staged));
  for (int64_t r = 0; r < tp; ++r) {
    for (int64_t bb = 0; bb < b; ++bb) {
      SY_RETURN_IF_ERROR(CopyAsync(s, Slice(staged, ((r * b) + bb) * s_loc * w, {s_loc * w}),
                                   Slice(whole, ((bb * tp) + r) * s_loc * w, {s_loc * w})));
    }
  }
  return absl::OkStatus();
}

absl::Status GptModel::ReduceScatterSeq(const Stream& s, const Tensor& whole, const Tensor& local,
                                        int64_t seq_len) {
  const int64_t tp = config_.tp_size, s_loc = seq_len / tp;
  const int64_t w = whole.numel() / whole.dim(0), b = whole.dim(0) / seq_len;
  if (b == 1) return groups_.tp->ReduceScatter(whole, local, comm::ReduceOp::kSum);
  const Tensor staged = Slice(perm_, 0, {whole.numel()});
  for (int64_t r = 0; r < tp; ++r) {
    for (int64_t bb = 0; bb < b; ++bb) {
      SY_RETURN_IF_ERROR(CopyAsync(s, Slice(whole, ((bb * tp) + r) * s_loc * w, {s_loc * w}),
                                   Slice(staged, ((r * b) + bb) * s_loc * w, {s_loc * w})));
    }
  }
  return groups_.tp->ReduceScatter(staged, local, comm::ReduceOp::kSum);
}

absl::Status GptModel::LayerForward(const Stream& s, Layer& L, int64_t seq_len, int micro,
                                    bool training) {
  const GptConfig& c = config_;
  const bool tp = c.tp_size > 1;
  // t: the whole micro-batch's tokens; tl: this rank's sequence shard (== t without TP).
  const int64_t t = tokens_, tl = t / c.tp_size, b = t / seq_len, h = c.hidden_size;
  const int64_t d = c.head_dim, hq = c.num_heads / c.tp_size, hkv = c.num_kv_heads / c.tp_size;
  const float eps = static_cast<float>(c.norm_epsilon);
  const float base = static_cast<float>(c.rotary_base);
  const Tensor x = Rows(resid_[L.resid], tl), x_next = Rows(resid_[L.resid + 1], tl);
  const Tensor n1 = Rows(L.n1, tl), mid = Rows(L.mid, tl), n2 = Rows(L.n2, tl);
  const Tensor q = Rows(L.q, t), k = Rows(L.k, t), v = Rows(L.v, t), o = Rows(L.o, t);

  ScopedRange range(s, "layer.fwd", L.index);
  PhaseSequence phase(s);
  phase.Next("norm_qkv_rope");
  SY_RETURN_IF_ERROR(kernels::RmsNormForward(s, x, L.w_in, eps, n1, Rows(L.rstd1, tl)));
  // SP: the column-parallel q/k/v see the whole sequence of normed inputs.
  const Tensor n1_all = tp ? Rows(ag_, t) : n1;
  if (tp) SY_RETURN_IF_ERROR(GatherSeq(s, n1, n1_all, seq_len));
  const Tensor q_lin = c.qk_layernorm ? Rows(L.q_pre, t) : q;
  const Tensor k_lin = c.qk_layernorm ? Rows(L.k_pre, t) : k;
  SY_RETURN_IF_ERROR(Gemm(s, n1_all, false, L.wq, true, Reshape(q_lin, {t, hq * d})));
  SY_RETURN_IF_ERROR(Gemm(s, n1_all, false, L.wk, true, Reshape(k_lin, {t, hkv * d})));
  SY_RETURN_IF_ERROR(Gemm(s, n1_all, false, L.wv, true, Reshape(v, {t, hkv * d})));
  const kernels::RopeCp rope_cp{c.cp_size, c.cp_rank};
  if (c.qk_layernorm) {
    // q_norm / k_norm, then RoPE: one fused kernel on CUDA (kernels/attention/qk_norm_rope.h).
    SY_RETURN_IF_ERROR(kernels::QkNormRopeForward(s, {q_lin, L.w_qn, q, Rows(L.q_rstd, t * hq)},
                                                  {k_lin, L.w_kn, k, Rows(L.k_rstd, t * hkv)}, eps,
                                                  seq_len, base, rope_cp));
  } else {
    SY_RETURN_IF_ERROR(kernels::RopeForward(s, q, seq_len, base, q, rope_cp));
    SY_RETURN_IF_ERROR(kernels::RopeForward(s, k, seq_len, base, k, rope_cp));
  }
  phase.Next("attention");
  if (c.cp_size > 1) {
    SY_RETURN_IF_ERROR(CpAttentionForward(s, L, b, seq_len));
  } else {
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    SY_RETURN_IF_ERROR(
        kernels::AttentionForward(s, q, k, v, seq_len, scale, o, Reshape(L.lse, {b, hq, seq_len})));
  }
  phase.Next("oproj_residual_norm");
  if (tp) {
    // Row-parallel o-proj: partial sums over this rank's heads, reduce-scattered onto the shard.
    SY_RETURN_IF_ERROR(Gemm(s, Reshape(o, {t, hq * d}), false, L.wo, true, Rows(rs_, t)));
    SY_RETURN_IF_ERROR(ReduceScatterSeq(s, Rows(rs_, t), mid, seq_len));
    SY_RETURN_IF_ERROR(kernels::Axpby(s, 1.0f, x, 1.0f, mid, mid));
  } else {
    SY_RETURN_IF_ERROR(CopyAsync(s, x, mid));
    SY_RETURN_IF_ERROR(Gemm(s, Reshape(o, {t, hq * d}), false, L.wo, true, mid, 1.0f, 1.0f));
  }
  SY_RETURN_IF_ERROR(kernels::RmsNormForward(s, mid, L.w_post, eps, n2, Rows(L.rstd2, tl)));
  phase.Next(L.is_moe ? "moe" : "mlp");
  if (L.is_moe) {
    // Offsets of the whole micro-batch (max_tokens_·CP rows): under CP the layer adds each
    // local chunk's place in it, so every token gets the noise one process gives it.
    const uint64_t jitter =
        (step_counter_ * static_cast<uint64_t>(c.num_layers) + static_cast<uint64_t>(L.index)) *
        static_cast<uint64_t>(max_tokens_ * c.cp_size * h);
    SY_RETURN_IF_ERROR(L.moe->Forward(s, L.mp, L.rs, n2, x_next, training ? jitter : 0));
    SY_RETURN_IF_ERROR(kernels::Axpby(s, 1.0f, mid, 1.0f, x_next, x_next));
    if (micro >= 0) {
      const int64_t n_moe = c.num_moe_layers(), e = c.moe.router.num_experts;
      SY_RETURN_IF_ERROR(
          CopyAsync(s, L.moe->losses(),
                    Slice(stat_moe_losses_, (micro * n_moe + L.moe_index) * num_moe_terms_,
                          {num_moe_terms_})));
      SY_RETURN_IF_ERROR(CopyAsync(s, L.moe->tokens_per_expert(),
                                   Slice(stat_counts_, (micro * n_moe + L.moe_index) * e, {e})));
    }
  } else {
    const Tensor hh = Rows(L.h, t), a = Rows(L.a, t);
    const Tensor n2_all = tp ? Rows(ag_, t) : n2;
    if (tp) SY_RETURN_IF_ERROR(GatherSeq(s, n2, n2_all, seq_len));
    SY_RETURN_IF_ERROR(Gemm(s, n2_all, false, L.w_fc1, true, hh));
    SY_RETURN_IF_ERROR(kernels::SwigluForward(s, hh, Tensor(), Tensor(), a));
    if (tp) {
      SY_RETURN_IF_ERROR(Gemm(s, a, false, L.w_fc2, true, Rows(rs_, t)));
      SY_RETURN_IF_ERROR(ReduceScatterSeq(s, Rows(rs_, t), x_next, seq_len));
      SY_RETURN_IF_ERROR(kernels::Axpby(s, 1.0f, mid, 1.0f, x_next, x_next));
    } else {
      SY_RETURN_IF_ERROR(CopyAsync(s, mid, x_next));
      SY_RETURN_IF_ERROR(Gemm(s, a, false, L.w_fc2, true, x_next, 1.0f, 1.0f));
    }
  }
  return absl::OkStatus();
}

Tensor GptModel::ChunkOutput(int chunk, int64_t rows) const {
  return Rows(resid_[chunk_resid_[chunk] + chunk_layer_[chunk + 1] - chunk_layer_[chunk]], rows);
}

absl::Status GptModel::ForwardPass(const Stream& s, const Tensor& ids, int64_t seq_len, int micro,
                                   bool training, const Tensor& input, int chunk) {
  const int64_t t = ids.numel();
  if (ids.dtype != DType::kI32 || ids.device != device_ || s.device != device_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptModel: ids must be i32 on ", device_.ToString(), ", got ", ids.DebugString()));
  }
  // seq_len is the LOCAL sequence length: S / CP tokens of each sequence under CP.
  const int64_t cp = config_.cp_size, local_max = config_.seq_length / cp;
  if (seq_len < 1 || seq_len > local_max || t % seq_len != 0 || t == 0 || t > max_tokens_ ||
      (cp > 1 && seq_len % 2 != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptModel: ", t, " tokens must be a positive multiple of seq_len (", seq_len,
                     ") with seq_len <= seq_length / context_parallel_size (", config_.seq_length,
                     " / ", cp, ")", cp > 1 ? " and even (two chunks per rank)" : "",
                     " and at most ", max_tokens_, " tokens (the planned micro-batch)"));
  }
  if (config_.tp_size > 1 && seq_len != local_max) {
    // The MoE layers' sequence shards (jitter positions, per-sequence counts) are planned for
    // seq_length / (CP·TP) positions.
    return absl::InvalidArgumentError(absl::StrCat(
        "GptModel: seq_len (", seq_len, ") must be model.seq_length (", config_.seq_length,
        cp > 1 ? absl::StrCat(") / context_parallel_size (", cp) : std::string(),
        ") with tensor_model_parallel_size ", config_.tp_size,
        ": sequence parallelism gives every TP rank seq_length / (CP·TP) positions"));
  }
  if (micro >= max_micro_) {
    return absl::InvalidArgumentError(
        absl::StrCat("GptModel: micro-batch slot ", micro, " >= ", max_micro_));
  }
  if (config_.num_moe_layers() > 0 && seq_len != local_max) {
    for (const auto& aux : config_.moe.router.aux_losses) {
      if (aux.type == kernels::AuxLossType::kSeqAuxLoss) {
        return absl::InvalidArgumentError(
            "GptModel: seq_aux_loss needs seq_len == model.seq_length / context_parallel_size");
      }
    }
  }
  tokens_ = t;
  const int64_t tl = t / config_.tp_size;
  ++step_counter_;
  const Tensor x0 = Rows(resid_[chunk_resid_[chunk]], tl);
  if (!config_.EmbedsIn(chunk)) {
    // Pipeline: the previous (virtual) stage's output is this chunk's x_0.
    SY_RETURN_IF_ERROR(CheckTensor(input, "GptModel: pipeline stage input", config_.dtype,
                                   {tl, config_.hidden_size}));
    SY_RETURN_IF_ERROR(CopyAsync(s, input, x0));
  } else {
    ScopedRange range(s, "embedding.fwd");
    if (config_.tp_size > 1) {
      // Vocabulary-parallel (§1.7): every token of the micro-batch looked up in this rank's rows
      // (zero rows for the others' ids), then reduce-scattered onto this rank's sequence shard:
      // the sum over TP has exactly one non-zero term per token.
      const int64_t vl = config_.vocab_size / config_.tp_size;
      SY_RETURN_IF_ERROR(
          kernels::VocabShardEmbeddingForward(s, ids, P("embedding.weight"), config_.tp_rank * vl,
                                              config_.vocab_size, Rows(ids_loc_, t), Rows(rs_, t)));
      SY_RETURN_IF_ERROR(ReduceScatterSeq(s, Rows(rs_, t), x0, seq_len));
    } else {
      SY_RETURN_IF_ERROR(kernels::EmbeddingForward(s, ids, P("embedding.weight"), x0));
    }
  }
  for (int64_t i = chunk_layer_[chunk]; i < chunk_layer_[chunk + 1]; ++i) {
    SY_RETURN_IF_ERROR(LayerForward(s, layers_[i], seq_len, micro, training));
  }
  if (!config_.HeadIn(chunk)) return absl::OkStatus();
  ScopedRange range(s, "final_norm.fwd");
  SY_RETURN_IF_ERROR(kernels::RmsNormForward(s, ChunkOutput(chunk, tl), P("final_norm.weight"),
                                             static_cast<float>(config_.norm_epsilon),
                                             Rows(final_n_, tl), Rows(final_rstd_, tl)));
  return absl::OkStatus();
}

void GptModel::SetTraining(bool training) {
  // Every in-flight slot's MoE layers (the inactive slots' vector of the active one is empty).
  for (Layer& L : layers_) {
    if (L.moe != nullptr) L.moe->set_training(training);
  }
  for (auto& layers : slot_layers_) {
    for (Layer& L : layers) {
      if (L.moe != nullptr) L.moe->set_training(training);
    }
  }
}

absl::Status GptModel::Forward(const Stream& stream, const Tensor& ids, const Tensor& targets,
                               int64_t seq_len, int micro, const Tensor& logits,
                               const Tensor& input, int chunk, Tensor* output) {
  if (chunk < 0 || chunk >= config_.num_chunks()) {
    return absl::InvalidArgumentError(absl::StrCat("GptModel::Forward: chunk (", chunk,
                                                   ") must be in [0, ", config_.num_chunks(), ")"));
  }
  if (!config_.HeadIn(chunk) && output == nullptr) {
    return absl::InvalidArgumentError(
        "GptModel::Forward: a chunk without the LM head must take output");
  }
  // Slot 0: evaluation runs between steps, no training micro-batch is in flight.
  SelectSlot(0);
  SY_RETURN_IF_ERROR(
      ForwardPass(stream, ids, seq_len, targets.data ? micro : -1, false, input, chunk));
  const int64_t t = tokens_, tl = t / config_.tp_size;
  if (!config_.HeadIn(chunk)) {
    *output = ChunkOutput(chunk, tl);  // handed to the next (virtual) stage by the trainer
    return absl::OkStatus();
  }
  const Tensor w_out = config_.untie_embeddings ? P("output.weight") : P("embedding.weight");
  const bool tp = config_.tp_size > 1;
  if (logits.data != nullptr) {
    SY_RETURN_IF_ERROR(
        CheckTensor(logits, "GptModel::Forward.logits", logits.dtype, {t, config_.vocab_size}));
  }
  // TP > 1: the LM head is vocabulary-parallel over the whole micro-batch: gather the final
  // norm's sequence shards into the all-gather scratch (no layer uses it after the forward).
  const Tensor normed = tp ? Rows(ag_, t) : Rows(final_n_, t);
  if (tp && (targets.data != nullptr || logits.data != nullptr)) {
    SY_RETURN_IF_ERROR(GatherSeq(stream, Rows(final_n_, tl), normed, seq_len));
  }
  if (targets.data != nullptr) {
    if (ce_ == nullptr) {  // HeadIn holds only on the last stage, which builds it
      return absl::FailedPreconditionError(absl::StrCat(
          "GptModel::Forward: pipeline stage ", config_.pp_rank, " has no fused LM-head loss"));
    }
    const Tensor loss = Slice(stat_ce_, micro, {1});
    if (tp) {
      SY_RETURN_IF_ERROR(ce_->VocabParallelForward(stream, normed, w_out, targets, MakeVocabShard(),
                                                   loss, ce_num_valid_, Rows(ce_lse_, t)));
      SY_RETURN_IF_ERROR(KeepLossOnFirstTpRank(stream, loss));
    } else {
      SY_RETURN_IF_ERROR(
          ce_->Forward(stream, normed, w_out, targets, loss, ce_num_valid_, Rows(ce_lse_, t)));
    }
  }
  if (logits.data != nullptr) {
    if (!tp) return Gemm(stream, normed, false, w_out, true, logits);
    SY_RETURN_IF_ERROR(GatherLogits(stream, normed, w_out, logits));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Context-parallel attention (all-gather of K/V; see the header's "Context parallelism")

// The chunk layout is CopyCpChunks'.
absl::Status GptModel::CpGatherKv(const Stream& s, const Tensor& local, const Tensor& whole,
                                  int64_t b, int64_t s_loc) {
  const int64_t cp = config_.cp_size;
  const int64_t row = local.numel() / local.dim(0), n_local = b * s_loc;
  const Tensor gather = Slice(cp_gather_, 0, {cp * n_local * row});
  SY_RETURN_IF_ERROR(groups_.cp->AllGather(Slice(local, 0, {n_local * row}), gather));
  // The gather is in CP order (rank r's local rows, rank by rank): put every chunk at its place.
  return CopyCpChunks(s, gather, whole, cp, b, s_loc, row, /*to_whole=*/true);
}

absl::Status GptModel::CpReduceScatterKv(const Stream& s, const Tensor& whole, const Tensor& local,
                                         int64_t b, int64_t s_loc) {
  const int64_t cp = config_.cp_size;
  const int64_t row = local.numel() / local.dim(0), n_local = b * s_loc;
  const Tensor gather = Slice(cp_gather_, 0, {cp * n_local * row});
  SY_RETURN_IF_ERROR(CopyCpChunks(s, gather, whole, cp, b, s_loc, row, /*to_whole=*/false));
  // Rank r receives the sum over the CP ranks of the gradient of its own K/V rows.
  return groups_.cp->ReduceScatter(gather, Slice(local, 0, {n_local * row}), comm::ReduceOp::kSum);
}

absl::Status GptModel::CpAttentionForward(const Stream& s, Layer& L, int64_t b, int64_t s_loc) {
  const GptConfig& c = config_;
  const int64_t cp = c.cp_size, ch = s_loc / 2, seq = s_loc * cp, t = b * s_loc;
  // This rank's TP share of the heads: under TP·CP the K/V all-gather runs over the CP group
  // of this TP rank, whose peers hold the same heads (GptModel's "Tensor and context").
  const int64_t hq = c.num_heads / c.tp_size, hkv = c.num_kv_heads / c.tp_size, d = c.head_dim;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  SY_RETURN_IF_ERROR(CpGatherKv(s, Rows(L.k, t), cp_k_, b, s_loc));
  SY_RETURN_IF_ERROR(CpGatherKv(s, Rows(L.v, t), cp_v_, b, s_loc));
  // One call per (sequence, local chunk): the chunk's queries are the last ch positions of the
  // K/V prefix [0, (id+1)·ch) of their sequence (bottom-right causal). lse slot of the call:
  // [b][j] blocks of [Hq, ch] in L.lse (the layout only the backward below reads).
  for (int64_t bb = 0; bb < b; ++bb) {
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t kv_len = (kernels::CpChunkId(j, cp, c.cp_rank) + 1) * ch;
      const int64_t q0 = bb * s_loc + j * ch;
      SY_RETURN_IF_ERROR(kernels::AttentionForward(
          s, Slice(L.q, q0 * hq * d, {ch, hq, d}),
          Slice(cp_k_, bb * seq * hkv * d, {kv_len, hkv, d}),
          Slice(cp_v_, bb * seq * hkv * d, {kv_len, hkv, d}), ch, kv_len, scale,
          Slice(L.o, q0 * hq * d, {ch, hq, d}), Slice(L.lse, (bb * 2 + j) * hq * ch, {1, hq, ch})));
    }
  }
  return absl::OkStatus();
}

absl::Status GptModel::CpAttentionBackward(const Stream& s, Layer& L, int64_t b, int64_t s_loc) {
  const GptConfig& c = config_;
  const int64_t cp = c.cp_size, ch = s_loc / 2, seq = s_loc * cp, t = b * s_loc;
  // This rank's TP share of the heads: under TP·CP the K/V all-gather runs over the CP group
  // of this TP rank, whose peers hold the same heads (GptModel's "Tensor and context").
  const int64_t hq = c.num_heads / c.tp_size, hkv = c.num_kv_heads / c.tp_size, d = c.head_dim;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  // K and V of the whole sequences again (not kept from the forward: that would hold B·S rows of
  // K and V per layer, the memory CP exists to save).
  SY_RETURN_IF_ERROR(CpGatherKv(s, Rows(L.k, t), cp_k_, b, s_loc));
  SY_RETURN_IF_ERROR(CpGatherKv(s, Rows(L.v, t), cp_v_, b, s_loc));
  const Tensor dk_whole = Rows(cp_dk_, b * seq), dv_whole = Rows(cp_dv_, b * seq);
  SY_RETURN_IF_ERROR(ZeroAsync(s, dk_whole));
  SY_RETURN_IF_ERROR(ZeroAsync(s, dv_whole));
  for (int64_t bb = 0; bb < b; ++bb) {
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t kv_len = (kernels::CpChunkId(j, cp, c.cp_rank) + 1) * ch;
      const int64_t q0 = bb * s_loc + j * ch, k0 = bb * seq * hkv * d;
      const Tensor dk_part = Slice(cp_dk_part_, 0, {kv_len, hkv, d});
      const Tensor dv_part = Slice(cp_dv_part_, 0, {kv_len, hkv, d});
      SY_RETURN_IF_ERROR(kernels::AttentionBackward(
          s, Slice(L.q, q0 * hq * d, {ch, hq, d}), Slice(cp_k_, k0, {kv_len, hkv, d}),
          Slice(cp_v_, k0, {kv_len, hkv, d}), Slice(L.o, q0 * hq * d, {ch, hq, d}),
          Slice(L.lse, (bb * 2 + j) * hq * ch, {1, hq, ch}), Slice(d_o_, q0 * hq * d, {ch, hq, d}),
          ch, kv_len, scale, Slice(delta_, (bb * 2 + j) * hq * ch, {1, hq, ch}),
          Slice(dq_, q0 * hq * d, {ch, hq, d}), dk_part, dv_part));
      // The two chunks' prefixes overlap: add, not overwrite.
      const Tensor dk_dst = Slice(cp_dk_, k0, {kv_len, hkv, d});
      const Tensor dv_dst = Slice(cp_dv_, k0, {kv_len, hkv, d});
      SY_RETURN_IF_ERROR(kernels::Axpby(s, 1.0f, dk_part, 1.0f, dk_dst, dk_dst));
      SY_RETURN_IF_ERROR(kernels::Axpby(s, 1.0f, dv_part, 1.0f, dv_dst, dv_dst));
    }
  }
  SY_RETURN_IF_ERROR(CpReduceScatterKv(s, dk_whole, Rows(dk_, t), b, s_loc));
  return CpReduceScatterKv(s, dv_whole, Rows(dv_, t), b, s_loc);
}

// ---------------------------------------------------------------------------------------------
// Backward

absl::Status GptModel::LayerBackward(const Stream& s, Layer& L, int64_t seq_len,
                                     double aux_grad_scale) {
  const GptConfig& c = config_;
  const bool tp = c.tp_size > 1;
  const int64_t t = tokens_, tl = t / c.tp_size, b = t / seq_len, d = c.head_dim;
  const int64_t hq = c.num_heads / c.tp_size, hkv = c.num_kv_heads / c.tp_size;
  const float base = static_cast<float>(c.rotary_base);
  const Tensor x = Rows(resid_[L.resid], tl);
  const Tensor n1 = Rows(L.n1, tl), mid = Rows(L.mid, tl), n2 = Rows(L.n2, tl);
  const Tensor g = Rows(g_, tl), dn = Rows(dn_, tl);
  // SP: the gathered output gradient, and the input gradient's partial sums [t, H].
  const Tensor all = tp ? Rows(ag_, t) : Tensor(), partial = tp ? Rows(rs_, t) : dn;

  const float eps = static_cast<float>(c.norm_epsilon);

  ScopedRange range(s, "layer.bwd", L.index);
  PhaseSequence phase(s);
  if (c.recompute_layernorm) {
    // "layernorm": n2 again, for the MLP / MoE weight gradients (the MoE layer reads it as the
    // x its forward was given: the same scratch, restored to the same values).
    phase.Next("norm_recompute");
    SY_RETURN_IF_ERROR(kernels::RmsNormForward(s, mid, L.w_post, eps, n2, Rows(L.rstd2, tl)));
  }
  phase.Next(L.is_moe ? "moe" : "mlp");
  // MLP: dn = d(loss)/d(n2), then through the post-attention norm into g.
  if (L.is_moe) {
    // The first Backward after ZeroGrads(kOverwrite) writes the expert gradients (and, with
    // them, the router's and shared expert's, which were zeroed) instead of adding.
    bool overwrite = false;
    if (static_cast<size_t>(L.index) < overwrite_expert_grads_.size()) {
      overwrite = overwrite_expert_grads_[L.index];
      overwrite_expert_grads_[L.index] = false;
    }
    SY_RETURN_IF_ERROR(L.moe->Backward(
        s, L.mp, L.mg, g, dn, aux_grad_scale,
        overwrite ? MoELayer::GradMode::kOverwrite : MoELayer::GradMode::kAccumulate));
  } else {
    const Tensor hh = Rows(L.h, t), a = Rows(L.a, t), dh = Rows(dh_, t), da = Rows(da_, t);
    if (c.recompute_mlp) {
      // "mlp": fc1 and SwiGLU again from the kept input, as LayerForward computed them.
      const Tensor n2_all = tp ? all : n2;
      if (tp) SY_RETURN_IF_ERROR(GatherSeq(s, n2, n2_all, seq_len));
      SY_RETURN_IF_ERROR(Gemm(s, n2_all, false, L.w_fc1, true, hh));
      SY_RETURN_IF_ERROR(kernels::SwigluForward(s, hh, Tensor(), Tensor(), a));
    }
    const Tensor g_all = tp ? all : g;
    if (tp) SY_RETURN_IF_ERROR(GatherSeq(s, g, g_all, seq_len));
    SY_RETURN_IF_ERROR(Gemm(s, g_all, false, L.w_fc2, false, da));
    SY_RETURN_IF_ERROR(Gemm(s, g_all, true, a, false, L.g_fc2, 1.0f, 1.0f));
    SY_RETURN_IF_ERROR(kernels::SwigluBackward(s, da, hh, Tensor(), Tensor(), dh, Tensor()));
    const Tensor n2_all = tp ? all : n2;  // g_all is no longer needed
    if (tp) SY_RETURN_IF_ERROR(GatherSeq(s, n2, n2_all, seq_len));
    SY_RETURN_IF_ERROR(Gemm(s, dh, true, n2_all, false, L.g_fc1, 1.0f, 1.0f));
    SY_RETURN_IF_ERROR(Gemm(s, dh, false, L.w_fc1, false, partial));
    if (tp) SY_RETURN_IF_ERROR(ReduceScatterSeq(s, partial, dn, seq_len));
  }
  phase.Next("oproj_residual_norm");
  PhaseSequence oproj_phase(s);  // its parts, nested (--breakdown)
  oproj_phase.Next("post_norm");
  // The residual: g += the norm's input gradient, inside the norm's backward (one rounding).
  SY_RETURN_IF_ERROR(kernels::RmsNormBackward(s, dn, mid, L.w_post, Rows(L.rstd2, tl), g, L.g_post,
                                              true, rms_ws_, /*accumulate_dx=*/true));
  oproj_phase.Next("oproj");

  // Attention: g is now d(loss)/d(mid).
  const Tensor q = Rows(L.q, t), k = Rows(L.k, t), v = Rows(L.v, t), o = Rows(L.o, t);
  const Tensor d_o = Rows(d_o_, t), dq = Rows(dq_, t), dk = Rows(dk_, t), dv = Rows(dv_, t);
  const Tensor g_all = tp ? all : g;
  if (tp) SY_RETURN_IF_ERROR(GatherSeq(s, g, g_all, seq_len));
  SY_RETURN_IF_ERROR(Gemm(s, g_all, false, L.wo, false, Reshape(d_o, {t, hq * d})));
  SY_RETURN_IF_ERROR(Gemm(s, g_all, true, Reshape(o, {t, hq * d}), false, L.go, 1.0f, 1.0f));
  oproj_phase.Close();
  phase.Next("attention");
  if (c.cp_size > 1) {
    SY_RETURN_IF_ERROR(CpAttentionBackward(s, L, b, seq_len));
  } else {
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    SY_RETURN_IF_ERROR(kernels::AttentionBackward(s, q, k, v, o, Reshape(L.lse, {b, hq, seq_len}),
                                                  d_o, seq_len, scale,
                                                  Reshape(delta_, {b, hq, seq_len}), dq, dk, dv));
  }
  phase.Next("norm_qkv_rope");
  PhaseSequence qkv_phase(s);  // its parts, nested (--breakdown); closes before `phase`
  qkv_phase.Next("rope_qk_norm");
  const kernels::RopeCp rope_cp{c.cp_size, c.cp_rank};
  if (c.qk_layernorm) {
    SY_RETURN_IF_ERROR(kernels::QkNormRopeBackward(
        s, {Rows(L.q_pre, t), L.w_qn, Rows(L.q_rstd, t * hq), dq, L.g_qn},
        {Rows(L.k_pre, t), L.w_kn, Rows(L.k_rstd, t * hkv), dk, L.g_kn}, seq_len, base, rms_ws_,
        rope_cp));
  } else {
    SY_RETURN_IF_ERROR(kernels::RopeBackward(s, dq, seq_len, base, dq, rope_cp));
    SY_RETURN_IF_ERROR(kernels::RopeBackward(s, dk, seq_len, base, dk, rope_cp));
  }
  const Tensor dq2 = Reshape(dq, {t, hq * d}), dk2 = Reshape(dk, {t, hkv * d});
  const Tensor dv2 = Reshape(dv, {t, hkv * d});
  if (c.recompute_layernorm) {
    // "layernorm": n1 again, for the q/k/v weight gradients.
    SY_RETURN_IF_ERROR(kernels::RmsNormForward(s, x, L.w_in, eps, n1, Rows(L.rstd1, tl)));
  }
  const Tensor n1_all = tp ? all : n1;  // g_all is no longer needed
  if (tp) SY_RETURN_IF_ERROR(GatherSeq(s, n1, n1_all, seq_len));
  qkv_phase.Next("qkv_wgrad");
  SY_RETURN_IF_ERROR(Gemm(s, dq2, true, n1_all, false, L.gq, 1.0f, 1.0f));
  SY_RETURN_IF_ERROR(Gemm(s, dk2, true, n1_all, false, L.gk, 1.0f, 1.0f));
  SY_RETURN_IF_ERROR(Gemm(s, dv2, true, n1_all, false, L.gv, 1.0f, 1.0f));
  qkv_phase.Next("qkv_dgrad");
  SY_RETURN_IF_ERROR(Gemm(s, dq2, false, L.wq, false, partial));
  SY_RETURN_IF_ERROR(Gemm(s, dk2, false, L.wk, false, partial, 1.0f, 1.0f));
  SY_RETURN_IF_ERROR(Gemm(s, dv2, false, L.wv, false, partial, 1.0f, 1.0f));
  if (tp) SY_RETURN_IF_ERROR(ReduceScatterSeq(s, partial, dn, seq_len));
  qkv_phase.Next("input_norm");
  SY_RETURN_IF_ERROR(kernels::RmsNormBackward(s, dn, x, L.w_in, Rows(L.rstd1, tl), g, L.g_in, true,
                                              rms_ws_, /*accumulate_dx=*/true));
  return absl::OkStatus();
}

absl::Status GptModel::ForwardBackward(const Stream& s, const Tensor& ids, const Tensor& targets,
                                       int64_t seq_len, float ce_scale, double aux_grad_scale,
                                       int micro, const Tensor& input, Tensor* input_grad,
                                       int slot) {
  if (micro < 0) return absl::InvalidArgumentError("GptModel: micro-batch slot must be >= 0");
  if (slot < 0 || slot >= num_slots()) {
    return absl::InvalidArgumentError(absl::StrCat("GptModel::ForwardBackward: slot (", slot,
                                                   ") must be in [0, ", num_slots(), ")"));
  }
  const int head = static_cast<int>(config_.num_chunks() - 1);
  if (!config_.last_stage() || ce_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("GptModel::ForwardBackward: pipeline stage ", config_.pp_rank,
                     " is not the last (it has no LM head and no fused loss): use ForwardStage / "
                     "BackwardStage"));
  }
  if (!config_.EmbedsIn(head) && input_grad == nullptr) {
    return absl::InvalidArgumentError(
        "GptModel::ForwardBackward: a later pipeline stage must take input_grad");
  }
  ScopedRange range(s, "forward_backward", micro);
  SelectSlot(slot);
  SY_RETURN_IF_ERROR(ForwardPass(s, ids, seq_len, micro, true, input, head));
  const int64_t t = tokens_, tl = t / config_.tp_size;
  const Tensor w_out = config_.untie_embeddings ? P("output.weight") : P("embedding.weight");
  const Tensor dw_out = config_.untie_embeddings ? G("output.weight") : G("embedding.weight");
  const Tensor fn = Rows(final_n_, tl), lse = Rows(ce_lse_, t);
  const Tensor dn = Rows(dn_, tl), g = Rows(g_, tl);
  const bool tp = config_.tp_size > 1;
  {
    // LM head loss and its gradient in one pass (the logits of each chunk computed once).
    ScopedRange head(s, "lm_head_loss");
    const Tensor loss = Slice(stat_ce_, micro, {1});
    if (tp) {
      // Vocabulary-parallel (§1.8): the whole micro-batch's final norm (SP all-gather) against
      // this rank's V/TP rows; max and (sum-exp, target logit) all-reduced over TP inside, never
      // the logits. The input gradient is this rank's partial sum over its vocabulary rows:
      // reduce-scattered onto the sequence shard (the all-gather's backward).
      const Tensor fn_all = Rows(ag_, t), dfn_all = Rows(rs_, t);
      SY_RETURN_IF_ERROR(GatherSeq(s, fn, fn_all, seq_len));
      SY_RETURN_IF_ERROR(ce_->VocabParallelForwardBackward(s, fn_all, w_out, targets,
                                                           MakeVocabShard(), ce_scale, loss,
                                                           ce_num_valid_, lse, dfn_all, dw_out));
      SY_RETURN_IF_ERROR(KeepLossOnFirstTpRank(s, loss));
      SY_RETURN_IF_ERROR(ReduceScatterSeq(s, dfn_all, dn, seq_len));
    } else {
      SY_RETURN_IF_ERROR(ce_->ForwardBackward(s, fn, w_out, targets, ce_scale, loss, ce_num_valid_,
                                              lse, dn, dw_out));
    }
  }
  {
    // Backward: final norm, then the layers in reverse, then the embedding.
    ScopedRange norm(s, "final_norm.bwd");
    SY_RETURN_IF_ERROR(kernels::RmsNormBackward(s, dn, ChunkOutput(head, tl),
                                                P("final_norm.weight"), Rows(final_rstd_, tl), g,
                                                G("final_norm.weight"), true, rms_ws_));
  }
  if (backward_hook_) SY_RETURN_IF_ERROR(backward_hook_(config_.num_layers));
  return LayersBackward(s, ids, seq_len, aux_grad_scale, input_grad, head);
}

absl::Status GptModel::LayersBackward(const Stream& s, const Tensor& ids, int64_t seq_len,
                                      double aux_grad_scale, Tensor* input_grad, int chunk) {
  // g_ holds d(loss)/d(x_L) of this stage's last layer.
  const int64_t tl = tokens_ / config_.tp_size;
  const Tensor g = Rows(g_, tl);
  for (int64_t i = chunk_layer_[chunk + 1] - 1; i >= chunk_layer_[chunk]; --i) {
    SY_RETURN_IF_ERROR(LayerBackward(s, layers_[i], seq_len, aux_grad_scale));
    if (backward_hook_) SY_RETURN_IF_ERROR(backward_hook_(layers_[i].index));
  }
  if (!config_.EmbedsIn(chunk)) {
    if (input_grad != nullptr) *input_grad = g;  // sent to the previous stage by the trainer
    return absl::OkStatus();
  }
  {
    ScopedRange emb(s, "embedding.bwd");
    if (config_.tp_size > 1) {
      // Vocabulary-parallel: the reduce-scatter's backward (all-gather of the shard gradients),
      // then this rank's rows get every token they embedded (ids mapped again: another
      // micro-batch may have used ids_loc_ since the forward).
      const int64_t t = tokens_, vl = config_.vocab_size / config_.tp_size;
      SY_RETURN_IF_ERROR(GatherSeq(s, g, Rows(ag_, t), seq_len));
      SY_RETURN_IF_ERROR(kernels::VocabShardEmbeddingBackward(
          s, ids, Rows(ag_, t), G("embedding.weight"), config_.tp_rank * vl, config_.vocab_size,
          Rows(ids_loc_, t), true, emb_ws_));
    } else {
      SY_RETURN_IF_ERROR(
          kernels::EmbeddingBackward(s, ids, g, G("embedding.weight"), true, emb_ws_));
    }
  }
  if (backward_hook_) SY_RETURN_IF_ERROR(backward_hook_(-1));
  return absl::OkStatus();
}

absl::Status GptModel::ForwardStage(const Stream& s, const Tensor& ids, const Tensor& input,
                                    int64_t seq_len, int micro, int slot, Tensor* output,
                                    int chunk) {
  if (chunk < 0 || chunk >= config_.num_chunks() || config_.HeadIn(chunk) || slot < 0 ||
      slot >= num_slots() || micro < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptModel::ForwardStage: needs a chunk without the LM head (stage ", config_.pp_rank,
        " of ", config_.pp_size, ", chunk ", chunk, " of ", config_.num_chunks(), "), slot in [0, ",
        num_slots(), ") (got ", slot, ") and micro >= 0"));
  }
  ScopedRange range(s, "forward_stage", micro);
  SelectSlot(slot);
  SY_RETURN_IF_ERROR(ForwardPass(s, ids, seq_len, micro, true, input, chunk));
  *output = ChunkOutput(chunk, tokens_ / config_.tp_size);
  return absl::OkStatus();
}

absl::Status GptModel::BackwardStage(const Stream& s, const Tensor& ids, const Tensor& output_grad,
                                     int64_t seq_len, double aux_grad_scale, int slot,
                                     Tensor* input_grad, int chunk) {
  if (chunk < 0 || chunk >= config_.num_chunks() || config_.HeadIn(chunk) || slot < 0 ||
      slot >= num_slots()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GptModel::BackwardStage: needs a chunk without the LM head (stage ", config_.pp_rank,
        " of ", config_.pp_size, ", chunk ", chunk, " of ", config_.num_chunks(),
        ") and slot in [0, ", num_slots(), ") (got ", slot, ")"));
  }
  ScopedRange range(s, "backward_stage", slot);
  SelectSlot(slot);
  tokens_ = ids.numel();  // the slot's micro-batch (all micro-batches have the same size)
  const int64_t tl = tokens_ / config_.tp_size;
  SY_RETURN_IF_ERROR(CheckTensor(output_grad, "GptModel::BackwardStage.output_grad", config_.dtype,
                                 {tl, config_.hidden_size}));
  SY_RETURN_IF_ERROR(CopyAsync(s, output_grad, Rows(g_, tl)));
  return LayersBackward(s, ids, seq_len, aux_grad_scale, input_grad, chunk);
}

// ---------------------------------------------------------------------------------------------
// Statistics and per-global-batch updates

absl::StatusOr<GptStepStats> GptModel::ReadStepStats(const Stream& stream, int num_micro) const {
  if (num_micro < 1 || num_micro > max_micro_) {
    return absl::InvalidArgumentError(absl::StrCat("GptModel::ReadStepStats: num_micro (",
                                                   num_micro, ") not in [1, ", max_micro_, "]"));
  }
  if (stream.is_cuda()) {
    SY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream.cuda_stream));
  }
  GptStepStats out;
  auto to_host = [](const Tensor& t) -> absl::StatusOr<Buffer> {
    SY_ASSIGN_OR_RETURN(Buffer b, Buffer::ForTensor(t.dtype, t.shape, Device::Cpu()));
    SY_RETURN_IF_ERROR(kernels::CopyTensor(t, b.View()));
    return b;
  };
  SY_ASSIGN_OR_RETURN(Buffer ce, to_host(stat_ce_));
  for (int i = 0; i < num_micro; ++i) out.loss_sum += LoadAsDouble(ce.View(), i);
  const int64_t n_moe = config_.num_moe_layers();
  if (n_moe > 0) {
    const int64_t e = config_.moe.router.num_experts;
    SY_ASSIGN_OR_RETURN(Buffer losses, to_host(stat_moe_losses_));
    SY_ASSIGN_OR_RETURN(Buffer counts, to_host(stat_counts_));
    out.moe_losses.assign(n_moe, std::vector<double>(num_moe_terms_, 0.0));
    out.expert_tokens.assign(n_moe, std::vector<int64_t>(e, 0));
    for (int i = 0; i < num_micro; ++i) {
      for (int64_t l = 0; l < n_moe; ++l) {
        for (int64_t j = 0; j < num_moe_terms_; ++j) {
          out.moe_losses[l][j] +=
              LoadAsDouble(losses.View(), (i * n_moe + l) * num_moe_terms_ + j) / num_micro;
        }
        for (int64_t j = 0; j < e; ++j) {
          out.expert_tokens[l][j] += counts.View().as<int32_t>()[(i * n_moe + l) * e + j];
        }
      }
    }
  }
  return out;
}

int64_t GptModel::GradReadyIndex(const ParamInfo& p) const {
  if (p.name == "embedding.weight") return -1;
  if (absl::StartsWith(p.name, "layers.")) {
    int64_t l = 0;
    const size_t dot = p.name.find('.', 7);
    if (absl::SimpleAtoi(p.name.substr(7, dot - 7), &l)) return l;
  }
  return config_.num_layers;  // output.weight, final_norm.weight
}

absl::Status GptModel::EndGlobalBatch(const Stream& stream) {
  if (config_.moe.router.use_expert_bias && groups_.tdc != nullptr &&
      local_counts_.View().numel() > 0) {
    // Global token counts per expert (spec §1.5): one all-reduce for every MoE layer.
    SY_RETURN_IF_ERROR(
        groups_.tdc->AllReduce(local_counts_.View(), local_counts_.View(), comm::ReduceOp::kSum));
  }
  // The other in-flight slots' MoE layers (pipeline) share the bias and counts: reset only.
  for (auto& layers : slot_layers_) {
    for (Layer& L : layers) {
      if (L.is_moe) SY_RETURN_IF_ERROR(L.moe->ResetGlobalBatch());
    }
  }
  for (Layer& L : layers_) {
    if (!L.is_moe) continue;
    if (config_.moe.router.use_expert_bias) {
      SY_RETURN_IF_ERROR(
          kernels::UpdateExpertBias(stream, L.rs.local_tokens_per_expert, L.rs.expert_bias,
                                    static_cast<float>(config_.expert_bias_update_rate)));
    }
    SY_RETURN_IF_ERROR(L.moe->ResetGlobalBatch());
  }
  return absl::OkStatus();
}

}  // namespace switchyard::model
