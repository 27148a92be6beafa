// Validation tests, part 4: the knobs Switchyard implements only in part
// (common/config/validate_knobs.cc). One test per rule: start from the valid baseline
// (common/config/validate_test_util.h), break exactly that rule, check INVALID_ARGUMENT and the
// field path and rule in the message; and check that the implemented values stay valid.
#include "common/config/config_defaults.h"
#include "common/config/validate.h"
#include "common/config/validate_test_util.h"
#include "gtest/gtest.h"

namespace switchyard {
namespace {

using testing::ExpectValid;
using testing::ExpectViolation;
using testing::RawBaseline;

TEST(ValidateKnobsTest, RouterDtypeFp64IsRejectedFp32Accepted) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_router_dtype("fp32");
  ExpectValid(spec);
  spec.mutable_model()->set_moe_router_dtype("fp64");
  ExpectViolation(spec, {"model.moe_router_dtype (\"fp64\") is not supported", "fp32"});
}

TEST(ValidateKnobsTest, FlexDispatcherIsRejected) {
  v1::JobSpec spec = RawBaseline();
  for (const char* ok : {"allgather", "alltoall"}) {
    spec.mutable_model()->set_moe_token_dispatcher_type(ok);
    ExpectValid(spec);
  }
  spec.mutable_model()->set_moe_token_dispatcher_type("flex");
  ExpectViolation(spec, {"model.moe_token_dispatcher_type (\"flex\") must be one of \"allgather\", "
                         "\"alltoall\""});
}

TEST(ValidateKnobsTest, GroupedGemmFalseIsRejected) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_grouped_gemm(true);
  ExpectValid(spec);
  spec.mutable_model()->set_moe_grouped_gemm(false);
  ExpectViolation(spec, {"model.moe_grouped_gemm (false) is not supported"});
}

TEST(ValidateKnobsTest, AttentionBackendIsOneOfAutoCudnnNative) {
  v1::JobSpec spec = RawBaseline();
  for (const char* ok : {"auto", "cudnn", "native"}) {
    spec.mutable_model()->set_attention_backend(ok);
    ExpectValid(spec);
  }
  spec.mutable_model()->set_attention_backend("flash");
  ExpectViolation(spec, {"model.attention_backend (\"flash\") must be one of \"auto\", "
                         "\"cudnn\", \"native\""});
}

TEST(ValidateKnobsTest, MaxPositionEmbeddingsCoversTheSequence) {
  v1::JobSpec spec = RawBaseline();  // seq_length 2048
  spec.mutable_model()->set_max_position_embeddings(2048);
  ExpectValid(spec);
  spec.mutable_model()->set_max_position_embeddings(1024);
  ExpectViolation(spec, {"model.max_position_embeddings (1024) must be at least "
                         "model.seq_length (2048)"});
}

// Unset: sharded exactly when W > 1 (the planner's choice); explicit true: fine at any W;
// explicit false: fine with one rank, rejected with more (no replicated optimizer across ranks).
TEST(ValidateKnobsTest, ExplicitReplicatedOptimizerNeedsOneRank) {
  v1::JobSpec spec = RawBaseline();  // world 32
  spec.mutable_parallel()->clear_use_distributed_optimizer();
  ExpectValid(spec);
  spec.mutable_parallel()->set_use_distributed_optimizer(false);
  ExpectViolation(spec, {"parallel.use_distributed_optimizer (false) with parallel.world_size "
                         "(32) > 1 is not supported"});

  v1::JobSpec one;
  one.mutable_model()->set_hidden_size(64);
  one.mutable_model()->set_num_attention_heads(4);
  one.mutable_training()->set_train_iters(10);
  one.mutable_parallel()->set_world_size(1);
  one.mutable_parallel()->set_use_distributed_optimizer(false);
  ExpectValid(one);
  one.mutable_parallel()->set_use_distributed_optimizer(true);
  ExpectValid(one);
}

TEST(ValidateKnobsTest, TokenizerTypeIsKnownAndNeedsAModel) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_data()->set_tokenizer_type("HuggingFaceTokenizer");
  spec.mutable_data()->set_tokenizer_model("/models/tokenizer.json");
  ExpectValid(spec);
  spec.mutable_data()->set_tokenizer_type("ByteLevelBPE");
  ExpectValid(spec);
  spec.mutable_data()->set_tokenizer_type("GPT2BPETokenizer");
  ExpectViolation(spec, {"data.tokenizer_type (\"GPT2BPETokenizer\") must be one of "
                         "\"ByteLevelBPE\", \"HuggingFaceTokenizer\""});
  spec.mutable_data()->set_tokenizer_type("HuggingFaceTokenizer");
  spec.mutable_data()->clear_tokenizer_model();
  ExpectViolation(spec, {"data.tokenizer_type (\"HuggingFaceTokenizer\") requires "
                         "data.tokenizer_model"});
}

