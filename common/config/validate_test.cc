// Validation tests, part 1: the baseline, ApplyDefaults, required fields, ranges and the dense
// model rules. One test per rule: start from the valid baseline, break exactly that rule, check
// INVALID_ARGUMENT and that the message names the field path and the rule. MoE rules are in
// validate_moe_test.cc; parallel, training, elastic and data rules in validate_parallel_test.cc.
#include "common/config/validate.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/config_defaults.h"
#include "common/config/validate_test_util.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace switchyard {
namespace {

using google::protobuf::util::MessageDifferencer;
using testing::ExpectValid;
using testing::ExpectViolation;
using testing::RawBaseline;
using testing::SetIntField;

TEST(ValidateTest, BaselinePasses) {
  ExpectValid(RawBaseline());
  v1::JobSpec spec = RawBaseline();
  ApplyDefaults(&spec);
  EXPECT_EQ(spec.training().global_batch_size(), 32);  // micro 2 x DP 8 x PP 2
  EXPECT_EQ(spec.min_workers(), 32);
}

TEST(ValidateTest, ApplyDefaultsIsIdempotent) {
  v1::JobSpec dense;
  dense.mutable_model()->set_hidden_size(100);  // not divisible by heads: kv_channels stays unset
  dense.mutable_model()->set_num_attention_heads(3);
  for (const v1::JobSpec& raw : {RawBaseline(), v1::JobSpec(), dense}) {
    v1::JobSpec once = raw;
    ApplyDefaults(&once);
    v1::JobSpec twice = once;
    ApplyDefaults(&twice);
    EXPECT_TRUE(MessageDifferencer::Equals(once, twice)) << once.DebugString();
  }
}

TEST(ValidateTest, ApplyDefaultsFillsMegatronDefaults) {
  v1::JobSpec spec;
  spec.mutable_model()->set_hidden_size(512);
  spec.mutable_model()->set_num_attention_heads(8);
  spec.mutable_model()->set_num_experts(8);
  spec.mutable_parallel()->set_tensor_model_parallel_size(2);
  spec.mutable_parallel()->set_world_size(8);
  spec.mutable_training()->set_train_iters(100);
  ApplyDefaults(&spec);
  const v1::ModelConfig& m = spec.model();
  EXPECT_EQ(m.num_layers(), 2);
  EXPECT_EQ(m.num_query_groups(), 8);
  EXPECT_EQ(m.ffn_hidden_size(), 2048);
  EXPECT_EQ(m.kv_channels(), 64);
  EXPECT_EQ(m.seq_length(), 1024);
  EXPECT_EQ(m.max_position_embeddings(), 1024);
  EXPECT_EQ(m.normalization(), "RMSNorm");
  EXPECT_DOUBLE_EQ(m.norm_epsilon(), 1e-5);
  EXPECT_DOUBLE_EQ(m.rotary_base(), 10000);
  EXPECT_DOUBLE_EQ(m.init_method_std(), 0.02);
  EXPECT_FALSE(m.has_vocab_size());
  EXPECT_EQ(m.moe_ffn_hidden_size(), 2048);
  EXPECT_EQ(m.moe_router_topk(), 2);
  EXPECT_EQ(m.moe_router_score_function(), "softmax");
  ASSERT_EQ(m.moe_router_load_balancing_type_size(), 1);
  EXPECT_EQ(m.moe_router_load_balancing_type(0), "aux_loss");
  ASSERT_EQ(m.moe_aux_loss_coeff_size(), 1);
  EXPECT_EQ(m.moe_aux_loss_coeff(0), 0.0);
  EXPECT_EQ(m.moe_token_dispatcher_type(), "allgather");
  EXPECT_EQ(m.moe_token_drop_policy(), "probs");
  EXPECT_EQ(m.moe_router_dtype(), "fp32");
  EXPECT_DOUBLE_EQ(m.moe_router_bias_update_rate(), 1e-3);
  EXPECT_EQ(m.moe_layer_freq(), 1);
  EXPECT_TRUE(m.moe_grouped_gemm());
  EXPECT_FALSE(m.has_moe_expert_capacity_factor());
  const v1::ParallelConfig& p = spec.parallel();
  EXPECT_EQ(p.pipeline_model_parallel_size(), 1);
  EXPECT_EQ(p.context_parallel_size(), 1);
  EXPECT_EQ(p.expert_model_parallel_size(), 1);
  EXPECT_EQ(p.expert_tensor_parallel_size(), 2);  // = TP
  EXPECT_EQ(p.num_distributed_optimizer_instances(), 1);
  EXPECT_FALSE(p.has_virtual_pipeline_model_parallel_size());
  const v1::TrainingConfig& t = spec.training();
  EXPECT_EQ(t.micro_batch_size(), 1);
  EXPECT_EQ(t.global_batch_size(), 4);  // 1 x DP (8 / TP 2)
  EXPECT_DOUBLE_EQ(t.lr(), 1e-4);
  EXPECT_EQ(t.min_lr(), 0.0);
  EXPECT_EQ(t.lr_warmup_iters(), 0);
  EXPECT_EQ(t.lr_decay_iters(), 100);
  EXPECT_EQ(t.lr_decay_style(), "cosine");
  EXPECT_DOUBLE_EQ(t.weight_decay(), 0.01);
  EXPECT_DOUBLE_EQ(t.adam_beta1(), 0.9);
  EXPECT_DOUBLE_EQ(t.adam_beta2(), 0.999);
  EXPECT_DOUBLE_EQ(t.adam_eps(), 1e-8);
  EXPECT_DOUBLE_EQ(t.clip_grad(), 1.0);
  EXPECT_EQ(t.seed(), 1234);
  EXPECT_EQ(t.log_interval(), 1);
  EXPECT_FALSE(t.has_bf16());
  EXPECT_EQ(spec.min_workers(), 8);
  EXPECT_EQ(spec.max_workers(), 8);
  EXPECT_EQ(spec.max_restarts(), 3);
}

// Evaluation defaults (config_defaults.h): eval_iters 100 and Megatron's split "969,30,1" only
// for a job that sets eval_interval, so that every other job keeps its training data.
TEST(ValidateTest, EvaluationDefaultsOnlyForJobsThatEvaluate) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_data()->clear_split();
  v1::JobSpec plain = spec;
  ApplyDefaults(&plain);
  EXPECT_FALSE(plain.training().has_eval_iters());
  EXPECT_EQ(plain.data().split(), "");  // all documents stay training data

