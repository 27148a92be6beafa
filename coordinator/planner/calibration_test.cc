// File: coordinator/planner/calibration_test.cc
//
// FitCalibration against calibration.h: the four per-term factors (compute, non-EP
// communication, EP all-to-all, bubble) recovered exactly from measurements synthesised with the
// model's own terms of real candidates (PlanJob of a small MoE model on two nodes: PP, TP, CP, EP
// and DP mappings), the defaults of the columns that take no part (no EP traffic, EP traffic
// only, no communication), the shared-communication fall-back, the one-mapping ratio, the
// degenerate systems, the non-negativity constraint, no usable point; EstimateMappingTime equal
// to the planner's own estimate of each candidate; ApplyCalibration re-ranking a plan by the
// calibrated time.
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

// M of calibration.h: all but the EP all-to-all.
double NonEpCommunication(const v1::TimeEstimate& t) {
  return t.tp_communication() + t.dp_communication() + t.pp_communication();
}

// What a run of `time`'s mapping would measure if the true factors were a (compute), b (non-EP
// communication), e (EP communication), c (bubble).
double Synthetic(const v1::TimeEstimate& t, double a, double b, double e, double c) {
  return a * t.compute() + b * NonEpCommunication(t) + e * t.ep_communication() +
         c * t.pipeline_bubble();
}

// Hand-made terms with the communication all EP's (A; M = 0).
v1::TimeEstimate Terms(double compute, double communication, double bubble) {
  v1::TimeEstimate t;
  t.set_compute(compute);
  t.set_ep_communication(communication);
  t.set_pipeline_bubble(bubble);
  t.set_total(compute + communication + bubble);
  return t;
}

