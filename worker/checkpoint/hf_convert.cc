// HF Mixtral / Qwen3-MoE checkpoint import and export (see hf_convert.h for the mapping).
#include "worker/checkpoint/hf_convert.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace switchyard::model {
namespace {

using Json = nlohmann::ordered_json;
using kernels::Buffer;

// ---------------------------------------------------------------------------------------------
// Dtype helpers

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(man), -24);  // zero or subnormal, exact
  } else if (exp == 31) {
    f = man ? std::nanf("") : INFINITY;
  } else {
    f = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  }
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits |= sign;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even; overflow to inf; NaN stays NaN.
uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  if (std::isnan(f)) return sign | 0x7e00u;
  const float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00u;           // rounds to inf
  if (a < std::ldexp(1.0f, -14)) {                    // subnormal range: multiples of 2^-24
    const float q = std::nearbyint(a * 16777216.0f);  // default rounding: to nearest even
    return sign | static_cast<uint16_t>(q);
  }
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  // 11 significant bits: a = q * 2^(e - 11), q in [1024, 2048].
  float q = std::nearbyint(std::ldexp(m, 11));
  if (q >= 2048.0f) {
    q = 1024.0f;
    ++e;
  }
  const int exp = e - 1 + 15;  // a = 1.xxx * 2^(e-1)
  if (exp >= 31) return sign | 0x7c00u;
  return sign | static_cast<uint16_t>(exp << 10) | (static_cast<uint16_t>(q) - 1024u);
}

// `src` (CPU, f32/f64/bf16/f16) widened to an f32 CPU buffer of the same shape.
absl::StatusOr<Buffer> ToF32(const Tensor& src, const std::string& what) {
  SY_ASSIGN_OR_RETURN(Buffer out, Buffer::ForTensor(DType::kF32, src.shape, Device::Cpu()));
  if (src.dtype == DType::kF16) {
    const uint16_t* s = static_cast<const uint16_t*>(src.data);
    float* d = out.View().as<float>();
    for (int64_t i = 0; i < src.numel(); ++i) d[i] = HalfToFloat(s[i]);
    return out;
  }
  if (src.dtype != DType::kF32 && src.dtype != DType::kBF16 && src.dtype != DType::kF64) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": dtype ", DTypeName(src.dtype),
                                                   " is not supported (F32, BF16, F16, F64)"));
  }
  SY_RETURN_IF_ERROR(Annotate(ConvertTensor(src, out.View()), what));
  return out;
}

// f32 CPU `src` converted to `dtype` in a new CPU buffer.
absl::StatusOr<Buffer> FromF32(const Tensor& src, DType dtype) {
  SY_ASSIGN_OR_RETURN(Buffer out, Buffer::ForTensor(dtype, src.shape, Device::Cpu()));
  if (dtype == DType::kF16) {
    const float* s = src.as<float>();
    uint16_t* d = static_cast<uint16_t*>(out.data());
    for (int64_t i = 0; i < src.numel(); ++i) d[i] = FloatToHalf(s[i]);
    return out;
  }
  SY_RETURN_IF_ERROR(ConvertTensor(src, out.View()));
  return out;
}

std::string ShapeStr(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ","), "]");
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---------------------------------------------------------------------------------------------
// config.json

struct JsonReader {
  const Json& j;
  std::string file;

  bool Present(const char* key) const { return j.contains(key) && !j[key].is_null(); }
  absl::Status Err(const char* key, const std::string& rule) const {
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", key, ": ", rule));
  }
  absl::StatusOr<int64_t> Int(const char* key, std::optional<int64_t> def = std::nullopt) const {
    if (!Present(key)) {
      if (def) return *def;
      return Err(key, "missing");
    }
    const Json& v = j[key];
    if (!v.is_number_integer()) return Err(key, "expected an integer, got " + v.dump());
    return v.get<int64_t>();
  }
  absl::StatusOr<double> Double(const char* key, std::optional<double> def = std::nullopt) const {
    if (!Present(key)) {
      if (def) return *def;
      return Err(key, "missing");
    }
    const Json& v = j[key];
    if (!v.is_number()) return Err(key, "expected a number, got " + v.dump());
    return v.get<double>();
  }
  absl::StatusOr<bool> Bool(const char* key, bool def) const {
    if (!Present(key)) return def;
    const Json& v = j[key];
    if (!v.is_boolean()) return Err(key, "expected a boolean, got " + v.dump());
    return v.get<bool>();
  }
};

