// Validation tests, part 4: the knobs Switchyard implements only in part
// (common/config/validate_knobs.cc). One test per rule: start from the valid baseline
// (common/config/validate_test_util.h), break exactly that rule, check INVALID_ARGUMENT and the
// field path and rule in the message; and check that the implemented values stay valid.
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

}  // namespace
}  // namespace switchyard
