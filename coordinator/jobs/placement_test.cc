// File: coordinator/jobs/placement_test.cc
#include "coordinator/jobs/placement.h"

#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/config/config_defaults.h"
#include "common/config/validate.h"
#include "common/model/engine_support.h"
#include "coordinator/api/worker_test_util.h"
#include "coordinator/planner/planner.h"
#include "gtest/gtest.h"

namespace switchyard::jobs {
namespace {

cluster::WorkerInfo Worker(const std::string& id, const std::string& host, int64_t gpu_bytes) {
  cluster::WorkerInfo w;
  w.id = id;
  w.host = host;
  if (gpu_bytes > 0) {
    w.gpu = v1::GpuInfo();
    w.gpu->set_memory_bytes(gpu_bytes);
  }
  return w;
}

TEST(PlacementTest, WorkerRangeDefaults) {
  v1::JobSpec spec;
  EXPECT_EQ(WorkerRange(spec), std::make_pair(1, std::numeric_limits<int32_t>::max()));
  spec.mutable_parallel()->set_world_size(8);
  EXPECT_EQ(WorkerRange(spec), std::make_pair(8, 8));
  spec.set_min_workers(4);
  EXPECT_EQ(WorkerRange(spec), std::make_pair(4, 8));
  spec.set_max_workers(16);
  EXPECT_EQ(WorkerRange(spec), std::make_pair(4, 16));
}

TEST(PlacementTest, EligibleWorkersAreThoseScopedToTheJobThenUnscoped) {
  std::vector<cluster::WorkerInfo> workers(5);
  const char* scopes[] = {"", "jobs/2", "jobs/1", "", "jobs/1"};
  for (int i = 0; i < 5; ++i) {
    workers[i].id = "w" + std::to_string(i);
    workers[i].scope = scopes[i];
  }
  auto ids = [](const std::vector<cluster::WorkerInfo>& ws) {
    std::string out;
    for (const cluster::WorkerInfo& w : ws) out += w.id + " ";
    return out;
  };
  std::printf("jobs/1: %s| jobs/2: %s| jobs/3: %s\n", ids(EligibleFor("jobs/1", workers)).c_str(),
              ids(EligibleFor("jobs/2", workers)).c_str(),
              ids(EligibleFor("jobs/3", workers)).c_str());
  EXPECT_EQ(ids(EligibleFor("jobs/1", workers)), "w2 w4 w0 w3 ");
  EXPECT_EQ(ids(EligibleFor("jobs/2", workers)), "w1 w0 w3 ");
  EXPECT_EQ(ids(EligibleFor("jobs/3", workers)), "w0 w3 ");
  EXPECT_TRUE(EligibleFor("jobs/1", {}).empty());
}

TEST(PlacementTest, UnsupportedParallelismNamesTheField) {
  v1::ParallelConfig p;
  EXPECT_EQ(UnsupportedParallelism(p), "");
  p.set_tensor_model_parallel_size(1);
  p.set_expert_model_parallel_size(8);  // EP is what workers do
  EXPECT_EQ(UnsupportedParallelism(p), "");
  p.set_pipeline_model_parallel_size(2);  // PP runs (1F1B)
  EXPECT_EQ(UnsupportedParallelism(p), "");
  p.set_virtual_pipeline_model_parallel_size(2);  // the interleaved schedule runs too
  EXPECT_EQ(UnsupportedParallelism(p), "");
}

TEST(PlacementTest, PlanRequestDescribesTheChosenWorkers) {
  v1::JobSpec stored = api::testing::SmallSpec(2, 8);
  stored.mutable_parallel()->set_world_size(8);
  std::vector<cluster::WorkerInfo> workers = {
      Worker("a", "n1", 80LL << 30), Worker("b", "n1", 40LL << 30), Worker("c", "n1", 80LL << 30),
      Worker("d", "n2", 80LL << 30)};
  ClusterDefaults defaults;
  v1::PlanRequest r = PlanRequestFor(stored, 2, workers, defaults);
  EXPECT_FALSE(r.spec().parallel().has_world_size());
  EXPECT_EQ(r.spec().min_workers(), 2);
  EXPECT_EQ(r.spec().max_workers(), 4);
  EXPECT_EQ(r.spec().training().save(), kJobDirectoryPlaceholder);  // save_interval can be planned
  EXPECT_EQ(r.spec().parallel().tensor_model_parallel_size(), 1);
  EXPECT_EQ(r.cluster().num_gpus(), 4);
  EXPECT_EQ(r.cluster().gpu_memory_bytes(), static_cast<double>(40LL << 30));
  EXPECT_EQ(r.cluster().gpus_per_node(), 3);
  workers.push_back(Worker("cpu", "n3", 0));
  r = PlanRequestFor(stored, 2, workers, defaults);
  EXPECT_EQ(r.cluster().gpu_memory_bytes(), static_cast<double>(40LL << 30));
  defaults.cpu_worker_memory_bytes = 8LL << 30;
  r = PlanRequestFor(stored, 2, workers, defaults);
  EXPECT_EQ(r.cluster().gpu_memory_bytes(), static_cast<double>(8LL << 30));

  // The planner shrinks the world to one the global batch (12) divides: 5 workers -> 4.
  absl::StatusOr<v1::Plan> plan = planner::PlanJob(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->best().mapping().data_parallel_size(), 4);
  std::printf("5 idle workers, GBS 12: %s\n",
              planner::MappingToString(plan->best().mapping()).c_str());
}

// Context parallelism runs in the workers: a spec that fixes CP = 2 is planned with it (the
// planner offers CP2 x DP2 on 4 workers) and every rank is assigned it; a spec that leaves it to
// the defaults gets CP = 1 (the planner does not pick CP on its own: the CUDA attention does not
// run it yet).
TEST(PlacementTest, ContextParallelIsPlannedAndAssignedWhenTheSpecFixesIt) {
  v1::JobSpec stored = api::testing::SmallSpec(4, 4);  // seq_length 128, 12 experts, GBS 12
  stored.mutable_parallel()->set_context_parallel_size(2);
  ApplyDefaults(&stored);
  const std::vector<cluster::WorkerInfo> workers = {
      Worker("a", "n1", 80LL << 30), Worker("b", "n1", 80LL << 30), Worker("c", "n1", 80LL << 30),
      Worker("d", "n1", 80LL << 30)};
  const v1::PlanRequest r = PlanRequestFor(stored, 4, workers, ClusterDefaults{});
  EXPECT_EQ(r.spec().parallel().context_parallel_size(), 2);
  absl::StatusOr<v1::Plan> plan = planner::PlanJob(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const v1::Mapping& m = plan->best().mapping();
  std::printf("CP fixed to 2, 4 workers: %s\n", planner::MappingToString(m).c_str());
  EXPECT_EQ(m.context_parallel_size(), 2);
  EXPECT_EQ(m.data_parallel_size(), 2);
  absl::StatusOr<v1::JobSpec> assigned =
      AssignedSpec(stored, m, 4, "jobs/5", JobRoots{"/ckpt", "/data"});
  ASSERT_TRUE(assigned.ok()) << assigned.status();
  EXPECT_EQ(assigned->parallel().context_parallel_size(), 2);
  EXPECT_EQ(UnsupportedParallelism(assigned->parallel()), "");
  v1::JobSpec defaulted = *assigned;
  ApplyDefaults(&defaulted);
  const absl::Status valid = ValidateJobSpec(defaulted);
  EXPECT_TRUE(valid.ok()) << valid;

  v1::JobSpec plain = api::testing::SmallSpec(4, 4);
  ApplyDefaults(&plain);
  absl::StatusOr<v1::Plan> plain_plan =
      planner::PlanJob(PlanRequestFor(plain, 4, workers, ClusterDefaults{}));
  ASSERT_TRUE(plain_plan.ok()) << plain_plan.status();
  EXPECT_EQ(plain_plan->best().mapping().context_parallel_size(), 1);
}

// Pipeline parallelism runs in the workers (1F1B): a spec that fixes PP = 2 is planned with it
// on 4 workers and every rank is assigned it; the assigned spec passes the rules and the engine
// check. Virtual pipeline stages (VPP 2) have no feasible mapping: the planner rejects every
// candidate with the engine's rule rather than return one the workers would refuse.
TEST(PlacementTest, PipelineParallelIsPlannedAndAssignedWhenTheSpecFixesIt) {
  v1::JobSpec stored = api::testing::SmallSpec(4, 4);  // 2 layers, 12 experts, GBS 12
  stored.mutable_parallel()->set_pipeline_model_parallel_size(2);
  stored.mutable_model()->set_untie_embeddings_and_output_weights(true);
  ApplyDefaults(&stored);
  const std::vector<cluster::WorkerInfo> workers = {
      Worker("a", "n1", 80LL << 30), Worker("b", "n1", 80LL << 30), Worker("c", "n1", 80LL << 30),
      Worker("d", "n1", 80LL << 30)};
  const v1::PlanRequest r = PlanRequestFor(stored, 4, workers, ClusterDefaults{});
  EXPECT_EQ(r.spec().parallel().pipeline_model_parallel_size(), 2);
  absl::StatusOr<v1::Plan> plan = planner::PlanJob(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const v1::Mapping& m = plan->best().mapping();
  std::printf("PP fixed to 2, 4 workers: %s (bubble %.3g s of %.3g s)\n",
              planner::MappingToString(m).c_str(), plan->best().time().pipeline_bubble(),
              plan->best().time().total());
  EXPECT_EQ(m.pipeline_model_parallel_size(), 2);
  EXPECT_EQ(m.data_parallel_size(), 2);
  EXPECT_GT(plan->best().time().pipeline_bubble(), 0);
  absl::StatusOr<v1::JobSpec> assigned =
      AssignedSpec(stored, m, 4, "jobs/6", JobRoots{"/ckpt", "/data"});
  ASSERT_TRUE(assigned.ok()) << assigned.status();
  EXPECT_EQ(assigned->parallel().pipeline_model_parallel_size(), 2);
  EXPECT_EQ(UnsupportedJobSpec("", *assigned), "");
  v1::JobSpec defaulted = *assigned;
  ApplyDefaults(&defaulted);
  const absl::Status valid = ValidateJobSpec(defaulted);
  EXPECT_TRUE(valid.ok()) << valid;

  v1::JobSpec vpp = stored;
  vpp.mutable_model()->set_num_layers(4);  // PP 2 x VPP 2 chunks of one layer
  vpp.mutable_parallel()->set_virtual_pipeline_model_parallel_size(2);
  absl::StatusOr<v1::Plan> vpp_plan =
      planner::PlanJob(PlanRequestFor(vpp, 4, workers, ClusterDefaults{}));
  ASSERT_TRUE(vpp_plan.ok()) << vpp_plan.status();  // the interleaved schedule runs
  // Layers that do not divide into PP·VPP chunks are still refused, naming the fields.
  vpp.mutable_model()->set_num_layers(6);
  vpp_plan = planner::PlanJob(PlanRequestFor(vpp, 4, workers, ClusterDefaults{}));
  ASSERT_EQ(vpp_plan.status().code(), absl::StatusCode::kInvalidArgument) << vpp_plan.status();
  std::printf("VPP 2, 6 layers: %s\n", std::string(vpp_plan.status().message()).c_str());
  EXPECT_NE(
      vpp_plan.status().message().find("parallel.virtual_pipeline_model_parallel_size (2 * 2 = 4)"),
      absl::string_view::npos);
}

TEST(PlacementTest, AssignedSpecCheckpointDirAndValidity) {
  v1::JobSpec stored = api::testing::SmallSpec(2, 4);
  ApplyDefaults(&stored);
  v1::Mapping m;
  m.set_data_parallel_size(3);
  m.set_expert_model_parallel_size(3);
  m.set_micro_batch_size(1);
  m.set_num_micro_batches(4);
  m.set_use_distributed_optimizer(true);
  const JobRoots roots{"/ckpt", "/data"};
  absl::StatusOr<v1::JobSpec> assigned = AssignedSpec(stored, m, 3, "jobs/42", roots);
  ASSERT_TRUE(assigned.ok()) << assigned.status();
  v1::JobSpec a = *assigned;
  EXPECT_EQ(a.parallel().world_size(), 3);
  EXPECT_EQ(a.parallel().expert_model_parallel_size(), 3);
  EXPECT_EQ(a.training().global_batch_size(), 12);
  EXPECT_EQ(a.training().save(), "/ckpt/jobs/42");
  EXPECT_EQ(a.training().load(), "/ckpt/jobs/42");
  v1::JobSpec defaulted = a;
  ApplyDefaults(&defaulted);
  absl::Status valid = ValidateJobSpec(defaulted);
  EXPECT_TRUE(valid.ok()) << valid;

  // save is relative to the job's directory; load defaults to it, or names a job's checkpoint.
  stored.mutable_training()->set_save("run7");
  a = *AssignedSpec(stored, m, 3, "jobs/42", roots);
  EXPECT_EQ(a.training().save(), "/ckpt/jobs/42/run7");
  EXPECT_EQ(a.training().load(), "/ckpt/jobs/42/run7");
  stored.mutable_training()->set_load("jobs/7/run7/step_600");
  stored.mutable_data()->add_data_path("wiki_text_document");
  stored.mutable_data()->set_tokenizer_model("tok/gpt2.json");
  a = *AssignedSpec(stored, m, 3, "jobs/42", roots);
  std::printf("assigned paths: save %s load %s data %s tokenizer %s\n", a.training().save().c_str(),
              a.training().load().c_str(), a.data().data_path(0).c_str(),
              a.data().tokenizer_model().c_str());
  EXPECT_EQ(a.training().load(), "/ckpt/jobs/7/run7/step_600");
  EXPECT_EQ(a.data().data_path(0), "/data/wiki_text_document");
  EXPECT_EQ(a.data().tokenizer_model(), "/data/tok/gpt2.json");
}

// Expert tensor parallelism runs in the workers, so a spec's ETP reaches the planner (not pinned
// to 1), the planner's mapping carries it and the assigned spec runs it (and validates).
TEST(PlacementTest, ExpertTensorParallelIsPlannedAndAssigned) {
  v1::JobSpec stored = api::testing::SmallSpec(4, 4);
  stored.mutable_parallel()->set_expert_tensor_parallel_size(2);
  ApplyDefaults(&stored);
  const std::vector<cluster::WorkerInfo> workers = {
      Worker("a", "n1", 80LL << 30), Worker("b", "n1", 80LL << 30), Worker("c", "n1", 80LL << 30),
      Worker("d", "n1", 80LL << 30)};
  const v1::PlanRequest r = PlanRequestFor(stored, 4, workers, ClusterDefaults());
  EXPECT_EQ(r.spec().parallel().expert_tensor_parallel_size(), 2);
  absl::StatusOr<v1::Plan> plan = planner::PlanJob(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const v1::Mapping& m = plan->best().mapping();
  std::printf("ETP 2 on 4 workers: %s\n", planner::MappingToString(m).c_str());
  EXPECT_EQ(m.expert_tensor_parallel_size(), 2);
  absl::StatusOr<v1::JobSpec> assigned =
      AssignedSpec(stored, m, 4, "jobs/42", JobRoots{"/ckpt", "/data"});
  ASSERT_TRUE(assigned.ok()) << assigned.status();
  EXPECT_EQ(assigned->parallel().expert_tensor_parallel_size(), 2);
  EXPECT_EQ(assigned->parallel().expert_model_parallel_size(), m.expert_model_parallel_size());
  EXPECT_EQ(UnsupportedParallelism(assigned->parallel()), "");
  v1::JobSpec defaulted = *assigned;
  ApplyDefaults(&defaulted);
  const absl::Status valid = ValidateJobSpec(defaulted);
  EXPECT_TRUE(valid.ok()) << valid;
}

// Tensor parallelism runs on the workers: a spec asking for TP = 2 is planned at TP = 2 (with
// sequence parallelism and ETP = 1), the planner offers such a mapping, and the spec every rank
// is assigned carries it and validates.
TEST(PlacementTest, TensorParallelSpecIsPlannedAndAssigned) {
  v1::JobSpec stored = api::testing::SmallSpec(4, 4);
  stored.mutable_parallel()->set_tensor_model_parallel_size(2);
  // ETP = 1 explicitly (Megatron's default ETP is TP): experts follow EP only in this plan.
  stored.mutable_parallel()->set_expert_tensor_parallel_size(1);
  ApplyDefaults(&stored);
  EXPECT_EQ(UnsupportedParallelism(stored.parallel()), "");
  std::vector<cluster::WorkerInfo> workers = {
      Worker("a", "n1", 80LL << 30), Worker("b", "n1", 80LL << 30), Worker("c", "n1", 80LL << 30),
      Worker("d", "n1", 80LL << 30)};
  const v1::PlanRequest r = PlanRequestFor(stored, 4, workers, ClusterDefaults{});
  EXPECT_EQ(r.spec().parallel().tensor_model_parallel_size(), 2);
  EXPECT_TRUE(r.spec().parallel().sequence_parallel());
  EXPECT_EQ(r.spec().parallel().expert_tensor_parallel_size(), 1);
  absl::StatusOr<v1::Plan> plan = planner::PlanJob(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->has_best());
  const v1::Mapping& m = plan->best().mapping();
  std::printf("TP=2 plan: TP%d DP%d EP%d ETP%d\n", m.tensor_model_parallel_size(),
              m.data_parallel_size(), m.expert_model_parallel_size(),
              m.expert_tensor_parallel_size());
  EXPECT_EQ(m.tensor_model_parallel_size(), 2);
  absl::StatusOr<v1::JobSpec> assigned = AssignedSpec(stored, m, 4, "jobs/5", JobRoots{"/c", "/d"});
  ASSERT_TRUE(assigned.ok()) << assigned.status();
  EXPECT_EQ(assigned->parallel().tensor_model_parallel_size(), 2);
  EXPECT_TRUE(assigned->parallel().sequence_parallel());
  EXPECT_EQ(assigned->parallel().expert_tensor_parallel_size(), 1);
  v1::JobSpec defaulted = *assigned;
  ApplyDefaults(&defaulted);
  absl::Status valid = ValidateJobSpec(defaulted);
  EXPECT_TRUE(valid.ok()) << valid;
  EXPECT_EQ(UnsupportedParallelism(defaulted.parallel()), "");
}

// A spec stored before the path rules (an absolute save) is refused, naming the field.
TEST(PlacementTest, AssignedSpecRefusesAStoredEscapingPath) {
  v1::JobSpec stored = api::testing::SmallSpec(2, 4);
  ApplyDefaults(&stored);
  stored.mutable_training()->set_save("/etc/cron.d");
  v1::Mapping m;
  m.set_data_parallel_size(1);
  m.set_micro_batch_size(1);
  m.set_num_micro_batches(1);
  absl::StatusOr<v1::JobSpec> a = AssignedSpec(stored, m, 1, "jobs/42", JobRoots{"/ckpt", "/d"});
  std::printf("stored save /etc/cron.d: %s\n", a.status().ToString().c_str());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(a.status().message(), "training.save (\"/etc/cron.d\")"));
}

}  // namespace
}  // namespace switchyard::jobs
