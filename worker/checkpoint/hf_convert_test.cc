// Tests of the HF Mixtral / Qwen3-MoE import and export: synthetic checkpoints written here (the
// mapping of every tensor, lossless round trips, error cases) and, when present, the fixtures
// of tools/hf_fixtures/make_hf_fixtures.py in worker/checkpoint/testdata/hf/ (logits vs
// transformers).
#include "worker/checkpoint/hf_convert.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "kernels/runtime/buffer.h"
#include "worker/model/gpt_model.h"

namespace switchyard::model {
namespace {

using kernels::Buffer;
namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(root ? root : "/tmp", "/hf_", getpid(), "_", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// HF tensors of a synthetic checkpoint: name -> (shape, values).
struct HfTensor {
  std::vector<int64_t> shape;
  std::vector<float> v;
  float at(int64_t r, int64_t c) const { return v[r * shape.back() + c]; }
};
using HfMap = std::map<std::string, HfTensor>;

struct Synthetic {
  bool qwen = false;
  int64_t layers = 2, h = 16, heads = 4, kv = 2, d = 8, e = 4, topk = 2, fe = 12, f = 20, v = 32;
  bool tie = false;
  std::string config_json;
  HfMap tensors;
};

Synthetic MakeSynthetic(bool qwen, uint32_t seed) {
  Synthetic s;
  s.qwen = qwen;
  s.tie = qwen;  // Qwen3 tied (no lm_head), Mixtral untied
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 0.3f);
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    HfTensor t;
    t.shape = shape;
    int64_t n = 1;
    for (int64_t x : shape) n *= x;
    t.v.resize(n);
    for (float& x : t.v) x = nd(rng);
    s.tensors[name] = std::move(t);
  };
  add("model.embed_tokens.weight", {s.v, s.h});
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add(p + "input_layernorm.weight", {s.h});
    add(p + "self_attn.q_proj.weight", {s.heads * s.d, s.h});
    add(p + "self_attn.k_proj.weight", {s.kv * s.d, s.h});
    add(p + "self_attn.v_proj.weight", {s.kv * s.d, s.h});
    add(p + "self_attn.o_proj.weight", {s.h, s.heads * s.d});
    if (qwen) {
      add(p + "self_attn.q_norm.weight", {s.d});
      add(p + "self_attn.k_norm.weight", {s.d});
    }
    add(p + "post_attention_layernorm.weight", {s.h});
    if (qwen && l == 1) {  // mlp_only_layers = [1]
      add(p + "mlp.gate_proj.weight", {s.f, s.h});
      add(p + "mlp.up_proj.weight", {s.f, s.h});
      add(p + "mlp.down_proj.weight", {s.h, s.f});
      continue;
    }
    const std::string moe = p + (qwen ? "mlp." : "block_sparse_moe.");
    add(moe + "gate.weight", {s.e, s.h});
    for (int64_t j = 0; j < s.e; ++j) {
      const std::string x = absl::StrCat(moe, "experts.", j, ".");
      add(x + (qwen ? "gate_proj" : "w1") + ".weight", {s.fe, s.h});
      add(x + (qwen ? "up_proj" : "w3") + ".weight", {s.fe, s.h});
      add(x + (qwen ? "down_proj" : "w2") + ".weight", {s.h, s.fe});
    }
  }
  add("model.norm.weight", {s.h});
  if (!s.tie) add("lm_head.weight", {s.v, s.h});
  if (qwen) {
    s.config_json = R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
      "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 20,
      "moe_intermediate_size": 12, "num_experts": 4, "num_experts_per_tok": 2,
      "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [1],
      "vocab_size": 32, "max_position_embeddings": 64, "rms_norm_eps": 1e-06,
      "rope_theta": 1000000.0, "rope_scaling": null, "tie_word_embeddings": true,
      "attention_bias": false, "use_sliding_window": false, "sliding_window": null,
      "hidden_act": "silu", "router_aux_loss_coef": 0.001, "torch_dtype": "float32"})";
  } else {
    s.config_json = R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
      "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 12,
      "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 32,
      "max_position_embeddings": 64, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
      "sliding_window": null, "tie_word_embeddings": false, "hidden_act": "silu",
      "router_aux_loss_coef": 0.02, "router_jitter_noise": 0.0, "torch_dtype": "float32"})";
  }
  return s;
}

