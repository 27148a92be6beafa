// PrepareGeneration's rules, the WorkerExit code table and the StepMetrics summary.
#include "worker/agent/generation.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/match.h"
#include "common/config/config.h"
#include "gtest/gtest.h"

namespace switchyard::agent {
namespace {

constexpr char kSpec[] = R"(
model:
  num_layers: 2
  hidden_size: 32
  num_attention_heads: 4
  ffn_hidden_size: 48
  seq_length: 16
  vocab_size: 64
  num_experts: 8
  moe_router_topk: 2
  moe_ffn_hidden_size: 24
training:
  micro_batch_size: 1
  global_batch_size: 8
  train_iters: 4
data:
  mock_data: true
)";

v1::Assignment Valid(int rank = 1, int world = 2, int ep = 2) {
  v1::Assignment a;
  a.set_job("jobs/1");
  a.set_generation(3);
  a.set_rank(rank);
  a.set_world_size(world);
  *a.mutable_spec() = *ParseJobSpecYaml(kSpec);
  a.mutable_mapping()->set_expert_model_parallel_size(ep);
  a.mutable_mapping()->set_data_parallel_size(world);
  return a;
}

void ExpectRejected(const v1::Assignment& a, absl::StatusCode code, const char* names) {
  absl::StatusOr<PreparedGeneration> p = PrepareGeneration(a, Device::Cpu(), JobRoots{});
  std::printf("%-40s -> %s\n", names, p.status().ToString().c_str());
  EXPECT_EQ(p.status().code(), code) << p.status();
  EXPECT_TRUE(absl::StrContains(p.status().message(), names)) << p.status();
}

TEST(PrepareGenerationTest, FillsTheParallelSizes) {
  absl::StatusOr<PreparedGeneration> p = PrepareGeneration(Valid(), Device::Cpu(), JobRoots{});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->dims.world_size, 2);
  EXPECT_EQ(p->dims.expert_model_parallel_size, 2);
  EXPECT_EQ(p->spec.parallel().world_size(), 2);
  EXPECT_EQ(p->spec.parallel().expert_model_parallel_size(), 2);
  p = PrepareGeneration(Valid(0, 1, 1), Device::Cpu(), JobRoots{});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->dims.world_size, 1);
  EXPECT_FALSE(p->spec.parallel().has_expert_model_parallel_size()) << "world 1: left unset";
  EXPECT_EQ(p->dims.tensor_model_parallel_size, 1);
  // A TP mapping runs with sequence parallelism and ETP = 1 (the engine's expert grid).
  v1::Assignment tp2 = Valid(1, 2, 1);
  tp2.mutable_mapping()->set_tensor_model_parallel_size(2);
  tp2.mutable_mapping()->set_data_parallel_size(1);
  p = PrepareGeneration(tp2, Device::Cpu(), JobRoots{});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->dims.tensor_model_parallel_size, 2);
  EXPECT_EQ(p->dims.expert_tensor_parallel_size, 1);
  EXPECT_EQ(p->spec.parallel().tensor_model_parallel_size(), 2);
  EXPECT_TRUE(p->spec.parallel().sequence_parallel());
  EXPECT_EQ(p->spec.parallel().expert_tensor_parallel_size(), 1);
}

// Pipeline parallelism runs (1F1B): the mapping's PP reaches the process-group dims and the spec
// (PP2 on 2 ranks; tied embeddings: the engine sums the embedding gradient over the two stages).
TEST(PrepareGenerationTest, CarriesTheMappingsPipelineParallelSize) {
  v1::Assignment a = Valid(1, 2, 1);
  a.mutable_mapping()->set_pipeline_model_parallel_size(2);
  a.mutable_mapping()->set_data_parallel_size(1);
  absl::StatusOr<PreparedGeneration> p = PrepareGeneration(a, Device::Cpu(), JobRoots{});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->dims.pipeline_model_parallel_size, 2);
  EXPECT_EQ(p->spec.parallel().pipeline_model_parallel_size(), 2);
}

