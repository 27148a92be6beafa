// Validation tests, part 3: parallel mapping (megatron_moe.md §5.2), training schedule and
// optimizer, elastic range and data. One test per rule: start from the valid baseline
// (common/config/validate_test_util.h: world 32 = TP 2 x PP 2 x DP 8; experts ETP 1 x EP 4 x EDP 4
// x PP 2), break exactly that rule, check INVALID_ARGUMENT and the field paths and rule in the
// message.
#include "absl/strings/str_cat.h"
#include "common/config/validate.h"
#include "common/config/validate_test_util.h"
#include "gtest/gtest.h"

namespace switchyard {
namespace {

using testing::ExpectValid;
using testing::ExpectViolation;
using testing::RawBaseline;

TEST(ValidateParallelTest, SequenceParallelRequiresTensorParallel) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_parallel()->set_tensor_model_parallel_size(1);
  ExpectViolation(spec, {"parallel.sequence_parallel requires "
                         "parallel.tensor_model_parallel_size > 1 (got 1)"});
}

TEST(ValidateParallelTest, NumLayersDivisibleByPipelineParallel) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_num_layers(7);
  ExpectViolation(spec, {"model.num_layers (7) must be divisible by "
                         "parallel.pipeline_model_parallel_size (2)"});
}

TEST(ValidateParallelTest, VirtualPipelineRequiresPipelineParallel) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_parallel()->set_pipeline_model_parallel_size(1);
  spec.mutable_parallel()->set_virtual_pipeline_model_parallel_size(2);
  ExpectViolation(spec, {"parallel.virtual_pipeline_model_parallel_size (2) requires "
                         "parallel.pipeline_model_parallel_size > 1 (got 1)"});
  spec.mutable_parallel()->set_pipeline_model_parallel_size(2);
  ExpectValid(spec);
}

TEST(ValidateParallelTest, NumLayersDivisibleByVirtualPipelineStages) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_parallel()->set_virtual_pipeline_model_parallel_size(3);
  ExpectViolation(spec, {"model.num_layers (8) must be divisible by",
                         "parallel.virtual_pipeline_model_parallel_size (2 * 3 = 6)"});
}

// Megatron's decoder_first/last_pipeline_num_layers: the first / last stage fixed, the rest split
// equally over the other stages (PP 2 and 8 layers in the baseline).
TEST(ValidateParallelTest, UnevenPipelineLayout) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_parallel()->set_decoder_first_pipeline_num_layers(3);  // 3 | 5
  ExpectValid(spec);
  spec.mutable_parallel()->set_decoder_last_pipeline_num_layers(3);  // 3 | 3, 2 left over
  ExpectViolation(spec, {"model.num_layers (8) - parallel.decoder_first_pipeline_num_layers (3) - "
                         "parallel.decoder_last_pipeline_num_layers (3) = 2 layers must be 0: "
                         "parallel.pipeline_model_parallel_size (2) leaves no other stage"});
  spec.mutable_parallel()->clear_decoder_last_pipeline_num_layers();
  spec.mutable_parallel()->set_decoder_first_pipeline_num_layers(8);  // nothing for stage 1
  ExpectViolation(spec, {"= 0 layers must divide into the 1 other stages of "
                         "parallel.pipeline_model_parallel_size (2), at least one layer each"});
  spec.mutable_parallel()->set_decoder_first_pipeline_num_layers(3);
  spec.mutable_parallel()->set_virtual_pipeline_model_parallel_size(2);
  ExpectViolation(spec, {"parallel.decoder_first_pipeline_num_layers (3) must be divisible by "
                         "parallel.virtual_pipeline_model_parallel_size (2)"});
  spec.mutable_parallel()->clear_virtual_pipeline_model_parallel_size();
  spec.mutable_parallel()->set_pipeline_model_parallel_size(1);
  ExpectViolation(spec, {"parallel.decoder_first_pipeline_num_layers (3) requires "
                         "parallel.pipeline_model_parallel_size > 1 (got 1)"});
}