void WriteCheckpoint(const std::string& dir, const std::string& config_json, const HfMap& tensors) {
  WriteText(dir + "/config.json", config_json);
  SafetensorsWriter w;
  for (const auto& [name, t] : tensors) {
    w.Add(name, Tensor(DType::kF32, t.shape, Device::Cpu(), const_cast<float*>(t.v.data())));
  }
  ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
}

const float* Data(const HfCheckpoint& ck, const std::string& name) {
  auto t = ck.Get(name);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? t->as<float>() : nullptr;
}

void ExpectBitIdentical(const HfCheckpoint& a, const HfCheckpoint& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, buf] : a.tensors) {
    auto it = b.tensors.find(name);
    ASSERT_NE(it, b.tensors.end()) << name;
    ASSERT_EQ(buf.View().shape, it->second.View().shape) << name;
    EXPECT_EQ(std::memcmp(buf.data(), it->second.data(), buf.bytes()), 0) << name;
  }
  EXPECT_EQ(a.config.DebugString(), b.config.DebugString());
  EXPECT_EQ(a.architecture, b.architecture);
}

// Builds a CPU f32 model for `ck` (seq_length `seq`) and loads the checkpoint.
std::unique_ptr<GptModel> BuildModel(const HfCheckpoint& ck, int64_t seq, int64_t batch) {
  v1::ModelConfig m = ck.config;
  m.set_seq_length(static_cast<int32_t>(seq));
  auto c = GptConfig::FromProto(m, DType::kF32);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return nullptr;
  auto model = GptModel::Create(*c, Device::Cpu(), batch, 1);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  absl::Status s = LoadIntoModel(ck, model->get());
  EXPECT_TRUE(s.ok()) << s;
  return std::move(*model);
}

class HfSyntheticTest : public ::testing::TestWithParam<bool> {};