absl::Status CheckInt32(const char* key, int64_t v, int64_t min) {
  if (v < min || v > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: ", key, " (", v, ") must be in [", min, ", 2^31)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::ModelConfig> HfConfigToModelConfig(const std::string& text,
                                                      std::string* architecture) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("config.json: not a JSON object");
  }
  JsonReader r{j, "config.json"};
  if (!j.contains("architectures") || !j["architectures"].is_array() ||
      j["architectures"].size() != 1 || !j["architectures"][0].is_string()) {
    return r.Err("architectures", "expected a list of one architecture name");
  }
  const std::string arch = j["architectures"][0].get<std::string>();
  if (arch != kHfMixtral && arch != kHfQwen3Moe) {
    return r.Err("architectures", absl::StrCat("\"", arch, "\" is not supported (", kHfMixtral,
                                               " or ", kHfQwen3Moe, ")"));
  }
  const bool qwen = arch == kHfQwen3Moe;
  if (architecture) *architecture = arch;

  // Features we cannot represent.
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") {
    return r.Err("hidden_act",
                 "only \"silu\" (SwiGLU) is supported, got " + j["hidden_act"].dump());
  }
  SY_ASSIGN_OR_RETURN(bool attention_bias, r.Bool("attention_bias", false));
  if (attention_bias) return r.Err("attention_bias", "attention biases are not supported");
  SY_ASSIGN_OR_RETURN(bool mlp_bias, r.Bool("mlp_bias", false));
  if (mlp_bias) return r.Err("mlp_bias", "MLP biases are not supported");
  if (r.Present("rope_scaling")) {
    return r.Err("rope_scaling", "RoPE scaling is not supported (only plain RoPE), got " +
                                     j["rope_scaling"].dump());
  }
  if (r.Present("rope_parameters")) {  // transformers 5: {"rope_type": "default", "rope_theta": x}
    const Json& rp = j["rope_parameters"];
    bool plain = rp.is_object();
    if (plain) {
      for (auto it = rp.begin(); it != rp.end(); ++it) {
        if (it.key() == "rope_type" || it.key() == "type") {
          plain = plain && it.value() == "default";
        } else if (it.key() != "rope_theta") {
          plain = false;
        }
      }
    }
    if (!plain) {
      return r.Err("rope_parameters",
                   "only plain RoPE (rope_type \"default\") is supported, got " + rp.dump());
    }
  }
  SY_ASSIGN_OR_RETURN(int64_t max_pos, r.Int("max_position_embeddings", qwen ? 32768 : 131072));
  if (qwen) {
    SY_ASSIGN_OR_RETURN(bool sw, r.Bool("use_sliding_window", false));
    if (sw) return r.Err("use_sliding_window", "sliding-window attention is not supported");
    SY_ASSIGN_OR_RETURN(int64_t shared, r.Int("shared_expert_intermediate_size", 0));
    if (shared != 0)
      return r.Err("shared_expert_intermediate_size", "Qwen3-MoE has no shared expert; must be 0");
  } else if (r.Present("sliding_window")) {
    SY_ASSIGN_OR_RETURN(int64_t sw, r.Int("sliding_window"));
    if (sw < max_pos) {
      return r.Err("sliding_window",
                   absl::StrCat("sliding-window attention is not supported (", sw,
                                " < max_position_embeddings ", max_pos, "); use null"));
    }
  }

  v1::ModelConfig m;
  SY_ASSIGN_OR_RETURN(int64_t hidden, r.Int("hidden_size"));
  SY_ASSIGN_OR_RETURN(int64_t layers, r.Int("num_hidden_layers"));
  SY_ASSIGN_OR_RETURN(int64_t heads, r.Int("num_attention_heads"));
  SY_ASSIGN_OR_RETURN(int64_t kv_heads, r.Int("num_key_value_heads", heads));
  SY_RETURN_IF_ERROR(CheckInt32("hidden_size", hidden, 1));
  SY_RETURN_IF_ERROR(CheckInt32("num_hidden_layers", layers, 1));
  SY_RETURN_IF_ERROR(CheckInt32("num_attention_heads", heads, 1));
  SY_RETURN_IF_ERROR(CheckInt32("num_key_value_heads", kv_heads, 1));
  SY_ASSIGN_OR_RETURN(int64_t head_dim, r.Int("head_dim", hidden / heads));
  SY_RETURN_IF_ERROR(CheckInt32("head_dim", head_dim, 1));
  SY_ASSIGN_OR_RETURN(int64_t inter, r.Int("intermediate_size"));
  SY_RETURN_IF_ERROR(CheckInt32("intermediate_size", inter, 1));
  SY_ASSIGN_OR_RETURN(int64_t moe_inter, qwen ? r.Int("moe_intermediate_size") : inter);
  SY_RETURN_IF_ERROR(
      CheckInt32(qwen ? "moe_intermediate_size" : "intermediate_size", moe_inter, 1));
  // transformers 4.x writes Qwen3-MoE's expert count as "num_experts", 5.x as
  // "num_local_experts" (Mixtral's name); accept either.
  const char* experts_key =
      qwen && !r.Present("num_local_experts") ? "num_experts" : "num_local_experts";
  SY_ASSIGN_OR_RETURN(int64_t experts, r.Int(experts_key));
  SY_RETURN_IF_ERROR(CheckInt32(experts_key, experts, 1));
  SY_ASSIGN_OR_RETURN(int64_t topk, r.Int("num_experts_per_tok"));
  SY_RETURN_IF_ERROR(CheckInt32("num_experts_per_tok", topk, 1));
  SY_ASSIGN_OR_RETURN(int64_t vocab, r.Int("vocab_size"));
  SY_RETURN_IF_ERROR(CheckInt32("vocab_size", vocab, 1));
  SY_RETURN_IF_ERROR(CheckInt32("max_position_embeddings", max_pos, 1));
  SY_ASSIGN_OR_RETURN(double eps, r.Double("rms_norm_eps", qwen ? 1e-6 : 1e-5));
  double theta_default = qwen ? 10000.0 : 1e6;
  if (r.Present("rope_parameters") && j["rope_parameters"].is_object() &&
      j["rope_parameters"].contains("rope_theta") &&
      j["rope_parameters"]["rope_theta"].is_number()) {
    theta_default = j["rope_parameters"]["rope_theta"].get<double>();
  }
  SY_ASSIGN_OR_RETURN(double theta, r.Double("rope_theta", theta_default));
  SY_ASSIGN_OR_RETURN(bool tie, r.Bool("tie_word_embeddings", false));
  SY_ASSIGN_OR_RETURN(double aux_coef, r.Double("router_aux_loss_coef", 0.001));
  SY_ASSIGN_OR_RETURN(double init_std, r.Double("initializer_range", 0.02));

  m.set_num_layers(static_cast<int32_t>(layers));
  m.set_hidden_size(static_cast<int32_t>(hidden));
  m.set_num_attention_heads(static_cast<int32_t>(heads));
  m.set_num_query_groups(static_cast<int32_t>(kv_heads));
  m.set_kv_channels(static_cast<int32_t>(head_dim));
  m.set_ffn_hidden_size(static_cast<int32_t>(inter));
  m.set_max_position_embeddings(static_cast<int32_t>(max_pos));
  m.set_vocab_size(static_cast<int32_t>(vocab));
  m.set_norm_epsilon(eps);
  m.set_rotary_base(theta);
  m.set_qk_layernorm(qwen);
  m.set_untie_embeddings_and_output_weights(!tie);
  m.set_init_method_std(init_std);
  m.set_num_experts(static_cast<int32_t>(experts));
  m.set_moe_ffn_hidden_size(static_cast<int32_t>(moe_inter));
  m.set_moe_router_topk(static_cast<int32_t>(topk));
  if (aux_coef != 0) {
    m.add_moe_router_load_balancing_type("aux_loss");
    m.add_moe_aux_loss_coeff(aux_coef);
  }
  if (qwen) {
    SY_ASSIGN_OR_RETURN(bool norm_topk, r.Bool("norm_topk_prob", false));
    m.set_moe_router_pre_softmax(!norm_topk);
    SY_ASSIGN_OR_RETURN(int64_t step, r.Int("decoder_sparse_step", 1));
    if (step < 1) return r.Err("decoder_sparse_step", "must be >= 1");
    std::set<int64_t> dense;
    if (r.Present("mlp_only_layers")) {
      const Json& list = j["mlp_only_layers"];
      if (!list.is_array()) return r.Err("mlp_only_layers", "expected a list of layer indices");
      for (const Json& v : list) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= layers) {
          return r.Err("mlp_only_layers",
                       "entries must be layer indices in [0, num_hidden_layers)");
        }
        dense.insert(v.get<int64_t>());
      }
    }
    for (int64_t l = 0; l < layers; ++l) {
      m.add_moe_layer_pattern(dense.count(l) == 0 && (l + 1) % step == 0 ? 1 : 0);
    }
  } else {
    m.set_moe_router_pre_softmax(false);  // Mixtral: softmax, top-k, renormalise
    for (int64_t l = 0; l < layers; ++l) m.add_moe_layer_pattern(1);
    SY_ASSIGN_OR_RETURN(double jitter, r.Double("router_jitter_noise", 0.0));
    if (jitter != 0) m.set_moe_input_jitter_eps(jitter);
  }
  return m;
}

