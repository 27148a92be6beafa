// Megatron-LM flags -> JobSpec: a full Mixtral-style command line, every flag kind (int, int64,
// double, string, store_true, repeated), the special cases, and the errors naming the flag.
#include "cli/megatron_args.h"

#include <cstdio>

#include "absl/status/status.h"
#include "common/config/config.h"
#include "gtest/gtest.h"

namespace switchyard::cli {
namespace {

absl::StatusOr<v1::JobSpec> Apply(const std::string& line) {
  auto words = SplitCommandLine(line);
  if (!words.ok()) return words.status();
  v1::JobSpec spec;
  absl::Status s = ApplyMegatronArgs(*words, &spec);
  if (!s.ok()) return s;
  return spec;
}

void ExpectError(const std::string& line, const std::string& substring) {
  auto spec = Apply(line);
  ASSERT_FALSE(spec.ok()) << line;
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << line;
  EXPECT_NE(std::string(spec.status().message()).find(substring), std::string::npos)
      << line << " -> " << spec.status().message() << " (want '" << substring << "')";
  std::printf("%-60s -> %s\n", line.c_str(), std::string(spec.status().message()).c_str());
}

TEST(MegatronArgs, MixtralStyleCommandLine) {
  auto spec = Apply(
      "--use-mcore-models --num-layers 4 --hidden-size 128 --num-attention-heads 4 "
      "--group-query-attention --num-query-groups 2 --ffn-hidden-size 256 --kv-channels 32 "
      "--seq-length 64 --max-position-embeddings 64 --vocab-size 4096 --normalization RMSNorm "
      "--norm-epsilon 1e-6 --rotary-base 1000000 --position-embedding-type rope --swiglu "
      "--qk-layernorm --untie-embeddings-and-output-weights --disable-bias-linear "
      "--init-method-std 0.01 --num-experts 8 --moe-ffn-hidden-size 128 --moe-router-topk 2 "
      "--moe-router-score-function sigmoid --moe-router-enable-expert-bias "
      "--moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 0.001 "
      "--moe-z-loss-coeff 1e-3 --moe-token-dispatcher-type alltoall --moe-layer-freq [0,1,1,1] "
      "--moe-grouped-gemm --expert-model-parallel-size 2 --tensor-model-parallel-size 1 "
      "--pipeline-model-parallel-size 1 --context-parallel-size 1 --sequence-parallel "
      "--use-distributed-optimizer --micro-batch-size 4 --global-batch-size 8 "
      "--train-iters 100 --lr 3e-4 --min-lr=3e-5 --lr-warmup-iters 10 --lr-decay-style cosine "
      "--weight-decay 0.1 --adam-beta2 0.95 --clip-grad 1.0 --bf16 --seed 42 "
      "--save /ckpt --load /ckpt --save-interval 50 --log-interval 1 "
      "--data-path 0.7 /data/a_text_document 0.3 '/data/b text' --split 969,30,1 "
      "--tokenizer-type HuggingFaceTokenizer --tokenizer-model /tok.json "
      "--transformer-impl local");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const v1::ModelConfig& m = spec->model();
  EXPECT_EQ(m.num_layers(), 4);
  EXPECT_EQ(m.hidden_size(), 128);
  EXPECT_EQ(m.num_query_groups(), 2);
  EXPECT_EQ(m.kv_channels(), 32);
  EXPECT_EQ(m.max_position_embeddings(), 64);
  EXPECT_EQ(m.vocab_size(), 4096);
  EXPECT_EQ(m.normalization(), "RMSNorm");
  EXPECT_DOUBLE_EQ(m.norm_epsilon(), 1e-6);
  EXPECT_DOUBLE_EQ(m.rotary_base(), 1e6);
  EXPECT_TRUE(m.qk_layernorm());
  EXPECT_TRUE(m.untie_embeddings_and_output_weights());
  EXPECT_FALSE(m.add_bias_linear());
  EXPECT_EQ(m.num_experts(), 8);
  EXPECT_EQ(m.moe_ffn_hidden_size(), 128);
  EXPECT_EQ(m.moe_router_topk(), 2);
  EXPECT_EQ(m.moe_router_score_function(), "sigmoid");
  EXPECT_TRUE(m.moe_router_enable_expert_bias());
  ASSERT_EQ(m.moe_router_load_balancing_type_size(), 1);
  EXPECT_EQ(m.moe_router_load_balancing_type(0), "seq_aux_loss");
  ASSERT_EQ(m.moe_aux_loss_coeff_size(), 1);
  EXPECT_DOUBLE_EQ(m.moe_aux_loss_coeff(0), 0.001);
  EXPECT_EQ(m.moe_token_dispatcher_type(), "alltoall");
  EXPECT_FALSE(m.has_moe_layer_freq());
  ASSERT_EQ(m.moe_layer_pattern_size(), 4);
  EXPECT_EQ(m.moe_layer_pattern(0), 0);
  EXPECT_EQ(m.moe_layer_pattern(3), 1);
  EXPECT_TRUE(m.moe_grouped_gemm());
  const v1::ParallelConfig& p = spec->parallel();
  EXPECT_EQ(p.expert_model_parallel_size(), 2);
  EXPECT_TRUE(p.has_tensor_model_parallel_size());
  EXPECT_TRUE(p.sequence_parallel());
  EXPECT_TRUE(p.use_distributed_optimizer());
  const v1::TrainingConfig& t = spec->training();
  EXPECT_EQ(t.micro_batch_size(), 4);
  EXPECT_EQ(t.global_batch_size(), 8);
  EXPECT_EQ(t.train_iters(), 100);
  EXPECT_DOUBLE_EQ(t.lr(), 3e-4);
  EXPECT_DOUBLE_EQ(t.min_lr(), 3e-5);
  EXPECT_EQ(t.lr_warmup_iters(), 10);
  EXPECT_EQ(t.lr_decay_style(), "cosine");
  EXPECT_DOUBLE_EQ(t.adam_beta2(), 0.95);
  EXPECT_TRUE(t.has_bf16() && t.bf16());
  EXPECT_EQ(t.seed(), 42);
  EXPECT_EQ(t.save(), "/ckpt");
  EXPECT_EQ(t.load(), "/ckpt");
  EXPECT_EQ(t.save_interval(), 50);
  const v1::DataConfig& d = spec->data();
  ASSERT_EQ(d.data_path_size(), 4);
  EXPECT_EQ(d.data_path(0), "0.7");
  EXPECT_EQ(d.data_path(3), "/data/b text");
  EXPECT_EQ(d.split(), "969,30,1");
  EXPECT_EQ(d.tokenizer_type(), "HuggingFaceTokenizer");
  std::printf("spec from Megatron flags:\n%s\n", JobSpecToYaml(*spec).c_str());
}

TEST(MegatronArgs, RepeatedAndSpecialValues) {
  auto spec = Apply(
      "--moe-router-load-balancing-type aux_loss seq_aux_loss --moe-aux-loss-coeff 0.01 0.001 "
      "--moe-expert-capacity-factor -1 --moe-layer-freq 2 --mock-data");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().moe_router_load_balancing_type_size(), 2);
  EXPECT_EQ(spec->model().moe_aux_loss_coeff_size(), 2);
  EXPECT_DOUBLE_EQ(spec->model().moe_expert_capacity_factor(), -1);
  EXPECT_EQ(spec->model().moe_layer_freq(), 2);
  EXPECT_TRUE(spec->data().mock_data());
}

TEST(MegatronArgs, OverridesAFileSpec) {
  auto base = ParseJobSpecYaml("model: {num_layers: 2, hidden_size: 64}\ntraining: {lr: 0.1}\n");
  ASSERT_TRUE(base.ok()) << base.status();
  v1::JobSpec spec = *base;
  ASSERT_TRUE(ApplyMegatronArgs({"--num-layers", "8", "--lr", "0.5"}, &spec).ok());
  EXPECT_EQ(spec.model().num_layers(), 8);
  EXPECT_EQ(spec.model().hidden_size(), 64);
  EXPECT_DOUBLE_EQ(spec.training().lr(), 0.5);
}

TEST(MegatronArgs, ErrorsNameTheFlag) {
  ExpectError("--num-layers 4 --moe-routr-topk 2", "unknown Megatron flag '--moe-routr-topk'");
  ExpectError("--num_layers 4", "unknown Megatron flag '--num_layers'");
  ExpectError("--Num-Layers 4", "unknown Megatron flag '--Num-Layers'");
  ExpectError("--swiglu-activation x", "unknown Megatron flag '--swiglu-activation'");
  ExpectError("--moe-layer-pattern 1", "unknown Megatron flag '--moe-layer-pattern'");
  ExpectError("--num-layers four", "--num-layers: expected an integer, got 'four'");
  ExpectError("--num-layers 2.5", "--num-layers: expected an integer, got '2.5'");
  ExpectError("--num-layers 3000000000", "--num-layers: 3000000000 does not fit");
  ExpectError("--lr fast", "--lr: expected a number, got 'fast'");
  ExpectError("--num-layers", "--num-layers needs a value");
  ExpectError("--num-layers 1 2", "--num-layers takes exactly one value");
  ExpectError("--qk-layernorm=true", "--qk-layernorm takes no value");
  ExpectError("--fp16", "--fp16: not supported");
  ExpectError("--position-embedding-type learned_absolute",
              "--position-embedding-type: 'learned_absolute' is not supported");
  ExpectError("--moe-layer-freq [0,x]", "--moe-layer-freq: expected an integer or a list");
  ExpectError("4 --num-layers 4", "unexpected value '4'");
  ExpectError("--save '/a b", "unclosed ' quote");
}

TEST(SplitCommandLine, QuotesAndEscapes) {
  auto words = SplitCommandLine(R"(  a "b c" 'd "e"' f\ g "" )");
  ASSERT_TRUE(words.ok());
  EXPECT_EQ(*words, (std::vector<std::string>{"a", "b c", "d \"e\"", "f g", ""}));
}

}  // namespace
}  // namespace switchyard::cli
