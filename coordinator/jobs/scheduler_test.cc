// File: coordinator/jobs/scheduler_test.cc
//
// The job lifecycle of WORKER_PROTOCOL.md end to end: a real gRPC server on loopback with the
// worker services, a real SQLite file, fake workers that are real gRPC clients.
#include "coordinator/jobs/scheduler.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/config_defaults.h"
#include "common/config/validate.h"
#include "coordinator/api/worker_test_util.h"
#include "gtest/gtest.h"

namespace switchyard::jobs {
namespace {

using api::testing::FakeWorker;
using api::testing::Harness;
using api::testing::HeartbeatTicker;
using v1::CoordinatorMessage;
using v1::Job;

struct Fleet {
  std::vector<std::unique_ptr<FakeWorker>> workers;
  std::unique_ptr<HeartbeatTicker> ticker;

  Fleet(Harness* h, int n, const std::string& prefix = "w") {
    std::vector<FakeWorker*> raw;
    for (int i = 0; i < n; ++i) {
      workers.push_back(std::make_unique<FakeWorker>(api::testing::MakeChannel(h->port()),
                                                     absl::StrCat(prefix, i), "host-a"));
      workers.back()->Attach();
      raw.push_back(workers.back().get());
    }
    ticker = std::make_unique<HeartbeatTicker>(raw, absl::Milliseconds(200));
    // Wait until every worker is registered.
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (h->plane()->registry()->CountInState(cluster::WorkerState::kIdle) < n &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_EQ(h->plane()->registry()->CountInState(cluster::WorkerState::kIdle), n);
  }
  ~Fleet() {
    ticker.reset();
    workers.clear();
  }
};

// Waits for an Assignment on each of `workers` and then its Start; checks ranks 0..n-1, one
// world size, one generation, Start after the Assignment. Returns rank -> worker.
std::map<int, FakeWorker*> ExpectGeneration(const std::vector<FakeWorker*>& workers,
                                            const std::string& job, int64_t generation, int world) {
  std::map<int, FakeWorker*> by_rank;
  absl::Time last_assignment = absl::InfinitePast(), first_start = absl::InfiniteFuture();
  for (FakeWorker* w : workers) {
    auto a = w->WaitFor(CoordinatorMessage::kAssignment);
    EXPECT_TRUE(a.has_value()) << w->id() << " got no Assignment";
    if (!a) continue;
    const v1::Assignment& as = a->message.assignment();
    EXPECT_EQ(as.job(), job);
    EXPECT_EQ(as.generation(), generation);
    EXPECT_EQ(as.world_size(), world);
    EXPECT_EQ(as.spec().parallel().world_size(), world);
    EXPECT_EQ(as.mapping().data_parallel_size(), world);
    EXPECT_EQ(as.spec().training().global_batch_size() %
                  (as.spec().training().micro_batch_size() * world),
              0);
    EXPECT_EQ(as.rendezvous_address(), "coordinator.test:7070");
    EXPECT_FALSE(as.spec().training().save().empty());
    EXPECT_EQ(as.spec().training().save(), as.spec().training().load());
    // The worker validates the assigned spec as the coordinator does.
    v1::JobSpec defaulted = as.spec();
    ApplyDefaults(&defaulted);
    absl::Status valid = ValidateJobSpec(defaulted);
    EXPECT_TRUE(valid.ok()) << valid;
    EXPECT_TRUE(by_rank.emplace(as.rank(), w).second) << "rank " << as.rank() << " twice";
    auto s = w->WaitFor(CoordinatorMessage::kStart);
    EXPECT_TRUE(s.has_value()) << w->id() << " got no Start";
    if (s) {
      EXPECT_GE(s->time, a->time);
      first_start = std::min(first_start, s->time);
    }
    last_assignment = std::max(last_assignment, a->time);
  }
  std::vector<std::string> ranks;
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(by_rank.count(r), 1u) << "rank " << r << " missing";
    if (by_rank.count(r)) ranks.push_back(absl::StrCat(r, "=", by_rank[r]->id()));
  }
  std::printf(
      "%s generation %lld: world %d, ranks {%s}; first Start received %s after the last "
      "Assignment (another stream may overtake)\n",
      job.c_str(), static_cast<long long>(generation), world, absl::StrJoin(ranks, ", ").c_str(),
      absl::FormatDuration(first_start - last_assignment).c_str());
  return by_rank;
}

std::vector<FakeWorker*> Raw(const Fleet& fleet) {
  std::vector<FakeWorker*> out;
  for (const auto& w : fleet.workers) out.push_back(w.get());
  return out;
}

// One coordinator with a fleet of fake workers, and the job a test drives on them. The helpers
// ASSERT: call them through ASSERT_NO_FATAL_FAILURE.
class SchedulerTest : public ::testing::Test {
 protected:
  // A harness over the fresh store `store_name` with `workers` registered, heartbeating workers.
  void StartFleet(const std::string& store_name, int workers) {
    h_ = Harness::Start(store_name);
    ASSERT_NE(h_, nullptr);
    fleet_ = std::make_unique<Fleet>(h_.get(), workers);
  }

  // Submits `spec` as job_ and expects its generation 1 of world `world` on the whole fleet.
  void SubmitGeneration1(const v1::JobSpec& spec, int world) {
    job_ = h_->Submit(spec);
    ranks_ = ExpectGeneration(Raw(*fleet_), job_, 1, world);
    ASSERT_EQ(ranks_.size(), static_cast<size_t>(world));
  }

  // Every rank of generation 1 reports step 1 with `loss`; waits for RUNNING.
  void ReportStep1(double loss) {
    for (auto& [rank, w] : ranks_) w->SendStep(1, loss);
    h_->WaitForState(job_, Job::RUNNING);
  }

  void PrintEvents() {
    auto events = h_->registry()->ListEvents(job_);
    ASSERT_TRUE(events.ok());
    for (const v1::JobEvent& e : *events) {
      std::printf("  event %lld %s gen %lld %s: %s\n", static_cast<long long>(e.sequence()),
                  Job::State_Name(e.state()).c_str(), static_cast<long long>(e.generation()),
                  e.reason().c_str(), e.message().c_str());
    }
  }

  bool HasEvent(Job::State state, const std::string& reason) {
    auto events = h_->registry()->ListEvents(job_);
    if (!events.ok()) return false;
    for (const v1::JobEvent& e : *events) {
      if (e.state() == state && e.reason() == reason) return true;
    }
    return false;
  }