namespace {

// What an exported / imported model looks like, from a ModelConfig.
struct Dims {
  int64_t layers, h, hq, hkv, d, f, fe, e, v;
  bool qk_norm, untie;
  std::vector<bool> moe;
};

absl::StatusOr<Dims> DimsOf(const v1::ModelConfig& m) {
  SY_ASSIGN_OR_RETURN(GptConfig c, GptConfig::FromProto(m, DType::kF32));
  if (c.num_moe_layers() == 0) {
    return absl::InvalidArgumentError("model.num_experts: HF MoE export/import needs MoE layers");
  }
  return Dims{c.num_layers, c.hidden_size,     c.num_heads,           c.num_kv_heads,
              c.head_dim,   c.ffn_hidden_size, c.moe.ffn_hidden_size, c.moe.router.num_experts,
              c.vocab_size, c.qk_layernorm,    c.untie_embeddings,    c.moe_layers};
}

// A tensor that HF's checkpoints and ours hold alike, under different names.
struct SameTensor {
  std::string hf, ours;
  std::vector<int64_t> shape;
};

// Layer l's norms and attention projections, in file order: what import and export map one to
// one.
std::vector<SameTensor> AttentionTensors(const Dims& dm, int64_t l) {
  const std::string hf = absl::StrCat("model.layers.", l, ".");
  const std::string our = absl::StrCat("layers.", l, ".");
  const int64_t h = dm.h, d = dm.d;
  std::vector<SameTensor> t = {
      {hf + "input_layernorm.weight", our + "input_norm.weight", {h}},
      {hf + "self_attn.q_proj.weight", our + "attention.q.weight", {dm.hq * d, h}},
      {hf + "self_attn.k_proj.weight", our + "attention.k.weight", {dm.hkv * d, h}},
      {hf + "self_attn.v_proj.weight", our + "attention.v.weight", {dm.hkv * d, h}},
      {hf + "self_attn.o_proj.weight", our + "attention.o.weight", {h, dm.hq * d}},
  };
  if (dm.qk_norm) {
    t.push_back({hf + "self_attn.q_norm.weight", our + "attention.q_norm.weight", {d}});
    t.push_back({hf + "self_attn.k_norm.weight", our + "attention.k_norm.weight", {d}});
  }
  t.push_back({hf + "post_attention_layernorm.weight", our + "post_attention_norm.weight", {h}});
  return t;
}

const char* TorchDType(DType d) {
  switch (d) {
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kF64:
      return "float64";
    default:
      return "float32";
  }
}

}  // namespace

