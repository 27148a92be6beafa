// Two real agents against the coordinator's real worker side (coordinator/api/worker_plane.h:
// WorkerPlane with its registry, scheduler, planner, Attach service and rendezvous over a real
// SQLite store, through api::testing::Harness on loopback gRPC): a submitted 2-worker MoE job is
// planned, assigned, started, trained over Gloo with the rendezvous through the coordinator, and
// reaches SUCCEEDED from the agents' WorkerExit(0). Then one agent is shut down mid-job and the job
// goes through RESTARTING onto the remaining worker, resuming from the job's checkpoint. A stream
// the coordinator cuts is re-attached with the same worker_id and the job goes on. A job loads
// another job's checkpoint by naming it (training.load "jobs/<id>"); a named checkpoint that does
// not exist fails the job with the path and errno instead of training from scratch. Job-scoped
// agents (--job): a scoped worker is never given another job, two jobs each run on their own
// scoped workers, each worker leaves (Run returns OK: exit 0) once its job SUCCEEDED or was
// CANCELLED; a missing or finished job, a malformed --job and an unscoped worker under
// --require-job-scoped-workers are refused, naming the flag.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/job_paths.h"
#include "common/port_test_util.h"
#include "coordinator/api/auth.h"
#include "coordinator/api/rendezvous_service.h"
#include "coordinator/api/worker_test_util.h"
#include "gtest/gtest.h"
#include "worker/agent/agent.h"
#include "worker/agent/testing/running_agent.h"
#include "worker/checkpoint/checkpoint.h"