  std::unique_ptr<Harness> h_;
  std::unique_ptr<Fleet> fleet_;  // declared after h_: stops before the harness
  std::string job_;
  std::map<int, FakeWorker*> ranks_;  // generation 1, from SubmitGeneration1
};

TEST_F(SchedulerTest, AssignsRunsSucceeds) {
  ASSERT_NO_FATAL_FAILURE(StartFleet("sched_success.db", 4));
  auto watch_steps = h_->plane()->steps();
  job_ = h_->Submit(api::testing::SmallSpec(2, 4));
  std::shared_ptr<StepSubscription> sub = watch_steps->Subscribe(job_);
  auto ranks = ExpectGeneration(Raw(*fleet_), job_, 1, 4);
  ASSERT_EQ(ranks.size(), 4u);
  EXPECT_EQ(ranks[0]->assignment()->spec().training().save(),
            absl::StrCat(std::getenv("TEST_TMPDIR"), "/checkpoints/jobs/1"));  // <root>/jobs/<id>
  Job starting = h_->WaitForState(job_, Job::STARTING);
  EXPECT_EQ(starting.generation(), 1);

  for (auto& [rank, w] : ranks) w->SendStep(1, 5.0 + rank);
  h_->WaitForState(job_, Job::RUNNING);
  auto step = sub->Next(absl::Seconds(10));
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->step(), 1);
  EXPECT_DOUBLE_EQ(step->loss(), 5.0);  // rank 0's report
  for (auto& [rank, w] : ranks) w->SendStep(2, 4.0 + rank);
  step = sub->Next(absl::Seconds(10));
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->step(), 2);
  std::printf("WatchJob subscription got steps 1 and 2 with rank 0's loss %.1f\n", step->loss());

  // CheckpointNow reaches every rank; a job without a running generation is refused.
  ASSERT_TRUE(h_->plane()->scheduler()->RequestCheckpoint(job_).ok());
  for (auto& [rank, w] : ranks) {
    EXPECT_TRUE(w->WaitFor(CoordinatorMessage::kCheckpoint).has_value()) << "rank " << rank;
  }
  EXPECT_EQ(h_->plane()->scheduler()->RequestCheckpoint("jobs/999").code(),
            absl::StatusCode::kFailedPrecondition);

  // Workers report BUSY in the store while running.
  auto row = h_->store()->GetWorker(ranks[1]->id());
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->state, store::WorkerState::kAssigned);
  EXPECT_EQ(row->job, job_);

  for (auto& [rank, w] : ranks) w->SendExit(0);
  Job done = h_->WaitForState(job_, Job::SUCCEEDED);
  PrintEvents();
  EXPECT_TRUE(HasEvent(Job::SUCCEEDED, "ALL_RANKS_FINISHED"));
  ASSERT_TRUE(h_->plane()->steps()->LastStep(job_).has_value());
  EXPECT_EQ(h_->plane()->steps()->LastStep(job_)->step(), 2);
  // The subscription closes with the job.
  EXPECT_FALSE(sub->Next(absl::Seconds(2)).has_value());
  EXPECT_TRUE(sub->done());
  // Every worker is idle again (in memory and in the store) and no Stop was sent.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (h_->plane()->registry()->CountInState(cluster::WorkerState::kIdle) < 4 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(h_->plane()->registry()->CountInState(cluster::WorkerState::kIdle), 4);
  for (auto& w : fleet_->workers) EXPECT_EQ(w->CountReceived(CoordinatorMessage::kStop), 0);
  row = h_->store()->GetWorker(ranks[1]->id());
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->state, store::WorkerState::kIdle);
}

// Job-scoped workers (Registration.job): a job goes only to workers scoped to it or unscoped; a
// scoped worker idle next to a pending job it is not scoped to is never given that job; once its
// job is finished it gets JobEnded with the final state.
TEST_F(SchedulerTest, ScopedWorkersGetOnlyTheirJobAndJobEnded) {
  h_ = Harness::Start("sched_scoped.db");
  ASSERT_NE(h_, nullptr);
  const std::string a = h_->Submit(api::testing::SmallSpec(1, 1));
  const std::string b = h_->Submit(api::testing::SmallSpec(1, 1));
  // Scoped to b, the later job: an unscoped worker would get a (id order).
  FakeWorker wb(api::testing::MakeChannel(h_->port()), "wb");
  wb.set_scope(b);
  wb.Attach();
  HeartbeatTicker ticker_b({&wb}, absl::Milliseconds(200));
  std::optional<FakeWorker::Received> got = wb.WaitFor(CoordinatorMessage::kAssignment);
  ASSERT_TRUE(got.has_value());
  std::printf("worker scoped to %s got %s (a = %s pending)\n", b.c_str(),
              got->message.assignment().job().c_str(), a.c_str());
  EXPECT_EQ(got->message.assignment().job(), b);
  wb.SendExit(0);
  h_->WaitForState(b, Job::SUCCEEDED);
  std::optional<FakeWorker::Received> ended = wb.WaitFor(CoordinatorMessage::kJobEnded);
  ASSERT_TRUE(ended.has_value());
  std::printf("JobEnded: %s\n", ended->message.job_ended().ShortDebugString().c_str());
  EXPECT_EQ(ended->message.job_ended().job(), b);
  EXPECT_EQ(ended->message.job_ended().state(), "SUCCEEDED");
  // wb stays attached and idle (a fake ignores JobEnded): a is still never given to it.
  absl::SleepFor(absl::Seconds(1));
  EXPECT_EQ(wb.CountReceived(CoordinatorMessage::kAssignment), 1);
  const Job pending = *h_->registry()->GetJob(a);
  EXPECT_EQ(pending.state(), Job::PENDING);
  EXPECT_EQ(pending.last_event().message(), "needs 1 worker(s), 0 attached");
  // An unscoped worker takes a.
  FakeWorker any(api::testing::MakeChannel(h_->port()), "any");
  any.Attach();
  HeartbeatTicker ticker_any({&any}, absl::Milliseconds(200));
  got = any.WaitFor(CoordinatorMessage::kAssignment);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->message.assignment().job(), a);
  EXPECT_EQ(any.CountReceived(CoordinatorMessage::kJobEnded), 0);
}