absl::StatusOr<std::string> ModelConfigToHfConfig(const v1::ModelConfig& m,
                                                  const std::string& architecture) {
  const bool qwen = architecture == kHfQwen3Moe;
  if (!qwen && architecture != kHfMixtral) {
    return absl::InvalidArgumentError(absl::StrCat("architecture \"", architecture,
                                                   "\" is not supported (", kHfMixtral, " or ",
                                                   kHfQwen3Moe, ")"));
  }
  SY_ASSIGN_OR_RETURN(Dims dm, DimsOf(m));
  auto unsupported = [&](const std::string& field, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.", field, ": cannot be expressed in ", architecture, ": ", why));
  };
  if (!m.moe_router_score_function().empty() && m.moe_router_score_function() != "softmax") {
    return unsupported("moe_router_score_function", "HF routers use softmax");
  }
  if (m.moe_router_enable_expert_bias())
    return unsupported("moe_router_enable_expert_bias", "no expert bias");
  if (m.moe_router_num_groups() > 1)
    return unsupported("moe_router_num_groups", "no group-limited routing");
  if (m.has_moe_router_topk_scaling_factor() && m.moe_router_topk_scaling_factor() != 1.0) {
    return unsupported("moe_router_topk_scaling_factor", "must be 1");
  }
  if (m.moe_shared_expert_intermediate_size() > 0) {
    return unsupported("moe_shared_expert_intermediate_size", "no shared expert");
  }
  if (!qwen) {
    for (bool b : dm.moe) {
      if (!b) return unsupported("moe_layer_pattern", "every Mixtral layer is MoE");
    }
    if (dm.qk_norm) return unsupported("qk_layernorm", "Mixtral has no QK norm");
    if (m.moe_router_pre_softmax()) {
      return unsupported("moe_router_pre_softmax", "Mixtral always renormalises the top-k");
    }
  } else if (!dm.qk_norm) {
    return unsupported("qk_layernorm", "Qwen3 always has QK norm");
  }
  double aux = 0;
  for (int i = 0; i < m.moe_router_load_balancing_type_size(); ++i) {
    const std::string& t = m.moe_router_load_balancing_type(i);
    if (t == "none") continue;
    if (t != "aux_loss") {
      return unsupported("moe_router_load_balancing_type", "only \"aux_loss\" (got \"" + t + "\")");
    }
    aux = i < m.moe_aux_loss_coeff_size() ? m.moe_aux_loss_coeff(i) : 0.0;
  }
  const int64_t max_pos = m.has_max_position_embeddings()
                              ? m.max_position_embeddings()
                              : (m.has_seq_length() ? m.seq_length() : 1024);
  Json j;
  j["architectures"] = Json::array({architecture});
  j["model_type"] = qwen ? "qwen3_moe" : "mixtral";
  j["vocab_size"] = dm.v;
  j["hidden_size"] = dm.h;
  j["intermediate_size"] = qwen ? dm.f : dm.fe;
  if (qwen) j["moe_intermediate_size"] = dm.fe;
  j["num_hidden_layers"] = dm.layers;
  j["num_attention_heads"] = dm.hq;
  j["num_key_value_heads"] = dm.hkv;
  j["head_dim"] = dm.d;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = max_pos;
  j["initializer_range"] = m.has_init_method_std() ? m.init_method_std() : 0.02;
  j["rms_norm_eps"] = m.has_norm_epsilon() ? m.norm_epsilon() : 1e-5;
  j["rope_theta"] = m.has_rotary_base() ? m.rotary_base() : 10000.0;
  j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = !dm.untie;
  j["attention_dropout"] = 0.0;
  j["use_cache"] = true;
  j["num_experts_per_tok"] = m.moe_router_topk();
  j["router_aux_loss_coef"] = aux;
  j["output_router_logits"] = false;
  if (qwen) {
    j["num_experts"] = dm.e;
    j["norm_topk_prob"] = !m.moe_router_pre_softmax();
    j["decoder_sparse_step"] = 1;
    Json dense = Json::array();
    for (int64_t l = 0; l < dm.layers; ++l) {
      if (!dm.moe[l]) dense.push_back(l);
    }
    j["mlp_only_layers"] = dense;
    j["attention_bias"] = false;
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = dm.layers;
  } else {
    j["num_local_experts"] = dm.e;
    j["sliding_window"] = nullptr;
    j["router_jitter_noise"] = m.moe_input_jitter_eps();
  }
  return j.dump(2) + "\n";
}

