// File: coordinator/jobs/measured_runs.cc
#include "coordinator/jobs/measured_runs.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/status.h"
#include "coordinator/jobs/job_registry.h"
#include "coordinator/planner/calibration.h"
#include "coordinator/planner/planner.h"
#include "google/protobuf/util/message_differencer.h"

namespace switchyard::jobs {

namespace {

using google::protobuf::util::MessageDifferencer;

// The newest measurement of one mapping.
struct Newest {
  v1::Mapping mapping;
  v1::MeasuredRun run;
  absl::Time update_time = absl::InfinitePast();
};

// The entry of `mapping` in `all` (added when absent). Linear: a workload has a few mappings.
Newest& EntryOf(std::vector<Newest>* all, const v1::Mapping& mapping) {
  for (Newest& n : *all) {
    if (MessageDifferencer::Equals(n.mapping, mapping)) return n;
  }
  all->push_back(Newest{mapping, {}, absl::InfinitePast()});
  return all->back();
}

}  // namespace

bool SameWorkload(const v1::JobSpec& a, const v1::JobSpec& b) {
  return MessageDifferencer::Equals(a.model(), b.model()) &&
         a.training().has_global_batch_size() == b.training().has_global_batch_size() &&
         a.training().global_batch_size() == b.training().global_batch_size() &&
         a.training().has_bf16() == b.training().has_bf16() &&
         a.training().bf16() == b.training().bf16();
}

absl::StatusOr<std::vector<MeasuredMapping>> MeasuredMappings(store::Store* store,
                                                              const v1::JobSpec& spec) {
  std::vector<Newest> by_mapping;
  for (int64_t after = 0;;) {
    SY_ASSIGN_OR_RETURN(std::vector<store::JobRow> rows,
                        store->ListJobs(v1::Job::STATE_UNSPECIFIED, after, kMeasuredRunsPageSize));
    if (rows.empty()) break;
    after = rows.back().id;
    for (const store::JobRow& row : rows) {
      if (!row.plan.has_value() || !row.last_step.has_value()) continue;
      const v1::StepMetrics& step = *row.last_step;
      if (step.step() < kMinMeasuredStep || !(step.step_ms() > 0)) continue;
      if (!SameWorkload(row.spec, spec)) continue;
      Newest& n = EntryOf(&by_mapping, row.plan->best().mapping());
      n.run.set_runs(n.run.runs() + 1);
      if (row.update_time < n.update_time) continue;
      n.update_time = row.update_time;
      n.run.set_job(JobName(row.id));
      n.run.set_step(step.step());
      n.run.set_step_seconds(step.step_ms() / 1000.0);
      n.run.set_memory_bytes(step.device_memory_bytes());
    }
  }
  std::vector<MeasuredMapping> out;
  out.reserve(by_mapping.size());
  for (Newest& n : by_mapping) out.push_back({std::move(n.mapping), std::move(n.run)});
  return out;
}

namespace {

// PlanCandidate.measured from `measured` on the best and every alternative.
void Attach(const std::vector<MeasuredMapping>& measured, v1::Plan* plan) {
  auto attach = [&](v1::PlanCandidate* c) {
    c->clear_measured();
    for (const MeasuredMapping& m : measured) {
      if (MessageDifferencer::Equals(m.mapping, c->mapping())) *c->mutable_measured() = m.run;
    }
  };
  if (plan->has_best()) attach(plan->mutable_best());
  for (v1::PlanCandidate& c : *plan->mutable_alternatives()) attach(&c);
}

}  // namespace

absl::Status AttachMeasuredRuns(store::Store* store, const v1::JobSpec& spec, v1::Plan* plan) {
  SY_ASSIGN_OR_RETURN(const std::vector<MeasuredMapping> measured, MeasuredMappings(store, spec));
  Attach(measured, plan);
  return absl::OkStatus();
}

absl::Status AttachMeasurements(store::Store* store, const v1::PlanRequest& request,
                                v1::Plan* plan) {
  SY_ASSIGN_OR_RETURN(const std::vector<MeasuredMapping> measured,
                      MeasuredMappings(store, request.spec()));
  Attach(measured, plan);
  plan->clear_calibration();
  if (plan->has_best()) plan->mutable_best()->clear_calibrated_step_seconds();
  for (v1::PlanCandidate& c : *plan->mutable_alternatives()) c.clear_calibrated_step_seconds();
  std::vector<planner::MeasuredPoint> points;
  for (const MeasuredMapping& m : measured) {
    // A mapping the request's rules now refuse cannot be estimated like the candidates: left out.
    absl::StatusOr<v1::TimeEstimate> terms = planner::EstimateMappingTime(request, m.mapping);
    if (!terms.ok()) continue;
    points.push_back({*std::move(terms), m.run.step_seconds(), m.run.runs()});
  }
  if (std::optional<v1::Calibration> calibration = planner::FitCalibration(points)) {
    planner::ApplyCalibration(*calibration, plan);
  }
  return absl::OkStatus();
}

}  // namespace switchyard::jobs