TEST_F(SchedulerTest, LostWorkerRestartsOnFewerWorkers) {
  ASSERT_NO_FATAL_FAILURE(StartFleet("sched_lost.db", 4));
  ASSERT_NO_FATAL_FAILURE(SubmitGeneration1(api::testing::SmallSpec(2, 4), 4));
  ReportStep1(3.0);

  // Rank 2 goes silent: no heartbeats, no answers.
  FakeWorker* silent = ranks_[2];
  silent->set_ack_stop(false);
  silent->set_heartbeating(false);
  const absl::Time silenced = absl::Now();
  // RESTARTING lasts only until the Stops are acknowledged: wait for its event.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!HasEvent(Job::RESTARTING, "WORKER_LOST") && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  std::printf("silent worker %s: job RESTARTING after %s (heartbeat_timeout 1s)\n",
              silent->id().c_str(), absl::FormatDuration(absl::Now() - silenced).c_str());
  EXPECT_TRUE(HasEvent(Job::RESTARTING, "WORKER_LOST"));
  // Its stream is ended by the coordinator.
  auto end = silent->WaitForEnd(absl::Seconds(10));
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->error_code(), grpc::StatusCode::UNAVAILABLE) << end->error_message();

  // The other three get Stop (and acknowledge), then a generation 2 of world 3.
  std::vector<FakeWorker*> rest;
  for (auto& [rank, w] : ranks_) {
    if (w == silent) continue;
    auto stop = w->WaitFor(CoordinatorMessage::kStop);
    ASSERT_TRUE(stop.has_value()) << w->id();
    EXPECT_NE(stop->message.stop().reason().find("WORKER_LOST"), std::string::npos);
    rest.push_back(w);
  }
  auto ranks2 = ExpectGeneration(rest, job_, 2, 3);
  ASSERT_EQ(ranks2.size(), 3u);
  Job restarted = h_->WaitForState(job_, Job::STARTING);
  EXPECT_EQ(restarted.restart_count(), 1);
  EXPECT_EQ(restarted.generation(), 2);
  for (auto& [rank, w] : ranks2) w->SendStep(2, 2.0);
  h_->WaitForState(job_, Job::RUNNING);
  for (auto& [rank, w] : ranks2) w->SendExit(0);
  h_->WaitForState(job_, Job::SUCCEEDED);
  PrintEvents();
  auto lost = h_->plane()->registry()->Get(silent->id());
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ(lost->state, cluster::WorkerState::kLost);
  auto row = h_->store()->GetWorker(silent->id());
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->state, store::WorkerState::kLost);
}

TEST_F(SchedulerTest, RestartLimitExceededFails) {
  ASSERT_NO_FATAL_FAILURE(StartFleet("sched_limit.db", 2));
  ASSERT_NO_FATAL_FAILURE(SubmitGeneration1(api::testing::SmallSpec(2, 2, /*max_restarts=*/1), 2));
  ranks_[1]->SendExit(200, "NCCL timeout");  // retryable
  auto stop = ranks_[0]->WaitFor(CoordinatorMessage::kStop);
  ASSERT_TRUE(stop.has_value());
  std::printf("Stop to rank 0: %s\n", stop->message.stop().reason().c_str());
  auto ranks2 = ExpectGeneration(Raw(*fleet_), job_, 2, 2);
  ASSERT_EQ(ranks2.size(), 2u);
  ranks2[0]->SendExit(137, "lost peer");
  ASSERT_TRUE(ranks2[1]->WaitFor(CoordinatorMessage::kStop).has_value());
  Job failed = h_->WaitForState(job_, Job::FAILED);
  std::printf("failure_reason: %s\n", failed.failure_reason().c_str());
  EXPECT_NE(failed.failure_reason().find("RESTART_LIMIT_EXCEEDED"), std::string::npos);
  EXPECT_NE(failed.failure_reason().find("WORKER_FAILED"), std::string::npos);
  EXPECT_EQ(failed.restart_count(), 1);
  PrintEvents();
  // No third generation.
  absl::SleepFor(absl::Milliseconds(300));
  for (auto& w : fleet_->workers) EXPECT_EQ(w->CountReceived(CoordinatorMessage::kAssignment), 2);
}

TEST_F(SchedulerTest, PermanentExitFails) {
  ASSERT_NO_FATAL_FAILURE(StartFleet("sched_permanent.db", 3));
  ASSERT_NO_FATAL_FAILURE(SubmitGeneration1(api::testing::SmallSpec(3, 3), 3));
  ReportStep1(1.0);
  ranks_[1]->SendExit(2, "bad spec: unsupported layout");
  Job failed = h_->WaitForState(job_, Job::FAILED);
  std::printf("failure_reason: %s\n", failed.failure_reason().c_str());
  EXPECT_NE(failed.failure_reason().find("WORKER_EXIT_PERMANENT"), std::string::npos);
  EXPECT_NE(failed.failure_reason().find("code 2"), std::string::npos);
  EXPECT_EQ(failed.restart_count(), 0);
  ASSERT_TRUE(ranks_[0]->WaitFor(CoordinatorMessage::kStop).has_value());
  ASSERT_TRUE(ranks_[2]->WaitFor(CoordinatorMessage::kStop).has_value());
  EXPECT_EQ(ranks_[1]->CountReceived(CoordinatorMessage::kStop), 0);
}

TEST_F(SchedulerTest, CancelStopsEveryRank) {
  ASSERT_NO_FATAL_FAILURE(StartFleet("sched_cancel.db", 2));
  ASSERT_NO_FATAL_FAILURE(SubmitGeneration1(api::testing::SmallSpec(2, 2), 2));
  ReportStep1(1.0);
  const absl::Time cancelled = absl::Now();
  ASSERT_TRUE(h_->hub()->CancelJob(job_).ok());  // what JobService.CancelJob does
  for (auto& [rank, w] : ranks_) {
    auto stop = w->WaitFor(CoordinatorMessage::kStop);
    ASSERT_TRUE(stop.has_value()) << w->id();
    std::printf("rank %d got Stop %s after CancelJob: %s\n", rank,
                absl::FormatDuration(stop->time - cancelled).c_str(),
                stop->message.stop().reason().c_str());
  }
  h_->WaitForState(job_, Job::CANCELLED);
  // The acknowledged workers are idle and take the next job.
  const std::string next = h_->Submit(api::testing::SmallSpec(2, 2));
  auto ranks2 = ExpectGeneration(Raw(*fleet_), next, 1, 2);
  EXPECT_EQ(ranks2.size(), 2u);
}