  spec.mutable_training()->set_eval_interval(50);
  v1::JobSpec evaluating = spec;
  ApplyDefaults(&evaluating);
  EXPECT_EQ(evaluating.training().eval_iters(), 100);
  EXPECT_EQ(evaluating.data().split(), "969,30,1");
  ExpectValid(evaluating);

  spec.mutable_training()->set_eval_iters(7);
  spec.mutable_data()->set_split("90,10");
  ApplyDefaults(&spec);
  EXPECT_EQ(spec.training().eval_iters(), 7);
  EXPECT_EQ(spec.data().split(), "90,10");

  v1::JobSpec mock = RawBaseline();
  mock.mutable_data()->clear_split();
  mock.mutable_data()->clear_data_path();
  mock.mutable_data()->set_mock_data(true);
  mock.mutable_training()->set_eval_interval(5);
  ApplyDefaults(&mock);
  EXPECT_EQ(mock.data().split(), "");  // no documents to split: the validator refuses the job
}

TEST(ValidateTest, ApplyDefaultsNeverOverwritesExplicitValues) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_num_query_groups(0);  // explicit zeros stay, for the validator
  spec.mutable_parallel()->set_context_parallel_size(0);
  spec.mutable_model()->set_moe_router_score_function("sigmoid");
  spec.mutable_model()->clear_moe_router_load_balancing_type();
  spec.mutable_model()->add_moe_router_load_balancing_type("seq_aux_loss");
  spec.mutable_model()->add_moe_router_load_balancing_type("aux_loss");
  spec.mutable_model()->set_moe_grouped_gemm(false);
  spec.mutable_training()->set_global_batch_size(7);
  spec.set_max_restarts(0);
  v1::JobSpec before = spec;
  ApplyDefaults(&spec);
  EXPECT_EQ(spec.model().num_query_groups(), 0);
  EXPECT_EQ(spec.parallel().context_parallel_size(), 0);
  EXPECT_EQ(spec.model().moe_router_score_function(), "sigmoid");
  EXPECT_EQ(spec.model().moe_router_load_balancing_type_size(), 2);
  EXPECT_EQ(spec.model().moe_aux_loss_coeff_size(), 1);  // wrong length: left for the validator
  EXPECT_FALSE(spec.model().moe_grouped_gemm());
  EXPECT_EQ(spec.training().global_batch_size(), 7);
  EXPECT_EQ(spec.max_restarts(), 0);
  // Every field set before keeps its value.
  MessageDifferencer differencer;
  differencer.set_scope(MessageDifferencer::PARTIAL);
  EXPECT_TRUE(differencer.Compare(before, spec));
}

