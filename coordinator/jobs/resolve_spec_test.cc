// File: coordinator/jobs/resolve_spec_test.cc
//
// ResolveJobSpec, the one validation path of CreateJob, PlanService and the scheduler: what it
// fills (defaults, the default corpus's vocabulary, the checkpoint directory) and the rules it
// adds to ValidateJobSpec, each named in its message.
#include "coordinator/jobs/resolve_spec.h"

#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace switchyard::jobs {
namespace {

// A small MoE spec without vocab_size or data: it reads the default corpus.
v1::JobSpec CorpusSpec() {
  v1::JobSpec spec;
  v1::ModelConfig& m = *spec.mutable_model();
  m.set_num_layers(2);
  m.set_hidden_size(64);
  m.set_num_attention_heads(2);
  m.set_seq_length(32);
  m.set_num_experts(4);
  spec.mutable_training()->set_train_iters(10);
  spec.mutable_training()->set_micro_batch_size(1);
  return spec;
}

void ExpectInvalid(const absl::StatusOr<v1::JobSpec>& got, const std::string& needle) {
  ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  EXPECT_NE(got.status().message().find(needle), absl::string_view::npos) << got.status();
  std::printf("rejected: %s\n", std::string(got.status().message()).c_str());
}

TEST(ResolveSpecTest, FillsVocabularyAndKeepsPathsRelative) {
  CoordinatorContext context{"/ckpt", 4096};
  v1::JobSpec spec = CorpusSpec();
  spec.mutable_training()->set_save_interval(5);  // needs a directory: the job's own
  auto at_submit = ResolveJobSpec(spec, context);
  ASSERT_TRUE(at_submit.ok()) << at_submit.status();
  EXPECT_EQ(at_submit->model().vocab_size(), 4096);
  // Paths stay as written (empty = the job's directory); AssignedSpec resolves them later.
  EXPECT_TRUE(at_submit->training().save().empty());
  EXPECT_TRUE(at_submit->training().load().empty());
  auto scheduled = ResolveJobSpec(*at_submit, context);
  ASSERT_TRUE(scheduled.ok()) << scheduled.status();
  // Resolving what CreateJob stored again (the scheduler does) is the same spec.
  EXPECT_EQ(scheduled->SerializeAsString(), at_submit->SerializeAsString());
  std::printf("resolved: vocab %lld, save \"%s\"\n",
              static_cast<long long>(scheduled->model().vocab_size()),
              scheduled->training().save().c_str());
}

TEST(ResolveSpecTest, PathRulesApply) {
  CoordinatorContext context{"/ckpt", 4096};
  v1::JobSpec spec = CorpusSpec();
  spec.mutable_training()->set_save("/etc/cron.d");
  ExpectInvalid(ResolveJobSpec(spec, context), "training.save");
  spec.mutable_training()->set_save("run1");
  spec.mutable_training()->set_load("../other");
  ExpectInvalid(ResolveJobSpec(spec, context), "training.load");
}

TEST(ResolveSpecTest, VocabularyRequiredWhenNothingDecidesIt) {
  ExpectInvalid(ResolveJobSpec(CorpusSpec(), CoordinatorContext{"/ckpt", 0}),
                "model.vocab_size is required: the job reads the default corpus");
  v1::JobSpec mock = CorpusSpec();
  mock.mutable_data()->set_mock_data(true);
  ExpectInvalid(ResolveJobSpec(mock, CoordinatorContext{"/ckpt", 4096}),
                "model.vocab_size is required with data.mock_data");
  v1::JobSpec dataset = CorpusSpec();
  dataset.mutable_data()->add_data_path("wiki_text_document");
  ExpectInvalid(ResolveJobSpec(dataset, CoordinatorContext{"/ckpt", 4096}),
                "model.vocab_size is required with data.data_path");
  dataset.mutable_model()->set_vocab_size(32000);
  EXPECT_TRUE(ResolveJobSpec(dataset, CoordinatorContext{"/ckpt", 4096}).ok());
}

TEST(ResolveSpecTest, SaveIntervalNeedsADirectory) {
  v1::JobSpec spec = CorpusSpec();
  spec.mutable_training()->set_save_interval(5);
  ExpectInvalid(ResolveJobSpec(spec, CoordinatorContext{"", 4096}), "training.save");
}

// Pipeline parallelism runs in the workers (1F1B, interleaved with virtual stages): a PP2 job,
// with untied or tied embeddings, global_aux_loss or evaluation, is accepted and keeps its PP; a
// layer count that does not divide into the stages' chunks is refused, naming the fields.
TEST(ResolveSpecTest, ParallelismTheWorkersCannotRunIsRejected) {
  const CoordinatorContext context{"/ckpt", 4096};
  v1::JobSpec spec = CorpusSpec();
  spec.mutable_parallel()->set_pipeline_model_parallel_size(2);
  spec.mutable_model()->set_untie_embeddings_and_output_weights(true);
  auto pp2 = ResolveJobSpec(spec, context);
  ASSERT_TRUE(pp2.ok()) << pp2.status();
  EXPECT_EQ(pp2->parallel().pipeline_model_parallel_size(), 2);

  v1::JobSpec tied = spec;
  tied.mutable_model()->set_untie_embeddings_and_output_weights(false);
  EXPECT_TRUE(ResolveJobSpec(tied, context).ok());  // the embedding group sums its gradient
  v1::JobSpec global_aux = spec;
  global_aux.mutable_model()->add_moe_router_load_balancing_type("global_aux_loss");
  EXPECT_TRUE(ResolveJobSpec(global_aux, context).ok());  // one running count per layer
  v1::JobSpec eval = spec;
  eval.mutable_training()->set_eval_interval(5);
  EXPECT_TRUE(ResolveJobSpec(eval, context).ok());  // the forward-only pipeline schedule
  // Virtual pipeline stages run (the interleaved schedule) when the layers divide into PP·VPP
  // chunks; 2 layers at PP 2 · VPP 2 do not (Megatron's rule, common/config).
  v1::JobSpec vpp = spec;
  vpp.mutable_model()->set_num_layers(4);
  vpp.mutable_parallel()->set_virtual_pipeline_model_parallel_size(2);
  EXPECT_TRUE(ResolveJobSpec(vpp, context).ok());
  vpp.mutable_model()->set_num_layers(2);
  ExpectInvalid(ResolveJobSpec(vpp, context),
                "model.num_layers (2) must be divisible by parallel.pipeline_model_parallel_size "
                "* parallel.virtual_pipeline_model_parallel_size (2 * 2 = 4)");
  // A PP that does not divide the layers is still Megatron's rule (common/config).
  v1::JobSpec pp3 = spec;
  pp3.mutable_parallel()->set_pipeline_model_parallel_size(3);
  ExpectInvalid(ResolveJobSpec(pp3, context),
                "model.num_layers (2) must be divisible by parallel.pipeline_model_parallel_size "
                "(3)");
}

TEST(ResolveSpecTest, BoundsComeFirst) {
  v1::JobSpec spec = CorpusSpec();
  spec.set_display_name("evil\x1b[2J");
  spec.mutable_model()->set_hidden_size(0);
  ExpectInvalid(ResolveJobSpec(spec, CoordinatorContext{"/ckpt", 4096}),
                "display_name must not contain control characters (byte 0x1B at offset 4)");
}

TEST(ResolveSpecTest, QueueIsFilledAndChecked) {
  CoordinatorContext context{"/ckpt", 4096, {{"a", 2}}};
  auto resolved = ResolveJobSpec(CorpusSpec(), context);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->queue(), "default");
  EXPECT_EQ(resolved->priority(), 0);
  v1::JobSpec spec = CorpusSpec();
  spec.set_queue("b");
  ExpectInvalid(ResolveJobSpec(spec, context),
                "queue (\"b\") must be one of this coordinator's queues: default, a");
  spec.set_queue("a");
  spec.set_priority(-1001);
  ExpectInvalid(ResolveJobSpec(spec, context), "priority (-1001) must be within [-1000, 1000]");
  spec.set_priority(1000);
  spec.set_min_workers(3);
  ExpectInvalid(ResolveJobSpec(spec, context), "must be at most the worker quota of queue a (2)");
  spec.set_min_workers(2);
  EXPECT_TRUE(ResolveJobSpec(spec, context).ok());
}