// A job needing more workers than attached waits PENDING with one WAITING_FOR_WORKERS event
// (not one per scheduler pass); parallelism the workers cannot run never gets that far: it is
// refused at submit (jobs/resolve_spec.h), naming the field.
TEST_F(SchedulerTest, WaitsForMinWorkersWithAReasonAndRefusesUnsupportedParallelism) {
  ASSERT_NO_FATAL_FAILURE(StartFleet("sched_wait.db", 1));
  job_ = h_->Submit(api::testing::SmallSpec(2, 2));
  // PP runs in the workers (1F1B, interleaved with virtual stages); layers that do not divide
  // into PP·VPP chunks do not.
  v1::JobSpec vpp2 = api::testing::SmallSpec(1, 1);
  vpp2.mutable_model()->set_num_layers(6);
  vpp2.mutable_model()->set_untie_embeddings_and_output_weights(true);
  vpp2.mutable_parallel()->set_pipeline_model_parallel_size(2);
  vpp2.mutable_parallel()->set_virtual_pipeline_model_parallel_size(2);
  v1::CreateJobRequest bad;
  *bad.mutable_spec() = vpp2;
  absl::StatusOr<Job> refused = h_->hub()->CreateJob(bad);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  std::printf("PP=2 VPP=2 job of 6 layers refused at submit: %s\n",
              std::string(refused.status().message()).c_str());
  EXPECT_NE(
      refused.status().message().find("parallel.virtual_pipeline_model_parallel_size (2 * 2 = 4)"),
      absl::string_view::npos);
  // The wait reason appears once, however many passes run meanwhile (rescan every 1 s here).
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  Job pending;
  while (absl::Now() < deadline) {
    pending = *h_->hub()->GetJob(job_);
    if (pending.last_event().reason() == "WAITING_FOR_WORKERS") break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(pending.state(), Job::PENDING) << "1 idle worker < min_workers 2";
  EXPECT_EQ(pending.last_event().reason(), "WAITING_FOR_WORKERS");
  EXPECT_EQ(pending.last_event().message(), "needs 2 worker(s), 1 attached");
  absl::SleepFor(absl::Milliseconds(2500));
  auto events = h_->hub()->ListEvents(job_);
  ASSERT_TRUE(events.ok());
  int waits = 0;
  for (const v1::JobEvent& e : *events) waits += e.reason() == "WAITING_FOR_WORKERS";
  EXPECT_EQ(waits, 1) << "the reason did not change, so it is recorded once";
  // Nor is the spec validated again on every pass: it is resolved once while it waits.
  EXPECT_EQ(h_->plane()->scheduler()->SpecResolutions(), 1);
  std::printf("pending: %s: %s (%d event(s) after 2.5 s of passes)\n",
              pending.last_event().reason().c_str(), pending.last_event().message().c_str(), waits);
  // A second worker arrives: the job starts on both.
  FakeWorker second(api::testing::MakeChannel(h_->port()), "late", "host-b");
  second.Attach();
  fleet_->ticker->Add(&second);
  auto ranks = ExpectGeneration({fleet_->workers[0].get(), &second}, job_, 1, 2);
  EXPECT_EQ(ranks.size(), 2u);
  // The cluster changed (a worker attached) and the cached spec was planned on the new one.
  EXPECT_EQ(h_->plane()->scheduler()->SpecResolutions(), 1);
}

// The bug this path fixes: save_interval without save passed CreateJob, then failed at planning
// (NO_FEASIBLE_PLAN: training.save_interval requires training.save). The scheduler resolves the
// stored spec as CreateJob does (an empty save is the job's directory), so it starts, saving to
// <checkpoint root>/jobs/<job id>.
TEST_F(SchedulerTest, SaveIntervalWithoutSaveStartsWithTheCoordinatorsDirectory) {
  ASSERT_NO_FATAL_FAILURE(StartFleet("sched_save_interval.db", 1));
  v1::JobSpec spec = api::testing::SmallSpec(1, 1);
  spec.mutable_training()->set_save_interval(5);
  job_ = h_->Submit(spec);
  auto ranks = ExpectGeneration(Raw(*fleet_), job_, 1, 1);
  ASSERT_EQ(ranks.size(), 1u);
  const v1::Assignment a = *ranks[0]->assignment();
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/checkpoints/jobs/1");
  EXPECT_EQ(a.spec().training().save(), dir);
  EXPECT_EQ(a.spec().training().load(), dir);
  EXPECT_EQ(a.spec().training().save_interval(), 5);
  std::printf("assigned save %s every %lld steps\n", a.spec().training().save().c_str(),
              static_cast<long long>(a.spec().training().save_interval()));
}

// Queues (scheduler.h "Queues"): 3 gangs of 2 on 4 workers, queues a and b with a quota of 2
// workers each. jobs/1 (a, priority 0), jobs/2 (a, priority 10), jobs/3 (b, priority 0) are
// submitted before any worker attaches; workers then attach one at a time. jobs/2 goes first
// (priority) and no lower-priority job takes the first worker from it; jobs/3 follows on the
// next two; jobs/1 waits at its queue's quota with position 1 and QUEUE_QUOTA_EXCEEDED (GetJob,
// ListJobs) until jobs/2 ends, then starts on its workers. No job ever starts with fewer ranks
// than its gang.
TEST_F(SchedulerTest, QueuesAdmitByPriorityWithinQuotaAndWholeGangsOnly) {
  h_ = Harness::Start("sched_queues.db", true, {}, {{"a", 2}, {"b", 2}});
  ASSERT_NE(h_, nullptr);
  auto spec = [](const std::string& queue, int priority) {
    v1::JobSpec s = api::testing::SmallSpec(2, 2);
    s.set_queue(queue);
    s.set_priority(priority);
    return s;
  };
  // Bad queue input is refused at submit, naming the field and the rule; nothing is stored.
  for (const auto& [bad, needle] : std::vector<std::pair<v1::JobSpec, std::string>>{
           {spec("nope", 0),
            "queue (\"nope\") must be one of this coordinator's queues: "
            "default, a, b"},
           {spec("a", 5000), "priority (5000) must be within [-1000, 1000]"},
           {api::testing::SmallSpec(3, 3), ""}}) {
    v1::JobSpec s = bad;
    std::string want = needle;
    if (want.empty()) {  // a gang larger than its queue's quota could never be admitted
      s.set_queue("b");
      want =
          "min_workers (3, or parallel.world_size when unset) must be at most the worker "
          "quota of queue b (2)";
    }
    v1::CreateJobRequest request;
    *request.mutable_spec() = s;
    absl::StatusOr<Job> refused = h_->hub()->CreateJob(request);
    ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_NE(refused.status().message().find(want), absl::string_view::npos) << refused.status();
    std::printf("refused: %s\n", std::string(refused.status().message()).c_str());
  }
  ASSERT_EQ(*h_->store()->CountJobs(), 0);

  const std::string j1 = h_->Submit(spec("a", 0));
  const std::string j2 = h_->Submit(spec("a", 10));
  const std::string j3 = h_->Submit(spec("b", 0));
  ASSERT_EQ(j1, "jobs/1");
  std::vector<std::unique_ptr<FakeWorker>> workers;
  std::unique_ptr<HeartbeatTicker> ticker;
  auto attach = [&](int i) {
    workers.push_back(std::make_unique<FakeWorker>(api::testing::MakeChannel(h_->port()),
                                                   absl::StrCat("q", i), "host-a"));
    workers.back()->Attach();
    if (ticker == nullptr) {
      ticker = std::make_unique<HeartbeatTicker>(std::vector<FakeWorker*>{workers.back().get()},
                                                 absl::Milliseconds(200));
    } else {
      ticker->Add(workers.back().get());
    }
  };
  auto status_of = [&](const std::string& name) { return h_->hub()->GetJob(name)->queue_status(); };
  auto wait_reason = [&](const std::string& name, const std::string& reason) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (status_of(name).reason() != reason && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    const v1::QueueStatus q = status_of(name);
    std::printf("%s: queue %s position %d %s: %s\n", name.c_str(), q.queue().c_str(), q.position(),
                q.reason().c_str(), q.message().c_str());
    return q;
  };

  // One worker: jobs/2 (priority 10) waits for a second one; the priority-0 jobs may not take it.
  attach(0);
  v1::QueueStatus q2 = wait_reason(j2, "WAITING_FOR_WORKERS");
  EXPECT_EQ(q2.queue(), "a");
  EXPECT_EQ(q2.position(), 1);
  v1::QueueStatus q1 = wait_reason(j1, "WAITING_FOR_PRIORITY");
  EXPECT_EQ(q1.position(), 2) << "behind jobs/2 in queue a";
  EXPECT_EQ(wait_reason(j3, "WAITING_FOR_PRIORITY").position(), 1) << "first in queue b";
  EXPECT_EQ(workers[0]->CountReceived(CoordinatorMessage::kAssignment), 0) << "no partial gang";

  // A second worker: jobs/2 starts on both.
  attach(1);
  auto ranks2 = ExpectGeneration({workers[0].get(), workers[1].get()}, j2, 1, 2);
  ASSERT_EQ(ranks2.size(), 2u);
  // Queue a is at its quota: jobs/1 waits for it; jobs/3 (queue b) waits for workers.
  q1 = wait_reason(j1, "QUEUE_QUOTA_EXCEEDED");
  EXPECT_EQ(q1.position(), 1);
  EXPECT_EQ(q1.message(), "queue a: 2 of 2 worker(s) in use, needs 2");
  wait_reason(j3, "WAITING_FOR_WORKERS");
  attach(2);
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(workers[2]->CountReceived(CoordinatorMessage::kAssignment), 0)
      << "one idle worker is not a gang of 2";
  attach(3);
  auto ranks3 = ExpectGeneration({workers[2].get(), workers[3].get()}, j3, 1, 2);
  ASSERT_EQ(ranks3.size(), 2u);
  EXPECT_FALSE(h_->hub()->GetJob(j3)->has_queue_status()) << "started jobs do not wait";

  // ListJobs (syctl list) shows the same position and reason for the waiting job.
  v1::ListJobsRequest list;
  list.set_state(Job::PENDING);
  absl::StatusOr<v1::ListJobsResponse> pending = h_->hub()->ListJobs(list);
  ASSERT_TRUE(pending.ok());
  ASSERT_EQ(pending->jobs_size(), 1);
  EXPECT_EQ(pending->jobs(0).name(), j1);
  EXPECT_EQ(pending->jobs(0).queue_status().position(), 1);
  EXPECT_EQ(pending->jobs(0).queue_status().reason(), "QUEUE_QUOTA_EXCEEDED");
  // The scheduler's per-queue view (the switchyard_queue_* gauges), as the pass after jobs/3's
  // start publishes it (its workers get the Start before the pass ends).
  std::map<std::string, JobHub::QueueUsage> usage;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10); absl::Now() < deadline;) {
    usage.clear();
    for (const JobHub::QueueUsage& u : h_->hub()->QueueState()) usage[u.queue] = u;
    if (usage["b"].workers_in_use == 2) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(usage["a"].quota, 2);
  EXPECT_EQ(usage["a"].workers_in_use, 2);
  EXPECT_EQ(usage["a"].pending, 1);
  EXPECT_EQ(usage["b"].workers_in_use, 2);
  EXPECT_EQ(usage["b"].pending, 0);
  EXPECT_FALSE(usage["default"].quota.has_value());

  // jobs/2 ends: its workers and its quota go to jobs/1.
  for (auto& [rank, w] : ranks2) w->SendExit(0);
  h_->WaitForState(j2, Job::SUCCEEDED);
  auto ranks1 = ExpectGeneration({ranks2[0], ranks2[1]}, j1, 1, 2);
  EXPECT_EQ(ranks1.size(), 2u);
  // Every generation had its whole gang: 2 ranks each, on 4 distinct workers at any time.
  for (const std::string& name : {j1, j2, j3}) {
    const Job job = *h_->hub()->GetJob(name);
    EXPECT_EQ(job.plan().best().mapping().data_parallel_size(), 2) << name;
  }
  for (auto& [rank, w] : ranks3) w->SendExit(0);
  for (auto& [rank, w] : ranks1) w->SendExit(0);
  h_->WaitForState(j1, Job::SUCCEEDED);
  h_->WaitForState(j3, Job::SUCCEEDED);
  ticker.reset();
  workers.clear();
}