TEST(ValidateParallelTest, WorldDivisibleByAttentionModelParallel) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_parallel()->set_context_parallel_size(3);
  spec.mutable_model()->set_seq_length(1536);  // a multiple of 2·CP·TP = 12: only the world rule
  ExpectViolation(spec, {"parallel.world_size (32) must be divisible by "
                         "parallel.tensor_model_parallel_size * "
                         "parallel.pipeline_model_parallel_size * "
                         "parallel.context_parallel_size (2 * 2 * 3 = 12)"});
}

// Causal CP cuts each sequence into 2·CP chunks, each split over TP (written 2·CP·TP).
TEST(ValidateParallelTest, SeqLengthDivisibleByTwiceContextTimesTensorParallel) {
  v1::JobSpec spec = RawBaseline();  // TP 2, PP 2, world 32, seq_length 2048
  spec.mutable_parallel()->set_context_parallel_size(2);
  spec.mutable_model()->set_seq_length(2040);  // 2040 = 8·255: a multiple of 2·CP·TP = 8
  ExpectValid(spec);
  spec.mutable_model()->set_seq_length(2044);  // 2044 = 4·511: not a multiple of 8
  ExpectViolation(spec, {"model.seq_length (2044) must be divisible by 2 * "
                         "parallel.context_parallel_size * parallel.tensor_model_parallel_size "
                         "(2 * 2 * 2 = 8)"});
  spec.mutable_parallel()->set_tensor_model_parallel_size(1);
  spec.mutable_parallel()->set_sequence_parallel(false);
  spec.mutable_model()->set_seq_length(2046);  // odd half: not a multiple of 2·CP = 4
  ExpectViolation(spec, {"model.seq_length (2046) must be divisible by 2 * "
                         "parallel.context_parallel_size * parallel.tensor_model_parallel_size "
                         "(2 * 2 * 1 = 4)"});
}

TEST(ValidateParallelTest, WorldDivisibleByExpertModelParallel) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_parallel()->set_world_size(12);  // attention: 12 / 4 = DP 3; experts: 12 % 8
  ExpectViolation(spec, {"parallel.world_size (12) must be divisible by "
                         "parallel.expert_tensor_parallel_size * "
                         "parallel.expert_model_parallel_size * "
                         "parallel.pipeline_model_parallel_size (1 * 4 * 2 = 8)"});
}

TEST(ValidateParallelTest, WorldRulesNeedTheWorldSize) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_parallel()->clear_world_size();
  spec.mutable_parallel()->set_context_parallel_size(3);
  spec.mutable_model()->set_seq_length(1536);  // a multiple of 2·CP·TP = 12 (a world-free rule)
  spec.mutable_training()->set_global_batch_size(7);
  ExpectValid(spec);  // the planner checks these against the actual world size
}

TEST(ValidateParallelTest, DistributedOptimizerInstancesRequireDistributedOptimizer) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_parallel()->set_use_distributed_optimizer(false);
  spec.mutable_parallel()->set_num_distributed_optimizer_instances(2);
  ExpectViolation(spec, {"parallel.num_distributed_optimizer_instances (2) > 1 requires "
                         "parallel.use_distributed_optimizer"});
}

TEST(ValidateParallelTest, DataTimesContextParallelDivisibleByInstances) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_parallel()->set_expert_model_parallel_size(1);  // EDP = 32 / (1 * 1 * 2) = 16
  spec.mutable_parallel()->set_num_distributed_optimizer_instances(16);
  ExpectViolation(spec, {"data-parallel size * parallel.context_parallel_size (8 * 1 = 8) must "
                         "be divisible by parallel.num_distributed_optimizer_instances (16)"});
}

TEST(ValidateParallelTest, ExpertDataParallelDivisibleByInstances) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_parallel()->set_num_distributed_optimizer_instances(8);  // DP 8, EDP 4
  ExpectViolation(spec, {"expert data-parallel size (4) must be divisible by "
                         "parallel.num_distributed_optimizer_instances (8)"});
  spec.mutable_parallel()->set_num_distributed_optimizer_instances(4);
  ExpectValid(spec);
}

TEST(ValidateParallelTest, GlobalBatchDivisibleByMicroBatchTimesDataParallel) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_training()->set_global_batch_size(20);
  ExpectViolation(spec, {"training.global_batch_size (20) must be divisible by "
                         "training.micro_batch_size * data-parallel size (2 * 8 = 16"});
  spec.mutable_training()->set_global_batch_size(64);
  ExpectValid(spec);
}

