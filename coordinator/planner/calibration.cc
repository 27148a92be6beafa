// File: coordinator/planner/calibration.cc
#include "coordinator/planner/calibration.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "coordinator/planner/planner.h"

namespace switchyard::planner {
namespace {

// The columns C, M, A, B of calibration.h (kCommunication is M, the non-EP communication).
constexpr int kCompute = 0, kCommunication = 1, kEpCommunication = 2, kBubble = 3, kTerms = 4;

using Terms = std::array<double, kTerms>;

// M of calibration.h: everything but the EP all-to-all (CP is inside tp_communication).
double NonEpCommunication(const v1::TimeEstimate& t) {
  return t.tp_communication() + t.dp_communication() + t.pp_communication();
}

Terms TermsOf(const v1::TimeEstimate& t) {
  return {t.compute(), NonEpCommunication(t), t.ep_communication(), t.pipeline_bubble()};
}

bool PositiveFinite(double x) { return std::isfinite(x) && x > 0; }

// One usable point of the relative least squares: its terms divided by the measured time, so that
// the target is 1 (calibration.h FIT).
struct Row {
  Terms x{};
};

// Solves the n x n system a·f = b in place by Gaussian elimination with partial pivoting; false
// when a pivot is zero (singular).
template <size_t N>
bool Solve(int n, std::array<std::array<double, N>, N> a, std::array<double, N> b,
           std::array<double, N>* f) {
  for (int col = 0; col < n; ++col) {
    int pivot = col;
    for (int r = col + 1; r < n; ++r) {
      if (std::abs(a[r][col]) > std::abs(a[pivot][col])) pivot = r;
    }
    if (a[pivot][col] == 0) return false;
    std::swap(a[pivot], a[col]);
    std::swap(b[pivot], b[col]);
    for (int r = col + 1; r < n; ++r) {
      const double k = a[r][col] / a[col][col];
      for (int c = col; c < n; ++c) a[r][c] -= k * a[col][c];
      b[r] -= k * b[col];
    }
  }
  for (int r = n - 1; r >= 0; --r) {
    double s = b[r];
    for (int c = r + 1; c < n; ++c) s -= a[r][c] * (*f)[c];
    (*f)[r] = s / a[r][r];
  }
  return true;
}

// Determinant of the Gram matrix of `cols`, each column scaled to unit length: in [0, 1], 0 when
// they are linearly dependent.
double NormalisedGramDeterminant(const std::vector<Row>& rows, const std::vector<int>& cols) {
  const int n = static_cast<int>(cols.size());
  std::array<std::array<double, kTerms>, kTerms> g{};
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      for (const Row& r : rows) g[i][j] += r.x[cols[i]] * r.x[cols[j]];
    }
  }
  std::array<double, kTerms> norm{};
  for (int i = 0; i < n; ++i) {
    if (!(g[i][i] > 0)) return 0;  // a column that is zero in every row
    norm[i] = std::sqrt(g[i][i]);
  }
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) g[i][j] /= norm[i] * norm[j];
  }
  // Elimination (the matrix is symmetric positive semi-definite: no pivoting needed for the
  // determinant's sign; a zero pivot means singular).
  double det = 1;
  for (int col = 0; col < n; ++col) {
    if (!(g[col][col] > 0)) return 0;
    det *= g[col][col];
    for (int r = col + 1; r < n; ++r) {
      const double k = g[r][col] / g[col][col];
      for (int c = col; c < n; ++c) g[r][c] -= k * g[col][c];
    }
  }
  return det;
}

// The unconstrained least squares of the columns `cols` (Σ (x·f − 1)² over the rows), in `f`
// (other factors 0); false when singular.
bool LeastSquares(const std::vector<Row>& rows, const std::vector<int>& cols, Terms* f) {
  const int n = static_cast<int>(cols.size());
  std::array<std::array<double, kTerms>, kTerms> g{};
  std::array<double, kTerms> rhs{};
  for (int i = 0; i < n; ++i) {
    for (const Row& r : rows) rhs[i] += r.x[cols[i]];
    for (int j = 0; j < n; ++j) {
      for (const Row& r : rows) g[i][j] += r.x[cols[i]] * r.x[cols[j]];
    }
  }
  std::array<double, kTerms> solution{};
  if (!Solve<kTerms>(n, g, rhs, &solution)) return false;
  *f = Terms{};
  for (int i = 0; i < n; ++i) (*f)[cols[i]] = solution[i];
  return true;
}

double Objective(const std::vector<Row>& rows, const Terms& f) {
  double sum = 0;
  for (const Row& r : rows) {
    double e = -1;
    for (int j = 0; j < kTerms; ++j) e += r.x[j] * f[j];
    sum += e * e;
  }
  return sum;
}

// The exact non-negative least squares over `cols` (calibration.h FIT): the best feasible
// unconstrained solution among the subsets of the columns.
Terms NonNegativeLeastSquares(const std::vector<Row>& rows, const std::vector<int>& cols) {
  const int n = static_cast<int>(cols.size());
  Terms best{};
  double best_objective = std::numeric_limits<double>::infinity();
  for (int mask = 1; mask < (1 << n); ++mask) {
    std::vector<int> subset;
    for (int i = 0; i < n; ++i) {
      if (mask & (1 << i)) subset.push_back(cols[i]);
    }
    Terms f;
    if (!LeastSquares(rows, subset, &f)) continue;
    if (std::any_of(f.begin(), f.end(), [](double v) { return v < 0; })) continue;
    const double objective = Objective(rows, f);
    if (objective < best_objective) {
      best_objective = objective;
      best = f;
    }
  }
  return best;
}

