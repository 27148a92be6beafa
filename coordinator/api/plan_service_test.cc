// File: coordinator/api/plan_service_test.cc
//
// PlanService's measured columns end to end: a real coordinator (gRPC and REST on loopback) over a
// real SQLite file, jobs created through its API, their plans and step reports written into the
// same file through a second connection (as the scheduler and the workers' step stream would),
// then Plan over gRPC and POST /v1/plans: a mapping that jobs of the same workload ran carries the
// newest one's measurement; other workloads, warm-up steps and other mappings carry none. And the
// calibration fitted on those runs (coordinator/planner/calibration.h): its factors (the EP
// all-to-all's apart from the other communication once EP 1 and EP > 1 runs were measured), the
// calibrated times of measured and unmeasured mappings, and the ranking it changes.
#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "coordinator/api/api_test_util.h"
#include "coordinator/api/server.h"
#include "coordinator/jobs/job_registry.h"
#include "coordinator/jobs/resolve_spec.h"
#include "coordinator/planner/planner.h"
#include "coordinator/store/store.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "switchyard/v1/job.grpc.pb.h"
#include "switchyard/v1/plan.grpc.pb.h"

namespace switchyard::api {
namespace {

using Json = nlohmann::json;

v1::StepMetrics Step(int64_t step, double ms, double memory_bytes) {
  v1::StepMetrics m;
  m.set_step(step);
  m.set_step_ms(ms);
  m.set_device_memory_bytes(memory_bytes);
  return m;
}

// A job of `spec` created through the API; its name.
std::string CreateJob(v1::JobService::Stub* jobs, const v1::JobSpec& spec) {
  v1::CreateJobRequest create;
  *create.mutable_spec() = spec;
  v1::Job job;
  const grpc::Status s = jobs->CreateJob(testing::Context().get(), create, &job);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return job.name();
}

// What the scheduler (the plan it started the job with) and rank 0's step stream record for a job
// that ran `candidate`, written through the store as the coordinator writes them.
void RecordRun(jobs::JobRegistry& registry, const std::string& name,
               const v1::PlanCandidate& candidate, const v1::StepMetrics& step) {
  v1::Plan plan;
  *plan.mutable_best() = candidate;
  const absl::StatusOr<v1::Job> started =
      registry.Transition(name, v1::Job::STARTING, "SCHEDULED", "", &plan);
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_TRUE(registry.RecordLastStep(name, step).ok());
}

TEST(PlanServiceTest, RankedMappingsCarryWhatJobsOfTheSameWorkloadMeasured) {
  const std::string db = testing::FreshPath("plan_measured.db");
  std::unique_ptr<CoordinatorServer> server = testing::StartServer(
      "plan_measured.db", [](ServerOptions& o) { o.workers = false; });  // no scheduler
  ASSERT_NE(server, nullptr);
  auto channel = testing::Channel(server->grpc_port());
  auto jobs = v1::JobService::NewStub(channel);
  auto plans = v1::PlanService::NewStub(channel);

  // One workload planned at two expert-parallel sizes (under a coordinator the spec fixes EP:
  // ResolveJobSpec defaults it to 1), so two mappings of the same workload.
  v1::PlanRequest request;
  *request.mutable_spec() = testing::ValidSpec("measured");
  request.mutable_spec()->mutable_parallel()->set_expert_model_parallel_size(1);
  *request.mutable_cluster() = testing::Cluster32();
  v1::PlanRequest request_ep2 = request;
  request_ep2.mutable_spec()->mutable_parallel()->set_expert_model_parallel_size(2);
  v1::Plan before, before_ep2;
  ASSERT_TRUE(plans->Plan(testing::Context().get(), request, &before).ok());
  ASSERT_TRUE(plans->Plan(testing::Context().get(), request_ep2, &before_ep2).ok());
  ASSERT_EQ(before.best().mapping().expert_model_parallel_size(), 1);
  ASSERT_EQ(before_ep2.best().mapping().expert_model_parallel_size(), 2);
  EXPECT_FALSE(before.best().has_measured());  // no job yet

  // Jobs through the API: three of the planned workload, one of another (ffn size differs).
  auto create = [&](const v1::JobSpec& spec) { return CreateJob(jobs.get(), spec); };
  const std::string older = create(request.spec()), newer = create(request.spec()),
                    early = create(request_ep2.spec());
  v1::JobSpec other_spec = request.spec();
  other_spec.mutable_model()->set_ffn_hidden_size(other_spec.model().ffn_hidden_size() * 2);
  const std::string other = create(other_spec);

  // What the scheduler and rank 0's step stream record, through a second connection.
  absl::StatusOr<std::unique_ptr<store::Store>> store = store::Store::Open(db);
  ASSERT_TRUE(store.ok()) << store.status();
  jobs::JobRegistry registry(store->get());
  auto ran = [&](const std::string& name, const v1::PlanCandidate& candidate,
                 const v1::StepMetrics& step) { RecordRun(registry, name, candidate, step); };
  const double gib = 1024.0 * 1024 * 1024;
  ran(older, before.best(), Step(40, 510.0, 30 * gib));
  ran(newer, before.best(), Step(20, 480.0, 31 * gib));
  ran(early, before_ep2.best(), Step(jobs::kMinMeasuredStep - 1, 900.0, 0));  // warm-up only
  ran(other, before.best(), Step(50, 777.0, 0));  // the newest, but another workload

  v1::Plan after, after_ep2;
  ASSERT_TRUE(plans->Plan(testing::Context().get(), request, &after).ok());
  ASSERT_TRUE(plans->Plan(testing::Context().get(), request_ep2, &after_ep2).ok());
  ASSERT_TRUE(after.best().has_measured()) << after.best().DebugString();
  const v1::MeasuredRun& m = after.best().measured();
  EXPECT_EQ(m.job(), newer);  // the most recently updated of the two
  EXPECT_EQ(m.step(), 20);
  EXPECT_DOUBLE_EQ(m.step_seconds(), 0.480);
  EXPECT_DOUBLE_EQ(m.memory_bytes(), 31 * gib);
  EXPECT_EQ(m.runs(), 2);
  EXPECT_FALSE(after_ep2.best().has_measured()) << after_ep2.best().DebugString();
  for (const v1::PlanCandidate& c : after.alternatives()) {
    EXPECT_FALSE(c.has_measured()) << c.DebugString();
  }
  // The estimates themselves are unchanged by the measurements.
  EXPECT_DOUBLE_EQ(after.best().time().total(), before.best().time().total());

  // POST /v1/plans answers the same (PlanForUser serves both).
  httplib::Client http("127.0.0.1", server->http_port());
  Json body = {{"spec", Json::parse(JobSpecToJson(request.spec()))},
               {"cluster", Json::parse(MessageToJsonText(request.cluster()))}};
  httplib::Result r =
      http.Post("/v1/plans", {{"Authorization", absl::StrCat("Bearer ", testing::kToken)}},
                body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  Json json = Json::parse(r->body);
  std::printf("POST /v1/plans best.measured: %s\n", json["best"]["measured"].dump().c_str());
  EXPECT_EQ(json["best"]["measured"]["job"], newer);
  EXPECT_EQ(json["best"]["measured"]["runs"], 2);
}

double Communication(const v1::TimeEstimate& t) {
  return t.tp_communication() + t.ep_communication() + t.dp_communication() + t.pp_communication();
}

void ExpectRel(double actual, double expected, const std::string& what) {
  EXPECT_LE(std::abs(actual - expected), 1e-9 * std::abs(expected))
      << what << ": got " << actual << ", expected " << expected;
}

// Runs of two mappings of one workload calibrate the step-time model: every Plan of that workload
// carries the fitted factors, the measured mappings' calibrated times reproduce their runs, an
// unmeasured mapping gets a prediction, and the order of the mappings by calibrated time is not
// the estimate's. The coordinator's Plan pins the spec's sizes (jobs/resolve_spec.h), so each
// holds one mapping; the re-ranking of a plan with alternatives is shown on a request with free
// TP and EP calibrated from the same store (JobRegistry::AttachMeasurements, what Plan calls). A
// run of another workload changes nothing.
TEST(PlanServiceTest, MeasuredRunsCalibrateTheStepTimeAndItsRanking) {
  const std::string db = testing::FreshPath("plan_calibrated.db");
  std::unique_ptr<CoordinatorServer> server = testing::StartServer(
      "plan_calibrated.db", [](ServerOptions& o) { o.workers = false; });  // no scheduler
  ASSERT_NE(server, nullptr);
  auto channel = testing::Channel(server->grpc_port());
  auto jobs = v1::JobService::NewStub(channel);
  auto plans = v1::PlanService::NewStub(channel);

  // One workload (global batch fixed: its default depends on DP) on 32 GPUs at TP 1, 2, 4 with
  // EP 8: each request pins its mapping, DP = 32 / TP.
  v1::JobSpec base = testing::ValidSpec("calibrated");
  base.mutable_training()->set_global_batch_size(64);
  base.mutable_parallel()->set_expert_model_parallel_size(8);
  auto request_tp = [&](int tp) {
    v1::PlanRequest r;
    *r.mutable_spec() = base;
    r.mutable_spec()->mutable_parallel()->set_tensor_model_parallel_size(tp);
    r.mutable_spec()->mutable_parallel()->set_sequence_parallel(tp > 1);  // MoE with TP needs SP
    *r.mutable_cluster() = testing::Cluster32();
    return r;
  };
  const std::vector<int> tps = {1, 2, 4};
  std::vector<v1::Plan> before(tps.size());
  for (size_t i = 0; i < tps.size(); ++i) {
    ASSERT_TRUE(plans->Plan(testing::Context().get(), request_tp(tps[i]), &before[i]).ok());
    ASSERT_EQ(before[i].best().mapping().tensor_model_parallel_size(), tps[i]);
    EXPECT_EQ(before[i].alternatives_size(), 0);  // the coordinator plans the spec's mapping
    EXPECT_FALSE(before[i].has_calibration());    // nothing measured yet
    EXPECT_FALSE(before[i].best().has_calibrated_step_seconds());
  }
  const v1::PlanCandidate &tp1 = before[0].best(), &tp2 = before[1].best(), &tp4 = before[2].best();
  // The model ranks TP 4 first, then TP 2, then TP 1.
  ASSERT_LT(tp4.time().total(), tp2.time().total());
  ASSERT_LT(tp2.time().total(), tp1.time().total());

  // What the runs "measured": compute 1.5x the model's, communication 0.05x (mostly hidden behind
  // compute): y = 1.5·compute + 0.05·communication of each mapping's own terms.
  const double a = 1.5, b = 0.05;
  auto truth = [&](const v1::TimeEstimate& t) { return a * t.compute() + b * Communication(t); };

  auto create = [&](const v1::JobSpec& spec) { return CreateJob(jobs.get(), spec); };
  absl::StatusOr<std::unique_ptr<store::Store>> store = store::Store::Open(db);
  ASSERT_TRUE(store.ok()) << store.status();
  jobs::JobRegistry registry(store->get());
  auto ran = [&](const std::string& name, const v1::PlanCandidate& candidate, double seconds) {
    RecordRun(registry, name, candidate, Step(20, seconds * 1000.0, 0));
  };
  // TP 1 twice (the older run slower: the newest counts), TP 4 once; TP 2 never.
  ran(create(request_tp(1).spec()), tp1, 2 * truth(tp1.time()));
  ran(create(request_tp(1).spec()), tp1, truth(tp1.time()));
  ran(create(request_tp(4).spec()), tp4, truth(tp4.time()));
  // Another workload (ffn size differs) ran TP 2 absurdly fast: not this workload's run.
  v1::PlanRequest other = request_tp(2);
  other.mutable_spec()->mutable_model()->set_ffn_hidden_size(base.model().ffn_hidden_size() * 2);
  v1::Plan other_before;
  ASSERT_TRUE(plans->Plan(testing::Context().get(), other, &other_before).ok());
  ASSERT_EQ(other_before.best().mapping().SerializeAsString(), tp2.mapping().SerializeAsString());
  ran(create(other.spec()), other_before.best(), 0.001);

  std::vector<v1::Plan> after(tps.size());
  for (size_t i = 0; i < tps.size(); ++i) {
    ASSERT_TRUE(plans->Plan(testing::Context().get(), request_tp(tps[i]), &after[i]).ok());
    ASSERT_TRUE(after[i].has_calibration()) << after[i].DebugString();
    const v1::Calibration& cal = after[i].calibration();
    std::printf("TP%d: estimate %.4f ms, calibrated %.4f ms; %s\n", tps[i],
                after[i].best().time().total() * 1e3,
                after[i].best().calibrated_step_seconds() * 1e3, cal.ShortDebugString().c_str());
    EXPECT_EQ(cal.method(), v1::Calibration::PER_TERM);
    ExpectRel(cal.compute_factor(), a, "compute factor");
    ExpectRel(cal.communication_factor(), b, "communication factor");
    EXPECT_EQ(cal.bubble_factor(), cal.compute_factor());  // no PP run measured
    EXPECT_EQ(cal.mappings(), 2);                          // TP 1 and TP 4; not the other workload
    EXPECT_EQ(cal.runs(), 3);
    EXPECT_LT(cal.max_relative_error(), 1e-9);
    // The analytic estimate is unchanged and still there.
    EXPECT_EQ(after[i].best().time().SerializeAsString(),
              before[i].best().time().SerializeAsString());
    ASSERT_TRUE(after[i].best().has_calibrated_step_seconds());
    ExpectRel(after[i].best().calibrated_step_seconds(), truth(after[i].best().time()),
              "calibrated step time");
  }
  EXPECT_TRUE(after[0].best().has_measured());
  EXPECT_FALSE(after[1].best().has_measured());  // TP 2: a prediction, not a run
  EXPECT_TRUE(after[2].best().has_measured());
  // By calibrated time TP 2 (never run) is the fastest, then TP 4, then TP 1: not the estimate's
  // order.
  EXPECT_LT(after[1].best().calibrated_step_seconds(), after[2].best().calibrated_step_seconds());
  EXPECT_LT(after[2].best().calibrated_step_seconds(), after[0].best().calibrated_step_seconds());
  // The other workload is calibrated by its own run only.
  v1::Plan other_after;
  ASSERT_TRUE(plans->Plan(testing::Context().get(), other, &other_after).ok());
  ASSERT_TRUE(other_after.has_calibration());
  EXPECT_EQ(other_after.calibration().method(), v1::Calibration::SINGLE_RATIO);
  EXPECT_EQ(other_after.calibration().mappings(), 1);
  EXPECT_EQ(other_after.calibration().runs(), 1);
  ExpectRel(other_after.best().calibrated_step_seconds(), 0.001, "other workload");

  // A plan with alternatives: the same workload with TP and EP free, planned and then calibrated
  // from the store as Plan does. The estimate ranks TP 4 · EP 8 first; the calibration ranks
  // TP 2 · EP 8 first and every candidate by its calibrated time.
  v1::PlanRequest free_request = request_tp(1);
  absl::StatusOr<v1::PlanRequest> resolved = jobs::ResolvePlanRequest(free_request, {});
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  resolved->mutable_spec()->mutable_parallel()->clear_tensor_model_parallel_size();
  resolved->mutable_spec()->mutable_parallel()->clear_expert_model_parallel_size();
  absl::StatusOr<v1::Plan> estimated = planner::PlanJob(*resolved);
  ASSERT_TRUE(estimated.ok()) << estimated.status();
  ASSERT_GT(estimated->alternatives_size(), 3);
  EXPECT_EQ(estimated->best().mapping().SerializeAsString(), tp4.mapping().SerializeAsString())
      << planner::MappingToString(estimated->best().mapping());
  v1::Plan calibrated = *estimated;
  ASSERT_TRUE(registry.AttachMeasurements(*resolved, &calibrated).ok());
  ASSERT_TRUE(calibrated.has_calibration());
  EXPECT_EQ(calibrated.calibration().SerializeAsString(),
            after[0].calibration().SerializeAsString());
  std::printf("free TP and EP: estimated best %s, calibrated best %s\n",
              planner::MappingToString(estimated->best().mapping()).c_str(),
              planner::MappingToString(calibrated.best().mapping()).c_str());
  EXPECT_EQ(calibrated.best().mapping().SerializeAsString(), tp2.mapping().SerializeAsString())
      << planner::MappingToString(calibrated.best().mapping());
  ASSERT_EQ(calibrated.alternatives_size(), estimated->alternatives_size());
  std::vector<const v1::PlanCandidate*> ranked = {&calibrated.best()};
  for (const v1::PlanCandidate& c : calibrated.alternatives()) ranked.push_back(&c);
  int measured = 0;
  for (size_t i = 0; i < ranked.size(); ++i) {
    ASSERT_TRUE(ranked[i]->has_calibrated_step_seconds());
    ExpectRel(ranked[i]->calibrated_step_seconds(), truth(ranked[i]->time()), "alternative");
    if (i > 0) {
      EXPECT_LE(ranked[i - 1]->calibrated_step_seconds(), ranked[i]->calibrated_step_seconds());
    }
    if (ranked[i]->has_measured()) {
      ++measured;
      EXPECT_TRUE(ranked[i]->mapping().tensor_model_parallel_size() == 1 ||
                  ranked[i]->mapping().tensor_model_parallel_size() == 4)
          << ranked[i]->DebugString();
    }
  }
  EXPECT_EQ(measured, 2);

  // POST /v1/plans answers the same (PlanForUser serves both).
  const v1::PlanRequest rest_request = request_tp(2);
  httplib::Client http("127.0.0.1", server->http_port());
  Json body = {{"spec", Json::parse(JobSpecToJson(rest_request.spec()))},
               {"cluster", Json::parse(MessageToJsonText(rest_request.cluster()))}};
  httplib::Result r =
      http.Post("/v1/plans", {{"Authorization", absl::StrCat("Bearer ", testing::kToken)}},
                body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  Json json = Json::parse(r->body);
  std::printf("POST /v1/plans calibration: %s\n", json["calibration"].dump().c_str());
  EXPECT_EQ(json["calibration"]["method"], "PER_TERM");
  EXPECT_EQ(json["calibration"]["mappings"], 2);
  EXPECT_DOUBLE_EQ(json["best"]["calibrated_step_seconds"].get<double>(),
                   after[1].best().calibrated_step_seconds());
}

// Every ranked candidate of `plan`, best first.
std::vector<const v1::PlanCandidate*> Ranked(const v1::Plan& plan) {
  std::vector<const v1::PlanCandidate*> ranked = {&plan.best()};
  for (const v1::PlanCandidate& c : plan.alternatives()) ranked.push_back(&c);
  return ranked;
}

std::vector<std::string> Varied(const v1::Plan& plan) {
  return {plan.search().varied().begin(), plan.search().varied().end()};
}

void ExpectWorld(const v1::Mapping& m, int64_t world) {
  EXPECT_EQ(int64_t{m.tensor_model_parallel_size()} * m.context_parallel_size() *
                m.data_parallel_size() * m.pipeline_model_parallel_size(),
            world)
      << planner::MappingToString(m);
  EXPECT_EQ(int64_t{m.expert_tensor_parallel_size()} * m.expert_model_parallel_size() *
                m.expert_data_parallel_size() * m.pipeline_model_parallel_size(),
            world)
      << planner::MappingToString(m);
}

// PlanRequest.search: the sizes the spec leaves unset (TP, CP, PP, ETP, EP) are varied over one
// world, every feasible mapping ranked, every other one rejected with its rule; a size the spec
// sets (to 1 or more) stays pinned; without the search the plan is the scheduler's one mapping.
// gRPC and REST.
TEST(PlanServiceTest, SearchRanksEveryMappingOfTheSizesTheSpecLeavesUnset) {
  std::unique_ptr<CoordinatorServer> server = testing::StartServer(
      "plan_search.db", [](ServerOptions& o) { o.workers = false; });  // no scheduler
  ASSERT_NE(server, nullptr);
  auto plans = v1::PlanService::NewStub(testing::Channel(server->grpc_port()));

  // The spec fixes world 32 and the micro-batch; TP, CP, PP, ETP and EP unset.
  v1::PlanRequest request;
  *request.mutable_spec() = testing::ValidSpec("search");
  request.mutable_spec()->mutable_parallel()->clear_expert_model_parallel_size();
  request.mutable_spec()->mutable_parallel()->clear_expert_tensor_parallel_size();
  *request.mutable_cluster() = testing::Cluster32();

  // Without the search: the scheduler's mapping (every unset size 1), alone.
  v1::Plan scheduled;
  grpc::Status s = plans->Plan(testing::Context().get(), request, &scheduled);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(scheduled.alternatives_size(), 0);
  EXPECT_FALSE(scheduled.has_search());
  EXPECT_EQ(planner::MappingToString(scheduled.best().mapping()),
            "TP1 CP1 DP32 PP1 | ETP1 EP1 EDP32 | dist-opt | mbs 2 x 1");

  v1::PlanRequest search = request;
  search.mutable_search();  // present, world unset: the spec's 32
  v1::Plan searched;
  s = plans->Plan(testing::Context().get(), search, &searched);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(searched.has_search());
  EXPECT_EQ(searched.search().world_size(), 32);
  EXPECT_EQ(Varied(searched),
            (std::vector<std::string>{"tensor_model_parallel_size", "context_parallel_size",
                                      "pipeline_model_parallel_size", "expert_tensor_parallel_size",
                                      "expert_model_parallel_size"}));
  const std::vector<const v1::PlanCandidate*> ranked = Ranked(searched);
  std::printf("search over 32: %zu ranked, %d rejected; best %s (%.2f ms)\n", ranked.size(),
              searched.rejected_size(), planner::MappingToString(searched.best().mapping()).c_str(),
              searched.best().time().total() * 1e3);
  ASSERT_GT(ranked.size(), 20u);
  std::set<int> tps, eps, pps, cps;
  bool has_scheduled = false;
  for (size_t i = 0; i < ranked.size(); ++i) {
    const v1::PlanCandidate& c = *ranked[i];
    ExpectWorld(c.mapping(), 32);
    EXPECT_TRUE(c.rejection().empty()) << c.DebugString();
    EXPECT_FALSE(c.has_calibrated_step_seconds());  // nothing measured
    EXPECT_EQ(c.mapping().num_micro_batches() * c.mapping().micro_batch_size() *
                  c.mapping().data_parallel_size(),
              64)  // every candidate trains the spec's global batch (its default at world 32)
        << c.DebugString();
    if (i > 0) EXPECT_LE(ranked[i - 1]->time().total(), c.time().total());
    tps.insert(c.mapping().tensor_model_parallel_size());
    eps.insert(c.mapping().expert_model_parallel_size());
    pps.insert(c.mapping().pipeline_model_parallel_size());
    cps.insert(c.mapping().context_parallel_size());
    if (c.mapping().SerializeAsString() == scheduled.best().mapping().SerializeAsString()) {
      has_scheduled = true;  // the scheduler's mapping is one of them, estimated the same
      EXPECT_EQ(c.time().SerializeAsString(), scheduled.best().time().SerializeAsString());
      EXPECT_EQ(c.memory().SerializeAsString(), scheduled.best().memory().SerializeAsString());
    }
  }
  EXPECT_TRUE(has_scheduled);
  EXPECT_GT(tps.size(), 1u);
  EXPECT_GT(eps.size(), 1u);
  EXPECT_GT(pps.size(), 1u);
  EXPECT_GT(cps.size(), 1u);
  // The rest are rejected with their rule, e.g. an EP that does not divide the 16 experts.
  ASSERT_GT(searched.rejected_size(), 0);
  bool experts_rule = false;
  for (const v1::PlanCandidate& c : searched.rejected()) {
    EXPECT_FALSE(c.rejection().empty()) << c.DebugString();
    ExpectWorld(c.mapping(), 32);
    if (c.rejection().find("model.num_experts") != std::string::npos) experts_rule = true;
  }
  EXPECT_TRUE(experts_rule);
  // search.world_size equal to the spec's is the same search.
  v1::PlanRequest search32 = search;
  search32.mutable_search()->set_world_size(32);
  v1::Plan searched32;
  ASSERT_TRUE(plans->Plan(testing::Context().get(), search32, &searched32).ok());
  EXPECT_EQ(searched32.SerializeAsString(), searched.SerializeAsString());

  // EP set to 1 is pinned, not unset: every candidate has EP 1 (unlike the free search).
  v1::PlanRequest ep1 = search;
  ep1.mutable_spec()->mutable_parallel()->set_expert_model_parallel_size(1);
  v1::Plan searched_ep1;
  s = plans->Plan(testing::Context().get(), ep1, &searched_ep1);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(
      Varied(searched_ep1),
      (std::vector<std::string>{"tensor_model_parallel_size", "context_parallel_size",
                                "pipeline_model_parallel_size", "expert_tensor_parallel_size"}));
  EXPECT_GT(searched_ep1.alternatives_size(), 0);
  for (const v1::PlanCandidate* c : Ranked(searched_ep1)) {
    EXPECT_EQ(c->mapping().expert_model_parallel_size(), 1) << c->DebugString();
  }

  // A spec that pins TP keeps it pinned under the search; the rest still vary.
  v1::PlanRequest tp2 = search;
  tp2.mutable_spec()->mutable_parallel()->set_tensor_model_parallel_size(2);
  tp2.mutable_spec()->mutable_parallel()->set_sequence_parallel(true);
  v1::Plan searched_tp2;
  s = plans->Plan(testing::Context().get(), tp2, &searched_tp2);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(
      Varied(searched_tp2),
      (std::vector<std::string>{"context_parallel_size", "pipeline_model_parallel_size",
                                "expert_tensor_parallel_size", "expert_model_parallel_size"}));
  ASSERT_GT(searched_tp2.alternatives_size(), 5);
  std::set<int> tp2_eps;
  for (const v1::PlanCandidate* c : Ranked(searched_tp2)) {
    EXPECT_EQ(c->mapping().tensor_model_parallel_size(), 2) << c->DebugString();
    tp2_eps.insert(c->mapping().expert_model_parallel_size());
  }
  EXPECT_GT(tp2_eps.size(), 1u);
  for (const v1::PlanCandidate& c : searched_tp2.rejected()) {
    EXPECT_EQ(c.mapping().tensor_model_parallel_size(), 2) << c.DebugString();
  }

  // POST /v1/plans with "search": the same plan, Plan.search included.
  httplib::Client http("127.0.0.1", server->http_port());
  Json body = {{"spec", Json::parse(JobSpecToJson(search.spec()))},
               {"cluster", Json::parse(MessageToJsonText(search.cluster()))},
               {"search", {{"world_size", 32}}}};
  httplib::Result r =
      http.Post("/v1/plans", {{"Authorization", absl::StrCat("Bearer ", testing::kToken)}},
                body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  Json json = Json::parse(r->body);
  std::printf("POST /v1/plans search: %s, %zu alternatives\n", json["search"].dump().c_str(),
              json["alternatives"].size());
  EXPECT_EQ(json["search"]["world_size"], 32);
  EXPECT_EQ(json["search"]["varied"].size(), 5u);
  EXPECT_EQ(json["alternatives"].size(), static_cast<size_t>(searched.alternatives_size()));
  EXPECT_EQ(json["best"]["mapping"].dump(),
            Json::parse(MessageToJsonText(searched.best().mapping())).dump());
  // Without "search", the REST plan is the scheduler's too.
  body.erase("search");
  r = http.Post("/v1/plans", {{"Authorization", absl::StrCat("Bearer ", testing::kToken)}},
                body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json = Json::parse(r->body);
  EXPECT_FALSE(json.contains("search"));
  EXPECT_FALSE(json.contains("alternatives"));
}

// A world whose all-1 mapping breaks a rule is still searched: micro-batch 2, global batch 4 on 4
// ranks cannot run DP 4 (4 % (2 * 4) != 0), but mappings of DP <= 2 can; the search ranks those
// and rejects the DP 4 ones naming the global batch rule.
TEST(PlanServiceTest, SearchOfAWorldWhoseAllOnesMappingBreaksARule) {
  std::unique_ptr<CoordinatorServer> server =
      testing::StartServer("plan_search_dp.db", [](ServerOptions& o) { o.workers = false; });
  ASSERT_NE(server, nullptr);
  auto plans = v1::PlanService::NewStub(testing::Channel(server->grpc_port()));
  v1::PlanRequest request;
  *request.mutable_spec() = testing::ValidSpec("search-dp");
  request.mutable_spec()->mutable_parallel()->clear_world_size();
  request.mutable_spec()->mutable_parallel()->clear_expert_model_parallel_size();
  request.mutable_spec()->mutable_training()->set_global_batch_size(4);
  *request.mutable_cluster() = testing::Cluster32();
  request.mutable_search()->set_world_size(4);
  v1::Plan plan;
  const grpc::Status s = plans->Plan(testing::Context().get(), request, &plan);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(plan.search().world_size(), 4);
  EXPECT_GT(plan.alternatives_size(), 0);
  for (const v1::PlanCandidate* c : Ranked(plan)) {
    ExpectWorld(c->mapping(), 4);
    EXPECT_LE(c->mapping().data_parallel_size(), 2) << c->DebugString();
  }
  bool batch_rule = false;
  for (const v1::PlanCandidate& c : plan.rejected()) {
    if (c.mapping().data_parallel_size() == 4 &&
        c.rejection().find("training.global_batch_size (4)") != std::string::npos) {
      batch_rule = true;
    }
  }
  EXPECT_TRUE(batch_rule);
  std::printf("world 4, global batch 4: %d ranked, best %s\n", plan.alternatives_size() + 1,
              planner::MappingToString(plan.best().mapping()).c_str());
}

// A search whose input cannot be planned is INVALID_ARGUMENT naming the field and the rule (gRPC
// and REST), before any planning.
TEST(PlanServiceTest, BadSearchIsRejectedNamingTheFieldAndTheRule) {
  std::unique_ptr<CoordinatorServer> server =
      testing::StartServer("plan_bad_search.db", [](ServerOptions& o) { o.workers = false; });
  ASSERT_NE(server, nullptr);
  auto plans = v1::PlanService::NewStub(testing::Channel(server->grpc_port()));
  v1::PlanRequest base;
  *base.mutable_spec() = testing::ValidSpec("bad-search");
  base.mutable_spec()->mutable_parallel()->clear_world_size();
  *base.mutable_cluster() = testing::Cluster32();
  struct Case {
    const char* label;
    int world;
    int tp;  // 0: unset
    const char* needle;
  };
  const Case cases[] = {
      {"world 0", 0, 0, "search.world_size (0) must be positive"},
      {"above the cluster", 64, 0, "search.world_size (64) must be at most cluster.num_gpus (32)"},
      {"pinned TP 4 into 6", 6, 4,
       "search.world_size (6) must be divisible by the attention grid the spec pins"},
      // ValidSpec pins EP 4 (and ETP 1): 4 does not divide 6.
      {"pinned EP 4 into 6", 6, 0,
       "search.world_size (6) must be divisible by the expert grid the spec pins"},
  };
  httplib::Client http("127.0.0.1", server->http_port());
  for (const Case& c : cases) {
    v1::PlanRequest request = base;
    request.mutable_search()->set_world_size(c.world);
    if (c.tp > 0) {
      request.mutable_spec()->mutable_parallel()->set_tensor_model_parallel_size(c.tp);
      request.mutable_spec()->mutable_parallel()->set_sequence_parallel(true);
      request.mutable_spec()->mutable_parallel()->clear_expert_model_parallel_size();
    }
    v1::Plan plan;
    const grpc::Status s = plans->Plan(testing::Context().get(), request, &plan);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.label;
    EXPECT_NE(s.error_message().find(c.needle), std::string::npos)
        << c.label << ": " << s.error_message();
    std::printf("%s: %s\n", c.label, s.error_message().c_str());
    Json body = {{"spec", Json::parse(JobSpecToJson(request.spec()))},
                 {"cluster", Json::parse(MessageToJsonText(request.cluster()))},
                 {"search", {{"world_size", c.world}}}};
    httplib::Result r =
        http.Post("/v1/plans", {{"Authorization", absl::StrCat("Bearer ", testing::kToken)}},
                  body.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << c.label << ": " << r->body;
    EXPECT_NE(r->body.find(c.needle), std::string::npos) << c.label << ": " << r->body;
  }
}

// The search of a PP-needing model: 32 layers with TP, ETP and EP pinned to 1 (nothing else
// shards the weights), short sequences (activations small) and a GPU too small for any PP 1 mapping
// of 4 ranks, the scheduler's plan (PP 1) finds nothing that fits (NO_FEASIBLE_PLAN) while the
// search (CP and PP varied) ranks the PP > 1 mappings that do, rejecting PP 1 ones for memory.
TEST(PlanServiceTest, SearchFindsThePipelineAModelNeeds) {
  std::unique_ptr<CoordinatorServer> server =
      testing::StartServer("plan_search_pp.db", [](ServerOptions& o) { o.workers = false; });
  ASSERT_NE(server, nullptr);
  auto plans = v1::PlanService::NewStub(testing::Channel(server->grpc_port()));
  v1::PlanRequest request;
  *request.mutable_spec() = testing::ValidSpec("needs-pp");
  v1::ParallelConfig* p = request.mutable_spec()->mutable_parallel();
  p->clear_world_size();
  p->set_expert_model_parallel_size(1);
  p->set_expert_tensor_parallel_size(1);
  p->set_tensor_model_parallel_size(1);
  request.mutable_spec()->mutable_model()->set_num_layers(32);
  request.mutable_spec()->mutable_model()->set_seq_length(256);
  request.mutable_spec()->mutable_training()->set_global_batch_size(16);
  *request.mutable_cluster() = testing::Cluster32();
  request.mutable_cluster()->set_num_gpus(4);
  request.mutable_search()->set_world_size(4);

  // With ample memory: the smallest per-rank estimate with PP 1 and with PP > 1.
  v1::Plan ample;
  grpc::Status s = plans->Plan(testing::Context().get(), request, &ample);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Varied(ample),
            (std::vector<std::string>{"context_parallel_size", "pipeline_model_parallel_size"}));
  double pp1 = 0, pp_more = 0;
  for (const v1::PlanCandidate* c : Ranked(ample)) {
    double& smallest = c->mapping().pipeline_model_parallel_size() == 1 ? pp1 : pp_more;
    if (smallest == 0 || c->memory().total() < smallest) smallest = c->memory().total();
  }
  const double gib = 1024.0 * 1024 * 1024;
  std::printf("smallest per-rank estimate over 4 ranks: PP 1 %.3f GiB, PP > 1 %.3f GiB\n",
              pp1 / gib, pp_more / gib);
  ASSERT_GT(pp1, 0);
  ASSERT_GT(pp_more, 0);
  ASSERT_LT(pp_more, pp1);

  // A GPU between the two.
  v1::PlanRequest tight = request;
  tight.mutable_cluster()->set_gpu_memory_bytes((pp1 + pp_more) / 2);
  v1::Plan searched;
  s = plans->Plan(testing::Context().get(), tight, &searched);
  ASSERT_TRUE(s.ok()) << s.error_message();
  for (const v1::PlanCandidate* c : Ranked(searched)) {
    EXPECT_GT(c->mapping().pipeline_model_parallel_size(), 1) << c->DebugString();
    EXPECT_EQ(c->mapping().tensor_model_parallel_size(), 1) << c->DebugString();
    EXPECT_EQ(c->mapping().expert_model_parallel_size(), 1) << c->DebugString();
    ExpectWorld(c->mapping(), 4);
  }
  int memory_rejections = 0;
  for (const v1::PlanCandidate& c : searched.rejected()) {
    EXPECT_EQ(c.mapping().tensor_model_parallel_size(), 1) << c.DebugString();
    if (c.mapping().pipeline_model_parallel_size() == 1 &&
        c.rejection().find("exceeds cluster.gpu_memory_bytes") != std::string::npos) {
      ++memory_rejections;
    }
  }
  EXPECT_GT(memory_rejections, 0);
  std::printf("tight GPU: best %s, %d PP 1 mappings rejected for memory\n",
              planner::MappingToString(searched.best().mapping()).c_str(), memory_rejections);

  // The scheduler's plan of the same spec pins PP 1: nothing fits.
  v1::PlanRequest scheduled = tight;
  scheduled.clear_search();
  v1::Plan none;
  s = plans->Plan(testing::Context().get(), scheduled, &none);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("no parallel mapping fits"), std::string::npos)
      << s.error_message();
}

// Runs of two mappings calibrate the search's ranking: the same store as
// MeasuredRunsCalibrateTheStepTimeAndItsRanking (TP 1 twice and TP 4 once, EP 8), then a search
// with TP and EP unset: before the runs it ranks by the estimate (TP 4 · EP 8 first); after them
// every ranked candidate carries its calibrated time, the two measured mappings their runs, and
// the ranking follows the calibrated times (TP 2 · EP 8 first, never run).
TEST(PlanServiceTest, SearchRanksByCalibratedTimesOnceTwoMappingsWereMeasured) {
  const std::string db = testing::FreshPath("plan_search_calibrated.db");
  std::unique_ptr<CoordinatorServer> server = testing::StartServer(
      "plan_search_calibrated.db", [](ServerOptions& o) { o.workers = false; });
  ASSERT_NE(server, nullptr);
  auto channel = testing::Channel(server->grpc_port());
  auto jobs = v1::JobService::NewStub(channel);
  auto plans = v1::PlanService::NewStub(channel);

  v1::JobSpec base = testing::ValidSpec("search-calibrated");
  base.mutable_training()->set_global_batch_size(64);
  base.mutable_parallel()->set_expert_model_parallel_size(8);
  auto request_tp = [&](int tp) {
    v1::PlanRequest r;
    *r.mutable_spec() = base;
    r.mutable_spec()->mutable_parallel()->set_tensor_model_parallel_size(tp);
    r.mutable_spec()->mutable_parallel()->set_sequence_parallel(tp > 1);
    *r.mutable_cluster() = testing::Cluster32();
    return r;
  };
  // The search: TP and EP unset (ETP stays pinned at 1, world 32 the spec's).
  v1::PlanRequest search;
  *search.mutable_spec() = base;
  search.mutable_spec()->mutable_parallel()->clear_expert_model_parallel_size();
  *search.mutable_cluster() = testing::Cluster32();
  search.mutable_search()->set_world_size(32);

  v1::Plan estimated;
  ASSERT_TRUE(plans->Plan(testing::Context().get(), search, &estimated).ok());
  EXPECT_FALSE(estimated.has_calibration());
  v1::Plan tp1, tp2, tp4;
  ASSERT_TRUE(plans->Plan(testing::Context().get(), request_tp(1), &tp1).ok());
  ASSERT_TRUE(plans->Plan(testing::Context().get(), request_tp(2), &tp2).ok());
  ASSERT_TRUE(plans->Plan(testing::Context().get(), request_tp(4), &tp4).ok());
  EXPECT_EQ(estimated.best().mapping().SerializeAsString(),
            tp4.best().mapping().SerializeAsString())
      << planner::MappingToString(estimated.best().mapping());

  // What the runs "measured" (PP 1: no bubble): y = 1.5·compute + 0.05·communication. With no PP
  // run measured the bubble is calibrated at the compute factor (calibration.h), so a searched
  // PP > 1 candidate is predicted at 1.5·compute + 0.05·communication + 1.5·bubble.
  const double a = 1.5, b = 0.05;
  auto truth = [&](const v1::TimeEstimate& t) {
    return a * t.compute() + b * Communication(t) + a * t.pipeline_bubble();
  };
  auto create = [&](const v1::JobSpec& spec) { return CreateJob(jobs.get(), spec); };
  absl::StatusOr<std::unique_ptr<store::Store>> store = store::Store::Open(db);
  ASSERT_TRUE(store.ok()) << store.status();
  jobs::JobRegistry registry(store->get());
  auto ran = [&](const std::string& name, const v1::PlanCandidate& candidate, double seconds) {
    RecordRun(registry, name, candidate, Step(20, seconds * 1000.0, 0));
  };
  ASSERT_EQ(tp1.best().time().pipeline_bubble(), 0);
  ASSERT_EQ(tp4.best().time().pipeline_bubble(), 0);
  ran(create(request_tp(1).spec()), tp1.best(), 2 * truth(tp1.best().time()));
  ran(create(request_tp(1).spec()), tp1.best(), truth(tp1.best().time()));
  ran(create(request_tp(4).spec()), tp4.best(), truth(tp4.best().time()));

  v1::Plan calibrated;
  ASSERT_TRUE(plans->Plan(testing::Context().get(), search, &calibrated).ok());
  ASSERT_TRUE(calibrated.has_calibration()) << calibrated.calibration().DebugString();
  EXPECT_EQ(calibrated.calibration().method(), v1::Calibration::PER_TERM);
  ExpectRel(calibrated.calibration().compute_factor(), a, "compute factor");
  ExpectRel(calibrated.calibration().communication_factor(), b, "communication factor");
  EXPECT_EQ(calibrated.calibration().bubble_factor(), calibrated.calibration().compute_factor());
  EXPECT_EQ(calibrated.calibration().mappings(), 2);
  EXPECT_EQ(calibrated.calibration().runs(), 3);
  EXPECT_EQ(calibrated.search().SerializeAsString(), estimated.search().SerializeAsString());
  ASSERT_EQ(calibrated.alternatives_size(), estimated.alternatives_size());
  EXPECT_EQ(calibrated.rejected_size(), estimated.rejected_size());
  std::printf("search: estimated best %s, calibrated best %s (%.3f ms)\n",
              planner::MappingToString(estimated.best().mapping()).c_str(),
              planner::MappingToString(calibrated.best().mapping()).c_str(),
              calibrated.best().calibrated_step_seconds() * 1e3);
  EXPECT_EQ(calibrated.best().mapping().SerializeAsString(),
            tp2.best().mapping().SerializeAsString())
      << planner::MappingToString(calibrated.best().mapping());
  EXPECT_FALSE(calibrated.best().has_measured());  // a prediction
  const std::vector<const v1::PlanCandidate*> ranked = Ranked(calibrated);
  int measured = 0;
  for (size_t i = 0; i < ranked.size(); ++i) {
    const v1::PlanCandidate& c = *ranked[i];
    ASSERT_TRUE(c.has_calibrated_step_seconds()) << c.DebugString();
    ExpectRel(c.calibrated_step_seconds(), truth(c.time()), "ranked candidate");
    if (i > 0) EXPECT_LE(ranked[i - 1]->calibrated_step_seconds(), c.calibrated_step_seconds());
    if (c.has_measured()) {
      ++measured;
      const bool is_tp1 =
          c.mapping().SerializeAsString() == tp1.best().mapping().SerializeAsString();
      const bool is_tp4 =
          c.mapping().SerializeAsString() == tp4.best().mapping().SerializeAsString();
      EXPECT_TRUE(is_tp1 || is_tp4) << c.DebugString();
      EXPECT_EQ(c.measured().runs(), is_tp1 ? 2 : 1);
      ExpectRel(c.measured().step_seconds(), truth(c.time()), "measured");
    }
  }
  EXPECT_EQ(measured, 2);
}

// Runs at EP 1 and EP > 1 separate the all-to-all from the other communication (issue 14: on
// real runs the all-to-all is far dearer than the DP reduce). Four mappings of one workload on 32
// GPUs measured with compute 1.5x the model, non-EP communication 0.2x (overlapped), the
// all-to-all 4x: the calibration recovers the three factors, the EP one apart from the non-EP
// one, and every candidate of a search with TP and EP unset is calibrated at those factors (an
// unmeasured EP 2 included).
TEST(PlanServiceTest, RunsAtEp1AndEpAbove1FitTheAllToAllItsOwnFactor) {
  const std::string db = testing::FreshPath("plan_ep_calibrated.db");
  std::unique_ptr<CoordinatorServer> server =
      testing::StartServer("plan_ep_calibrated.db", [](ServerOptions& o) { o.workers = false; });
  ASSERT_NE(server, nullptr);
  auto channel = testing::Channel(server->grpc_port());
  auto jobs = v1::JobService::NewStub(channel);
  auto plans = v1::PlanService::NewStub(channel);

  v1::JobSpec base = testing::ValidSpec("ep-calibrated");
  base.mutable_training()->set_global_batch_size(64);
  auto request = [&](int tp, int ep) {
    v1::PlanRequest r;
    *r.mutable_spec() = base;
    r.mutable_spec()->mutable_parallel()->set_tensor_model_parallel_size(tp);
    r.mutable_spec()->mutable_parallel()->set_sequence_parallel(tp > 1);
    r.mutable_spec()->mutable_parallel()->set_expert_model_parallel_size(ep);
    *r.mutable_cluster() = testing::Cluster32();
    return r;
  };
  const std::vector<std::pair<int, int>> measured_sizes = {{1, 1}, {1, 4}, {1, 8}, {2, 8}};
  std::vector<v1::PlanCandidate> runs;
  for (const auto& [tp, ep] : measured_sizes) {
    v1::Plan p;
    ASSERT_TRUE(plans->Plan(testing::Context().get(), request(tp, ep), &p).ok());
    ASSERT_EQ(p.best().mapping().expert_model_parallel_size(), ep);
    runs.push_back(p.best());
  }
  ASSERT_EQ(runs[0].time().ep_communication(), 0);  // EP 1: no all-to-all
  for (size_t i = 1; i < runs.size(); ++i) ASSERT_GT(runs[i].time().ep_communication(), 0);

  const double a = 1.5, b = 0.2, e = 4.0;
  auto truth = [&](const v1::TimeEstimate& t) {
    return a * t.compute() + b * (Communication(t) - t.ep_communication()) +
           e * t.ep_communication() + a * t.pipeline_bubble();
  };
  absl::StatusOr<std::unique_ptr<store::Store>> store = store::Store::Open(db);
  ASSERT_TRUE(store.ok()) << store.status();
  jobs::JobRegistry registry(store->get());
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto [tp, ep] = measured_sizes[i];
    RecordRun(registry, CreateJob(jobs.get(), request(tp, ep).spec()), runs[i],
              Step(20, truth(runs[i].time()) * 1000.0, 0));
  }

  // The coordinator's plan of an unmeasured EP 2: calibrated at the three factors.
  v1::Plan ep2;
  ASSERT_TRUE(plans->Plan(testing::Context().get(), request(1, 2), &ep2).ok());
  ASSERT_TRUE(ep2.has_calibration());
  const v1::Calibration& cal = ep2.calibration();
  std::printf("EP 1, EP 4, EP 8, TP 2 EP 8 measured: %s\n", cal.ShortDebugString().c_str());
  EXPECT_EQ(cal.method(), v1::Calibration::PER_TERM);
  ExpectRel(cal.compute_factor(), a, "compute factor");
  ExpectRel(cal.communication_factor(), b, "non-EP communication factor");
  ExpectRel(cal.ep_communication_factor(), e, "EP communication factor");
  EXPECT_GT(cal.ep_communication_factor(), 10 * cal.communication_factor());
  EXPECT_EQ(cal.bubble_factor(), cal.compute_factor());  // no PP run measured
  EXPECT_EQ(cal.mappings(), 4);
  EXPECT_EQ(cal.runs(), 4);
  EXPECT_LT(cal.max_relative_error(), 1e-9);
  EXPECT_FALSE(ep2.best().has_measured());
  ASSERT_GT(ep2.best().time().ep_communication(), 0);
  ExpectRel(ep2.best().calibrated_step_seconds(), truth(ep2.best().time()), "EP 2 predicted");

  // The search with TP and EP unset: every ranked candidate at the truth, ranked by it.
  v1::PlanRequest search;
  *search.mutable_spec() = base;
  search.mutable_spec()->mutable_parallel()->clear_tensor_model_parallel_size();
  search.mutable_spec()->mutable_parallel()->clear_expert_model_parallel_size();
  *search.mutable_cluster() = testing::Cluster32();
  search.mutable_search()->set_world_size(32);
  v1::Plan searched;
  ASSERT_TRUE(plans->Plan(testing::Context().get(), search, &searched).ok());
  ASSERT_TRUE(searched.has_calibration());
  EXPECT_EQ(searched.calibration().SerializeAsString(), cal.SerializeAsString());
  const std::vector<const v1::PlanCandidate*> ranked = Ranked(searched);
  const v1::PlanCandidate* estimated_best = ranked[0];
  int measured = 0;
  for (size_t i = 0; i < ranked.size(); ++i) {
    const v1::PlanCandidate& c = *ranked[i];
    ASSERT_TRUE(c.has_calibrated_step_seconds()) << c.DebugString();
    ExpectRel(c.calibrated_step_seconds(), truth(c.time()), "ranked candidate");
    if (i > 0) EXPECT_LE(ranked[i - 1]->calibrated_step_seconds(), c.calibrated_step_seconds());
    if (c.time().total() < estimated_best->time().total()) estimated_best = &c;
    if (c.has_measured()) ++measured;
  }
  EXPECT_EQ(measured, 4);
  std::printf("search over %zu mappings: estimated best %s, calibrated best %s (%.3f ms)\n",
              ranked.size(), planner::MappingToString(estimated_best->mapping()).c_str(),
              planner::MappingToString(searched.best().mapping()).c_str(),
              searched.best().calibrated_step_seconds() * 1e3);
}

}  // namespace
}  // namespace switchyard::api