absl::StatusOr<Tensor> HfCheckpoint::Get(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) return absl::NotFoundError(absl::StrCat("no tensor \"", name, "\""));
  return it->second.View();
}

// ---------------------------------------------------------------------------------------------
// Import

namespace {

// The HF tensors of a checkpoint directory, with the names consumed so far.
class HfTensors {
 public:
  absl::Status Open(const std::string& dir) {
    const std::string index = dir + "/model.safetensors.index.json";
    std::vector<std::string> files;
    if (std::filesystem::exists(index)) {
      SY_ASSIGN_OR_RETURN(std::string text, ReadFile(index));
      const Json j = Json::parse(text, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
          !j["weight_map"].is_object()) {
        return absl::InvalidArgumentError(index + ": weight_map: expected an object");
      }
      std::set<std::string> seen;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(index, ": weight_map.", it.key(), ": expected a file name"));
        }
        const std::string f = it.value().get<std::string>();
        if (f.find('/') != std::string::npos) {
          return absl::InvalidArgumentError(
              absl::StrCat(index, ": weight_map.", it.key(), ": file name must not contain '/'"));
        }
        if (seen.insert(f).second) files.push_back(f);
      }
    } else {
      files.push_back("model.safetensors");
    }
    for (const std::string& f : files) {
      SY_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(dir + "/" + f));
      for (const std::string& name : file.Names()) {
        SY_ASSIGN_OR_RETURN(Tensor t, file.Get(name));
        if (!views_.emplace(name, t).second) {
          return absl::InvalidArgumentError(
              absl::StrCat("tensor \"", name, "\" appears in more than one shard (", f, ")"));
        }
      }
      files_.push_back(std::move(file));
    }
    return absl::OkStatus();
  }

  bool Has(const std::string& name) const { return views_.count(name) > 0; }
  bool HasPrefix(const std::string& prefix) const {
    auto it = views_.lower_bound(prefix);
    return it != views_.end() && absl::StartsWith(it->first, prefix);
  }
  std::vector<int64_t> Shape(const std::string& name) const { return views_.at(name).shape; }

  // Tensor `name` with shape `shape`, widened to f32; marks it consumed.
  absl::StatusOr<Buffer> Take(const std::string& name, const std::vector<int64_t>& shape) {
    auto it = views_.find(name);
    if (it == views_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("missing tensor \"", name, "\""));
    }
    if (it->second.shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\" has shape ",
                                                     ShapeStr(it->second.shape), ", expected ",
                                                     ShapeStr(shape)));
    }
    used_.insert(name);
    return ToF32(it->second, absl::StrCat("tensor \"", name, "\""));
  }

  absl::Status CheckAllUsed() const {
    for (const auto& [name, t] : views_) {
      if (used_.count(name) || absl::EndsWith(name, ".rotary_emb.inv_freq")) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected tensor \"", name, "\" ", ShapeStr(t.shape)));
    }
    return absl::OkStatus();
  }

 private:
  std::vector<SafetensorsFile> files_;
  std::map<std::string, Tensor> views_;
  std::set<std::string> used_;
};

// dst[c][r] = src[r][c] for an R x C block (row strides in elements).
void Transpose(const float* src, int64_t rows, int64_t cols, int64_t src_stride, float* dst,
               int64_t dst_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[c * dst_stride + r] = src[r * src_stride + c];
  }
}