// Hand-made terms with non-EP (as DP) and EP communication.
v1::TimeEstimate Terms(double compute, double non_ep, double ep, double bubble) {
  v1::TimeEstimate t;
  t.set_compute(compute);
  t.set_dp_communication(non_ep);
  t.set_ep_communication(ep);
  t.set_pipeline_bubble(bubble);
  t.set_total(compute + non_ep + ep + bubble);
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
  // planner's own estimate, term by term. The true factors: compute 1.7, non-EP communication
  // 0.4, the EP all-to-all 2.9, bubble 1.3.
  const double a = 1.7, b = 0.4, e = 2.9, c = 1.3;
  std::vector<MeasuredPoint> points;
  bool pipelined = false, non_ep = false, ep = false;
  int32_t runs = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const v1::PlanCandidate& cand = all[i];
    absl::StatusOr<v1::TimeEstimate> t = EstimateMappingTime(req, cand.mapping());
    ASSERT_TRUE(t.ok()) << MappingToString(cand.mapping()) << ": " << t.status();
    EXPECT_EQ(t->SerializeAsString(), cand.time().SerializeAsString())
        << MappingToString(cand.mapping());
    pipelined |= t->pipeline_bubble() > 0;
    non_ep |= NonEpCommunication(*t) > 0;
    ep |= t->ep_communication() > 0;
    MeasuredPoint p;
    p.estimate = *t;
    p.measured_seconds = Synthetic(*t, a, b, e, c);
    p.runs = static_cast<int32_t>(1 + i % 3);
    runs += p.runs;
    points.push_back(p);
  }
  ASSERT_TRUE(pipelined);  // every factor is identifiable
  ASSERT_TRUE(non_ep);
  ASSERT_TRUE(ep);

  std::optional<v1::Calibration> cal = FitCalibration(points);
  ASSERT_TRUE(cal.has_value());
  std::printf("fit over %zu mappings: %s\n", points.size(), cal->ShortDebugString().c_str());
  EXPECT_EQ(cal->method(), v1::Calibration::PER_TERM);
  ExpectRel(cal->compute_factor(), a, 1e-12, "compute factor");
  ExpectRel(cal->communication_factor(), b, 1e-12, "non-EP communication factor");
  ExpectRel(cal->ep_communication_factor(), e, 1e-12, "EP communication factor");
  ExpectRel(cal->bubble_factor(), c, 1e-12, "bubble factor");
  EXPECT_EQ(cal->mappings(), static_cast<int32_t>(points.size()));
  EXPECT_EQ(cal->runs(), runs);
  EXPECT_LT(cal->max_relative_error(), 1e-12);
  for (const MeasuredPoint& p : points) {
    ExpectRel(CalibratedSeconds(*cal, p.estimate), p.measured_seconds, 1e-12, "calibrated");
  }

  // Without pipelined mappings the bubble is not identified: c = a.
  std::vector<MeasuredPoint> flat;
  for (const MeasuredPoint& p : points) {
    if (p.estimate.pipeline_bubble() == 0) flat.push_back(p);
  }
  ASSERT_GE(flat.size(), 3u);
  std::optional<v1::Calibration> flat_cal = FitCalibration(flat);
  ASSERT_TRUE(flat_cal.has_value());
  EXPECT_EQ(flat_cal->method(), v1::Calibration::PER_TERM);
  ExpectRel(flat_cal->compute_factor(), a, 1e-12, "compute factor, PP 1 only");
  ExpectRel(flat_cal->communication_factor(), b, 1e-12, "non-EP factor, PP 1 only");
  ExpectRel(flat_cal->ep_communication_factor(), e, 1e-12, "EP factor, PP 1 only");
  EXPECT_EQ(flat_cal->bubble_factor(), flat_cal->compute_factor());

  // No measured mapping with EP traffic (EP 1 and ETP 1 only): the all-to-all is not identified,
  // e = b.
  std::vector<MeasuredPoint> no_ep;
  for (const MeasuredPoint& p : flat) {
    if (p.estimate.ep_communication() == 0) no_ep.push_back(p);
  }
  ASSERT_GE(no_ep.size(), 2u);
  std::optional<v1::Calibration> no_ep_cal = FitCalibration(no_ep);
  ASSERT_TRUE(no_ep_cal.has_value());
  std::printf("fit over %zu EP 1 mappings: %s\n", no_ep.size(),
              no_ep_cal->ShortDebugString().c_str());
  EXPECT_EQ(no_ep_cal->method(), v1::Calibration::PER_TERM);
  ExpectRel(no_ep_cal->compute_factor(), a, 1e-12, "compute factor, EP 1 only");
  ExpectRel(no_ep_cal->communication_factor(), b, 1e-12, "non-EP factor, EP 1 only");
  EXPECT_EQ(no_ep_cal->ep_communication_factor(), no_ep_cal->communication_factor());
  EXPECT_EQ(no_ep_cal->bubble_factor(), no_ep_cal->compute_factor());

  // Two mappings that both communicate both ways cannot separate b from e: the shared fall-back
  // (one communication factor for both, as before the split) fits a and b = e, exact when the
  // runs had b = e. Their communication shares must differ.
  auto share = [](const MeasuredPoint& p) {
    return Communication(p.estimate) / p.estimate.compute();
  };
  std::vector<MeasuredPoint> both;
  for (const MeasuredPoint& p : flat) {
    if (NonEpCommunication(p.estimate) > 0 && p.estimate.ep_communication() > 0) both.push_back(p);
  }
  ASSERT_GE(both.size(), 2u);
  std::vector<MeasuredPoint> two = {both[0]};
  for (const MeasuredPoint& p : both) {
    if (two.size() == 1 && std::abs(share(p) - share(two[0])) > 0.1 * share(two[0])) {
      two.push_back(p);
    }
  }
  ASSERT_EQ(two.size(), 2u);
  for (MeasuredPoint& p : two) p.measured_seconds = Synthetic(p.estimate, a, e, e, c);
  std::optional<v1::Calibration> two_cal = FitCalibration(two);
  ASSERT_TRUE(two_cal.has_value());
  EXPECT_EQ(two_cal->method(), v1::Calibration::PER_TERM);
  ExpectRel(two_cal->compute_factor(), a, 1e-12, "compute factor, two mappings");
  ExpectRel(two_cal->communication_factor(), e, 1e-12, "communication factor, two mappings");
  EXPECT_EQ(two_cal->ep_communication_factor(), two_cal->communication_factor());
}

