// Validation tests, part 2: MoE rules (megatron_moe.md §1 and §5.3). One test per rule: start from
// the valid baseline (common/config/validate_test_util.h), break exactly that rule, check
// INVALID_ARGUMENT and that the message names the field paths and the rule.
#include "common/config/validate.h"
#include "common/config/validate_test_util.h"
#include "gtest/gtest.h"

namespace switchyard {
namespace {

using testing::ExpectValid;
using testing::ExpectViolation;
using testing::RawBaseline;

TEST(ValidateMoeTest, NumExpertsDivisibleByExpertParallel) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_num_experts(6);
  ExpectViolation(spec, {"model.num_experts (6) must be divisible by "
                         "parallel.expert_model_parallel_size (4)"});
}

TEST(ValidateMoeTest, MoeFfnDivisibleByExpertTensorParallel) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_parallel()->set_expert_tensor_parallel_size(2);
  spec.mutable_model()->set_moe_ffn_hidden_size(511);
  ExpectViolation(spec, {"model.moe_ffn_hidden_size (511) must be divisible by "
                         "parallel.expert_tensor_parallel_size (2)"});
  spec.mutable_model()->set_moe_ffn_hidden_size(512);
  ExpectValid(spec);
}

TEST(ValidateMoeTest, ExpertParallelRequiresNumExperts) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->clear_num_experts();
  ExpectViolation(spec, {"parallel.expert_model_parallel_size (4) > 1 requires model.num_experts"});
}

TEST(ValidateMoeTest, MoeWithTensorParallelRequiresSequenceParallel) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_parallel()->set_sequence_parallel(false);
  ExpectViolation(spec, {"parallel.sequence_parallel must be true",
                         "parallel.tensor_model_parallel_size (2) > 1"});
}

TEST(ValidateMoeTest, TopkBetweenOneAndNumExperts) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_router_topk(17);
  ExpectViolation(spec,
                  {"model.moe_router_topk (17) must be between 1 and model.num_experts (16)"});
  spec.mutable_model()->set_moe_router_topk(16);
  ExpectValid(spec);
}

TEST(ValidateMoeTest, TopOneSoftmaxNeedsPreSoftmaxOrSinkhorn) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_router_topk(1);
  ExpectViolation(spec, {"model.moe_router_topk (1)", "model.moe_router_pre_softmax",
                         "softmax over a [num_tokens, 1] tensor would yield a zero gradient"});
  v1::JobSpec pre = spec;
  pre.mutable_model()->set_moe_router_pre_softmax(true);
  ExpectValid(pre);
  v1::JobSpec sigmoid = spec;
  sigmoid.mutable_model()->set_moe_router_score_function("sigmoid");
  ExpectValid(sigmoid);
  v1::JobSpec sinkhorn = spec;
  sinkhorn.mutable_model()->set_moe_router_load_balancing_type(0, "sinkhorn");
  sinkhorn.mutable_model()->set_moe_aux_loss_coeff(0, 0);
  ExpectValid(sinkhorn);
}

TEST(ValidateMoeTest, GroupTopkRequiresNumGroups) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_router_group_topk(2);
  ExpectViolation(spec, {"model.moe_router_group_topk (2) requires model.moe_router_num_groups"});
}

TEST(ValidateMoeTest, NumExpertsDivisibleByNumGroups) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_router_num_groups(3);
  spec.mutable_model()->set_moe_router_group_topk(1);
  ExpectViolation(spec,
                  {"model.num_experts (16) must be divisible by model.moe_router_num_groups (3)"});
}

TEST(ValidateMoeTest, GroupTopkAtMostNumGroups) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_router_num_groups(4);
  spec.mutable_model()->set_moe_router_group_topk(5);
  ExpectViolation(spec, {"model.moe_router_group_topk (5) must be at most "
                         "model.moe_router_num_groups (4)"});
}