// Preemption at checkpoints (scheduler.h "Preemption"): 4 workers run jobs/1 and jobs/2 (priority
// 0, 2 workers each); jobs/3 (priority 10, 2 workers) arrives. The youngest victim (jobs/2) and
// only it gets CheckpointNow; at its CheckpointSaved(step 5, requested) it goes PENDING
// (PREEMPTED, "preempted at step 5"), its ranks get Stop and jobs/3 starts on them as one gang.
// jobs/1 is untouched. When jobs/3 ends, jobs/2 starts again (generation 2) on those workers.
TEST_F(SchedulerTest, PreemptsTheYoungestLowerPriorityJobAtItsCheckpoint) {
  ASSERT_NO_FATAL_FAILURE(StartFleet("sched_preempt.db", 4));
  auto spec = [](int priority) {
    v1::JobSpec s = api::testing::SmallSpec(2, 2);
    s.set_priority(priority);
    return s;
  };
  const std::string j1 = h_->Submit(spec(0));
  // Ranks go to the first idle workers by host, then id: w0 and w1.
  auto ranks1 = ExpectGeneration({Raw(*fleet_)[0], Raw(*fleet_)[1]}, j1, 1, 2);
  ASSERT_EQ(ranks1.size(), 2u);
  std::vector<FakeWorker*> rest;
  for (FakeWorker* w : Raw(*fleet_)) {
    if (w != ranks1[0] && w != ranks1[1]) rest.push_back(w);
  }
  const std::string j2 = h_->Submit(spec(0));
  auto ranks2 = ExpectGeneration(rest, j2, 1, 2);
  ASSERT_EQ(ranks2.size(), 2u);
  for (auto* ranks : {&ranks1, &ranks2}) {
    for (auto& [rank, w] : *ranks) w->SendStep(1, 5.0);
  }
  h_->WaitForState(j1, Job::RUNNING);
  h_->WaitForState(j2, Job::RUNNING);
  // An interval save of jobs/2 at step 4 is recorded (rank 0's report), not a preemption.
  auto saved = [&](FakeWorker* w, const std::string& job, int64_t generation, int32_t rank,
                   int64_t step, bool requested) {
    v1::WorkerMessage m;
    v1::CheckpointSaved* c = m.mutable_checkpoint_saved();
    c->set_job(job);
    c->set_generation(generation);
    c->set_rank(rank);
    c->set_step(step);
    c->set_dir(absl::StrCat("/ckpt/step_", step));
    c->set_requested(requested);
    w->SendRaw(m);
  };
  for (auto& [rank, w] : ranks2) saved(w, j2, 1, rank, 4, false);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!h_->hub()->GetJob(j2)->has_last_checkpoint_step() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(h_->hub()->GetJob(j2)->last_checkpoint_step(), 4);

  const std::string j3 = h_->Submit(spec(10));
  for (auto& [rank, w] : ranks2) {
    EXPECT_TRUE(w->WaitFor(CoordinatorMessage::kCheckpoint).has_value()) << "jobs/2 rank " << rank;
  }
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(h_->hub()->GetJob(j2)->state(), Job::RUNNING) << "stopped before its save";
  EXPECT_EQ(rest[0]->CountReceived(CoordinatorMessage::kStop), 0);
  for (auto& [rank, w] : ranks2) saved(w, j2, 1, rank, 5, true);
  Job preempted = h_->WaitForState(j2, Job::PENDING);
  EXPECT_EQ(preempted.last_checkpoint_step(), 5);
  EXPECT_EQ(preempted.restart_count(), 0) << "a preemption spends no restart";
  auto ranks3 = ExpectGeneration(rest, j3, 1, 2);
  EXPECT_EQ(ranks3.size(), 2u);
  for (auto& [rank, w] : ranks1) {
    EXPECT_EQ(w->CountReceived(CoordinatorMessage::kCheckpoint), 0) << "jobs/1 is not a victim";
    EXPECT_EQ(w->CountReceived(CoordinatorMessage::kStop), 0);
  }
  job_ = j2;
  PrintEvents();
  auto events = h_->registry()->ListEvents(j2);
  ASSERT_TRUE(events.ok());
  bool found = false;
  for (const v1::JobEvent& e : *events) {
    if (e.reason() == "PREEMPTED") {
      found = true;
      EXPECT_EQ(e.state(), Job::PENDING);
      EXPECT_NE(e.message().find("preempted at step 5 for " + j3), std::string::npos)
          << e.message();
    }
  }
  EXPECT_TRUE(found) << "no PREEMPTED event";
  EXPECT_TRUE(HasEvent(Job::RUNNING, "CHECKPOINT_SAVED"));

  // jobs/3 ends: jobs/2 resumes (generation 2) on the freed workers.
  for (auto& [rank, w] : ranks3) w->SendExit(0);
  h_->WaitForState(j3, Job::SUCCEEDED);
  auto again = ExpectGeneration(rest, j2, 2, 2);
  EXPECT_EQ(again.size(), 2u);
  for (auto& [rank, w] : again) w->SendExit(0);
  for (auto& [rank, w] : ranks1) w->SendExit(0);
  h_->WaitForState(j2, Job::SUCCEEDED);
  h_->WaitForState(j1, Job::SUCCEEDED);
}