// Reads the experts of one MoE layer into fc1 [E,H,2F] and fc2 [E,F,H].
absl::Status ImportExperts(HfTensors& hf, const std::string& moe, bool qwen, const Dims& dm,
                           float* fc1, float* fc2) {
  const int64_t e = dm.e, h = dm.h, f = dm.fe;
  const std::string gu = moe + "experts.gate_up_proj", dn = moe + "experts.down_proj";
  if (hf.Has(gu) || hf.Has(dn)) {  // fused 3-D storage
    if (!hf.Has(gu) || !hf.Has(dn)) {
      return absl::InvalidArgumentError(
          absl::StrCat("missing tensor \"", hf.Has(gu) ? dn : gu, "\" (fused expert storage)"));
    }
    const std::vector<int64_t> gu_rows{e, 2 * f, h}, gu_cols{e, h, 2 * f};
    const bool rows_form = hf.Shape(gu) == gu_rows;
    SY_ASSIGN_OR_RETURN(Buffer g, hf.Take(gu, rows_form ? gu_rows : gu_cols));
    const float* gp = g.View().as<float>();
    for (int64_t j = 0; j < e; ++j) {
      if (rows_form) {
        Transpose(gp + j * 2 * f * h, 2 * f, h, h, fc1 + j * h * 2 * f, 2 * f);
      } else {
        std::memcpy(fc1 + j * h * 2 * f, gp + j * h * 2 * f, sizeof(float) * h * 2 * f);
      }
    }
    const std::vector<int64_t> dn_linear{e, h, f}, dn_xw{e, f, h};
    const bool linear_form = hf.Shape(dn) == dn_linear;
    SY_ASSIGN_OR_RETURN(Buffer d, hf.Take(dn, linear_form ? dn_linear : dn_xw));
    const float* dp = d.View().as<float>();
    for (int64_t j = 0; j < e; ++j) {
      if (linear_form) {
        Transpose(dp + j * h * f, h, f, f, fc2 + j * f * h, h);
      } else {
        std::memcpy(fc2 + j * f * h, dp + j * f * h, sizeof(float) * f * h);
      }
    }
    return absl::OkStatus();
  }
  const char* gate_name = qwen ? "gate_proj" : "w1";
  const char* up_name = qwen ? "up_proj" : "w3";
  const char* down_name = qwen ? "down_proj" : "w2";
  for (int64_t j = 0; j < e; ++j) {
    const std::string pre = absl::StrCat(moe, "experts.", j, ".");
    SY_ASSIGN_OR_RETURN(Buffer g, hf.Take(pre + gate_name + ".weight", {f, h}));
    SY_ASSIGN_OR_RETURN(Buffer u, hf.Take(pre + up_name + ".weight", {f, h}));
    SY_ASSIGN_OR_RETURN(Buffer d, hf.Take(pre + down_name + ".weight", {h, f}));
    float* w1 = fc1 + j * h * 2 * f;
    Transpose(g.View().as<float>(), f, h, h, w1, 2 * f);
    Transpose(u.View().as<float>(), f, h, h, w1 + f, 2 * f);
    Transpose(d.View().as<float>(), h, f, f, fc2 + j * f * h, h);
  }
  return absl::OkStatus();
}

absl::StatusOr<Buffer> NewF32(std::vector<int64_t> shape) {
  return Buffer::ForTensor(DType::kF32, std::move(shape), Device::Cpu());
}

}  // namespace

absl::StatusOr<HfCheckpoint> ImportHfModel(const std::string& dir) {
  HfCheckpoint ck;
  SY_ASSIGN_OR_RETURN(std::string text, ReadFile(dir + "/config.json"));
  SY_ASSIGN_OR_RETURN(ck.config, HfConfigToModelConfig(text, &ck.architecture));
  const bool qwen = ck.architecture == kHfQwen3Moe;
  SY_ASSIGN_OR_RETURN(Dims dm, DimsOf(ck.config));
  HfTensors hf;
  SY_RETURN_IF_ERROR(hf.Open(dir));
  auto direct = [&](const std::string& hf_name, const std::string& ours,
                    std::vector<int64_t> shape) -> absl::Status {
    SY_ASSIGN_OR_RETURN(Buffer b, hf.Take(hf_name, shape));
    ck.tensors[ours] = std::move(b);
    return absl::OkStatus();
  };
  const int64_t h = dm.h;
  SY_RETURN_IF_ERROR(direct("model.embed_tokens.weight", "embedding.weight", {dm.v, h}));
  for (int64_t l = 0; l < dm.layers; ++l) {
    const std::string in = absl::StrCat("model.layers.", l, ".");
    const std::string out = absl::StrCat("layers.", l, ".");
    for (const SameTensor& t : AttentionTensors(dm, l)) {
      SY_RETURN_IF_ERROR(direct(t.hf, t.ours, t.shape));
    }
    if (dm.moe[l]) {
      const std::string moe =
          !qwen && hf.HasPrefix(in + "block_sparse_moe.") ? in + "block_sparse_moe." : in + "mlp.";
      SY_RETURN_IF_ERROR(direct(moe + "gate.weight", out + "moe.router.weight", {dm.e, h}));
      SY_ASSIGN_OR_RETURN(Buffer fc1, NewF32({dm.e, h, 2 * dm.fe}));
      SY_ASSIGN_OR_RETURN(Buffer fc2, NewF32({dm.e, dm.fe, h}));
      SY_RETURN_IF_ERROR(
          ImportExperts(hf, moe, qwen, dm, fc1.View().as<float>(), fc2.View().as<float>()));
      ck.tensors[out + "moe.experts.fc1"] = std::move(fc1);
      ck.tensors[out + "moe.experts.fc2"] = std::move(fc2);
    } else {
      const int64_t f = dm.f;
      SY_ASSIGN_OR_RETURN(Buffer g, hf.Take(in + "mlp.gate_proj.weight", {f, h}));
      SY_ASSIGN_OR_RETURN(Buffer u, hf.Take(in + "mlp.up_proj.weight", {f, h}));
      SY_ASSIGN_OR_RETURN(Buffer fc1, NewF32({2 * f, h}));
      std::memcpy(fc1.data(), g.data(), sizeof(float) * f * h);
      std::memcpy(static_cast<float*>(fc1.data()) + f * h, u.data(), sizeof(float) * f * h);
      ck.tensors[out + "mlp.fc1.weight"] = std::move(fc1);
      SY_RETURN_IF_ERROR(direct(in + "mlp.down_proj.weight", out + "mlp.fc2.weight", {h, f}));
    }
  }
  SY_RETURN_IF_ERROR(direct("model.norm.weight", "final_norm.weight", {h}));
  if (dm.untie) {
    SY_RETURN_IF_ERROR(direct("lm_head.weight", "output.weight", {dm.v, h}));
  } else if (hf.Has("lm_head.weight")) {
    SY_ASSIGN_OR_RETURN(Buffer lm, hf.Take("lm_head.weight", {dm.v, h}));
    if (std::memcmp(lm.data(), ck.tensors["embedding.weight"].data(), lm.bytes()) != 0) {
      return absl::InvalidArgumentError(
          "tensor \"lm_head.weight\" differs from model.embed_tokens.weight although "
          "tie_word_embeddings is true");
    }
  }
  SY_RETURN_IF_ERROR(hf.CheckAllUsed());
  return ck;
}