TEST_P(HfSyntheticTest, ImportMapsEveryTensorAndRoundTrips) {
  const bool qwen = GetParam();
  Synthetic s = MakeSynthetic(qwen, qwen ? 7 : 11);
  const std::string dir = TempDir(qwen ? "syn_qwen" : "syn_mixtral");
  WriteCheckpoint(dir, s.config_json, s.tensors);
  auto ck = ImportHfModel(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  const v1::ModelConfig& m = ck->config;
  EXPECT_EQ(ck->architecture, qwen ? kHfQwen3Moe : kHfMixtral);
  EXPECT_EQ(m.num_layers(), 2);
  EXPECT_EQ(m.hidden_size(), 16);
  EXPECT_EQ(m.num_query_groups(), 2);
  EXPECT_EQ(m.kv_channels(), 8);
  EXPECT_EQ(m.num_experts(), 4);
  EXPECT_EQ(m.moe_router_topk(), 2);
  EXPECT_EQ(m.moe_ffn_hidden_size(), 12);
  EXPECT_EQ(m.ffn_hidden_size(), qwen ? 20 : 12);
  EXPECT_FALSE(m.moe_router_pre_softmax());  // Mixtral, and Qwen3 with norm_topk_prob
  EXPECT_EQ(m.qk_layernorm(), qwen);
  EXPECT_EQ(m.untie_embeddings_and_output_weights(), !qwen);
  EXPECT_DOUBLE_EQ(m.rotary_base(), qwen ? 1e6 : 1e4);
  EXPECT_DOUBLE_EQ(m.norm_epsilon(), qwen ? 1e-6 : 1e-5);
  ASSERT_EQ(m.moe_layer_pattern_size(), 2);
  EXPECT_EQ(m.moe_layer_pattern(0), 1);
  EXPECT_EQ(m.moe_layer_pattern(1), qwen ? 0 : 1);
  ASSERT_EQ(m.moe_aux_loss_coeff_size(), 1);
  EXPECT_DOUBLE_EQ(m.moe_aux_loss_coeff(0), qwen ? 0.001 : 0.02);

  // Direct copies.
  auto same = [&](const std::string& hf, const std::string& ours) {
    const float* p = Data(*ck, ours);
    ASSERT_NE(p, nullptr);
    const HfTensor& t = s.tensors.at(hf);
    EXPECT_EQ(std::memcmp(p, t.v.data(), t.v.size() * 4), 0) << hf << " -> " << ours;
  };
  same("model.embed_tokens.weight", "embedding.weight");
  same("model.norm.weight", "final_norm.weight");
  if (!qwen) same("lm_head.weight", "output.weight");
  EXPECT_FALSE(ck->Get("output.weight").ok() && qwen);
  for (int l = 0; l < 2; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, "."),
                      o = absl::StrCat("layers.", l, ".");
    same(p + "input_layernorm.weight", o + "input_norm.weight");
    same(p + "post_attention_layernorm.weight", o + "post_attention_norm.weight");
    for (const char* x : {"q", "k", "v", "o"}) {
      same(p + "self_attn." + x + "_proj.weight", o + "attention." + x + ".weight");
    }
    if (qwen) {
      same(p + "self_attn.q_norm.weight", o + "attention.q_norm.weight");
      same(p + "self_attn.k_norm.weight", o + "attention.k_norm.weight");
    }
  }
  // MoE layer 0: fc1[j][:, :F] = gateᵀ, fc1[j][:, F:] = upᵀ, fc2[j] = downᵀ.
  const std::string moe = qwen ? "model.layers.0.mlp." : "model.layers.0.block_sparse_moe.";
  same(moe + "gate.weight", "layers.0.moe.router.weight");
  const float* fc1 = Data(*ck, "layers.0.moe.experts.fc1");
  const float* fc2 = Data(*ck, "layers.0.moe.experts.fc2");
  ASSERT_NE(fc1, nullptr);
  ASSERT_NE(fc2, nullptr);
  const int64_t h = s.h, f = s.fe;
  int64_t mismatches = 0;
  for (int64_t j = 0; j < s.e; ++j) {
    const std::string x = absl::StrCat(moe, "experts.", j, ".");
    const HfTensor& g = s.tensors.at(x + (qwen ? "gate_proj" : "w1") + ".weight");
    const HfTensor& u = s.tensors.at(x + (qwen ? "up_proj" : "w3") + ".weight");
    const HfTensor& dn = s.tensors.at(x + (qwen ? "down_proj" : "w2") + ".weight");
    for (int64_t r = 0; r < h; ++r) {
      for (int64_t c = 0; c < f; ++c) {
        mismatches += fc1[(j * h + r) * 2 * f + c] != g.at(c, r);
        mismatches += fc1[(j * h + r) * 2 * f + f + c] != u.at(c, r);
        mismatches += fc2[(j * f + c) * h + r] != dn.at(r, c);
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  if (qwen) {  // dense layer 1: fc1 rows = cat(gate_proj, up_proj), fc2 = down_proj
    const HfTensor& g = s.tensors.at("model.layers.1.mlp.gate_proj.weight");
    const HfTensor& u = s.tensors.at("model.layers.1.mlp.up_proj.weight");
    const float* d1 = Data(*ck, "layers.1.mlp.fc1.weight");
    ASSERT_NE(d1, nullptr);
    EXPECT_EQ(std::memcmp(d1, g.v.data(), g.v.size() * 4), 0);
    EXPECT_EQ(std::memcmp(d1 + g.v.size(), u.v.data(), u.v.size() * 4), 0);
    same("model.layers.1.mlp.down_proj.weight", "layers.1.mlp.fc2.weight");
  }

  // Into a model, forward, export from the model, re-import: lossless.
  std::unique_ptr<GptModel> model = BuildModel(*ck, 8, 2);
  ASSERT_NE(model, nullptr);
  Buffer ids = *Buffer::ForTensor(DType::kI32, {16}, Device::Cpu());
  for (int i = 0; i < 16; ++i) ids.View().as<int32_t>()[i] = (i * 7 + 3) % s.v;
  Buffer logits = *Buffer::ForTensor(DType::kF32, {16, s.v}, Device::Cpu());
  ASSERT_TRUE(model->Forward(Stream::Cpu(), ids.View(), Tensor(), 8, 0, logits.View()).ok());
  for (int64_t i = 0; i < 16 * s.v; ++i) ASSERT_TRUE(std::isfinite(logits.View().as<float>()[i]));

  const std::string out = TempDir(qwen ? "exp_qwen" : "exp_mixtral");
  absl::Status st = ExportHfModel(ck->config, ck->architecture, *model, out, DType::kF32);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_FALSE(fs::exists(out + ".tmp." + std::to_string(getpid())));
  // The exported file has exactly the HF names and shapes we wrote.
  auto file = SafetensorsFile::Open(out + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> expected;
  for (const auto& [name, t] : s.tensors) expected.push_back(name);
  EXPECT_EQ(file->Names(), expected);
  for (const auto& [name, t] : s.tensors) EXPECT_EQ(file->Get(name)->shape, t.shape) << name;
  auto again = ImportHfModel(out);
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectBitIdentical(*ck, *again);

  // Exporting over an existing directory replaces it (f16 this time: within f16 rounding).
  st = ExportHfModel(ck->config, ck->architecture, *model, out, DType::kF16);
  ASSERT_TRUE(st.ok()) << st;
  auto half = ImportHfModel(out);
  ASSERT_TRUE(half.ok()) << half.status();
  double worst = 0;
  for (const auto& [name, buf] : ck->tensors) {
    const Tensor a = buf.View(), b = half->tensors.at(name).View();
    for (int64_t i = 0; i < a.numel(); ++i) {
      const double x = a.as<float>()[i], y = b.as<float>()[i];
      worst = std::max(worst, std::fabs(x - y) / std::max(std::fabs(x), 1e-3));
    }
  }
  std::printf("%s f16 export round trip: max rel error %.3g (tolerance 2^-11 = %.3g)\n",
              qwen ? "qwen3_moe" : "mixtral", worst, std::ldexp(1.0, -11));
  EXPECT_LE(worst, std::ldexp(1.0, -11) * 1.0001);
  // And bf16.
  st = ExportHfModel(ck->config, ck->architecture, *model, out, DType::kBF16);
  ASSERT_TRUE(st.ok()) << st;
  auto bf = ImportHfModel(out);
  ASSERT_TRUE(bf.ok()) << bf.status();
}

TEST_P(HfSyntheticTest, FusedExpertStorageImportsIdentically) {
  const bool qwen = GetParam();
  Synthetic s = MakeSynthetic(qwen, 3);
  const std::string dir = TempDir(qwen ? "pe_qwen" : "pe_mixtral");
  WriteCheckpoint(dir, s.config_json, s.tensors);
  auto ref = ImportHfModel(dir);
  ASSERT_TRUE(ref.ok()) << ref.status();
  // Fuse layer 0 in both 3-D forms: gate_up [E,2F,H] + down [E,H,F], and [E,H,2F] + [E,F,H].
  for (int form = 0; form < 2; ++form) {
    HfMap fused = s.tensors;
    const std::string old_moe = qwen ? "model.layers.0.mlp." : "model.layers.0.block_sparse_moe.";
    const std::string moe = "model.layers.0.mlp.";  // transformers 5 names Mixtral's block mlp
    if (!qwen) {
      fused[moe + "gate.weight"] = fused[old_moe + "gate.weight"];
      fused.erase(old_moe + "gate.weight");
    }
    const int64_t e = s.e, h = s.h, f = s.fe;
    HfTensor gu, dn;
    gu.shape = form == 0 ? std::vector<int64_t>{e, 2 * f, h} : std::vector<int64_t>{e, h, 2 * f};
    dn.shape = form == 0 ? std::vector<int64_t>{e, h, f} : std::vector<int64_t>{e, f, h};
    gu.v.resize(e * 2 * f * h);
    dn.v.resize(e * f * h);
    for (int64_t j = 0; j < e; ++j) {
      const std::string x = absl::StrCat(old_moe, "experts.", j, ".");
      const std::string gn = x + (qwen ? "gate_proj" : "w1") + ".weight";
      const std::string un = x + (qwen ? "up_proj" : "w3") + ".weight";
      const std::string dname = x + (qwen ? "down_proj" : "w2") + ".weight";
      for (int64_t c = 0; c < f; ++c) {
        for (int64_t r = 0; r < h; ++r) {
          const float g = s.tensors.at(gn).at(c, r), u = s.tensors.at(un).at(c, r);
          const float d = s.tensors.at(dname).at(r, c);
          if (form == 0) {
            gu.v[(j * 2 * f + c) * h + r] = g;
            gu.v[(j * 2 * f + f + c) * h + r] = u;
            dn.v[(j * h + r) * f + c] = d;
          } else {
            gu.v[(j * h + r) * 2 * f + c] = g;
            gu.v[(j * h + r) * 2 * f + f + c] = u;
            dn.v[(j * f + c) * h + r] = d;
          }
        }
      }
      fused.erase(gn);
      fused.erase(un);
      fused.erase(dname);
    }
    fused[moe + "experts.gate_up_proj"] = gu;
    fused[moe + "experts.down_proj"] = dn;
    const std::string fdir = TempDir(absl::StrCat("fused", form, qwen));
    WriteCheckpoint(fdir, s.config_json, fused);
    auto got = ImportHfModel(fdir);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectBitIdentical(*ref, *got);
  }
}

TEST(HfConvertTest, ShardedIndexAndBf16Input) {
  const Synthetic s = MakeSynthetic(false, 9);
  const std::string dir = TempDir("sharded");
  WriteText(dir + "/config.json", s.config_json);
  // Shard 1: layer 0 and the embedding in f32; shard 2: everything else in bf16.
  SafetensorsWriter w1, w2;
  std::vector<std::vector<BF16>> keep;
  std::string index = R"({"metadata": {"total_size": 0}, "weight_map": {)";
  bool first = true;
  for (const auto& [name, t] : s.tensors) {
    const bool one = name.rfind("model.layers.0.", 0) == 0 || name == "model.embed_tokens.weight";
    if (one) {
      w1.Add(name, Tensor(DType::kF32, t.shape, Device::Cpu(), const_cast<float*>(t.v.data())));
    } else {
      keep.emplace_back();
      for (float x : t.v) keep.back().push_back(BF16::FromFloat(x));
      w2.Add(name, Tensor(DType::kBF16, t.shape, Device::Cpu(), keep.back().data()));
    }
    index += absl::StrCat(
        first ? "" : ", ", "\"", name, "\": \"",
        one ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors", "\"");
    first = false;
  }
  WriteText(dir + "/model.safetensors.index.json", index + "}}");
  ASSERT_TRUE(w1.Write(dir + "/model-00001-of-00002.safetensors").ok());
  ASSERT_TRUE(w2.Write(dir + "/model-00002-of-00002.safetensors").ok());
  auto ck = ImportHfModel(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  const HfTensor& emb = s.tensors.at("model.embed_tokens.weight");
  EXPECT_EQ(std::memcmp(Data(*ck, "embedding.weight"), emb.v.data(), emb.v.size() * 4), 0);
  const HfTensor& norm = s.tensors.at("model.norm.weight");
  const float* got = Data(*ck, "final_norm.weight");
  ASSERT_NE(got, nullptr);
  for (size_t i = 0; i < norm.v.size(); ++i) {
    EXPECT_EQ(got[i], BF16::FromFloat(norm.v[i]).ToFloat()) << i;
  }
  EXPECT_EQ(ck->tensors.size(), 3u + 2 * 9u);
}

INSTANTIATE_TEST_SUITE_P(Archs, HfSyntheticTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Qwen3Moe" : "Mixtral"; });

// Error cases: the message names the config key or the tensor.
void ExpectError(const std::string& dir, absl::StatusCode code, const std::string& needle) {
  auto r = ImportHfModel(dir);
  ASSERT_FALSE(r.ok()) << "expected an error naming " << needle;
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status();
  std::printf("expected error: %s\n", r.status().ToString().c_str());
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  const size_t pos = s.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  if (pos != std::string::npos) s.replace(pos, from.size(), to);
  return s;
}

TEST(HfConvertErrorsTest, ConfigAndTensorErrorsNameTheKey) {
  const Synthetic mix = MakeSynthetic(false, 5);
  const Synthetic qw = MakeSynthetic(true, 5);
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  std::string dir = TempDir("err_arch");
  WriteCheckpoint(dir, Replace(mix.config_json, "MixtralForCausalLM", "LlamaForCausalLM"),
                  mix.tensors);
  ExpectError(dir, kInvalid, "architectures");

  dir = TempDir("err_rope");
  WriteCheckpoint(dir,
                  Replace(mix.config_json, "\"sliding_window\": null",
                          "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}"),
                  mix.tensors);
  ExpectError(dir, kInvalid, "rope_scaling");

  dir = TempDir("err_sw");
  WriteCheckpoint(dir,
                  Replace(mix.config_json, "\"sliding_window\": null", "\"sliding_window\": 16"),
                  mix.tensors);
  ExpectError(dir, kInvalid, "sliding_window");

  dir = TempDir("err_qsw");
  WriteCheckpoint(
      dir, Replace(qw.config_json, "\"use_sliding_window\": false", "\"use_sliding_window\": true"),
      qw.tensors);
  ExpectError(dir, kInvalid, "use_sliding_window");

  dir = TempDir("err_bias");
  WriteCheckpoint(dir,
                  Replace(qw.config_json, "\"attention_bias\": false", "\"attention_bias\": true"),
                  qw.tensors);
  ExpectError(dir, kInvalid, "attention_bias");

  dir = TempDir("err_missing");
  HfMap t = mix.tensors;
  t.erase("model.layers.1.block_sparse_moe.experts.2.w3.weight");
  WriteCheckpoint(dir, mix.config_json, t);
  ExpectError(dir, kInvalid, "model.layers.1.block_sparse_moe.experts.2.w3.weight");

  dir = TempDir("err_shape");
  t = qw.tensors;
  t["model.layers.0.self_attn.k_proj.weight"].shape = {8, 32};
  WriteCheckpoint(dir, qw.config_json, t);
  ExpectError(dir, kInvalid, "model.layers.0.self_attn.k_proj.weight");

  dir = TempDir("err_extra");
  t = qw.tensors;
  t["model.layers.0.mlp.shared_expert.gate_proj.weight"] = t["model.layers.0.mlp.gate.weight"];
  WriteCheckpoint(dir, qw.config_json, t);
  ExpectError(dir, kInvalid, "model.layers.0.mlp.shared_expert.gate_proj.weight");

  dir = TempDir("err_none");
  ExpectError(dir, absl::StatusCode::kNotFound, "config.json");

  // Export: Mixtral cannot express a dense layer or QK norm.
  auto ck = ImportHfModel([&] {
    std::string d = TempDir("err_export_src");
    WriteCheckpoint(d, qw.config_json, qw.tensors);
    return d;
  }());
  ASSERT_TRUE(ck.ok()) << ck.status();
  auto text = ModelConfigToHfConfig(ck->config, kHfMixtral);
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("moe_layer_pattern"), std::string::npos) << text.status();
}

TEST(HfConvertErrorsTest, LoadIntoModelChecksNamesAndShapes) {
  const Synthetic s = MakeSynthetic(true, 13);
  const std::string dir = TempDir("load_err");
  WriteCheckpoint(dir, s.config_json, s.tensors);
  auto ck = ImportHfModel(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  std::unique_ptr<GptModel> model = BuildModel(*ck, 8, 1);
  ASSERT_NE(model, nullptr);
  Buffer saved = std::move(ck->tensors.at("layers.0.attention.k_norm.weight"));
  ck->tensors.erase("layers.0.attention.k_norm.weight");
  absl::Status st = LoadIntoModel(*ck, model.get());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("layers.0.attention.k_norm.weight"), std::string::npos) << st;
  ck->tensors["layers.0.attention.k_norm.weight"] =
      *Buffer::ForTensor(DType::kF32, {4}, Device::Cpu());
  st = LoadIntoModel(*ck, model.get());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("layers.0.attention.k_norm.weight"), std::string::npos) << st;
  ck->tensors["layers.0.attention.k_norm.weight"] = std::move(saved);
  ck->tensors["layers.9.extra"] = *Buffer::ForTensor(DType::kF32, {4}, Device::Cpu());
  st = LoadIntoModel(*ck, model.get());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("layers.9.extra"), std::string::npos) << st;
}

// The fixtures of tools/hf_fixtures/make_hf_fixtures.py (real transformers checkpoints and
// logits), when they have been generated and committed.
class HfFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFixtureTest, LogitsMatchTransformersAndExportRoundTrips) {
  const std::string dir = "worker/checkpoint/testdata/hf/" + GetParam();
  if (!fs::exists(dir + "/config.json")) {
    GTEST_SKIP() << "fixture directory " << dir
                 << " is missing: run tools/hf_fixtures/make_hf_fixtures.py --out "
                    "worker/checkpoint/testdata/hf on a machine with torch + transformers";
  }
  auto ck = ImportHfModel(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  auto ref = SafetensorsFile::Open(dir + "/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto ids = ref->Get("input_ids");
  auto want = ref->Get("logits");
  ASSERT_TRUE(ids.ok() && want.ok());
  ASSERT_EQ(ids->dtype, DType::kI32);
  ASSERT_EQ(ids->shape.size(), 2u);
  const int64_t b = ids->shape[0], seq = ids->shape[1], v = ck->config.vocab_size();
  ASSERT_EQ(want->shape, (std::vector<int64_t>{b, seq, v}));
  std::unique_ptr<GptModel> model = BuildModel(*ck, seq, b);
  ASSERT_NE(model, nullptr);
  Tensor flat_ids(DType::kI32, {b * seq}, Device::Cpu(), ids->data);
  Buffer logits = *Buffer::ForTensor(DType::kF32, {b * seq, v}, Device::Cpu());
  absl::Status st = model->Forward(Stream::Cpu(), flat_ids, Tensor(), seq, 0, logits.View());
  ASSERT_TRUE(st.ok()) << st;
  Buffer want32 = *Buffer::ForTensor(DType::kF32, want->shape, Device::Cpu());
  ASSERT_TRUE(ConvertTensor(*want, want32.View()).ok());
  double max_diff = 0, max_ref = 0, diff2 = 0, ref2 = 0;
  const float* got = logits.View().as<float>();
  const float* exp = want32.View().as<float>();
  for (int64_t i = 0; i < b * seq * v; ++i) {
    const double dd = static_cast<double>(got[i]) - exp[i];
    max_diff = std::max(max_diff, std::fabs(dd));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(exp[i])));
    diff2 += dd * dd;
    ref2 += static_cast<double>(exp[i]) * exp[i];
  }
  const double rel_max = max_diff / max_ref, rel_l2 = std::sqrt(diff2 / ref2);
  std::printf(
      "%s logits [%lld,%lld,%lld] vs transformers: max|diff|/max|ref| = %.3g (< 1e-4), "
      "rel L2 = %.3g (< 1e-5)\n",
      GetParam().c_str(), static_cast<long long>(b), static_cast<long long>(seq),
      static_cast<long long>(v), rel_max, rel_l2);
  EXPECT_LT(rel_max, 1e-4);
  EXPECT_LT(rel_l2, 1e-5);

  const std::string out = TempDir("fixture_" + GetParam());
  st = ExportHfModel(ck->config, ck->architecture, *model, out, DType::kF32);
  ASSERT_TRUE(st.ok()) << st;
  auto again = ImportHfModel(out);
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectBitIdentical(*ck, *again);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfFixtureTest, ::testing::Values("mixtral", "qwen3_moe"));

}  // namespace
}  // namespace switchyard::model