// Selective activation recompute (config.proto "activation recompute"): the honoured modules are
// valid, alone and together; Megatron's default ["core_attn"] fills an empty list under
// "selective"; "full", a module list without "selective", unknown names (with the allowed set)
// and the modules the engine does not run are each rejected naming the field.
TEST(ValidateKnobsTest, RecomputeGranularityAndModules) {
  v1::JobSpec spec = RawBaseline();  // every layer MoE
  spec.mutable_model()->set_recompute_granularity("selective");
  ExpectValid(spec);
  v1::JobSpec defaulted = spec;
  ApplyDefaults(&defaulted);
  ASSERT_EQ(defaulted.model().recompute_modules_size(), 1);
  EXPECT_EQ(defaulted.model().recompute_modules(0), "core_attn");
  for (const char* ok : {"core_attn", "moe_act", "layernorm"}) {
    spec.mutable_model()->clear_recompute_modules();
    spec.mutable_model()->add_recompute_modules(ok);
    ExpectValid(spec);
  }
  for (const char* ok : {"core_attn", "moe_act"}) spec.mutable_model()->add_recompute_modules(ok);
  ExpectValid(spec);  // layernorm, core_attn, moe_act
  // "mlp" needs dense layers: every other layer dense is valid.
  spec.mutable_model()->add_recompute_modules("mlp");
  ExpectViolation(spec, {"model.recompute_modules[3] (\"mlp\") recomputes the dense MLP layers "
                         "and this model has none"});
  spec.mutable_model()->set_moe_layer_freq(2);
  ExpectValid(spec);
  spec.mutable_model()->clear_moe_layer_freq();
  for (int x : {1, 0, 1, 1, 1, 1, 1, 1}) spec.mutable_model()->add_moe_layer_pattern(x);
  ExpectValid(spec);

  spec.mutable_model()->clear_recompute_modules();
  spec.mutable_model()->add_recompute_modules("moe_act");
  spec.mutable_model()->add_recompute_modules("attention");
  ExpectViolation(spec, {"model.recompute_modules[1] (\"attention\") must be one of \"core_attn\", "
                         "\"moe_act\", \"layernorm\", \"mla_up_proj\", \"mlp\", \"moe\", "
                         "\"shared_experts\""});
  spec.mutable_model()->set_recompute_modules(1, "moe");
  ExpectViolation(spec, {"model.recompute_modules[1] (\"moe\") is not supported"});
  spec.mutable_model()->set_recompute_modules(1, "shared_experts");
  ExpectViolation(spec, {"model.recompute_modules[1] (\"shared_experts\") is not supported"});
  spec.mutable_model()->set_recompute_modules(1, "mla_up_proj");
  ExpectViolation(spec, {"model.recompute_modules[1] (\"mla_up_proj\") requires multi-latent "
                         "attention"});

  spec.mutable_model()->clear_recompute_granularity();
  spec.mutable_model()->set_recompute_modules(1, "layernorm");
  ExpectViolation(spec, {"model.recompute_modules requires model.recompute_granularity "
                         "\"selective\" (got unset)"});
  spec.mutable_model()->clear_recompute_modules();
  spec.mutable_model()->set_recompute_granularity("full");
  ExpectViolation(spec, {"model.recompute_granularity (\"full\") is not supported"});
  spec.mutable_model()->set_recompute_granularity("block");
  ExpectViolation(spec, {"model.recompute_granularity (\"block\") must be one of \"selective\", "
                         "\"full\""});

  // A dense model: "mlp" is valid, "moe_act" has nothing to recompute.
  v1::JobSpec dense;
  dense.mutable_model()->set_hidden_size(64);
  dense.mutable_model()->set_num_attention_heads(4);
  dense.mutable_training()->set_train_iters(10);
  dense.mutable_model()->set_recompute_granularity("selective");
  dense.mutable_model()->add_recompute_modules("mlp");
  dense.mutable_model()->add_recompute_modules("layernorm");
  ExpectValid(dense);
  dense.mutable_model()->add_recompute_modules("moe_act");
  ExpectViolation(dense, {"model.recompute_modules[2] (\"moe_act\") requires MoE layers "
                          "(model.num_experts)"});
}

}  // namespace
}  // namespace switchyard