TEST(ValidateTest, DenseModelGetsNoMoeDefaults) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->Clear();
  spec.mutable_model()->set_hidden_size(1024);
  spec.mutable_model()->set_num_attention_heads(16);
  spec.mutable_parallel()->set_expert_model_parallel_size(1);
  ApplyDefaults(&spec);
  EXPECT_FALSE(spec.model().has_moe_router_topk());
  EXPECT_EQ(spec.model().moe_router_load_balancing_type_size(), 0);
  EXPECT_TRUE(spec.model().moe_token_dispatcher_type().empty());
  // TP 2 with sequence parallelism on a dense model is fine.
  ExpectValid(spec);
}

TEST(ValidateTest, RequiredFields) {
  for (const char* path :
       {"model.hidden_size", "model.num_attention_heads", "training.train_iters"}) {
    SCOPED_TRACE(path);
    v1::JobSpec spec = RawBaseline();
    if (absl::string_view(path) == "model.hidden_size") spec.mutable_model()->clear_hidden_size();
    if (absl::string_view(path) == "model.num_attention_heads") {
      spec.mutable_model()->clear_num_attention_heads();
      spec.mutable_model()->clear_num_query_groups();
    }
    if (absl::string_view(path) == "training.train_iters") {
      spec.mutable_training()->clear_train_iters();
      spec.mutable_training()->set_lr_decay_iters(1000);
    }
    ExpectViolation(spec, {path, "is required"}, /*only=*/false);
  }
}

// Every integer size and count: 0 and -1 are rejected naming the field (non-negative fields: -1).
TEST(ValidateTest, SizesAndCountsMustBePositive) {
  const char* kPositive[] = {"model.num_layers",
                             "model.hidden_size",
                             "model.num_attention_heads",
                             "model.num_query_groups",
                             "model.ffn_hidden_size",
                             "model.kv_channels",
                             "model.seq_length",
                             "model.max_position_embeddings",
                             "model.vocab_size",
                             "model.num_experts",
                             "model.moe_ffn_hidden_size",
                             "model.moe_router_topk",
                             "model.moe_router_num_groups",
                             "model.moe_router_group_topk",
                             "model.moe_shared_expert_intermediate_size",
                             "model.moe_layer_freq",
                             "parallel.tensor_model_parallel_size",
                             "parallel.pipeline_model_parallel_size",
                             "parallel.context_parallel_size",
                             "parallel.expert_model_parallel_size",
                             "parallel.expert_tensor_parallel_size",
                             "parallel.virtual_pipeline_model_parallel_size",
                             "parallel.num_distributed_optimizer_instances",
                             "parallel.world_size",
                             "training.micro_batch_size",
                             "training.global_batch_size",
                             "training.train_iters",
                             "training.lr_decay_iters",
                             "training.save_interval",
                             "training.log_interval",
                             "training.eval_interval",
                             "training.eval_iters",
                             "min_workers",
                             "max_workers"};
  for (const char* path : kPositive) {
    for (int64_t value : {0, -1}) {
      SCOPED_TRACE(absl::StrCat(path, " = ", value));
      v1::JobSpec spec = RawBaseline();
      SetIntField(&spec, path, value);
      ExpectViolation(spec, {absl::StrCat(path, " (", value, ") must be positive")}, false);
    }
  }
  for (const char* path : {"training.lr_warmup_iters", "max_restarts"}) {
    SCOPED_TRACE(path);
    v1::JobSpec spec = RawBaseline();
    SetIntField(&spec, path, -1);
    ExpectViolation(spec, {absl::StrCat(path, " (-1) must be non-negative")});
  }
}

