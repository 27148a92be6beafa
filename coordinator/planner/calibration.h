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
//   C_i = compute,
//   M_i = tp + dp + pp communication (everything but EP; tp_communication includes CP's ring
//         attention, cost_model.h),
//   A_i = ep_communication (the token dispatch and combine all-to-alls, and ETP's gathers),
//   B_i = pipeline_bubble.
// MODEL: y ≈ a·C + b·M + e·A + c·B, factors a, b, e, c >= 0 (v1::Calibration's compute_factor,
// communication_factor, ep_communication_factor, bubble_factor). The all-to-all has its own
// factor because it and the DP reduce run at very different fractions of the modelled bandwidth
// (a CPU run at world 2: EP 1 · EDP 2 526.8 ms, EP 2 695.0 ms measured; one communication factor
// fitted compute ×127114, communication ×0, 23.6 % error).
// TAKING PART: compute always; M, A and B each only when it is non-zero in some point (a column
// that is zero everywhere has no factor to fit). One that does not take part gets a default:
//   e = b when no point has EP traffic (only EP 1 measured),
//   b = e when no point has non-EP traffic,
//   b = e = a when neither (no measured mapping communicates),
//   c = a when no point has a bubble (no PP > 1 run; the bubble is idle time at the pace of the
//         stage's work, mostly compute).
// FIT (Calibration.method PER_TERM): non-negative least squares of the RELATIVE residuals over
// the taking-part columns,
//   minimise Σ_i ((a·C_i + b·M_i + e·A_i + c·B_i − y_i) / y_i)²   subject to a, b, e, c >= 0,
// so a 2 s mapping weighs as much as a 200 ms one (the ranking compares them relatively). Solved
// exactly: the unconstrained least squares on every subset of the factors (at most 15 systems of
// at most 4 unknowns), the best one whose factors are all >= 0; a factor the constraint binds is
// 0 (e.g. communication fully hidden behind compute in what was measured). Needs at least as many
// points as taking-part columns, at least two such columns, and a normalised Gram determinant of
// them >= kDegenerateGram; otherwise, in this order:
// SHARED COMMUNICATION (still PER_TERM, b = e): when M and A both take part but cannot be told
// apart -- fewer points than columns (e.g. two mappings: TP 1 and TP 4 at EP 8), or M and A
// (nearly) proportional across the points -- the one-communication-factor model: the fit above
// with the column M + A in place of M and A, its factor given to both b and e.
// FALL-BACK (SINGLE_RATIO): a = b = e = c = r, the same objective with one factor,
//   r = Σ_i (T_i / y_i) / Σ_i (T_i / y_i)²,  T_i = C_i + M_i + A_i + B_i (TimeEstimate.total),
// which is y / T for one point. Used when one mapping was measured, when compute is the only
// taking-part column (no measured mapping communicates or has a bubble: the per-term fit would be
// this ratio), or when neither fit above is possible: the columns are linearly dependent
// (normalised Gram determinant below kDegenerateGram; e.g. two mappings whose terms are
// proportional, or a compute column that is zero in every point).
// NO CALIBRATION: no usable point (none given; points with y_i or T_i not positive and finite are
// dropped).
// Calibration.max_relative_error = max_i |a·C_i + b·M_i + e·A_i + c·B_i − y_i| / y_i: how well the
// fitted model reproduces the runs it was fitted on (0 with one point or an exact fit).
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

// a·compute + b·(tp + dp + pp communication) + e·ep_communication + c·pipeline_bubble of `time`.
double CalibratedSeconds(const v1::Calibration& calibration, const v1::TimeEstimate& time);

// Sets plan->calibration, calibrated_step_seconds on the best and every alternative, and ranks
// them again by planner.h's rule with the calibrated time (RanksBefore): the first becomes
// Plan.best. Rejected candidates and every TimeEstimate are left as they are.
void ApplyCalibration(const v1::Calibration& calibration, v1::Plan* plan);

}  // namespace switchyard::planner

#endif  // SWITCHYARD_COORDINATOR_PLANNER_CALIBRATION_H_