// Like the anchor (megatron_moe.md §1.4), topk need not be a multiple of group_topk.
TEST(ValidateMoeTest, TopkNeedNotBeMultipleOfGroupTopk) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_router_topk(3);
  spec.mutable_model()->set_moe_router_num_groups(4);
  spec.mutable_model()->set_moe_router_group_topk(2);
  ExpectValid(spec);
}

TEST(ValidateMoeTest, ExpertBiasRequiresSigmoid) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_router_enable_expert_bias(true);
  ExpectViolation(spec, {"model.moe_router_enable_expert_bias requires "
                         "model.moe_router_score_function \"sigmoid\" (got \"softmax\")"});
  spec.mutable_model()->set_moe_router_score_function("sigmoid");
  ExpectValid(spec);
}

TEST(ValidateMoeTest, ScoreFunctionAllowedValues) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_router_score_function("softmx");
  ExpectViolation(spec, {R"(model.moe_router_score_function ("softmx") must be one of )"
                         R"("softmax", "sigmoid")"});
}

TEST(ValidateMoeTest, DispatcherAllowedValues) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_token_dispatcher_type("flex");
  ExpectViolation(spec, {R"(model.moe_token_dispatcher_type ("flex") must be one of )"
                         R"("allgather", "alltoall")"});
}

TEST(ValidateMoeTest, DropPolicyAllowedValues) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_token_drop_policy("random");
  ExpectViolation(spec, {R"(model.moe_token_drop_policy ("random") must be one of )"
                         R"("probs", "position")"});
}

TEST(ValidateMoeTest, LoadBalancingTypeAllowedValues) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_router_load_balancing_type(0, "aux");
  ExpectViolation(spec, {R"(model.moe_router_load_balancing_type[0] ("aux") must be one of )"
                         R"("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")"});
}

TEST(ValidateMoeTest, RouterDtypeAllowedValues) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_router_dtype("bf16");
  ExpectViolation(spec, {R"(model.moe_router_dtype ("bf16") must be one of "fp32", "fp64")"});
}

TEST(ValidateMoeTest, OneAuxCoefficientPerLoadBalancingType) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->add_moe_router_load_balancing_type("seq_aux_loss");
  ExpectViolation(spec, {"model.moe_aux_loss_coeff has 1 entries but "
                         "model.moe_router_load_balancing_type has 2"});
  spec.mutable_model()->add_moe_aux_loss_coeff(0.001);
  ExpectValid(spec);
}

TEST(ValidateMoeTest, AuxCoefficientsNonNegative) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_aux_loss_coeff(0, -0.01);
  ExpectViolation(spec, {"model.moe_aux_loss_coeff[0] (-0.01) must be non-negative"});
}

TEST(ValidateMoeTest, ZLossCoefficientNonNegative) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_z_loss_coeff(-1e-3);
  ExpectViolation(spec, {"model.moe_z_loss_coeff (-0.001) must be non-negative"});
}

TEST(ValidateMoeTest, BiasUpdateRateNonNegative) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_router_bias_update_rate(-1e-3);
  ExpectViolation(spec, {"model.moe_router_bias_update_rate (-0.001) must be non-negative"});
}

TEST(ValidateMoeTest, TopkScalingFactorPositive) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_router_topk_scaling_factor(0);
  ExpectViolation(spec, {"model.moe_router_topk_scaling_factor (0) must be positive"});
}

TEST(ValidateMoeTest, SinkhornRequiresZeroAuxCoefficient) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_router_load_balancing_type(0, "sinkhorn");
  ExpectViolation(spec, {"model.moe_aux_loss_coeff[0] (0.01) must be 0 for load balancing type "
                         "\"sinkhorn\""});
}

TEST(ValidateMoeTest, SinkhornCannotUseCapacityFactor) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_router_load_balancing_type(0, "sinkhorn");
  spec.mutable_model()->set_moe_aux_loss_coeff(0, 0);
  spec.mutable_model()->set_moe_expert_capacity_factor(1.25);
  ExpectViolation(spec, {"model.moe_expert_capacity_factor (1.25) cannot be combined with load "
                         "balancing type \"sinkhorn\"",
                         R"("aux_loss", "seq_aux_loss", "global_aux_loss", "none")"});
}