TEST(ValidateTest, SizesHaveSaneUpperBounds) {
  struct Bound {
    const char* path;
    int64_t max;
  };
  const Bound kBounds[] = {{"model.hidden_size", 1 << 20},
                           {"model.num_experts", 1 << 16},
                           {"model.num_layers", 1 << 14},
                           {"model.vocab_size", 1 << 26},
                           {"parallel.world_size", 1 << 20},
                           {"parallel.tensor_model_parallel_size", 1 << 20},
                           {"parallel.expert_model_parallel_size", 1 << 20},
                           {"training.global_batch_size", 1 << 30},
                           {"training.train_iters", int64_t{1} << 40}};
  for (const Bound& bound : kBounds) {
    SCOPED_TRACE(bound.path);
    v1::JobSpec spec = RawBaseline();
    SetIntField(&spec, bound.path, bound.max + 1);
    ExpectViolation(
        spec, {absl::StrCat(bound.path, " (", bound.max + 1, ") must be at most ", bound.max)},
        false);
  }
}

TEST(ValidateTest, DoublesMustBeFinite) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_training()->set_lr(std::numeric_limits<double>::quiet_NaN());
  ExpectViolation(spec, {"training.lr (nan) must be finite"}, false);
  spec = RawBaseline();
  spec.mutable_model()->set_moe_aux_loss_coeff(0, std::numeric_limits<double>::infinity());
  ExpectViolation(spec, {"model.moe_aux_loss_coeff[0] (inf) must be finite"});
}

TEST(ValidateTest, HiddenSizeDivisibleByHeadsWhenKvChannelsUnset) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_hidden_size(1000);
  ExpectViolation(spec, {"model.hidden_size (1000) must be divisible by "
                         "model.num_attention_heads (16) when model.kv_channels is unset"});
  spec.mutable_model()->set_kv_channels(64);  // an explicit head dim lifts the rule
  ExpectValid(spec);
}

TEST(ValidateTest, HeadsDivisibleByQueryGroups) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_num_query_groups(6);
  ExpectViolation(spec, {"model.num_attention_heads (16) must be divisible by "
                         "model.num_query_groups (6)"});
}

TEST(ValidateTest, HeadsDivisibleByTensorParallel) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_num_attention_heads(9);  // query groups then break the TP rule too
  spec.mutable_model()->set_num_query_groups(3);
  spec.mutable_model()->set_kv_channels(128);
  ExpectViolation(spec,
                  {"model.num_attention_heads (9) must be divisible by "
                   "parallel.tensor_model_parallel_size (2)"},
                  false);
}

TEST(ValidateTest, QueryGroupsDivisibleByTensorParallel) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_num_query_groups(1);
  ExpectViolation(spec, {"model.num_query_groups (1) must be divisible by "
                         "parallel.tensor_model_parallel_size (2)"});
}

// Sequence parallelism (on whenever TP > 1) splits every sequence over the TP ranks.
TEST(ValidateTest, SeqLengthDivisibleByTensorParallel) {
  v1::JobSpec spec = RawBaseline();  // TP 2
  spec.mutable_model()->set_seq_length(1023);
  ExpectViolation(spec, {"model.seq_length (1023) must be divisible by "
                         "parallel.tensor_model_parallel_size (2): sequence parallelism splits "
                         "every sequence over the TP ranks"});
}

// Column-parallel fc1 splits F over TP.
TEST(ValidateTest, FfnHiddenSizeDivisibleByTensorParallel) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_ffn_hidden_size(2049);
  ExpectViolation(spec, {"model.ffn_hidden_size (2049) must be divisible by "
                         "parallel.tensor_model_parallel_size (2)"});
}

TEST(ValidateTest, NormalizationAllowedValues) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_normalization("BatchNorm");
  ExpectViolation(spec,
                  {R"(model.normalization ("BatchNorm") must be one of "RMSNorm", "LayerNorm")"});
  spec.mutable_model()->set_normalization("LayerNorm");
  ExpectValid(spec);
}

TEST(ValidateTest, SwigluIsTheOnlyActivation) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_swiglu_activation("gelu");
  ExpectViolation(spec, {R"(model.swiglu_activation ("gelu") must be empty or "swiglu")"});
}

TEST(ValidateTest, NormEpsilonPositive) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_norm_epsilon(0);
  ExpectViolation(spec, {"model.norm_epsilon (0) must be positive"});
}