// Baseline: DP 8, micro-batch 2, PP 2; global batch 16 is one micro-batch per DP rank.
TEST(ValidateParallelTest, MicroBatchesAtLeastPipelineParallel) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_training()->set_global_batch_size(16);
  ExpectViolation(spec, {"training.global_batch_size / (training.micro_batch_size * data-parallel "
                         "size) (16 / (2 * 8) = 1 micro-batches) must be at least "
                         "parallel.pipeline_model_parallel_size (2)"});
  spec.mutable_training()->set_global_batch_size(32);
  ExpectValid(spec);
  spec.mutable_parallel()->set_pipeline_model_parallel_size(1);  // DP 16: one micro-batch is fine
  spec.mutable_training()->set_global_batch_size(32);
  ExpectValid(spec);
}

TEST(ValidateParallelTest, InterleavedMicroBatchesMultipleOfPipelineParallel) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_parallel()->set_pipeline_model_parallel_size(4);  // DP 4, 8 layers = 4 x 2
  spec.mutable_parallel()->set_virtual_pipeline_model_parallel_size(2);
  spec.mutable_training()->set_global_batch_size(48);  // 48 / (2 * 4) = 6 micro-batches
  ExpectViolation(spec, {"(48 / (2 * 4) = 6 micro-batches) must be a multiple of "
                         "parallel.pipeline_model_parallel_size (4) with "
                         "parallel.virtual_pipeline_model_parallel_size (2)"});
  spec.mutable_training()->set_global_batch_size(64);  // 8 micro-batches
  ExpectValid(spec);
  spec.mutable_parallel()->clear_virtual_pipeline_model_parallel_size();  // plain 1F1B: 6 >= 4
  spec.mutable_training()->set_global_batch_size(48);
  ExpectValid(spec);
}

TEST(ValidateParallelTest, TrainItersPositive) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_training()->set_train_iters(0);
  spec.mutable_training()->set_lr_decay_iters(1000);
  ExpectViolation(spec, {"training.train_iters (0) must be positive"});
}

TEST(ValidateParallelTest, LrNonNegative) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_training()->set_lr(-1e-4);
  spec.mutable_training()->set_min_lr(-1e-4);
  ExpectViolation(spec, {"training.lr (-0.0001) must be non-negative"}, /*only=*/false);
}

TEST(ValidateParallelTest, MinLrNonNegative) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_training()->set_min_lr(-1e-5);
  ExpectViolation(spec, {"training.min_lr (-1e-05) must be non-negative"});
}

TEST(ValidateParallelTest, MinLrAtMostLr) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_training()->set_min_lr(1e-3);
  ExpectViolation(spec, {"training.min_lr (0.001) must be at most training.lr (0.0003)"});
}

TEST(ValidateParallelTest, WarmupShorterThanDecay) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_training()->set_lr_warmup_iters(1000);  // decay defaults to train_iters = 1000
  ExpectViolation(spec, {"training.lr_warmup_iters (1000) must be less than "
                         "training.lr_decay_iters (1000)"});
}

TEST(ValidateParallelTest, LrDecayStyleAllowedValues) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_training()->set_lr_decay_style("WSD");
  ExpectViolation(spec, {R"(training.lr_decay_style ("WSD") must be one of "cosine", "linear", )"
                         R"("constant")"});
}

TEST(ValidateParallelTest, AdamBetasInUnitInterval) {
  for (double beta : {1.0, -0.1}) {
    v1::JobSpec spec = RawBaseline();
    spec.mutable_training()->set_adam_beta1(beta);
    ExpectViolation(spec, {"training.adam_beta1 (", ") must be in [0, 1)"});
    spec = RawBaseline();
    spec.mutable_training()->set_adam_beta2(beta);
    ExpectViolation(spec, {"training.adam_beta2 (", ") must be in [0, 1)"});
  }
}

TEST(ValidateParallelTest, AdamEpsPositive) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_training()->set_adam_eps(0);
  ExpectViolation(spec, {"training.adam_eps (0) must be positive"});
}

TEST(ValidateParallelTest, WeightDecayNonNegative) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_training()->set_weight_decay(-0.1);
  ExpectViolation(spec, {"training.weight_decay (-0.1) must be non-negative"});
}