TEST(ValidateMoeTest, CapacityFactorWithAllowedTypes) {
  for (const char* type : {"aux_loss", "seq_aux_loss", "global_aux_loss", "none"}) {
    v1::JobSpec spec = RawBaseline();
    spec.mutable_model()->set_moe_router_load_balancing_type(0, type);
    spec.mutable_model()->set_moe_expert_capacity_factor(1.0);
    spec.mutable_model()->set_moe_pad_expert_input_to_capacity(true);
    ExpectValid(spec);
  }
}

TEST(ValidateMoeTest, CapacityFactorZeroRejected) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_expert_capacity_factor(0);
  ExpectViolation(spec, {"model.moe_expert_capacity_factor (0) must be positive"});
}

TEST(ValidateMoeTest, PadToCapacityRequiresCapacityFactor) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_pad_expert_input_to_capacity(true);
  ExpectViolation(spec, {"model.moe_pad_expert_input_to_capacity requires a non-negative "
                         "model.moe_expert_capacity_factor"});
  spec.mutable_model()->set_moe_expert_capacity_factor(-1);  // negative: dropless, as unset
  ExpectViolation(spec, {"model.moe_pad_expert_input_to_capacity requires"});
}

TEST(ValidateMoeTest, SharedExpertSizePositive) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_shared_expert_intermediate_size(0);
  ExpectViolation(spec, {"model.moe_shared_expert_intermediate_size (0) must be positive"});
  spec.mutable_model()->set_moe_shared_expert_intermediate_size(2048);
  ExpectValid(spec);
}

TEST(ValidateMoeTest, SharedExpertOverlapRequiresAlltoall) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_shared_expert_intermediate_size(2048);
  spec.mutable_model()->set_moe_shared_expert_overlap(true);
  ExpectValid(spec);
  spec.mutable_model()->set_moe_token_dispatcher_type("allgather");
  ExpectViolation(spec, {"model.moe_shared_expert_overlap requires "
                         "model.moe_token_dispatcher_type \"alltoall\" (got \"allgather\")"});
}

TEST(ValidateMoeTest, BiasLinearRequiresExpertTensorParallelOne) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_add_bias_linear(true);
  ExpectValid(spec);  // ETP 1
  spec.mutable_parallel()->set_expert_tensor_parallel_size(2);
  ExpectViolation(spec, {"model.add_bias_linear with an MoE model requires "
                         "parallel.expert_tensor_parallel_size == 1 (got 2)"});
}

TEST(ValidateMoeTest, LayerPatternHasOneEntryPerLayer) {
  v1::JobSpec spec = RawBaseline();
  for (int v : {0, 1, 1}) spec.mutable_model()->add_moe_layer_pattern(v);
  ExpectViolation(spec, {"model.moe_layer_pattern has 3 entries but model.num_layers is 8"});
}

TEST(ValidateMoeTest, LayerPatternEntriesAreZeroOrOne) {
  v1::JobSpec spec = RawBaseline();
  for (int v : {0, 1, 1, 1, 2, 1, 1, 1}) spec.mutable_model()->add_moe_layer_pattern(v);
  ExpectViolation(spec, {"model.moe_layer_pattern[4] (2) must be 0 (dense) or 1 (MoE)"});
}

TEST(ValidateMoeTest, LayerFreqAtLeastOne) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_layer_freq(0);
  ExpectViolation(spec, {"model.moe_layer_freq (0) must be positive"});
}

TEST(ValidateMoeTest, InputJitterInUnitInterval) {
  for (double eps : {1.0, -0.1}) {
    v1::JobSpec spec = RawBaseline();
    spec.mutable_model()->set_moe_input_jitter_eps(eps);
    ExpectViolation(spec, {"model.moe_input_jitter_eps (", ") must be in [0, 1)"});
  }
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_input_jitter_eps(0.01);
  ExpectValid(spec);
}

}  // namespace
}  // namespace switchyard
