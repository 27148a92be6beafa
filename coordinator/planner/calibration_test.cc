// File: coordinator/planner/calibration_test.cc
//
// FitCalibration against calibration.h: per-term factors recovered exactly from measurements
// synthesised with the model's own terms of real candidates (PlanJob of a small MoE model on two
// nodes: PP, TP, CP, EP and DP mappings), the one-mapping ratio, the degenerate systems, the
// non-negativity constraint, no usable point; EstimateMappingTime equal to the planner's own
// estimate of each candidate; ApplyCalibration re-ranking a plan by the calibrated time.
#include "coordinator/planner/calibration.h"

#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "coordinator/planner/cost_model.h"
#include "coordinator/planner/planner.h"
#include "gtest/gtest.h"

namespace switchyard::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

void ExpectRel(double actual, double expected, double tolerance, const std::string& what) {
  EXPECT_LE(std::abs(actual - expected), tolerance * std::abs(expected))
      << what << ": got " << actual << ", expected " << expected;
}

// The small MoE model of planner_test (L 2, H 1024, E 8 top-2, S 1024), global batch 32, on two
// nodes of 4 GPUs: every folding is planned (no size fixed).
v1::PlanRequest SmallMoeRequest() {
  v1::PlanRequest req;
  v1::JobSpec& spec = *req.mutable_spec();
  v1::ModelConfig* m = spec.mutable_model();
  m->set_num_layers(2);
  m->set_hidden_size(1024);
  m->set_num_attention_heads(8);
  m->set_ffn_hidden_size(4096);
  m->set_vocab_size(32768);
  m->set_seq_length(1024);
  m->set_num_experts(8);
  m->set_moe_router_topk(2);
  m->set_moe_ffn_hidden_size(1024);
  m->set_moe_token_dispatcher_type("alltoall");
  spec.mutable_training()->set_train_iters(100);
  spec.mutable_training()->set_global_batch_size(32);
  spec.mutable_data()->set_mock_data(true);
  v1::Cluster& c = *req.mutable_cluster();
  c.set_num_gpus(8);
  c.set_gpus_per_node(4);
  c.set_gpu_memory_bytes(80 * kGiB);
  c.set_intra_node_bandwidth_bytes_per_second(1e11);
  c.set_inter_node_bandwidth_bytes_per_second(1e10);
  c.set_peak_flops(1e14);
  return req;
}

double Communication(const v1::TimeEstimate& t) {
  return t.tp_communication() + t.ep_communication() + t.dp_communication() + t.pp_communication();
}

// What a run of `time`'s mapping would measure if the true factors were a, b, c.
double Synthetic(const v1::TimeEstimate& t, double a, double b, double c) {
  return a * t.compute() + b * Communication(t) + c * t.pipeline_bubble();
}

v1::TimeEstimate Terms(double compute, double communication, double bubble) {
  v1::TimeEstimate t;
  t.set_compute(compute);
  t.set_ep_communication(communication);
  t.set_pipeline_bubble(bubble);
  t.set_total(compute + communication + bubble);
  return t;
}

std::vector<v1::PlanCandidate> Ranked(const v1::Plan& plan) {
  std::vector<v1::PlanCandidate> all = {plan.best()};
  all.insert(all.end(), plan.alternatives().begin(), plan.alternatives().end());
  return all;
}

