// File: coordinator/planner/calibration.h
//
// The step-time model (cost_model.h) calibrated from measured runs (issue 14 item 3): the model's
// constants (kComputeEfficiency, the bandwidths of the cluster description) are guesses, so its
// totals are off, and not by one factor (four H200s: 317 / 390 / 427 ms estimated against 480 /
// 747 / 836 ms measured for EP 1 / 2 / 4, the error growing with the all-to-all traffic). The
// coordinator fits per-term factors to what its own jobs of the same workload measured
// (coordinator/jobs/measured_runs.h collects them) and ranks by the corrected times. Pure
// arithmetic, no I/O.
//
// DATA: one point per DISTINCT measured mapping i (its newest run, MeasuredRun): y_i the measured
// step time and the model's terms of that mapping (planner.h EstimateMappingTime, for the plan's
// request: the same spec, cluster and formulas as the candidates they correct):
//   C_i = compute,  M_i = tp + ep + dp + pp communication,  B_i = pipeline_bubble.
// MODEL: y ≈ a·C + b·M + c·B, factors a, b, c >= 0 (v1::Calibration's compute_factor,
// communication_factor, bubble_factor).
// FIT (Calibration.method PER_TERM): non-negative least squares of the RELATIVE residuals,
//   minimise Σ_i ((a·C_i + b·M_i + c·B_i − y_i) / y_i)²   subject to a, b, c >= 0,
// so a 2 s mapping weighs as much as a 200 ms one (the ranking compares them relatively). Solved
// exactly: the unconstrained least squares on every subset of the factors (at most 7 systems of
// at most 3 unknowns), the best one whose factors are all >= 0; a factor the constraint binds is
// 0 (e.g. communication fully hidden behind compute in what was measured). The bubble column
// takes part only when some point has B_i > 0 (a measured PP > 1 run); otherwise c = a (the
// bubble is idle time at the pace of the stage's work, mostly compute).
// FALL-BACK (SINGLE_RATIO): a = b = c = r, the same objective with one factor,
//   r = Σ_i (T_i / y_i) / Σ_i (T_i / y_i)²,  T_i = C_i + M_i + B_i (TimeEstimate.total),
// which is y / T for one point. Used when one mapping was measured, or when the points cannot
// separate the factors: some taking-part column (compute, communication, bubble) is zero in every
// point (e.g. only EP 1 / DP-only runs measured on one GPU: no communication), or the columns are
// linearly dependent (normalised Gram determinant below kDegenerateGram; e.g. two mappings whose
// terms are proportional).
// NO CALIBRATION: no usable point (none given; points with y_i or T_i not positive and finite are
// dropped).
// Calibration.max_relative_error = max_i |a·C_i + b·M_i + c·B_i − y_i| / y_i: how well the fitted
// model reproduces the runs it was fitted on (0 with one point or an exact fit).
#ifndef SWITCHYARD_COORDINATOR_PLANNER_CALIBRATION_H_
#define SWITCHYARD_COORDINATOR_PLANNER_CALIBRATION_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "switchyard/v1/plan.pb.h"

namespace switchyard::planner {

// Below this the normalised Gram determinant of the taking-part columns (each column scaled to
// unit length; 1 for orthogonal columns, 0 for dependent ones) counts as singular: the factors
// would be fitted to rounding noise.
inline constexpr double kDegenerateGram = 1e-9;

// One measured mapping.
struct MeasuredPoint {
  v1::TimeEstimate estimate;    // the model's terms of the mapping (EstimateMappingTime)
  double measured_seconds = 0;  // MeasuredRun.step_seconds
  int32_t runs = 1;             // the jobs behind it (MeasuredRun.runs), for Calibration.runs
};

// The calibration of `points` (one per distinct mapping), or nullopt when none is usable (above).
std::optional<v1::Calibration> FitCalibration(const std::vector<MeasuredPoint>& points);

// a·compute + b·(tp + ep + dp + pp communication) + c·pipeline_bubble of `time`.
double CalibratedSeconds(const v1::Calibration& calibration, const v1::TimeEstimate& time);

// Sets plan->calibration, calibrated_step_seconds on the best and every alternative, and ranks
// them again by planner.h's rule with the calibrated time (RanksBefore): the first becomes
// Plan.best. Rejected candidates and every TimeEstimate are left as they are.
void ApplyCalibration(const v1::Calibration& calibration, v1::Plan* plan);

}  // namespace switchyard::planner

#endif  // SWITCHYARD_COORDINATOR_PLANNER_CALIBRATION_H_