namespace switchyard::agent {
namespace {

using ::switchyard::testing::FreePort;
using testing::RunningAgent;
using testing::StartRunningAgent;
using testing::TmpDir;

namespace wt = api::testing;

std::unique_ptr<RunningAgent> StartAgent(const std::string& coordinator, const std::string& id,
                                         const std::string& token_file,
                                         const std::string& job = "") {
  AgentOptions o;
  o.job = job;
  o.coordinator = coordinator;
  o.roots = testing::TestRoots();
  o.token_file = token_file;
  o.device = "cpu";
  o.worker_id = id;
  o.heartbeat_interval = absl::Milliseconds(200);
  o.comm_timeout = absl::Seconds(10);
  return StartRunningAgent(o);
}

// A tiny version of the harness's SmallSpec (2 MoE layers, 12 experts) that trains in well under
// a second per step on a 2-core machine.
v1::JobSpec TinySpec(int min_workers, int max_workers, int64_t train_iters) {
  v1::JobSpec spec = wt::SmallSpec(min_workers, max_workers, /*max_restarts=*/2);
  v1::ModelConfig* m = spec.mutable_model();
  m->set_hidden_size(32);
  m->set_num_attention_heads(4);
  m->set_ffn_hidden_size(64);
  m->set_moe_ffn_hidden_size(16);
  m->set_vocab_size(64);
  m->set_seq_length(16);
  spec.mutable_training()->set_train_iters(train_iters);
  spec.mutable_training()->set_lr(0.003);
  return spec;
}

class AgentCoordinatorTest : public ::testing::Test {
 protected:
  // Waits until `n` workers are registered and idle (so the scheduler sees all of them).
  bool WaitForIdleWorkers(size_t n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      if (harness_->plane()->registry()->Idle().size() >= n) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  void SetUp() override {
    rendezvous_port_ = FreePort();
    // A fresh store numbers jobs from 1 again: each test gets its own checkpoint root, or job 1
    // of one test would resume from job 1 of the previous one.
    checkpoint_root_ = TmpDir(absl::StrCat(
        "checkpoints_", ::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(checkpoint_root_);
    api::WorkerPlaneOptions options = wt::FastOptions(checkpoint_root_);
    options.scheduler.rendezvous_address = absl::StrCat("127.0.0.1:", rendezvous_port_);
    Tweak(options);
    harness_ = wt::Harness::Start("agent_e2e.db", /*fresh=*/true, options);
    ASSERT_NE(harness_, nullptr);
    // The coordinator's RendezvousService over the plane's store, on the advertised port.
    // With the plane's registry: the agents' rendezvous calls must name a rank of the generation.
    auth_ = *api::TokenAuth::FromToken(wt::kWorkerToken, api::kWorkerRole);
    rendezvous_ = std::make_unique<api::RendezvousServiceImpl>(
        harness_->plane()->rendezvous(), auth_.get(), harness_->plane()->registry());
    grpc::ServerBuilder b;
    int bound = 0;
    b.AddListeningPort(options.scheduler.rendezvous_address, grpc::InsecureServerCredentials(),
                       &bound);
    b.RegisterService(rendezvous_.get());
    rendezvous_server_ = b.BuildAndStart();
    ASSERT_EQ(bound, rendezvous_port_);
    token_file_ = TmpDir("e2e_token");
    std::ofstream(token_file_) << wt::kWorkerToken << "\n";
  }
  void TearDown() override {
    for (auto& a : agents_) a->Stop();
    if (rendezvous_server_) rendezvous_server_->Shutdown(std::chrono::system_clock::now());
    if (harness_) harness_->Stop();
  }

  // Lets a derived fixture change the coordinator's options.
  virtual void Tweak(api::WorkerPlaneOptions& options) {}

  std::string checkpoint_root_;
  int rendezvous_port_ = 0;
  std::unique_ptr<wt::Harness> harness_;
  std::unique_ptr<api::TokenAuth> auth_;
  std::unique_ptr<api::RendezvousServiceImpl> rendezvous_;
  std::unique_ptr<grpc::Server> rendezvous_server_;
  std::string token_file_;
  std::vector<std::unique_ptr<RunningAgent>> agents_;
};

TEST_F(AgentCoordinatorTest, TwoAgentsRunAJobToSucceeded) {
  for (int i = 0; i < 2; ++i) {
    agents_.push_back(StartAgent(harness_->address(), absl::StrCat("agent-", i), token_file_));
    ASSERT_NE(agents_.back(), nullptr);
  }
  ASSERT_TRUE(WaitForIdleWorkers(2));
  const std::string name = harness_->Submit(TinySpec(2, 2, 5));
  const absl::Time t0 = absl::Now();
  v1::Job job = harness_->WaitForState(name, v1::Job::SUCCEEDED, absl::Seconds(120));
  std::printf("job %s: %s after %.1f s, generation %lld, last step %lld loss %.4f, reason '%s'\n",
              name.c_str(), v1::Job::State_Name(job.state()).c_str(),
              absl::ToDoubleSeconds(absl::Now() - t0), static_cast<long long>(job.generation()),
              static_cast<long long>(job.last_step().step()), job.last_step().loss(),
              job.failure_reason().c_str());
  ASSERT_EQ(job.state(), v1::Job::SUCCEEDED) << job.ShortDebugString();
  EXPECT_EQ(job.generation(), 1);
  for (auto& a : agents_) {
    EXPECT_EQ(a->agent->generation(), 0) << "idle after the job";
  }
}

TEST_F(AgentCoordinatorTest, ALostAgentRestartsTheJobOnTheOther) {
  for (int i = 0; i < 2; ++i) {
    agents_.push_back(StartAgent(harness_->address(), absl::StrCat("agent-", i), token_file_));
    ASSERT_NE(agents_.back(), nullptr);
  }
  // Elastic 1..2 workers, long enough to be interrupted, a checkpoint every 2 steps.
  v1::JobSpec spec = TinySpec(1, 2, 100000);
  spec.mutable_training()->set_save("ckpt_e2e");  // <root>/jobs/<id>/ckpt_e2e
  spec.mutable_training()->set_save_interval(2);
  ASSERT_TRUE(WaitForIdleWorkers(2));
  const std::string name = harness_->Submit(spec);
  auto get = [&] {
    absl::StatusOr<v1::Job> job = harness_->registry()->GetJob(name);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  };
  auto last_step = [&] {
    std::optional<v1::StepMetrics> s = harness_->plane()->steps()->LastStep(name);
    return s.has_value() ? s->step() : int64_t{0};
  };
  // Let it pass a checkpoint (step 2), then take agent-1 away (its process ends).
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline && last_step() < 4) absl::SleepFor(absl::Milliseconds(20));
  v1::Job job = get();
  ASSERT_GE(last_step(), 4) << job.ShortDebugString();
  ASSERT_EQ(job.state(), v1::Job::RUNNING) << job.ShortDebugString();
  const int64_t generation = job.generation();
  std::printf("generation %lld running at step %lld: shutting agent-1 down\n",
              static_cast<long long>(generation), static_cast<long long>(last_step()));
  agents_[1]->Stop();
  EXPECT_TRUE(agents_[1]->result.ok()) << agents_[1]->result;
  // The coordinator restarts the job on agent-0 alone; it resumes from a checkpoint.
  const absl::Time t0 = absl::Now();
  deadline = t0 + absl::Seconds(60);
  while (absl::Now() < deadline) {
    job = get();
    if (job.generation() > generation && job.state() == v1::Job::RUNNING &&
        agents_[0]->agent->generation() == job.generation()) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  const int64_t at_restart = last_step();
  // The new generation trains: the job's last step moves on.
  const absl::Time t1 = absl::Now();
  while (absl::Now() - t1 < absl::Seconds(30) && last_step() < at_restart + 4) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::printf(
      "after the loss: %s, generation %lld on agent-0 alone (%.1f s after the stop), "
      "last step %lld -> %lld\n",
      v1::Job::State_Name(job.state()).c_str(), static_cast<long long>(job.generation()),
      absl::ToDoubleSeconds(t1 - t0), static_cast<long long>(at_restart),
      static_cast<long long>(last_step()));
  EXPECT_GT(job.generation(), generation);
  EXPECT_EQ(job.state(), v1::Job::RUNNING) << job.ShortDebugString();
  EXPECT_EQ(agents_[0]->agent->generation(), job.generation());
  EXPECT_GE(last_step(), at_restart + 4) << "the new generation makes progress";
}

TEST_F(AgentCoordinatorTest, ACutStreamReattachesAndTheJobContinues) {
  agents_.push_back(StartAgent(harness_->address(), "agent-k", token_file_));
  ASSERT_NE(agents_.back(), nullptr);
  ASSERT_TRUE(WaitForIdleWorkers(1));
  v1::JobSpec spec = TinySpec(1, 1, 100000);
  spec.mutable_training()->set_save("ckpt_k");
  spec.mutable_training()->set_save_interval(2);
  const std::string name = harness_->Submit(spec);
  auto last_step = [&] {
    std::optional<v1::StepMetrics> s = harness_->plane()->steps()->LastStep(name);
    return s.has_value() ? s->step() : int64_t{0};
  };
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline && last_step() < 4) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_GE(last_step(), 4);
  // The coordinator ends the stream (as for a worker it marked LOST).
  harness_->plane()->worker_service()->Kick("agent-k", "test: stream cut");
  const absl::Time t0 = absl::Now();
  v1::Job job;
  deadline = t0 + absl::Seconds(60);
  while (absl::Now() < deadline) {
    absl::StatusOr<v1::Job> j = harness_->registry()->GetJob(name);
    ASSERT_TRUE(j.ok()) << j.status();
    job = *j;
    // Either re-adopted (same generation) or restarted (a new one) on the re-attached agent.
    if (agents_[0]->agent->sessions() >= 1 && job.state() == v1::Job::RUNNING &&
        agents_[0]->agent->generation() == job.generation()) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  const int64_t at = last_step();
  deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline && last_step() < at + 4) absl::SleepFor(absl::Milliseconds(20));
  std::printf(
      "after the cut: %s generation %lld on agent-k (sessions %lld) after %.1f s, last "
      "step %lld -> %lld\n",
      v1::Job::State_Name(job.state()).c_str(), static_cast<long long>(job.generation()),
      static_cast<long long>(agents_[0]->agent->sessions()),
      absl::ToDoubleSeconds(absl::Now() - t0), static_cast<long long>(at),
      static_cast<long long>(last_step()));
  EXPECT_EQ(job.state(), v1::Job::RUNNING) << job.ShortDebugString();
  EXPECT_EQ(agents_[0]->agent->generation(), job.generation());
  EXPECT_GE(agents_[0]->agent->sessions(), 1) << "the first stream ended, a second one runs";
  EXPECT_EQ(harness_->plane()->worker_service()->open_streams(), 1);
  EXPECT_GE(last_step(), at + 4);
}

// Job A trains 4 steps and checkpoints; job B names A's checkpoint (training.load "jobs/<A>"),
// resumes at A's step 4 and writes its own checkpoints under its own directory; job C names a
// checkpoint that does not exist and FAILS naming it, instead of training from scratch.
TEST_F(AgentCoordinatorTest, AJobLoadsAnotherJobsCheckpointByName) {
  agents_.push_back(StartAgent(harness_->address(), "agent-l", token_file_));
  ASSERT_NE(agents_.back(), nullptr);
  ASSERT_TRUE(WaitForIdleWorkers(1));
  const std::string& root = checkpoint_root_;
  v1::JobSpec a_spec = TinySpec(1, 1, 4);
  a_spec.mutable_training()->set_save_interval(2);
  const std::string a = harness_->Submit(a_spec);
  v1::Job job = harness_->WaitForState(a, v1::Job::SUCCEEDED, absl::Seconds(120));
  ASSERT_EQ(job.state(), v1::Job::SUCCEEDED) << job.ShortDebugString();
  const std::string a_dir = absl::StrCat(root, "/", a);  // <root>/jobs/<id>
  absl::StatusOr<Checkpoint> a_ckpt = LoadCheckpoint(a_dir);
  ASSERT_TRUE(a_ckpt.ok()) << a_ckpt.status();
  EXPECT_EQ(a_ckpt->step(), 4);

  v1::JobSpec b_spec = TinySpec(1, 1, 6);
  b_spec.mutable_training()->set_save_interval(2);
  b_spec.mutable_training()->set_load(a);  // "jobs/<id of A>"
  const std::string b = harness_->Submit(b_spec);
  job = harness_->WaitForState(b, v1::Job::SUCCEEDED, absl::Seconds(120));
  ASSERT_EQ(job.state(), v1::Job::SUCCEEDED) << job.ShortDebugString();
  const std::string b_dir = absl::StrCat(root, "/", b);
  absl::StatusOr<Checkpoint> b_ckpt = LoadCheckpoint(b_dir);
  ASSERT_TRUE(b_ckpt.ok()) << b_ckpt.status();
  const bool b_has_step_2 = LoadCheckpoint(b_dir, 2).ok();
  std::printf("%s loaded %s (step %lld): own checkpoint step %lld, own step_2 %s\n", b.c_str(),
              a.c_str(), static_cast<long long>(a_ckpt->step()),
              static_cast<long long>(b_ckpt->step()), b_has_step_2 ? "present" : "absent");
  EXPECT_EQ(b_ckpt->step(), 6);
  EXPECT_FALSE(b_has_step_2) << "B started at A's step 4, it never was at step 2";
  EXPECT_TRUE(LoadCheckpoint(a_dir, 4).ok()) << "A's checkpoint is untouched";
  EXPECT_FALSE(LoadCheckpoint(a_dir, 6).ok()) << "B wrote into its own directory only";

  v1::JobSpec c_spec = TinySpec(1, 1, 4);
  c_spec.mutable_training()->set_load("jobs/999/step_4");
  const std::string c = harness_->Submit(c_spec);
  job = harness_->WaitForState(c, v1::Job::FAILED, absl::Seconds(120));
  std::printf("%s with load jobs/999/step_4: %s '%s'\n", c.c_str(),
              v1::Job::State_Name(job.state()).c_str(), job.failure_reason().c_str());
  ASSERT_EQ(job.state(), v1::Job::FAILED) << job.ShortDebugString();
  EXPECT_TRUE(absl::StrContains(job.failure_reason(), "training.load")) << job.failure_reason();
  EXPECT_TRUE(absl::StrContains(job.failure_reason(), root + "/jobs/999/step_4"))
      << job.failure_reason();
  EXPECT_TRUE(absl::StrContains(job.failure_reason(), "No such file or directory"))
      << job.failure_reason();
}

// --- job-scoped workers (switchyard-worker --job; one Kubernetes pod set per job) ------------

// Waits until the agent has its JobEnded and has closed its stream by itself (the registry shows
// it disconnected), then joins it: Run's result is what the process exit code comes from.
bool WaitForScopedExit(wt::Harness* harness, RunningAgent* a, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::optional<cluster::WorkerInfo> w = harness->plane()->registry()->Get(a->agent->worker_id());
    if (!a->agent->job_end_state().empty() && w.has_value() && !w->connected) {
      a->Stop();  // joins; Run has returned already
      return true;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

TEST_F(AgentCoordinatorTest, ScopedWorkersRunOnlyTheirJobAndExitWhenItEnds) {
  // job-1 needs one worker, job-2 two. The first worker is scoped to job-2: while it is idle and
  // job-1 is pending, it must never get job-1.
  const std::string job1 = harness_->Submit(TinySpec(1, 1, 3));
  const std::string job2 = harness_->Submit(TinySpec(2, 2, 3));
  agents_.push_back(StartAgent(harness_->address(), "scoped-2a", token_file_, job2));
  ASSERT_NE(agents_.back(), nullptr);
  ASSERT_TRUE(WaitForIdleWorkers(1));
  const absl::Time watch_until = absl::Now() + absl::Seconds(3);
  while (absl::Now() < watch_until) {
    std::optional<cluster::WorkerInfo> w = harness_->plane()->registry()->Get("scoped-2a");
    ASSERT_TRUE(w.has_value());
    ASSERT_EQ(w->state, cluster::WorkerState::kIdle) << "assigned " << w->job;
    ASSERT_EQ(harness_->registry()->GetJob(job1)->state(), v1::Job::PENDING);
    absl::SleepFor(absl::Milliseconds(50));
  }
  const v1::Job waiting = *harness_->registry()->GetJob(job1);
  std::printf("after 3 s with only a worker scoped to %s: %s %s, last event %s: %s\n", job2.c_str(),
              job1.c_str(), v1::Job::State_Name(waiting.state()).c_str(),
              waiting.last_event().reason().c_str(), waiting.last_event().message().c_str());
  EXPECT_EQ(waiting.last_event().reason(), "WAITING_FOR_WORKERS");
  EXPECT_TRUE(absl::StrContains(waiting.last_event().message(), "needs 1 worker(s), 0 attached"))
      << waiting.last_event().message();

  // Each job gets its own scoped workers; both succeed and every worker exits by itself.
  agents_.push_back(StartAgent(harness_->address(), "scoped-1", token_file_, job1));
  agents_.push_back(StartAgent(harness_->address(), "scoped-2b", token_file_, job2));
  for (const std::string& name : {job1, job2}) {
    const v1::Job job = harness_->WaitForState(name, v1::Job::SUCCEEDED, absl::Seconds(120));
    std::printf("%s: %s, generation %lld, last step %lld\n", name.c_str(),
                v1::Job::State_Name(job.state()).c_str(), static_cast<long long>(job.generation()),
                static_cast<long long>(job.last_step().step()));
    ASSERT_EQ(job.state(), v1::Job::SUCCEEDED) << job.ShortDebugString();
  }
  for (auto& a : agents_) {
    ASSERT_TRUE(WaitForScopedExit(harness_.get(), a.get(), absl::Seconds(20)))
        << a->agent->worker_id() << " did not leave after its job ended";
    std::printf("%s: JobEnded %s, Run returned %s\n", a->agent->worker_id().c_str(),
                a->agent->job_end_state().c_str(), a->result.ToString().c_str());
    EXPECT_EQ(a->agent->job_end_state(), "SUCCEEDED");
    EXPECT_TRUE(a->result.ok()) << a->result;  // the process exits 0
  }
}

TEST_F(AgentCoordinatorTest, ACancelledJobReleasesItsScopedWorker) {
  const std::string name = harness_->Submit(TinySpec(1, 1, 100000));
  agents_.push_back(StartAgent(harness_->address(), "scoped-c", token_file_, name));
  ASSERT_NE(agents_.back(), nullptr);
  harness_->WaitForState(name, v1::Job::RUNNING, absl::Seconds(60));
  ASSERT_TRUE(harness_->hub()->CancelJob(name).ok());
  harness_->plane()->scheduler()->OnJobChanged();
  ASSERT_TRUE(WaitForScopedExit(harness_.get(), agents_.back().get(), absl::Seconds(30)));
  std::printf("cancelled %s: its worker got JobEnded %s and Run returned %s\n", name.c_str(),
              agents_.back()->agent->job_end_state().c_str(),
              agents_.back()->result.ToString().c_str());
  EXPECT_EQ(agents_.back()->agent->job_end_state(), "CANCELLED");
  EXPECT_TRUE(agents_.back()->result.ok()) << agents_.back()->result;
}

// A scoped worker away (stream cut) while its job ends misses JobEnded; attaching again it is
// refused (the job is finished), and since it ran the job it leaves with Run OK (exit 0), not as a
// permanent error: the Kubernetes pod completes instead of failing.
TEST_F(AgentCoordinatorTest, AScopedWorkerThatMissedJobEndedLeavesOkOnReattach) {
  const std::string name = harness_->Submit(TinySpec(1, 1, 100000));
  AgentOptions o;
  o.coordinator = harness_->address();
  o.roots = testing::TestRoots();
  o.token_file = token_file_;
  o.device = "cpu";
  o.worker_id = "scoped-away";
  o.job = name;
  o.heartbeat_interval = absl::Milliseconds(200);
  o.comm_timeout = absl::Seconds(10);
  o.reconnect_initial_backoff = absl::Seconds(1);  // the job ends well before it is back
  o.reconnect_max_backoff = absl::Seconds(2);
  agents_.push_back(StartRunningAgent(o));
  ASSERT_NE(agents_.back(), nullptr);
  ASSERT_EQ(harness_->WaitForState(name, v1::Job::RUNNING, absl::Seconds(60)).state(),
            v1::Job::RUNNING);
  harness_->plane()->worker_service()->Kick("scoped-away", "test: stream cut");
  ASSERT_TRUE(harness_->hub()->CancelJob(name).ok());
  harness_->plane()->scheduler()->OnJobChanged();
  RunningAgent* a = agents_.back().get();
  a->thread.join();  // Run ends by itself
  a->thread = std::thread();
  std::printf("after %lld sessions: JobEnded '%s', Run returned %s\n",
              static_cast<long long>(a->agent->sessions()), a->agent->job_end_state().c_str(),
              a->result.ToString().c_str());
  EXPECT_GE(a->agent->sessions(), 2);        // it attached again
  EXPECT_EQ(a->agent->job_end_state(), "");  // and learnt the end from the refusal
  EXPECT_TRUE(a->result.ok()) << a->result;  // exit 0
}

TEST_F(AgentCoordinatorTest, ScopeToAMissingOrFinishedJobIsRefusedNamingTheFlag) {
  auto run_scoped = [&](const std::string& id, const std::string& job) {
    std::unique_ptr<RunningAgent> a = StartAgent(harness_->address(), id, token_file_, job);
    EXPECT_NE(a, nullptr);
    if (a == nullptr) return absl::InternalError("not started");
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline && a->agent->sessions() == 0) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    a->thread.join();  // a permanent refusal ends Run by itself
    a->thread = std::thread();
    return a->result;
  };
  const absl::Status missing = run_scoped("scoped-missing", "jobs/99");
  std::printf("--job jobs/99 (no such job): %s\n", missing.ToString().c_str());
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.message(), "--job jobs/99")) << missing;

  const std::string name = harness_->Submit(TinySpec(1, 1, 3));
  ASSERT_TRUE(harness_->hub()->CancelJob(name).ok());
  const absl::Status finished = run_scoped("scoped-finished", name);
  std::printf("--job %s (CANCELLED): %s\n", name.c_str(), finished.ToString().c_str());
  EXPECT_EQ(finished.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(finished.message(), "--job " + name)) << finished;
  EXPECT_TRUE(absl::StrContains(finished.message(), "CANCELLED")) << finished;
  EXPECT_FALSE(harness_->plane()->registry()->Get("scoped-missing").has_value());
  EXPECT_FALSE(harness_->plane()->registry()->Get("scoped-finished").has_value());

  // A malformed --job is refused before anything connects.
  for (const std::string bad : {"3", "jobs/", "jobs/0", "jobs/03", "jobs/3/x", "job/3"}) {
    AgentOptions o;
    o.coordinator = harness_->address();
    o.roots = testing::TestRoots();
    o.device = "cpu";
    o.job = bad;
    absl::StatusOr<std::unique_ptr<Agent>> agent = Agent::Create(o);
    std::printf("--job \"%s\": %s\n", bad.c_str(), agent.status().ToString().c_str());
    EXPECT_EQ(agent.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(agent.status().message(), "--job")) << agent.status();
  }
}

class RequireScopedTest : public AgentCoordinatorTest {
 protected:
  void Tweak(api::WorkerPlaneOptions& options) override {
    options.service.require_job_scoped_workers = true;
  }
};

TEST_F(RequireScopedTest, AnUnscopedWorkerIsRefusedAndAScopedOneRuns) {
  std::unique_ptr<RunningAgent> unscoped = StartAgent(harness_->address(), "unscoped", token_file_);
  ASSERT_NE(unscoped, nullptr);
  unscoped->thread.join();  // refused permanently: Run ends by itself
  unscoped->thread = std::thread();
  std::printf("unscoped worker: %s\n", unscoped->result.ToString().c_str());
  EXPECT_EQ(unscoped->result.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(unscoped->result.message(), "--require-job-scoped-workers"))
      << unscoped->result;
  EXPECT_FALSE(harness_->plane()->registry()->Get("unscoped").has_value());

  const std::string name = harness_->Submit(TinySpec(1, 1, 3));
  agents_.push_back(StartAgent(harness_->address(), "scoped", token_file_, name));
  ASSERT_NE(agents_.back(), nullptr);
  EXPECT_EQ(harness_->WaitForState(name, v1::Job::SUCCEEDED, absl::Seconds(120)).state(),
            v1::Job::SUCCEEDED);
  ASSERT_TRUE(WaitForScopedExit(harness_.get(), agents_.back().get(), absl::Seconds(20)));
  EXPECT_TRUE(agents_.back()->result.ok()) << agents_.back()->result;
}

}  // namespace
}  // namespace switchyard::agent