// ---------------------------------------------------------------------------------------------
// Loading into a model

absl::Status LoadIntoModel(const HfCheckpoint& ckpt, GptModel* model) {
  std::set<std::string> used;
  for (const ParamInfo& p : model->layout().params) {
    auto it = ckpt.tensors.find(p.name);
    if (it == ckpt.tensors.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoadIntoModel: no tensor for model parameter \"", p.name, "\""));
    }
    const Tensor src = it->second.View();
    if (src.shape != p.shape) {
      return absl::InvalidArgumentError(absl::StrCat("LoadIntoModel: tensor \"", p.name,
                                                     "\" has shape ", ShapeStr(src.shape),
                                                     ", the model expects ", ShapeStr(p.shape)));
    }
    SY_ASSIGN_OR_RETURN(Tensor dst, model->Param(p.name));
    if (!dst.device.is_cuda()) {
      SY_RETURN_IF_ERROR(ConvertTensor(src, dst));
    } else {
      SY_ASSIGN_OR_RETURN(Buffer host, Buffer::ForTensor(dst.dtype, dst.shape, Device::Cpu()));
      SY_RETURN_IF_ERROR(ConvertTensor(src, host.View()));
      SY_RETURN_IF_ERROR(kernels::CopyTensor(host.View(), dst));
    }
    used.insert(p.name);
  }
  for (const auto& [name, b] : ckpt.tensors) {
    if (!used.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoadIntoModel: tensor \"", name, "\" is not a parameter of the model"));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Export

namespace {

absl::Status WriteDirAtomically(const std::string& dir, const std::string& config_text,
                                const SafetensorsWriter& writer) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string tmp = absl::StrCat(dir, ".tmp.", getpid());
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec) || ec) {
    return absl::InternalError(absl::StrCat(tmp, ": cannot create directory: ", ec.message()));
  }
  auto fail = [&](absl::Status s) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    return s;
  };
  absl::Status s = WriteFileAtomically(tmp + "/config.json", config_text);
  if (s.ok()) s = writer.Write(tmp + "/model.safetensors");
  if (s.ok()) s = FsyncDirectory(tmp);
  if (!s.ok()) return fail(s);
  std::string old;
  if (fs::exists(dir, ec)) {
    old = absl::StrCat(dir, ".old.", getpid());
    fs::remove_all(old, ec);
    fs::rename(dir, old, ec);
    if (ec)
      return fail(absl::InternalError(absl::StrCat(dir, ": cannot move aside: ", ec.message())));
  }
  fs::rename(tmp, dir, ec);
  if (ec) {
    if (!old.empty()) fs::rename(old, dir, ec);
    return fail(
        absl::InternalError(absl::StrCat(dir, ": cannot rename ", tmp, ": ", ec.message())));
  }
  if (!old.empty()) fs::remove_all(old, ec);
  return FsyncDirectory(DirectoryOf(dir));
}

}  // namespace