// The per-term fit over `cols` in `f` (calibration.h FIT), or false when the rows cannot separate
// those factors: fewer than two columns, fewer rows than columns, or a degenerate Gram matrix.
bool PerTermFit(const std::vector<Row>& rows, const std::vector<int>& cols, Terms* f) {
  if (cols.size() < 2 || rows.size() < cols.size() ||
      NormalisedGramDeterminant(rows, cols) < kDegenerateGram) {
    return false;
  }
  *f = NonNegativeLeastSquares(rows, cols);
  return true;
}

}  // namespace

std::optional<v1::Calibration> FitCalibration(const std::vector<MeasuredPoint>& points) {
  std::vector<Row> rows;
  std::vector<const MeasuredPoint*> used;
  int32_t runs = 0;
  for (const MeasuredPoint& p : points) {
    if (!PositiveFinite(p.measured_seconds) || !PositiveFinite(p.estimate.total())) continue;
    const Terms t = TermsOf(p.estimate);
    if (std::any_of(t.begin(), t.end(), [](double v) { return !std::isfinite(v) || v < 0; })) {
      continue;
    }
    Row r;
    for (int j = 0; j < kTerms; ++j) r.x[j] = t[j] / p.measured_seconds;
    rows.push_back(r);
    used.push_back(&p);
    runs += std::max<int32_t>(p.runs, 1);
  }
  if (rows.empty()) return std::nullopt;

  // The columns taking part (calibration.h TAKING PART): compute always, the others when some
  // measured run had that term.
  auto taking_part = [&rows](int column) {
    return std::any_of(rows.begin(), rows.end(),
                       [column](const Row& r) { return r.x[column] > 0; });
  };
  const bool non_ep = taking_part(kCommunication), ep = taking_part(kEpCommunication),
             bubble = taking_part(kBubble);
  std::vector<int> cols = {kCompute};
  if (non_ep) cols.push_back(kCommunication);
  if (ep) cols.push_back(kEpCommunication);
  if (bubble) cols.push_back(kBubble);
  Terms f{};
  bool per_term = PerTermFit(rows, cols, &f);
  if (!per_term && non_ep && ep) {
    // SHARED COMMUNICATION: M + A as one column (the M slot), its factor for both.
    std::vector<Row> shared = rows;
    for (Row& r : shared) {
      r.x[kCommunication] += r.x[kEpCommunication];
      r.x[kEpCommunication] = 0;
    }
    std::vector<int> shared_cols = {kCompute, kCommunication};
    if (bubble) shared_cols.push_back(kBubble);
    per_term = PerTermFit(shared, shared_cols, &f);
    f[kEpCommunication] = f[kCommunication];
  }
  v1::Calibration cal;
  if (per_term) {
    cal.set_method(v1::Calibration::PER_TERM);
    // The defaults of the columns that took no part.
    if (!non_ep && !ep) {
      f[kCommunication] = f[kEpCommunication] = f[kCompute];
    } else if (!ep) {
      f[kEpCommunication] = f[kCommunication];
    } else if (!non_ep) {
      f[kCommunication] = f[kEpCommunication];
    }
    if (!bubble) f[kBubble] = f[kCompute];
  } else {
    // One factor: minimise Σ (r·T_i/y_i − 1)².
    cal.set_method(v1::Calibration::SINGLE_RATIO);
    double sum = 0, sum_squares = 0;
    for (const Row& r : rows) {
      double ratio = 0;
      for (int j = 0; j < kTerms; ++j) ratio += r.x[j];
      sum += ratio;
      sum_squares += ratio * ratio;
    }
    f.fill(sum / sum_squares);
  }
  cal.set_compute_factor(f[kCompute]);
  cal.set_communication_factor(f[kCommunication]);
  cal.set_ep_communication_factor(f[kEpCommunication]);
  cal.set_bubble_factor(f[kBubble]);
  cal.set_mappings(static_cast<int32_t>(rows.size()));
  cal.set_runs(runs);
  double worst = 0;
  for (const MeasuredPoint* p : used) {
    worst = std::max(worst, std::abs(CalibratedSeconds(cal, p->estimate) - p->measured_seconds) /
                                p->measured_seconds);
  }
  cal.set_max_relative_error(worst);
  return cal;
}

double CalibratedSeconds(const v1::Calibration& c, const v1::TimeEstimate& t) {
  return c.compute_factor() * t.compute() + c.communication_factor() * NonEpCommunication(t) +
         c.ep_communication_factor() * t.ep_communication() +
         c.bubble_factor() * t.pipeline_bubble();
}

void ApplyCalibration(const v1::Calibration& calibration, v1::Plan* plan) {
  *plan->mutable_calibration() = calibration;
  if (!plan->has_best()) return;
  std::vector<v1::PlanCandidate> ranked;
  ranked.reserve(plan->alternatives_size() + 1);
  ranked.push_back(std::move(*plan->mutable_best()));
  for (v1::PlanCandidate& c : *plan->mutable_alternatives()) ranked.push_back(std::move(c));
  for (v1::PlanCandidate& c : ranked) {
    c.set_calibrated_step_seconds(CalibratedSeconds(calibration, c.time()));
  }
  std::stable_sort(ranked.begin(), ranked.end(), RanksBefore);
  *plan->mutable_best() = std::move(ranked.front());
  plan->clear_alternatives();
  for (size_t i = 1; i < ranked.size(); ++i) *plan->add_alternatives() = std::move(ranked[i]);
}

}  // namespace switchyard::planner