TEST(ValidateTest, RotaryBasePositive) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_rotary_base(-1);
  ExpectViolation(spec, {"model.rotary_base (-1) must be positive"});
}

TEST(ValidateTest, InitMethodStdPositive) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_init_method_std(0);
  ExpectViolation(spec, {"model.init_method_std (0) must be positive"});
}

TEST(ValidateTest, AllViolationsListsEveryBrokenRule) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_num_experts(6);                  // 6 % EP 4
  spec.mutable_training()->set_adam_beta1(1.0);              // not < 1
  spec.mutable_model()->set_moe_token_dispatcher_type("x");  // unknown
  ApplyDefaults(&spec);
  std::vector<std::string> all = AllViolations(spec);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(ValidateJobSpec(spec).message(), all[0]);
  for (const std::string& v : all) std::printf("  %s\n", v.c_str());
}

// Specs with extreme and random values in every field: ApplyDefaults and validation never crash
// (no division by zero, no overflow on products of sizes) and answer OK or INVALID_ARGUMENT.
TEST(ValidateTest, RandomSpecsNeverCrash) {
  const unsigned seed = std::random_device{}();
  std::printf("random spec seed %u\n", seed);
  std::mt19937 rng(seed);
  const int64_t kInts[] = {
      std::numeric_limits<int32_t>::min(), -1, 0, 1, 2, 3, 4, 7, 8, 16, 64, 1 << 20,
      std::numeric_limits<int32_t>::max()};
  const double kDoubles[] = {
      std::nan(""), -std::numeric_limits<double>::infinity(), -1, 0, 1e-8, 0.5, 1, 1e300};
  const char* kStrings[] = {"",         "softmax",  "sigmoid", "alltoall", "allgather",
                            "sinkhorn", "aux_loss", "probs",   "fp32",     "cosine",
                            "RMSNorm",  "0.5",      "x",       "1,2,3"};
  int ok = 0, rejected = 0;
  for (int iteration = 0; iteration < 3000; ++iteration) {
    v1::JobSpec spec;
    for (google::protobuf::Message* m : std::vector<google::protobuf::Message*>{
             &spec, spec.mutable_model(), spec.mutable_parallel(), spec.mutable_training(),
             spec.mutable_data()}) {
      const google::protobuf::Reflection* r = m->GetReflection();
      for (int i = 0; i < m->GetDescriptor()->field_count(); ++i) {
        const google::protobuf::FieldDescriptor* f = m->GetDescriptor()->field(i);
        if (rng() % 3 == 0) continue;  // leave unset
        using FD = google::protobuf::FieldDescriptor;
        for (int k = 0, n = f->is_repeated() ? rng() % 4 : 1; k < n; ++k) {
          const int64_t v = kInts[rng() % (sizeof(kInts) / sizeof(kInts[0]))];
          const double d = kDoubles[rng() % (sizeof(kDoubles) / sizeof(kDoubles[0]))];
          const char* str = kStrings[rng() % (sizeof(kStrings) / sizeof(kStrings[0]))];
          switch (f->cpp_type()) {
            case FD::CPPTYPE_INT32:
              f->is_repeated() ? r->AddInt32(m, f, v) : r->SetInt32(m, f, v);
              break;
            case FD::CPPTYPE_INT64:
              f->is_repeated() ? r->AddInt64(m, f, v * (rng() % 2 ? 1 : 1 << 20))
                               : r->SetInt64(m, f, v * (rng() % 2 ? 1 : 1 << 20));
              break;
            case FD::CPPTYPE_DOUBLE:
              f->is_repeated() ? r->AddDouble(m, f, d) : r->SetDouble(m, f, d);
              break;
            case FD::CPPTYPE_BOOL:
              r->SetBool(m, f, rng() % 2);
              break;
            case FD::CPPTYPE_STRING:
              f->is_repeated() ? r->AddString(m, f, str) : r->SetString(m, f, str);
              break;
            default:
              break;
          }
        }
      }
    }
    ApplyDefaults(&spec);
    absl::Status status = ValidateJobSpec(spec);
    ASSERT_TRUE(status.ok() || status.code() == absl::StatusCode::kInvalidArgument) << status;
    status.ok() ? ++ok : ++rejected;
  }
  std::printf("random specs: %d valid, %d rejected\n", ok, rejected);
}

}  // namespace
}  // namespace switchyard