// The pattern of issue 14 (a CPU run at world 2: EP 2 much slower than EP 1 · EDP 2 though the
// model gives them similar communication): the all-to-all far dearer than the DP reduce. One
// communication factor cannot reproduce such runs; the split fits them exactly.
TEST(CalibrationTest, AnExpensiveAllToAllNeedsItsOwnFactor) {
  // Three mappings: DP only (non-EP only), EP with a little DP, EP with more DP. The truth:
  // compute 1.2, non-EP 0.1 (a cheap reduce), all-to-all 6.0.
  const std::vector<v1::TimeEstimate> terms = {
      Terms(0.30, 0.10, 0.00, 0), Terms(0.30, 0.04, 0.06, 0), Terms(0.25, 0.08, 0.02, 0)};
  std::vector<MeasuredPoint> split, shared;
  for (const v1::TimeEstimate& t : terms) {
    const double y = Synthetic(t, 1.2, 0.1, 6.0, 1.2);
    split.push_back({t, y, 1});
    // The same runs with the all-to-all counted as DP traffic: the one-factor model.
    v1::TimeEstimate merged = t;
    merged.set_dp_communication(t.dp_communication() + t.ep_communication());
    merged.set_ep_communication(0);
    shared.push_back({merged, y, 1});
  }
  std::optional<v1::Calibration> cal = FitCalibration(split);
  ASSERT_TRUE(cal.has_value());
  EXPECT_EQ(cal->method(), v1::Calibration::PER_TERM);
  ExpectRel(cal->compute_factor(), 1.2, 1e-12, "a");
  ExpectRel(cal->communication_factor(), 0.1, 1e-12, "b");
  ExpectRel(cal->ep_communication_factor(), 6.0, 1e-12, "e");
  EXPECT_LT(cal->max_relative_error(), 1e-12);
  std::optional<v1::Calibration> one = FitCalibration(shared);
  ASSERT_TRUE(one.has_value());
  std::printf("split: %s\none communication factor: %s\n", cal->ShortDebugString().c_str(),
              one->ShortDebugString().c_str());
  EXPECT_EQ(one->method(), v1::Calibration::PER_TERM);
  EXPECT_EQ(one->ep_communication_factor(), one->communication_factor());  // e = b: no EP column
  EXPECT_GT(one->max_relative_error(), 0.05);
}

// EP traffic but no other communication in any run (hand-made: real mappings with EP > 1 have DP
// or TP traffic too): b = e. And non-EP and EP traffic proportional in every run: not separable,
// the shared fall-back.
TEST(CalibrationTest, DefaultsOfTheColumnsThatTakeNoPart) {
  std::vector<MeasuredPoint> ep_only;
  for (const v1::TimeEstimate& t :
       {Terms(0.2, 0.0, 0.1, 0), Terms(0.4, 0.0, 0.1, 0), Terms(0.3, 0.0, 0.3, 0)}) {
    ep_only.push_back({t, Synthetic(t, 1.7, 0.4, 2.9, 1.3), 1});
  }
  std::optional<v1::Calibration> cal = FitCalibration(ep_only);
  ASSERT_TRUE(cal.has_value());
  EXPECT_EQ(cal->method(), v1::Calibration::PER_TERM);
  ExpectRel(cal->compute_factor(), 1.7, 1e-12, "a, EP only");
  ExpectRel(cal->ep_communication_factor(), 2.9, 1e-12, "e, EP only");
  EXPECT_EQ(cal->communication_factor(), cal->ep_communication_factor());  // b = e
  EXPECT_EQ(cal->bubble_factor(), cal->compute_factor());
  EXPECT_LT(cal->max_relative_error(), 1e-12);

  // A = 2·M in every run: b and e cannot be told apart; one factor for both (truth b = e = 0.8).
  std::vector<MeasuredPoint> proportional;
  for (const v1::TimeEstimate& t :
       {Terms(0.2, 0.05, 0.1, 0), Terms(0.4, 0.05, 0.1, 0), Terms(0.3, 0.1, 0.2, 0)}) {
    proportional.push_back({t, Synthetic(t, 1.7, 0.8, 0.8, 1.3), 1});
  }
  cal = FitCalibration(proportional);
  ASSERT_TRUE(cal.has_value());
  EXPECT_EQ(cal->method(), v1::Calibration::PER_TERM);
  ExpectRel(cal->compute_factor(), 1.7, 1e-12, "a, proportional");
  ExpectRel(cal->communication_factor(), 0.8, 1e-12, "b, proportional");
  EXPECT_EQ(cal->ep_communication_factor(), cal->communication_factor());
  EXPECT_LT(cal->max_relative_error(), 1e-12);
}