TEST(ResolveSpecTest, QueueFlagIsParsedOrRefusedNamingTheRule) {
  auto quotas = ParseQueueQuotas("a=2,team-b=0");
  ASSERT_TRUE(quotas.ok()) << quotas.status();
  EXPECT_EQ(*quotas, (std::map<std::string, int32_t>{{"a", 2}, {"team-b", 0}}));
  EXPECT_TRUE(ParseQueueQuotas("")->empty());
  const std::pair<std::string, std::string> bad[] = {
      {"a=-1", "--queues: quota of queue a (\"-1\") must be a non-negative worker count"},
      {"a=two", "quota of queue a (\"two\") must be a non-negative worker count"},
      {"a", "entry \"a\" must be NAME=WORKERS"},
      {"A=1", "queue name \"A\" must be a DNS-1123 label"},
      {"a=1,a=2", "--queues: queue a is listed twice"},
      {"a=1,", "entry \"\" must be NAME=WORKERS"},
  };
  for (const auto& [flag, needle] : bad) {
    auto got = ParseQueueQuotas(flag);
    ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << flag;
    EXPECT_NE(got.status().message().find(needle), absl::string_view::npos) << got.status();
    std::printf("--queues=%s: %s\n", flag.c_str(), std::string(got.status().message()).c_str());
  }
}