// Preemption within a full queue (scheduler.h "Preemption"): queue a has a quota of 2. jobs/1
// (queue a, priority 0, 2 workers) and jobs/2 (default queue, priority -1, 1 worker) run on 3 of
// 4 workers; jobs/3 (queue a, priority 10, 2 workers) waits with QUEUE_QUOTA_EXCEEDED although
// one worker is idle. jobs/1, the lower-priority job of its queue, gets CheckpointNow and at its
// save goes PENDING (PREEMPTED); jobs/3 starts. jobs/2, of lower priority but another queue (its
// workers free none of queue a's quota), is never a victim.
TEST_F(SchedulerTest, PreemptsWithinAFullQueue) {
  h_ = Harness::Start("sched_queue_preempt.db", true, {}, {{"a", 2}});
  ASSERT_NE(h_, nullptr);
  fleet_ = std::make_unique<Fleet>(h_.get(), 4);
  auto spec = [](const std::string& queue, int priority, int workers) {
    v1::JobSpec s = api::testing::SmallSpec(workers, workers);
    s.set_queue(queue);
    s.set_priority(priority);
    return s;
  };
  const std::string j1 = h_->Submit(spec("a", 0, 2));
  auto ranks1 = ExpectGeneration({Raw(*fleet_)[0], Raw(*fleet_)[1]}, j1, 1, 2);
  ASSERT_EQ(ranks1.size(), 2u);
  std::vector<FakeWorker*> rest;
  for (FakeWorker* w : Raw(*fleet_)) {
    if (w != ranks1[0] && w != ranks1[1]) rest.push_back(w);
  }
  const std::string j2 = h_->Submit(spec("", -1, 1));
  auto ranks2 = ExpectGeneration({rest[0]}, j2, 1, 1);  // the first idle worker by id
  ASSERT_EQ(ranks2.size(), 1u);
  for (auto* ranks : {&ranks1, &ranks2}) {
    for (auto& [rank, w] : *ranks) w->SendStep(1, 5.0);
  }
  h_->WaitForState(j1, Job::RUNNING);
  h_->WaitForState(j2, Job::RUNNING);

  const std::string j3 = h_->Submit(spec("a", 10, 2));
  for (auto& [rank, w] : ranks1) {
    EXPECT_TRUE(w->WaitFor(CoordinatorMessage::kCheckpoint).has_value()) << "jobs/1 rank " << rank;
  }
  // The pass that preempted publishes why jobs/3 waits once it ends.
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10);
       h_->hub()->GetJob(j3)->queue_status().reason().empty() && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(h_->hub()->GetJob(j3)->queue_status().reason(), "QUEUE_QUOTA_EXCEEDED");
  for (auto& [rank, w] : ranks1) {
    v1::WorkerMessage m;
    v1::CheckpointSaved* c = m.mutable_checkpoint_saved();
    c->set_job(j1);
    c->set_generation(1);
    c->set_rank(rank);
    c->set_step(7);
    c->set_dir("/ckpt/step_7");
    c->set_requested(true);
    w->SendRaw(m);
  }
  Job preempted = h_->WaitForState(j1, Job::PENDING);
  EXPECT_EQ(preempted.last_checkpoint_step(), 7);
  // The first idle workers by id: jobs/1's two (the one idle before, rest[1], sorts after them).
  const std::vector<FakeWorker*> freed = {ranks1[0], ranks1[1]};
  auto ranks3 = ExpectGeneration(freed, j3, 1, 2);
  EXPECT_EQ(ranks3.size(), 2u);
  EXPECT_EQ(ranks2[0]->CountReceived(CoordinatorMessage::kCheckpoint), 0)
      << "another queue's job frees none of queue a's quota";
  EXPECT_EQ(ranks2[0]->CountReceived(CoordinatorMessage::kStop), 0);
  job_ = j1;
  PrintEvents();
  EXPECT_TRUE(HasEvent(Job::PENDING, "PREEMPTED"));

  for (auto& [rank, w] : ranks3) w->SendExit(0);
  h_->WaitForState(j3, Job::SUCCEEDED);
  auto again = ExpectGeneration(freed, j1, 2, 2);
  EXPECT_EQ(again.size(), 2u);
  for (auto& [rank, w] : again) w->SendExit(0);
  for (auto& [rank, w] : ranks2) w->SendExit(0);
  h_->WaitForState(j1, Job::SUCCEEDED);
  h_->WaitForState(j2, Job::SUCCEEDED);
}