TEST(CalibrationTest, RecoversKnownFactorsFromTheModelsOwnTerms) {
  const v1::PlanRequest req = SmallMoeRequest();
  absl::StatusOr<v1::Plan> plan = PlanJob(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<v1::PlanCandidate> all = Ranked(*plan);
  ASSERT_GT(all.size(), 10u);

  // Every candidate's terms, as EstimateMappingTime gives them for the measured mappings: the
  // planner's own estimate, term by term.
  std::vector<MeasuredPoint> points;
  bool pipelined = false, communicates = false;
  int32_t runs = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const v1::PlanCandidate& c = all[i];
    absl::StatusOr<v1::TimeEstimate> t = EstimateMappingTime(req, c.mapping());
    ASSERT_TRUE(t.ok()) << MappingToString(c.mapping()) << ": " << t.status();
    EXPECT_EQ(t->SerializeAsString(), c.time().SerializeAsString()) << MappingToString(c.mapping());
    pipelined |= t->pipeline_bubble() > 0;
    communicates |= Communication(*t) > 0;
    MeasuredPoint p;
    p.estimate = *t;
    p.measured_seconds = Synthetic(*t, 1.7, 2.9, 1.3);
    p.runs = static_cast<int32_t>(1 + i % 3);
    runs += p.runs;
    points.push_back(p);
  }
  ASSERT_TRUE(pipelined);  // the bubble factor is identifiable
  ASSERT_TRUE(communicates);

  std::optional<v1::Calibration> cal = FitCalibration(points);
  ASSERT_TRUE(cal.has_value());
  std::printf("fit over %zu mappings: %s\n", points.size(), cal->ShortDebugString().c_str());
  EXPECT_EQ(cal->method(), v1::Calibration::PER_TERM);
  ExpectRel(cal->compute_factor(), 1.7, 1e-9, "compute factor");
  ExpectRel(cal->communication_factor(), 2.9, 1e-9, "communication factor");
  ExpectRel(cal->bubble_factor(), 1.3, 1e-9, "bubble factor");
  EXPECT_EQ(cal->mappings(), static_cast<int32_t>(points.size()));
  EXPECT_EQ(cal->runs(), runs);
  EXPECT_LT(cal->max_relative_error(), 1e-9);

  // Without pipelined mappings the bubble is not identified: c = a.
  std::vector<MeasuredPoint> flat;
  for (const MeasuredPoint& p : points) {
    if (p.estimate.pipeline_bubble() == 0) flat.push_back(p);
  }
  ASSERT_GE(flat.size(), 2u);
  std::optional<v1::Calibration> flat_cal = FitCalibration(flat);
  ASSERT_TRUE(flat_cal.has_value());
  EXPECT_EQ(flat_cal->method(), v1::Calibration::PER_TERM);
  ExpectRel(flat_cal->compute_factor(), 1.7, 1e-9, "compute factor, PP 1 only");
  ExpectRel(flat_cal->communication_factor(), 2.9, 1e-9, "communication factor, PP 1 only");
  EXPECT_EQ(flat_cal->bubble_factor(), flat_cal->compute_factor());

  // Two mappings suffice for compute and communication (when their shares differ).
  auto share = [](const MeasuredPoint& p) {
    return Communication(p.estimate) / p.estimate.compute();
  };
  std::vector<MeasuredPoint> two = {flat[0]};
  for (const MeasuredPoint& p : flat) {
    if (two.size() == 1 && std::abs(share(p) - share(two[0])) > 0.1 * share(two[0])) {
      two.push_back(p);
    }
  }
  ASSERT_EQ(two.size(), 2u);
  std::optional<v1::Calibration> two_cal = FitCalibration(two);
  ASSERT_TRUE(two_cal.has_value());
  EXPECT_EQ(two_cal->method(), v1::Calibration::PER_TERM);
  ExpectRel(two_cal->compute_factor(), 1.7, 1e-9, "compute factor, two mappings");
  ExpectRel(two_cal->communication_factor(), 2.9, 1e-9, "communication factor, two mappings");
}

TEST(CalibrationTest, OneMappingIsOneRatio) {
  MeasuredPoint p{Terms(0.3, 0.1, 0.0), 0.6, 4};
  std::optional<v1::Calibration> cal = FitCalibration({p});
  ASSERT_TRUE(cal.has_value());
  EXPECT_EQ(cal->method(), v1::Calibration::SINGLE_RATIO);
  ExpectRel(cal->compute_factor(), 1.5, 1e-15, "ratio");  // 0.6 / 0.4
  EXPECT_EQ(cal->communication_factor(), cal->compute_factor());
  EXPECT_EQ(cal->bubble_factor(), cal->compute_factor());
  EXPECT_EQ(cal->mappings(), 1);
  EXPECT_EQ(cal->runs(), 4);
  EXPECT_LT(cal->max_relative_error(), 1e-15);
  ExpectRel(CalibratedSeconds(*cal, p.estimate), 0.6, 1e-15, "calibrated = measured");
}

