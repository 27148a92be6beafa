// File: coordinator/api/plan_service_test.cc
//
// PlanService's measured columns end to end: a real coordinator (gRPC and REST on loopback) over a
// real SQLite file, jobs created through its API, their plans and step reports written into the
// same file through a second connection (as the scheduler and the workers' step stream would),
// then Plan over gRPC and POST /v1/plans: a mapping that jobs of the same workload ran carries the
// newest one's measurement; other workloads, warm-up steps and other mappings carry none. And the
// calibration fitted on those runs (coordinator/planner/calibration.h): its factors, the
// calibrated times of measured and unmeasured mappings, and the ranking it changes.
#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
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
  auto create = [&](const v1::JobSpec& spec) {
    v1::CreateJobRequest create;
    *create.mutable_spec() = spec;
    v1::Job job;
    const grpc::Status s = jobs->CreateJob(testing::Context().get(), create, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job.name();
  };
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
                 const v1::StepMetrics& step) {
    v1::Plan plan;
    *plan.mutable_best() = candidate;
    const absl::StatusOr<v1::Job> started =
        registry.Transition(name, v1::Job::STARTING, "SCHEDULED", "", &plan);
    ASSERT_TRUE(started.ok()) << started.status();
    ASSERT_TRUE(registry.RecordLastStep(name, step).ok());
  };
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

  auto create = [&](const v1::JobSpec& spec) {
    v1::CreateJobRequest create;
    *create.mutable_spec() = spec;
    v1::Job job;
    const grpc::Status s = jobs->CreateJob(testing::Context().get(), create, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job.name();
  };
  absl::StatusOr<std::unique_ptr<store::Store>> store = store::Store::Open(db);
  ASSERT_TRUE(store.ok()) << store.status();
  jobs::JobRegistry registry(store->get());
  auto ran = [&](const std::string& name, const v1::PlanCandidate& candidate, double seconds) {
    v1::Plan plan;
    *plan.mutable_best() = candidate;
    const absl::StatusOr<v1::Job> started =
        registry.Transition(name, v1::Job::STARTING, "SCHEDULED", "", &plan);
    ASSERT_TRUE(started.ok()) << started.status();
    ASSERT_TRUE(registry.RecordLastStep(name, Step(20, seconds * 1000.0, 0)).ok());
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

}  // namespace
}  // namespace switchyard::api