// Scale-up at a checkpoint boundary (scheduler.h "Scale-up"): a job of [1, 4] workers runs on
// the only worker; a second worker attaches. After scale_up_delay (300 ms here) the running
// generation gets CheckpointNow; at its CheckpointSaved(step 3, requested) it goes PENDING
// (SCALING_UP, "scaling up from 1 to 2 worker(s) at step 3") and generation 2 runs on both.
TEST_F(SchedulerTest, ScalesUpAtACheckpointWhenAWorkerAttaches) {
  const char* dir = std::getenv("TEST_TMPDIR");
  api::WorkerPlaneOptions options =
      api::testing::FastOptions(absl::StrCat(dir != nullptr ? dir : "/tmp", "/checkpoints"));
  options.scheduler.scale_up_delay = absl::Milliseconds(300);
  h_ = Harness::Start("sched_scale_up.db", true, options);
  ASSERT_NE(h_, nullptr);
  fleet_ = std::make_unique<Fleet>(h_.get(), 1);
  FakeWorker* w0 = Raw(*fleet_)[0];
  job_ = h_->Submit(api::testing::SmallSpec(1, 4));
  auto ranks = ExpectGeneration({w0}, job_, 1, 1);
  ASSERT_EQ(ranks.size(), 1u);
  w0->SendStep(1, 5.0);
  h_->WaitForState(job_, Job::RUNNING);
  absl::SleepFor(absl::Milliseconds(600));
  EXPECT_EQ(w0->CountReceived(CoordinatorMessage::kCheckpoint), 0)
      << "no idle worker: nothing to grow onto";

  auto w1 = std::make_unique<FakeWorker>(api::testing::MakeChannel(h_->port()), "w1", "host-a");
  w1->Attach();
  fleet_->ticker->Add(w1.get());
  ASSERT_TRUE(w0->WaitFor(CoordinatorMessage::kCheckpoint).has_value());
  EXPECT_EQ(h_->hub()->GetJob(job_)->state(), Job::RUNNING);
  v1::WorkerMessage m;
  v1::CheckpointSaved* c = m.mutable_checkpoint_saved();
  c->set_job(job_);
  c->set_generation(1);
  c->set_rank(0);
  c->set_step(3);
  c->set_requested(true);
  w0->SendRaw(m);
  auto grown = ExpectGeneration({w0, w1.get()}, job_, 2, 2);
  EXPECT_EQ(grown.size(), 2u);
  Job job = *h_->hub()->GetJob(job_);
  EXPECT_EQ(job.last_checkpoint_step(), 3);
  EXPECT_EQ(job.restart_count(), 0);
  PrintEvents();
  auto events = h_->registry()->ListEvents(job_);
  ASSERT_TRUE(events.ok());
  bool found = false;
  for (const v1::JobEvent& e : *events) {
    if (e.reason() != "SCALING_UP") continue;
    found = true;
    EXPECT_NE(e.message().find("scaling up from 1 to 2 worker(s) at step 3"), std::string::npos)
        << e.message();
  }
  EXPECT_TRUE(found) << "no SCALING_UP event";
  // Generation 2 uses every attached worker: no further CheckpointNow.
  for (auto& [rank, w] : grown) w->SendStep(4, 4.0);
  absl::SleepFor(absl::Milliseconds(800));
  EXPECT_EQ(w1->CountReceived(CoordinatorMessage::kCheckpoint), 0);
  for (auto& [rank, w] : grown) w->SendExit(0);
  h_->WaitForState(job_, Job::SUCCEEDED);
  fleet_->ticker.reset();
  w1.reset();
}

TEST_F(SchedulerTest, NoFeasiblePlanFails) {
  ASSERT_NO_FATAL_FAILURE(StartFleet("sched_noplan.db", 2));
  v1::JobSpec spec = api::testing::SmallSpec(2, 2);
  spec.mutable_training()->set_global_batch_size(3);  // not divisible by 1 x 2
  job_ = h_->Submit(spec);
  Job failed = h_->WaitForState(job_, Job::FAILED);
  std::printf("failure_reason: %s\n", failed.failure_reason().c_str());
  EXPECT_NE(failed.failure_reason().find("NO_FEASIBLE_PLAN"), std::string::npos);
  EXPECT_NE(failed.failure_reason().find("global_batch_size"), std::string::npos);
  for (auto& w : fleet_->workers) EXPECT_EQ(w->CountReceived(CoordinatorMessage::kAssignment), 0);
}

// Fewer workers than max_workers and no mapping for them: the job waits PENDING, and its event
// quotes the planner's rule (more workers may help, so it is not failed).
TEST_F(SchedulerTest, InfeasibleWithTheWorkersAttachedWaitsQuotingTheRule) {
  ASSERT_NO_FATAL_FAILURE(StartFleet("sched_noplan_wait.db", 2));
  v1::JobSpec spec = api::testing::SmallSpec(2, 4);
  spec.mutable_training()->set_global_batch_size(3);  // 2 workers: not divisible by 1 x 2
  job_ = h_->Submit(spec);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  Job pending;
  while (absl::Now() < deadline) {
    pending = *h_->hub()->GetJob(job_);
    if (pending.last_event().reason() == "NO_FEASIBLE_PLAN") break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  std::printf("pending: %s: %s\n", pending.last_event().reason().c_str(),
              pending.last_event().message().c_str());
  EXPECT_EQ(pending.state(), Job::PENDING);
  EXPECT_EQ(pending.last_event().reason(), "NO_FEASIBLE_PLAN");
  EXPECT_NE(pending.last_event().message().find("with 2 worker(s), waiting for more"),
            std::string::npos);
  EXPECT_NE(pending.last_event().message().find("global_batch_size"), std::string::npos);
  for (auto& w : fleet_->workers) EXPECT_EQ(w->CountReceived(CoordinatorMessage::kAssignment), 0);
}

TEST_F(SchedulerTest, UnacknowledgedStopMarksWorkerLostThenRestarts) {
  ASSERT_NO_FATAL_FAILURE(StartFleet("sched_stuck.db", 3));
  ASSERT_NO_FATAL_FAILURE(SubmitGeneration1(api::testing::SmallSpec(2, 3), 3));
  FakeWorker* stuck = ranks_[1];
  stuck->set_ack_stop(false);  // heartbeats on, but never answers the Stop (stuck collective)
  const absl::Time failed_at = absl::Now();
  ranks_[0]->SendExit(139, "CUDA error");
  ASSERT_TRUE(stuck->WaitFor(CoordinatorMessage::kStop).has_value());
  auto end = stuck->WaitForEnd(absl::Seconds(10));
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->error_code(), grpc::StatusCode::UNAVAILABLE);
  std::printf("stuck worker's stream ended after %s (stop_timeout 3s): %s\n",
              absl::FormatDuration(absl::Now() - failed_at).c_str(), end->error_message().c_str());
  EXPECT_NE(end->error_message().find("did not acknowledge Stop"), std::string::npos);
  auto ranks2 = ExpectGeneration({ranks_[0], ranks_[2]}, job_, 2, 2);
  EXPECT_EQ(ranks2.size(), 2u);
  PrintEvents();
}