TEST(ResolveSpecTest, PlanRequestIsPinnedToTheWorkersParallelism) {
  v1::PlanRequest request;
  *request.mutable_spec() = CorpusSpec();
  auto resolved = ResolvePlanRequest(request, CoordinatorContext{"/ckpt", 4096});
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->spec().parallel().tensor_model_parallel_size(), 1);
  EXPECT_EQ(resolved->spec().parallel().pipeline_model_parallel_size(), 1);
  EXPECT_EQ(resolved->spec().model().vocab_size(), 4096);
  EXPECT_EQ(resolved->spec().min_workers(), 1);  // smaller worlds are planned, as scheduled
  // The spec's PP is planned (the workers run it), not pinned to 1.
  v1::PlanRequest pp2 = request;
  pp2.mutable_spec()->mutable_parallel()->set_pipeline_model_parallel_size(2);
  pp2.mutable_spec()->mutable_model()->set_untie_embeddings_and_output_weights(true);
  auto resolved_pp2 = ResolvePlanRequest(pp2, CoordinatorContext{"/ckpt", 4096});
  ASSERT_TRUE(resolved_pp2.ok()) << resolved_pp2.status();
  EXPECT_EQ(resolved_pp2->spec().parallel().pipeline_model_parallel_size(), 2);
  EXPECT_EQ(ResolvePlanRequest(v1::PlanRequest(), CoordinatorContext{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

std::vector<std::string> Varied(const v1::SearchScope& scope) {
  return {scope.varied().begin(), scope.varied().end()};
}

// PlanRequest.search (opt-in): the sizes the spec as sent leaves UNSET are cleared again after
// ResolveJobSpec's defaults (which set them to 1), so the planner enumerates them; a size set to 1
// stays pinned; the world is the search's, else the spec's, else the cluster's capped by
// max_workers.
TEST(ResolveSpecTest, SearchFreesOnlyTheSizesTheSpecLeavesUnset) {
  const CoordinatorContext context{"/ckpt", 4096};
  v1::PlanRequest request;
  *request.mutable_spec() = CorpusSpec();
  request.mutable_spec()->mutable_parallel()->set_expert_model_parallel_size(1);  // pinned at 1
  request.mutable_cluster()->set_num_gpus(8);
  request.mutable_search()->set_world_size(4);
  v1::SearchScope scope;
  auto resolved = ResolvePlanRequest(request, context, &scope);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  const v1::ParallelConfig& p = resolved->spec().parallel();
  EXPECT_FALSE(p.has_tensor_model_parallel_size());
  EXPECT_FALSE(p.has_context_parallel_size());
  EXPECT_FALSE(p.has_pipeline_model_parallel_size());
  EXPECT_FALSE(p.has_expert_tensor_parallel_size());
  ASSERT_TRUE(p.has_expert_model_parallel_size());  // set to 1 is not unset
  EXPECT_EQ(p.expert_model_parallel_size(), 1);
  // The world is the worker range (no parallel.world_size: the planner validates each candidate,
  // not the spec's all-1 mapping at that world).
  EXPECT_FALSE(p.has_world_size());
  EXPECT_EQ(resolved->spec().min_workers(), 4);
  EXPECT_EQ(resolved->spec().max_workers(), 4);
  EXPECT_FALSE(p.sequence_parallel());
  EXPECT_EQ(resolved->spec().model().vocab_size(), 4096);  // resolved like a submit
  EXPECT_EQ(scope.world_size(), 4);
  EXPECT_EQ(Varied(scope), (std::vector<std::string>{
                               "tensor_model_parallel_size", "context_parallel_size",
                               "pipeline_model_parallel_size", "expert_tensor_parallel_size"}));
  // The same spec without the search: every size pinned, as the scheduler plans it.
  v1::PlanRequest plain = request;
  plain.clear_search();
  auto pinned = ResolvePlanRequest(plain, context, &scope);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_TRUE(pinned->spec().parallel().has_tensor_model_parallel_size());
  EXPECT_TRUE(pinned->spec().parallel().has_pipeline_model_parallel_size());
  EXPECT_FALSE(pinned->spec().parallel().has_world_size());

  // A pinned TP stays, with sequence parallelism; EP unset is varied.
  v1::PlanRequest tp2 = request;
  tp2.mutable_spec()->mutable_parallel()->set_tensor_model_parallel_size(2);
  tp2.mutable_spec()->mutable_parallel()->set_sequence_parallel(true);
  tp2.mutable_spec()->mutable_parallel()->clear_expert_model_parallel_size();
  auto resolved_tp2 = ResolvePlanRequest(tp2, context, &scope);
  ASSERT_TRUE(resolved_tp2.ok()) << resolved_tp2.status();
  EXPECT_EQ(resolved_tp2->spec().parallel().tensor_model_parallel_size(), 2);
  EXPECT_TRUE(resolved_tp2->spec().parallel().sequence_parallel());
  EXPECT_FALSE(resolved_tp2->spec().parallel().has_expert_model_parallel_size());
  EXPECT_EQ(Varied(scope), (std::vector<std::string>{
                               "context_parallel_size", "pipeline_model_parallel_size",
                               "expert_tensor_parallel_size", "expert_model_parallel_size"}));

  // No world in the search or the spec: the cluster's, capped by max_workers.
  v1::PlanRequest no_world = request;
  no_world.mutable_search()->clear_world_size();
  ASSERT_TRUE(ResolvePlanRequest(no_world, context, &scope).ok());
  EXPECT_EQ(scope.world_size(), 8);
  no_world.mutable_spec()->set_max_workers(2);
  ASSERT_TRUE(ResolvePlanRequest(no_world, context, &scope).ok());
  EXPECT_EQ(scope.world_size(), 2);
  // The spec's world.
  v1::PlanRequest spec_world = request;
  spec_world.mutable_search()->clear_world_size();
  spec_world.mutable_spec()->mutable_parallel()->set_world_size(2);
  ASSERT_TRUE(ResolvePlanRequest(spec_world, context, &scope).ok());
  EXPECT_EQ(scope.world_size(), 2);

  // A dense model has no expert grid to vary.
  v1::PlanRequest dense = request;
  dense.mutable_spec()->mutable_model()->clear_num_experts();
  dense.mutable_spec()->mutable_parallel()->clear_expert_model_parallel_size();
  ASSERT_TRUE(ResolvePlanRequest(dense, context, &scope).ok());
  EXPECT_EQ(Varied(scope),
            (std::vector<std::string>{"tensor_model_parallel_size", "context_parallel_size",
                                      "pipeline_model_parallel_size"}));
}

TEST(ResolveSpecTest, BadSearchIsRejectedNamingTheFieldAndTheRule) {
  const CoordinatorContext context{"/ckpt", 4096};
  v1::PlanRequest base;
  *base.mutable_spec() = CorpusSpec();
  base.mutable_cluster()->set_num_gpus(8);
  base.mutable_search();
  struct Case {
    const char* label;
    std::function<void(v1::PlanRequest*)> mutate;
    const char* needle;
  };
  const Case cases[] = {
      {"world 0", [](v1::PlanRequest* r) { r->mutable_search()->set_world_size(0); },
       "search.world_size (0) must be positive"},
      {"world -2", [](v1::PlanRequest* r) { r->mutable_search()->set_world_size(-2); },
       "search.world_size (-2) must be positive"},
      {"above the cluster", [](v1::PlanRequest* r) { r->mutable_search()->set_world_size(16); },
       "search.world_size (16) must be at most cluster.num_gpus (8)"},
      {"not the spec's world",
       [](v1::PlanRequest* r) {
         r->mutable_search()->set_world_size(4);
         r->mutable_spec()->mutable_parallel()->set_world_size(2);
       },
       "search.world_size (4) must equal parallel.world_size (2)"},
      {"outside the worker range",
       [](v1::PlanRequest* r) {
         r->mutable_search()->set_world_size(2);
         r->mutable_spec()->set_min_workers(4);
       },
       "search.world_size (2) must be within the spec's worker range [4, "},
      {"pinned TP does not divide",
       [](v1::PlanRequest* r) {
         r->mutable_search()->set_world_size(6);
         r->mutable_spec()->mutable_parallel()->set_tensor_model_parallel_size(4);
         r->mutable_spec()->mutable_parallel()->set_sequence_parallel(true);
         r->mutable_spec()->mutable_model()->set_num_attention_heads(4);
       },
       "search.world_size (6) must be divisible by the attention grid the spec pins: "
       "tensor_model_parallel_size * context_parallel_size * pipeline_model_parallel_size (4 * 1 "
       "* 1 = 4"},
      {"pinned EP does not divide",
       [](v1::PlanRequest* r) {
         r->mutable_search()->set_world_size(6);
         r->mutable_spec()->mutable_parallel()->set_expert_model_parallel_size(4);
       },
       "search.world_size (6) must be divisible by the expert grid the spec pins: "
       "expert_tensor_parallel_size * expert_model_parallel_size * pipeline_model_parallel_size "
       "(1 * 4 * 1 = 4"},
      {"no world and a bad cluster",
       [](v1::PlanRequest* r) { r->mutable_cluster()->set_num_gpus(0); },
       "cluster.num_gpus (0) must be positive"},
  };
  for (const Case& c : cases) {
    v1::PlanRequest request = base;
    c.mutate(&request);
    absl::StatusOr<v1::PlanRequest> got = ResolvePlanRequest(request, context);
    ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.label << got.status();
    EXPECT_NE(got.status().message().find(c.needle), absl::string_view::npos)
        << c.label << ": " << got.status();
    std::printf("%s: %s\n", c.label, std::string(got.status().message()).c_str());
  }
}

}  // namespace
}  // namespace switchyard::jobs
