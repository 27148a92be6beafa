// File: coordinator/api/plan_service_test.cc
//
// PlanService's measured columns end to end: a real coordinator (gRPC and REST on loopback) over a
// real SQLite file, jobs created through its API, their plans and step reports written into the
// same file through a second connection (as the scheduler and the workers' step stream would),
// then Plan over gRPC and POST /v1/plans: a mapping that jobs of the same workload ran carries the
// newest one's measurement; other workloads, warm-up steps and other mappings carry none.
#include <httplib.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "coordinator/api/api_test_util.h"
#include "coordinator/api/server.h"
#include "coordinator/jobs/job_registry.h"
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

}  // namespace
}  // namespace switchyard::api