// Expert tensor parallelism runs: the mapping's ETP reaches the process-group dims and the spec;
// a spec that says another ETP is refused naming the field.
TEST(PrepareGenerationTest, CarriesTheMappingsExpertTensorParallelSize) {
  v1::Assignment a = Valid(1, 4, 2);
  a.mutable_mapping()->set_expert_tensor_parallel_size(2);
  absl::StatusOr<PreparedGeneration> p = PrepareGeneration(a, Device::Cpu(), JobRoots{});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->dims.expert_tensor_parallel_size, 2);
  EXPECT_EQ(p->dims.expert_model_parallel_size, 2);
  EXPECT_EQ(p->spec.parallel().expert_tensor_parallel_size(), 2);
  a.mutable_spec()->mutable_parallel()->set_expert_tensor_parallel_size(1);
  ExpectRejected(a, absl::StatusCode::kInvalidArgument,
                 "spec.parallel.expert_tensor_parallel_size");
}

// Context parallelism runs: the mapping's CP reaches the process-group dims and the spec (CP2·EP2
// on 2 ranks: EP folds over CP).
TEST(PrepareGenerationTest, CarriesTheMappingsContextParallelSize) {
  v1::Assignment a = Valid();
  a.mutable_mapping()->set_context_parallel_size(2);
  a.mutable_mapping()->set_data_parallel_size(1);
  absl::StatusOr<PreparedGeneration> p = PrepareGeneration(a, Device::Cpu(), JobRoots{});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->dims.context_parallel_size, 2);
  EXPECT_EQ(p->spec.parallel().context_parallel_size(), 2);
  // TP and CP fold: both reach the dims (sequence parallelism on).
  v1::Assignment both = Valid(1, 4, 1);
  both.mutable_mapping()->set_tensor_model_parallel_size(2);
  both.mutable_mapping()->set_context_parallel_size(2);
  both.mutable_mapping()->set_data_parallel_size(1);
  p = PrepareGeneration(both, Device::Cpu(), JobRoots{});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->dims.tensor_model_parallel_size, 2);
  EXPECT_EQ(p->dims.context_parallel_size, 2);
  EXPECT_TRUE(p->spec.parallel().sequence_parallel());
}

TEST(PrepareGenerationTest, RejectsBadAssignmentsNamingTheField) {
  v1::Assignment a = Valid();
  a.clear_job();
  ExpectRejected(a, absl::StatusCode::kInvalidArgument, "assignment.job");
  a = Valid();
  a.set_generation(0);
  ExpectRejected(a, absl::StatusCode::kInvalidArgument, "assignment.generation");
  a = Valid();
  a.set_world_size(0);
  ExpectRejected(a, absl::StatusCode::kInvalidArgument, "assignment.world_size");
  ExpectRejected(Valid(2, 2), absl::StatusCode::kInvalidArgument, "assignment.rank");
  a = Valid();
  a.clear_spec();
  ExpectRejected(a, absl::StatusCode::kInvalidArgument, "assignment.spec");
  a = Valid();
  a.mutable_spec()->mutable_parallel()->set_world_size(4);
  ExpectRejected(a, absl::StatusCode::kInvalidArgument, "spec.parallel.world_size");
  a = Valid();
  a.mutable_spec()->mutable_parallel()->set_expert_model_parallel_size(1);
  ExpectRejected(a, absl::StatusCode::kInvalidArgument, "expert_model_parallel_size");
  a = Valid();
  a.mutable_spec()->mutable_parallel()->set_context_parallel_size(4);
  a.mutable_mapping()->set_context_parallel_size(2);
  ExpectRejected(a, absl::StatusCode::kInvalidArgument, "spec.parallel.context_parallel_size");
  a = Valid();
  a.mutable_spec()->mutable_parallel()->set_tensor_model_parallel_size(4);
  a.mutable_mapping()->set_tensor_model_parallel_size(2);
  ExpectRejected(a, absl::StatusCode::kInvalidArgument, "spec.parallel.tensor_model_parallel_size");
  // PP runs (1F1B, and interleaved with virtual stages); a spec PP that contradicts the
  // mapping's does not, nor 2 layers at PP 2 · VPP 2 (Megatron's layer rule).
  a = Valid();
  a.mutable_spec()->mutable_parallel()->set_pipeline_model_parallel_size(4);
  a.mutable_mapping()->set_pipeline_model_parallel_size(2);
  ExpectRejected(a, absl::StatusCode::kInvalidArgument,
                 "spec.parallel.pipeline_model_parallel_size");
  a = Valid();
  a.mutable_mapping()->set_pipeline_model_parallel_size(2);
  a.mutable_spec()->mutable_parallel()->set_virtual_pipeline_model_parallel_size(2);
  ExpectRejected(a, absl::StatusCode::kInvalidArgument,
                 "parallel.virtual_pipeline_model_parallel_size (2 * 2 = 4)");
  ExpectRejected(Valid(0, 3, 3), absl::StatusCode::kInvalidArgument, "assignment.spec");
}