TEST(CalibrationTest, OneMappingIsOneRatio) {
  MeasuredPoint p{Terms(0.3, 0.1, 0.0), 0.6, 4};
  std::optional<v1::Calibration> cal = FitCalibration({p});
  ASSERT_TRUE(cal.has_value());
  EXPECT_EQ(cal->method(), v1::Calibration::SINGLE_RATIO);
  ExpectRel(cal->compute_factor(), 1.5, 1e-15, "ratio");  // 0.6 / 0.4
  EXPECT_EQ(cal->communication_factor(), cal->compute_factor());
  EXPECT_EQ(cal->ep_communication_factor(), cal->compute_factor());
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
  EXPECT_EQ(cal->ep_communication_factor(), cal->compute_factor());
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

  // Pipelined runs measured but none communicating: the communication columns take no part
  // (b = e = a) and compute and bubble are fitted (y = 1.5·C + 2.5·B here).
  std::vector<MeasuredPoint> bubble_only;
  for (const v1::TimeEstimate& t : {Terms(0.2, 0, 0.1), Terms(0.4, 0, 0.05), Terms(0.3, 0, 0.3)}) {
    bubble_only.push_back({t, 1.5 * t.compute() + 2.5 * t.pipeline_bubble(), 1});
  }
  cal = FitCalibration(bubble_only);
  ASSERT_TRUE(cal.has_value());
  EXPECT_EQ(cal->method(), v1::Calibration::PER_TERM);
  ExpectRel(cal->compute_factor(), 1.5, 1e-12, "a, no communication");
  ExpectRel(cal->bubble_factor(), 2.5, 1e-12, "c, no communication");
  EXPECT_EQ(cal->communication_factor(), cal->compute_factor());
  EXPECT_EQ(cal->ep_communication_factor(), cal->compute_factor());

  // The same terms with communication separate: per-term.
  const std::vector<MeasuredPoint> separable = {{Terms(0.2, 0.1, 0), 0.5, 1},
                                                {Terms(0.4, 0.1, 0), 0.9, 1}};
  cal = FitCalibration(separable);
  ASSERT_TRUE(cal.has_value());
  EXPECT_EQ(cal->method(), v1::Calibration::PER_TERM);
  ExpectRel(cal->compute_factor(), 2.0, 1e-12, "a");  // 0.2a + 0.1b = 0.5, 0.4a + 0.1b = 0.9
  ExpectRel(cal->communication_factor(), 1.0, 1e-12, "b");
  EXPECT_EQ(cal->ep_communication_factor(), cal->communication_factor());  // EP traffic only
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
  EXPECT_EQ(cal->ep_communication_factor(), 0.0);
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
      FitCalibration({{before[0].time(), Synthetic(before[0].time(), a, b, b, a), 1},
                      {chatty->time(), Synthetic(chatty->time(), a, b, b, a), 1}});
  ASSERT_TRUE(cal.has_value());
  ExpectRel(cal->compute_factor(), a, 1e-9, "a");
  ExpectRel(cal->communication_factor(), b, 1e-9, "b");
  ExpectRel(cal->ep_communication_factor(), b, 1e-9, "e");

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
  EXPECT_LE(after[0].calibrated_step_seconds(), Synthetic(before[0].time(), a, b, b, a));
  EXPECT_LE(after[0].calibrated_step_seconds(), Synthetic(chatty->time(), a, b, b, a));
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