TEST(ValidateParallelTest, ClipGradNonNegative) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_training()->set_clip_grad(-1);
  ExpectViolation(spec, {"training.clip_grad (-1) must be non-negative"});
  spec.mutable_training()->set_clip_grad(0);  // 0 disables clipping
  ExpectValid(spec);
}

TEST(ValidateParallelTest, SaveIntervalRequiresSaveDirectory) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_training()->clear_save();
  ExpectViolation(spec, {"training.save_interval requires training.save"});
}

TEST(ValidateParallelTest, MaxRestartsNonNegative) {
  v1::JobSpec spec = RawBaseline();
  spec.set_max_restarts(-1);
  ExpectViolation(spec, {"max_restarts (-1) must be non-negative"});
  spec.set_max_restarts(0);
  ExpectValid(spec);
}

TEST(ValidateParallelTest, MinWorkersAtMostMaxWorkers) {
  v1::JobSpec spec = RawBaseline();
  spec.set_min_workers(64);
  spec.set_max_workers(16);
  ExpectViolation(spec, {"min_workers (64) must be at most max_workers (16)"});
}

TEST(ValidateParallelTest, WorldSizeWithinElasticRange) {
  v1::JobSpec spec = RawBaseline();
  spec.set_min_workers(64);
  spec.set_max_workers(128);
  ExpectViolation(spec, {"parallel.world_size (32) must be at least min_workers (64)"});
  spec.set_min_workers(8);
  spec.set_max_workers(16);
  ExpectViolation(spec, {"parallel.world_size (32) must be at most max_workers (16)"});
  spec.set_max_workers(64);
  ExpectValid(spec);
}

TEST(ValidateParallelTest, WeightedDataPathsAlternateWeightAndPrefix) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_data()->set_data_path(2, "/data/c_text_document");
  ExpectViolation(spec, {"data.data_path[2] (\"/data/c_text_document\") must be a non-negative "
                         "weight"});
  spec = RawBaseline();
  spec.mutable_data()->add_data_path("0.1");
  ExpectViolation(spec, {"data.data_path has 5 entries", "needs an even number"});
  spec = RawBaseline();
  spec.mutable_data()->clear_data_path();
  spec.mutable_data()->add_data_path("/data/a_text_document");  // unweighted forms are fine
  spec.mutable_data()->add_data_path("/data/b_text_document");
  ExpectValid(spec);
}

TEST(ValidateParallelTest, SplitIsUpToThreeNonNegativeNumbers) {
  for (const char* split : {"98,2,x", "0,0,0", "1,1,1,1", "-1,2"}) {
    v1::JobSpec spec = RawBaseline();
    spec.mutable_data()->set_split(split);
    ExpectViolation(spec, {"data.split (\"", "must be up to 3 non-negative numbers"});
  }
  v1::JobSpec spec = RawBaseline();
  spec.mutable_data()->set_split("90/10");
  ExpectValid(spec);
}

// Evaluation (training.eval_interval) reads the second share of data.split: a zero or missing
// weight leaves it empty on every dataset. Mock data evaluates on mock valid batches of their own
// (Megatron's mock valid dataset; worker/train/trainer.h "Validation").
TEST(ValidateParallelTest, EvaluationNeedsAValidShare) {
  v1::JobSpec spec = RawBaseline();  // split "98,2,0"
  spec.mutable_training()->set_eval_interval(10);
  ExpectValid(spec);
  for (const char* split : {"100,0,0", "100", "1,0"}) {
    spec.mutable_data()->set_split(split);
    ExpectViolation(spec, {absl::StrCat("data.split (\"", split,
                                        "\") must give the valid split a positive weight (its "
                                        "second number, e.g. \"969,30,1\") when "
                                        "training.eval_interval is set")});
  }
  spec.mutable_training()->clear_eval_interval();
  ExpectValid(spec);  // "1,0" is fine for a job that does not evaluate
  spec = RawBaseline();
  spec.mutable_training()->set_eval_interval(10);
  spec.mutable_data()->clear_data_path();
  spec.mutable_data()->clear_split();
  spec.mutable_data()->set_mock_data(true);
  ExpectValid(spec);
}

}  // namespace
}  // namespace switchyard