TEST(ExitCodeForTest, PermanentAndRetryable) {
  EXPECT_EQ(ExitCodeFor(absl::OkStatus()), 0);
  for (absl::StatusCode c :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kFailedPrecondition,
        absl::StatusCode::kUnimplemented, absl::StatusCode::kNotFound,
        absl::StatusCode::kResourceExhausted, absl::StatusCode::kDataLoss}) {
    EXPECT_EQ(ExitCodeFor(absl::Status(c, "x")), 1) << absl::StatusCodeToString(c);
  }
  EXPECT_EQ(ExitCodeFor(absl::UnavailableError("x")), 142);
  EXPECT_EQ(ExitCodeFor(absl::DeadlineExceededError("x")), 132);
  EXPECT_EQ(ExitCodeFor(absl::AbortedError("x")), 138);
  EXPECT_EQ(ExitCodeFor(absl::InternalError("x")), 141);
  EXPECT_EQ(ExitCodeFor(absl::CancelledError("x")), 129);
  EXPECT_EQ(ExitCodeFor(absl::UnknownError("x")), 130);
  for (int c = 0; c <= 16; ++c) {
    const int code = ExitCodeFor(absl::Status(static_cast<absl::StatusCode>(c), "x"));
    EXPECT_NE(code, kStoppedExitCode) << "143 is only sent for a Stop";
    EXPECT_TRUE(code == 0 || code == 1 || (code >= 128 && code <= 255)) << c;
  }
}

TEST(ToStepMetricsTest, SummarisesExpertLoadPerMoeLayer) {
  train::StepResult r;
  r.step = 7;
  r.loss = 3.5;
  r.lr = 1e-3;
  r.grad_norm = 0.5;
  r.step_ms = 20;
  r.tokens_per_s = 6400;
  r.tflops = 1.5;
  r.mfu = -1;
  r.expert_tokens = {{10, 30, 20, 20}, {0, 0, 80, 0}};
  v1::StepMetrics m = ToStepMetrics(r, {false, true, false, true});
  std::printf("%s\n", m.ShortDebugString().c_str());
  EXPECT_EQ(m.step(), 7);
  EXPECT_EQ(m.mfu(), -1);
  ASSERT_EQ(m.expert_load_size(), 2);
  EXPECT_EQ(m.expert_load(0).layer(), 1);
  EXPECT_EQ(m.expert_load(1).layer(), 3);
  EXPECT_EQ(m.expert_load(0).min_tokens(), 10);
  EXPECT_EQ(m.expert_load(0).max_tokens(), 30);
  EXPECT_EQ(m.expert_load(0).mean_tokens(), 20);
  EXPECT_DOUBLE_EQ(m.expert_load(0).imbalance(), 1.5);
  EXPECT_DOUBLE_EQ(m.expert_load(1).imbalance(), 4.0);
  EXPECT_EQ(m.expert_load(1).tokens_per_expert_size(), 4);
}

// The validation loss of a step that evaluated reaches the StepReport unchanged, with its
// perplexity; a step that did not evaluate carries neither field (absent, not 0).
TEST(ToStepMetricsTest, ValidationLossOnlyOnEvaluatedSteps) {
  train::StepResult r;
  r.step = 10;
  r.loss = 3.25;
  v1::StepMetrics plain = ToStepMetrics(r, {});
  EXPECT_FALSE(plain.has_validation_loss());
  EXPECT_FALSE(plain.has_validation_perplexity());
  r.validation_loss = 2.718281828459045;
  v1::StepMetrics m = ToStepMetrics(r, {});
  std::printf("%s\n", m.ShortDebugString().c_str());
  ASSERT_TRUE(m.has_validation_loss());
  EXPECT_EQ(m.validation_loss(), 2.718281828459045);  // bit for bit
  EXPECT_DOUBLE_EQ(m.validation_perplexity(), std::exp(2.718281828459045));
  EXPECT_EQ(m.loss(), 3.25);
}

}  // namespace
}  // namespace switchyard::agent