TEST(CalibrationTest, DegenerateSystemsFallBackToOneRatio) {
  // No measured mapping communicates (one GPU, DP only): the communication factor cannot be
  // fitted. r = Σ(T/y) / Σ(T/y)² with T/y = 0.5 and 0.8: 1.3 / 0.89.
  const std::vector<MeasuredPoint> silent = {{Terms(0.2, 0, 0), 0.4, 1},
                                             {Terms(0.4, 0, 0), 0.5, 2}};
  std::optional<v1::Calibration> cal = FitCalibration(silent);
  ASSERT_TRUE(cal.has_value());
  EXPECT_EQ(cal->method(), v1::Calibration::SINGLE_RATIO);
  ExpectRel(cal->compute_factor(), 1.3 / 0.89, 1e-12, "ratio without communication");
  EXPECT_EQ(cal->communication_factor(), cal->compute_factor());
  EXPECT_EQ(cal->bubble_factor(), cal->compute_factor());
  EXPECT_EQ(cal->runs(), 3);
  // |1.3/0.89 · 0.2 − 0.4| / 0.4 = 0.270 and |1.3/0.89 · 0.4 − 0.5| / 0.5 = 0.169.
  ExpectRel(cal->max_relative_error(), (0.4 - 1.3 / 0.89 * 0.2) / 0.4, 1e-12, "max error");

  // Proportional terms: two mappings that differ only in scale cannot separate the factors.
  const std::vector<MeasuredPoint> proportional = {{Terms(0.2, 0.1, 0), 0.5, 1},
                                                   {Terms(0.4, 0.2, 0), 0.9, 1}};
  cal = FitCalibration(proportional);
  ASSERT_TRUE(cal.has_value());
  EXPECT_EQ(cal->method(), v1::Calibration::SINGLE_RATIO);

  // Pipelined runs measured but none communicating: a zero column still means one ratio.
  const std::vector<MeasuredPoint> bubble_only = {
      {Terms(0.2, 0, 0.1), 0.5, 1}, {Terms(0.4, 0, 0.05), 0.9, 1}, {Terms(0.3, 0, 0.3), 0.8, 1}};
  cal = FitCalibration(bubble_only);
  ASSERT_TRUE(cal.has_value());
  EXPECT_EQ(cal->method(), v1::Calibration::SINGLE_RATIO);

  // The same terms with communication separate: per-term.
  const std::vector<MeasuredPoint> separable = {{Terms(0.2, 0.1, 0), 0.5, 1},
                                                {Terms(0.4, 0.1, 0), 0.9, 1}};
  cal = FitCalibration(separable);
  ASSERT_TRUE(cal.has_value());
  EXPECT_EQ(cal->method(), v1::Calibration::PER_TERM);
  ExpectRel(cal->compute_factor(), 2.0, 1e-12, "a");  // 0.2a + 0.1b = 0.5, 0.4a + 0.1b = 0.9
  ExpectRel(cal->communication_factor(), 1.0, 1e-12, "b");
}

TEST(CalibrationTest, NegativeFactorsAreClampedToZero) {
  // More communication measured faster: the unconstrained fit would give b < 0
  // (a + b = 1, a + 2b = 0.9: a = 1.1, b = -0.1). The constrained optimum drops communication
  // (b = 0) and fits compute alone: a = Σ(C/y) / Σ(C/y)², C/y = 1 and 1/0.9.
  const std::vector<MeasuredPoint> points = {{Terms(1, 1, 0), 1.0, 1}, {Terms(1, 2, 0), 0.9, 1}};
  std::optional<v1::Calibration> cal = FitCalibration(points);
  ASSERT_TRUE(cal.has_value());
  EXPECT_EQ(cal->method(), v1::Calibration::PER_TERM);
  EXPECT_EQ(cal->communication_factor(), 0.0);
  const double x1 = 1.0, x2 = 1.0 / 0.9;
  ExpectRel(cal->compute_factor(), (x1 + x2) / (x1 * x1 + x2 * x2), 1e-12, "a with b clamped");
  EXPECT_EQ(cal->bubble_factor(), cal->compute_factor());
  EXPECT_GE(cal->compute_factor(), 0.0);
}

TEST(CalibrationTest, NoUsableRunIsNoCalibration) {
  EXPECT_FALSE(FitCalibration({}).has_value());
  // Not measured (0), not finite, or no estimate: dropped.
  EXPECT_FALSE(FitCalibration({{Terms(0.2, 0.1, 0), 0.0, 1},
                               {Terms(0.2, 0.1, 0), std::nan(""), 1},
                               {Terms(0, 0, 0), 0.5, 1}})
                   .has_value());
}

