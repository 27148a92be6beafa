// File: worker/train/testing/curve.cc
#include "worker/train/testing/curve.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "worker/comm/testing/forked_ranks.h"

namespace switchyard::train::curves {

TrainerOptions CpuF32() {
  TrainerOptions opt;
  opt.force_dtype = true;
  opt.dtype = DType::kF32;
  return opt;
}

std::string CountsText(const StepResult& r) {
  std::string s;
  for (const auto& layer : r.expert_tokens) {
    for (int64_t c : layer) absl::StrAppend(&s, c, ",");
    s += ";";
  }
  return s;
}

Curve StepUntil(Trainer* trainer, int64_t last) {
  Curve c;
  while (trainer->step() < last) {
    absl::StatusOr<StepResult> r = trainer->Step();
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) break;
    c.loss.push_back(r->loss);
    c.norm.push_back(r->grad_norm);
    c.counts.push_back(CountsText(*r));
  }
  return c;
}

std::string CurveLine(const StepResult& r) {
  char line[128];
  std::snprintf(line, sizeof(line), "%.17g %.17g ", r.loss, r.grad_norm);
  return absl::StrCat(line, CountsText(r), "\n");
}

int TrainRank(Trainer* trainer, int rank, const std::string& out, int64_t last,
              const std::string& load_root, const std::string& save_root) {
  if (!load_root.empty()) SY_CHILD_OK(trainer->Load(load_root));
  std::ofstream f;
  if (rank == 0) f.open(out, std::ios::app);
  while (trainer->step() < last) {
    absl::StatusOr<StepResult> r = trainer->Step();
    SY_CHILD_OK(r.status());
    if (rank == 0) f << CurveLine(*r);
  }
  if (!save_root.empty()) SY_CHILD_OK(trainer->Save(save_root).status());
  return 0;
}

Curve ReadCurve(const std::string& path) {
  Curve c;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    if (parts.size() < 3) continue;
    c.loss.push_back(std::stod(parts[0]));
    c.norm.push_back(std::stod(parts[1]));
    c.counts.push_back(parts[2]);
  }
  return c;
}

std::string OutFile(const std::string& name) {
  const std::string path = comm::testing::UniqueStoreDir(name) + ".txt";
  std::remove(path.c_str());
  return path;
}

void ExpectSameCurve(const Curve& ref, const Curve& got, size_t first, const std::string& what,
                     double tolerance) {
  ASSERT_FALSE(got.loss.empty()) << what;
  ASSERT_LE(first + got.loss.size(), ref.loss.size()) << what;
  double worst_loss = 0, worst_norm = 0;
  int routing_diffs = 0;
  for (size_t i = 0; i < got.loss.size(); ++i) {
    const size_t s = first + i;
    worst_loss = std::max(worst_loss, std::abs(got.loss[i] - ref.loss[s]) / std::abs(ref.loss[s]));
    worst_norm = std::max(worst_norm, std::abs(got.norm[i] - ref.norm[s]) / std::abs(ref.norm[s]));
    if (std::getenv("SY_DEBUG_CURVE")) {
      std::printf("  step %zu loss %.9g / %.9g norm %.9g / %.9g\n", s + 1, got.loss[i], ref.loss[s],
                  got.norm[i], ref.norm[s]);
    }
    if (got.counts[i] != ref.counts[s]) {
      ++routing_diffs;
      ADD_FAILURE() << what << " step " << s + 1 << ": tokens per expert " << got.counts[i]
                    << " != reference " << ref.counts[s];
    }
  }
  std::printf(
      "%-46s steps %zu-%zu: loss %.4f -> %.4f, max rel diff loss %.2e grad_norm %.2e, routing "
      "differences %d (tolerance %.0e)\n",
      what.c_str(), first + 1, first + got.loss.size(), got.loss.front(), got.loss.back(),
      worst_loss, worst_norm, routing_diffs, tolerance);
  EXPECT_LE(worst_loss, tolerance) << what;
  EXPECT_LE(worst_norm, tolerance) << what;
  if (first == 0 && got.loss.size() == ref.loss.size()) {
    EXPECT_LT(got.loss.back(), got.loss.front()) << what;  // it trains
  }
}

}  // namespace switchyard::train::curves