absl::Status ExportHfModel(const v1::ModelConfig& config, const std::string& architecture,
                           const HfTensorSource& source, const std::string& dir, DType out_dtype) {
  if (out_dtype != DType::kF32 && out_dtype != DType::kBF16 && out_dtype != DType::kF16 &&
      out_dtype != DType::kF64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ExportHfModel: out_dtype ", DTypeName(out_dtype), " must be f32, bf16, f16 or f64"));
  }
  SY_ASSIGN_OR_RETURN(std::string text, ModelConfigToHfConfig(config, architecture));
  {  // torch_dtype is the file dtype
    Json j = Json::parse(text);
    j["torch_dtype"] = TorchDType(out_dtype);
    text = j.dump(2) + "\n";
  }
  const bool qwen = architecture == kHfQwen3Moe;
  SY_ASSIGN_OR_RETURN(Dims dm, DimsOf(config));
  std::vector<std::pair<std::string, Buffer>> out;
  // Fetches our tensor `name` (f32 CPU, shape checked).
  auto get = [&](const std::string& name,
                 const std::vector<int64_t>& shape) -> absl::StatusOr<Tensor> {
    SY_ASSIGN_OR_RETURN(Tensor t, source(name));
    if (t.dtype != DType::kF32 || t.device.is_cuda() || t.shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat("ExportHfModel: tensor \"", name, "\" is ",
                                                     t.DebugString(), ", expected f32",
                                                     ShapeStr(shape), " on the CPU"));
    }
    return t;
  };
  auto emit = [&](const std::string& hf_name, const Tensor& f32) -> absl::Status {
    SY_ASSIGN_OR_RETURN(Buffer b, FromF32(f32, out_dtype));
    out.emplace_back(hf_name, std::move(b));
    return absl::OkStatus();
  };
  auto direct = [&](const std::string& ours, const std::string& hf_name,
                    std::vector<int64_t> shape) -> absl::Status {
    SY_ASSIGN_OR_RETURN(Tensor t, get(ours, shape));
    return emit(hf_name, t);
  };
  const int64_t h = dm.h;
  SY_RETURN_IF_ERROR(direct("embedding.weight", "model.embed_tokens.weight", {dm.v, h}));
  for (int64_t l = 0; l < dm.layers; ++l) {
    const std::string hf = absl::StrCat("model.layers.", l, ".");
    const std::string our = absl::StrCat("layers.", l, ".");
    for (const SameTensor& t : AttentionTensors(dm, l)) {
      SY_RETURN_IF_ERROR(direct(t.ours, t.hf, t.shape));
    }
    if (dm.moe[l]) {
      const std::string moe = hf + (qwen ? "mlp." : "block_sparse_moe.");
      const int64_t f = dm.fe;
      SY_RETURN_IF_ERROR(direct(our + "moe.router.weight", moe + "gate.weight", {dm.e, h}));
      SY_ASSIGN_OR_RETURN(Tensor fc1, get(our + "moe.experts.fc1", {dm.e, h, 2 * f}));
      SY_ASSIGN_OR_RETURN(Tensor fc2, get(our + "moe.experts.fc2", {dm.e, f, h}));
      SY_ASSIGN_OR_RETURN(Buffer g, NewF32({f, h}));
      SY_ASSIGN_OR_RETURN(Buffer u, NewF32({f, h}));
      SY_ASSIGN_OR_RETURN(Buffer dn, NewF32({h, f}));
      for (int64_t j = 0; j < dm.e; ++j) {
        const float* w1 = fc1.as<float>() + j * h * 2 * f;
        Transpose(w1, h, f, 2 * f, g.View().as<float>(), h);
        Transpose(w1 + f, h, f, 2 * f, u.View().as<float>(), h);
        Transpose(fc2.as<float>() + j * f * h, f, h, h, dn.View().as<float>(), f);
        const std::string pre = absl::StrCat(moe, "experts.", j, ".");
        SY_RETURN_IF_ERROR(emit(pre + (qwen ? "gate_proj" : "w1") + ".weight", g.View()));
        SY_RETURN_IF_ERROR(emit(pre + (qwen ? "up_proj" : "w3") + ".weight", u.View()));
        SY_RETURN_IF_ERROR(emit(pre + (qwen ? "down_proj" : "w2") + ".weight", dn.View()));
      }
    } else {
      const int64_t f = dm.f;
      SY_ASSIGN_OR_RETURN(Tensor fc1, get(our + "mlp.fc1.weight", {2 * f, h}));
      SY_RETURN_IF_ERROR(
          emit(hf + "mlp.gate_proj.weight", Tensor(DType::kF32, {f, h}, Device::Cpu(), fc1.data)));
      SY_RETURN_IF_ERROR(emit(hf + "mlp.up_proj.weight",
                              Tensor(DType::kF32, {f, h}, Device::Cpu(), fc1.as<float>() + f * h)));
      SY_RETURN_IF_ERROR(direct(our + "mlp.fc2.weight", hf + "mlp.down_proj.weight", {h, f}));
    }
  }
  SY_RETURN_IF_ERROR(direct("final_norm.weight", "model.norm.weight", {h}));
  if (dm.untie) SY_RETURN_IF_ERROR(direct("output.weight", "lm_head.weight", {dm.v, h}));

  SafetensorsWriter writer;
  writer.SetMetadata("format", "pt");  // as transformers' save_pretrained writes
  for (const auto& [name, b] : out) writer.Add(name, b.View());
  return WriteDirAtomically(dir, text, writer);
}

absl::Status ExportHfModel(const v1::ModelConfig& config, const std::string& architecture,
                           const GptModel& model, const std::string& dir, DType out_dtype) {
  const Tensor params = model.params();
  SY_ASSIGN_OR_RETURN(Buffer host, Buffer::ForTensor(params.dtype, params.shape, Device::Cpu()));
  SY_RETURN_IF_ERROR(kernels::CopyTensor(params, host.View()));
  SY_ASSIGN_OR_RETURN(Buffer f32, ToF32(host.View(), "model parameters"));
  const GptParamLayout& layout = model.layout();
  HfTensorSource source = [&](const std::string& name) -> absl::StatusOr<Tensor> {
    const ParamInfo* p = layout.Find(name);
    if (p == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("ExportHfModel: the model has no \"", name,
                                                     "\"; its config differs from `config`"));
    }
    return Tensor(DType::kF32, p->shape, Device::Cpu(), f32.View().as<float>() + p->offset);
  };
  return ExportHfModel(config, architecture, source, dir, out_dtype);
}

}  // namespace switchyard::model