TEST(CalibrationTest, ApplyCalibrationRanksByTheCalibratedTime) {
  const v1::PlanRequest req = SmallMoeRequest();
  absl::StatusOr<v1::Plan> plan = PlanJob(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<v1::PlanCandidate> before = Ranked(*plan);

  // Runs that find communication twenty times cheaper than the model says (overlapped with
  // compute, say) and compute slower: measured on the estimated best and on the PP 1 mapping
  // that communicates most for its compute.
  const v1::PlanCandidate* chatty = &before[0];
  auto share = [](const v1::PlanCandidate& c) {
    return Communication(c.time()) / c.time().compute();
  };
  ASSERT_EQ(before[0].time().pipeline_bubble(), 0);  // two runs fit two factors: PP 1 both
  for (const v1::PlanCandidate& c : before) {
    if (c.time().pipeline_bubble() == 0 && share(c) > share(*chatty)) chatty = &c;
  }
  ASSERT_NE(chatty, &before[0]) << "the estimated best must not communicate the most";
  const double a = 1.5, b = 0.05;
  std::optional<v1::Calibration> cal =
      FitCalibration({{before[0].time(), Synthetic(before[0].time(), a, b, a), 1},
                      {chatty->time(), Synthetic(chatty->time(), a, b, a), 1}});
  ASSERT_TRUE(cal.has_value());
  ExpectRel(cal->compute_factor(), a, 1e-9, "a");
  ExpectRel(cal->communication_factor(), b, 1e-9, "b");

  v1::Plan calibrated = *plan;
  ApplyCalibration(*cal, &calibrated);
  ASSERT_TRUE(calibrated.has_calibration());
  EXPECT_EQ(calibrated.calibration().SerializeAsString(), cal->SerializeAsString());
  const std::vector<v1::PlanCandidate> after = Ranked(calibrated);
  ASSERT_EQ(after.size(), before.size());
  std::printf("estimated best %s (%.4f s) -> calibrated best %s (%.4f s, estimate %.4f s)\n",
              MappingToString(before[0].mapping()).c_str(), before[0].time().total(),
              MappingToString(after[0].mapping()).c_str(), after[0].calibrated_step_seconds(),
              after[0].time().total());
  // The order changed: the estimated best is no longer first.
  EXPECT_NE(after[0].mapping().SerializeAsString(), before[0].mapping().SerializeAsString());
  // Same candidates, estimates untouched, each with its calibrated time, ranked by it (ties by
  // memory), rejected ones as they were.
  std::set<std::string> mappings_before, mappings_after;
  for (const v1::PlanCandidate& c : before) {
    v1::PlanCandidate bare = c;
    bare.clear_calibrated_step_seconds();
    mappings_before.insert(bare.SerializeAsString());
  }
  for (size_t i = 0; i < after.size(); ++i) {
    const v1::PlanCandidate& c = after[i];
    ASSERT_TRUE(c.has_calibrated_step_seconds());
    EXPECT_DOUBLE_EQ(c.calibrated_step_seconds(), CalibratedSeconds(*cal, c.time()));
    if (i > 0) {
      ASSERT_LE(after[i - 1].calibrated_step_seconds(), c.calibrated_step_seconds());
      EXPECT_TRUE(RanksBefore(after[i - 1], c)) << MappingToString(c.mapping());
    }
    v1::PlanCandidate bare = c;
    bare.clear_calibrated_step_seconds();
    mappings_after.insert(bare.SerializeAsString());
  }
  EXPECT_EQ(mappings_after, mappings_before);
  EXPECT_EQ(calibrated.rejected_size(), plan->rejected_size());
  // The calibrated best is no slower than either measured run.
  EXPECT_LE(after[0].calibrated_step_seconds(), Synthetic(before[0].time(), a, b, a));
  EXPECT_LE(after[0].calibrated_step_seconds(), Synthetic(chatty->time(), a, b, a));
}

TEST(CalibrationTest, EstimateMappingTimeRefusesWhatThePlannerWould) {
  const v1::PlanRequest req = SmallMoeRequest();
  v1::Mapping m = MakeMapping(1, 1, 8, 1, 1, 3, 1);  // EP 3 x EDP 1 is not a world of 8
  m.set_micro_batch_size(1);
  m.set_num_micro_batches(4);
  absl::StatusOr<v1::TimeEstimate> t = EstimateMappingTime(req, m);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("ETP * EP * EDP * PP (3)"), std::string::npos) << t.status();
  // EP 3 over a world of 3: experts (8) not divisible by EP.
  m = MakeMapping(1, 1, 3, 1, 1, 3, 1);
  m.set_micro_batch_size(1);
  m.set_num_micro_batches(1);
  t = EstimateMappingTime(req, m);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("expert_model_parallel_size"), std::string::npos)
      << t.status();
  // A world the request's cluster and worker range would not plan is still estimated.
  m = MakeMapping(1, 1, 16, 1, 1, 8, 2);
  m.set_micro_batch_size(2);
  m.set_num_micro_batches(1);
  t = EstimateMappingTime(req, m);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_GT(t->total(), 0);
  m.set_data_parallel_size(0);
  EXPECT_EQ(EstimateMappingTime(req, m).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace switchyard::planner