TEST_F(SchedulerTest, ReconnectWithinTimeoutKeepsTheRank) {
  ASSERT_NO_FATAL_FAILURE(StartFleet("sched_reconnect.db", 2));
  ASSERT_NO_FATAL_FAILURE(SubmitGeneration1(api::testing::SmallSpec(2, 2), 2));
  ReportStep1(1.0);

  // Rank 1's connection breaks; a CheckpointNow sent meanwhile waits in its queue.
  FakeWorker* old = ranks_[1];
  const v1::Assignment assignment = *old->assignment();
  old->set_heartbeating(false);
  EXPECT_TRUE(old->Close().ok());
  ASSERT_TRUE(h_->plane()->scheduler()->RequestCheckpoint(job_).ok());
  FakeWorker again(api::testing::MakeChannel(h_->port(), 7), old->id(), "host-a");
  again.set_assignment(assignment);
  again.Attach();
  fleet_->ticker->Add(&again);
  auto checkpoint = again.WaitFor(CoordinatorMessage::kCheckpoint);
  ASSERT_TRUE(checkpoint.has_value()) << "the queued CheckpointNow was not delivered";
  absl::SleepFor(absl::Milliseconds(1500));  // past heartbeat_timeout: nobody is LOST
  EXPECT_EQ(h_->plane()->registry()->Get(old->id())->state, cluster::WorkerState::kBusy);
  again.SendStep(2, 0.5);
  ranks_[0]->SendStep(2, 0.5);
  ranks_[0]->SendExit(0);
  again.SendExit(0);
  Job done = h_->WaitForState(job_, Job::SUCCEEDED);
  EXPECT_EQ(done.generation(), 1);
  EXPECT_EQ(done.restart_count(), 0);
  EXPECT_EQ(ranks_[0]->CountReceived(CoordinatorMessage::kStop), 0);
  std::printf("rank 1 reconnected on a new stream, got the queued CheckpointNow, kept its rank\n");
}

TEST_F(SchedulerTest, ReconnectWithAnotherGenerationRestarts) {
  ASSERT_NO_FATAL_FAILURE(StartFleet("sched_reconnect_other.db", 2));
  ASSERT_NO_FATAL_FAILURE(SubmitGeneration1(api::testing::SmallSpec(1, 2), 2));
  FakeWorker* old = ranks_[1];
  old->set_heartbeating(false);
  EXPECT_TRUE(old->Close().ok());
  FakeWorker again(api::testing::MakeChannel(h_->port(), 8), old->id(), "host-a");
  again.Attach();  // a restarted process: idle, heartbeats generation 0
  fleet_->ticker->Add(&again);
  ASSERT_TRUE(ranks_[0]->WaitFor(CoordinatorMessage::kStop).has_value());
  auto ranks2 = ExpectGeneration({ranks_[0], &again}, job_, 2, 2);
  EXPECT_EQ(ranks2.size(), 2u);
  PrintEvents();
  EXPECT_TRUE(HasEvent(Job::RESTARTING, "WORKER_LOST"));
}

TEST_F(SchedulerTest, WaitsWhenMoreWorkersCouldMakeAPlan) {
  ASSERT_NO_FATAL_FAILURE(StartFleet("sched_wait_plan.db", 3));
  v1::JobSpec spec = api::testing::SmallSpec(2, 6);
  spec.mutable_training()->set_global_batch_size(5);  // only a world of 5 (or 1) divides it
  job_ = h_->Submit(spec);
  absl::SleepFor(absl::Milliseconds(600));
  EXPECT_EQ(h_->hub()->GetJob(job_)->state(), Job::PENDING) << "3 workers < 5: wait, not FAILED";
  std::vector<std::unique_ptr<FakeWorker>> more;
  std::vector<FakeWorker*> all = Raw(*fleet_);
  for (int i = 0; i < 2; ++i) {
    more.push_back(std::make_unique<FakeWorker>(api::testing::MakeChannel(h_->port()),
                                                absl::StrCat("more", i), "host-b"));
    more.back()->Attach();
    fleet_->ticker->Add(more.back().get());
    all.push_back(more.back().get());
  }
  auto ranks = ExpectGeneration(all, job_, 1, 5);
  EXPECT_EQ(ranks.size(), 5u);
}

// No fleet: the only worker is one that claims a generation the coordinator never ran.
TEST_F(SchedulerTest, IdleWorkerRunningAnUnknownGenerationGetsOneStop) {
  auto h = Harness::Start("sched_zombie.db");
  ASSERT_NE(h, nullptr);
  FakeWorker zombie(api::testing::MakeChannel(h->port()), "zombie");
  v1::Assignment stale;
  stale.set_job("jobs/99");
  stale.set_generation(5);
  zombie.set_assignment(stale);
  zombie.set_ack_stop(false);
  zombie.Attach();
  HeartbeatTicker ticker({&zombie}, absl::Milliseconds(100));
  auto stop = zombie.WaitFor(CoordinatorMessage::kStop, absl::Seconds(5));
  ASSERT_TRUE(stop.has_value());
  std::printf("zombie got Stop: %s\n", stop->message.stop().reason().c_str());
  EXPECT_NE(stop->message.stop().reason().find("generation 5"), std::string::npos);
  absl::SleepFor(absl::Milliseconds(1200));  // two more rescans: no second Stop
  EXPECT_EQ(zombie.CountReceived(CoordinatorMessage::kStop), 1);
}

}  // namespace
}  // namespace switchyard::jobs
