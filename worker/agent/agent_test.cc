// The worker agent against a real gRPC fake coordinator on loopback (testing/fake_coordinator.h):
// two agents (threads of this process, each with its own channel, Gloo transport and trainer)
// train a tiny CPU MoE job over Gloo through Assignment -> Start -> StepReports -> WorkerExit(0);
// a Stop mid-training ends the generation with 143 on both and they go idle; a second
// assignment (world 1) resumes from the CheckpointNow checkpoint and finishes; the agent's
// /metrics is scraped over HTTP; a stream cut by the coordinator is re-attached with the same
// worker_id while training goes on; a missing or wrong token is rejected with a clear error.
#include "worker/agent/agent.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config/config.h"
#include "data/indexed_dataset.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "worker/agent/testing/fake_coordinator.h"
#include "worker/agent/testing/running_agent.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/train/testing/tiny_moe_spec.h"
#include "worker/train/trainer.h"

namespace switchyard::agent {
namespace {

using testing::RunningAgent;
using testing::StartRunningAgent;
using testing::TmpDir;

using testing::FakeCoordinator;
using testing::WorkerRecord;
using Workers = std::map<std::string, WorkerRecord>;

// worker/train/distributed_trainer_test.cc's model: two MoE layers (0 and 2) and a dense one,
// 8 experts (EP = 2 holds 4 per rank), 8 micro-batches of one 16-token sequence per step.
const std::string kSpec = switchyard::test_specs::TinyMoeSpecYaml(6, /*jitter=*/false);
constexpr int64_t kTokensPerStep = 8 * 16;
constexpr char kToken[] = "s3cret-token";

std::string WriteTokenFile(const std::string& name, const std::string& token) {
  const std::string path = TmpDir(name);
  std::ofstream(path) << token << "\n";
  return path;
}

v1::CoordinatorMessage AssignmentMsg(const std::string& job, int64_t generation, int rank,
                                     int world, int64_t train_iters, const std::string& ckpt,
                                     const std::string& rendezvous) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(kSpec);
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->mutable_parallel()->set_world_size(world);
  spec->mutable_parallel()->set_expert_model_parallel_size(world);
  spec->mutable_training()->set_train_iters(train_iters);
  spec->mutable_training()->set_save(ckpt);
  spec->mutable_training()->set_load(ckpt);
  v1::CoordinatorMessage msg;
  v1::Assignment* a = msg.mutable_assignment();
  a->set_job(job);
  a->set_generation(generation);
  a->set_rank(rank);
  a->set_world_size(world);
  *a->mutable_spec() = *spec;
  a->mutable_mapping()->set_expert_model_parallel_size(world);
  a->mutable_mapping()->set_data_parallel_size(world);
  a->set_rendezvous_address(rendezvous);
  return msg;
}

v1::CoordinatorMessage StartMsg() {
  v1::CoordinatorMessage m;
  m.mutable_start();
  return m;
}
v1::CoordinatorMessage StopMsg(const std::string& reason) {
  v1::CoordinatorMessage m;
  m.mutable_stop()->set_reason(reason);
  return m;
}
v1::CoordinatorMessage CheckpointMsg() {
  v1::CoordinatorMessage m;
  m.mutable_checkpoint();
  return m;
}

// Step reports of (job, generation) from one worker.
std::vector<v1::StepReport> StepsOf(const WorkerRecord& w, const std::string& job, int64_t gen) {
  std::vector<v1::StepReport> out;
  for (const v1::StepReport& s : w.steps) {
    if (s.job() == job && s.generation() == gen) out.push_back(s);
  }
  return out;
}
const v1::WorkerExit* ExitOf(const WorkerRecord& w, const std::string& job, int64_t gen) {
  for (const v1::WorkerExit& e : w.exits) {
    if (e.job() == job && e.generation() == gen) return &e;
  }
  return nullptr;
}
bool HasExit(const Workers& ws, const std::string& id, const std::string& job, int64_t gen) {
  auto it = ws.find(id);
  return it != ws.end() && ExitOf(it->second, job, gen) != nullptr;
}
size_t NumSteps(const Workers& ws, const std::string& id, const std::string& job, int64_t gen) {
  auto it = ws.find(id);
  return it == ws.end() ? 0 : StepsOf(it->second, job, gen).size();
}
// Idle again: a heartbeat with generation 0 after the last exit.
bool Idle(const Workers& ws, const std::string& id) {
  auto it = ws.find(id);
  return it != ws.end() && it->second.heartbeats_since_last_exit > 0 &&
         it->second.last_heartbeat_generation == 0;
}

std::unique_ptr<RunningAgent> StartAgent(const FakeCoordinator& fake, const std::string& id,
                                         const std::string& token_file, int metrics_port) {
  AgentOptions o;
  o.coordinator = fake.address();
  o.roots = testing::TestRoots();
  o.token_file = token_file;
  o.device = "cpu";
  o.heartbeat_interval = absl::Milliseconds(100);
  o.metrics_port = metrics_port;
  o.metrics_bind_address = "127.0.0.1";
  // Bounds how long a rank stuck in a Gloo collective after a Stop unwinds in the background.
  o.comm_timeout = absl::Seconds(10);
  o.worker_id = id;
  o.reconnect_initial_backoff = absl::Milliseconds(50);
  o.reconnect_max_backoff = absl::Milliseconds(500);
  return StartRunningAgent(o);
}

void ExpectSane(const v1::StepReport& s, int rank) {
  const v1::StepMetrics& m = s.metrics();
  EXPECT_EQ(s.rank(), rank);
  EXPECT_TRUE(std::isfinite(m.loss()) && m.loss() > 0) << m.ShortDebugString();
  EXPECT_GT(m.step_ms(), 0);
  EXPECT_GT(m.tokens_per_second(), 0);
  EXPECT_GT(m.tflops(), 0);
  // Warm-up starts from lr 0 (Megatron's schedule at step 0).
  if (m.step() > 1) {
    EXPECT_GT(m.lr(), 0);
  }
  EXPECT_GE(m.lr(), 0);
  EXPECT_GT(m.grad_norm(), 0);
  ASSERT_EQ(m.expert_load_size(), 2) << "one summary per MoE layer";
  EXPECT_EQ(m.expert_load(0).layer(), 0);
  EXPECT_EQ(m.expert_load(1).layer(), 2);
  for (const v1::ExpertLoad& l : m.expert_load()) {
    ASSERT_EQ(l.tokens_per_expert_size(), 8);
    int64_t sum = 0;
    for (int64_t t : l.tokens_per_expert()) sum += t;
    EXPECT_EQ(sum, kTokensPerStep * 2) << "top-2 over the whole global batch";
    EXPECT_DOUBLE_EQ(l.mean_tokens(), kTokensPerStep * 2 / 8.0);
    EXPECT_LE(l.min_tokens(), l.mean_tokens());
    EXPECT_GE(l.max_tokens(), l.mean_tokens());
    EXPECT_NEAR(l.imbalance(), l.max_tokens() / l.mean_tokens(), 1e-12);
  }
}

// Values of the series `name` (with labels) in a text exposition: "name{labels}" -> value.
std::map<std::string, double> Series(const std::string& text, const std::string& name) {
  std::map<std::string, double> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    const std::string series(line.substr(0, space));
    if (series != name && !absl::StartsWith(series, name + "{")) continue;
    out[series] = std::strtod(std::string(line.substr(space + 1)).c_str(), nullptr);
  }
  return out;
}

// GET /metrics of the agent on `port`; empty (with a failure) when the scrape fails.
std::string ScrapeMetrics(int port) {
  EXPECT_GT(port, 0);
  httplib::Client client("127.0.0.1", port);
  httplib::Result res = client.Get("/metrics");
  EXPECT_TRUE(res) << "scrape failed: " << httplib::to_string(res.error());
  if (!res) return "";
  EXPECT_EQ(res->status, 200);
  std::printf("scraped http://127.0.0.1:%d/metrics (%zu bytes)\n", port, res->body.size());
  return res->body;
}

// An idle agent's /metrics: every step gauge is back to 0 and no per-layer series is left, so a
// dashboard never shows an ended job's numbers as current.
void ExpectMetricsReset(int port, const char* when) {
  const std::string text = ScrapeMetrics(port);
  std::printf("/metrics %s:\n", when);
  for (const char* name :
       {"switchyard_worker_step", "switchyard_worker_step_seconds",
        "switchyard_worker_tokens_per_second", "switchyard_worker_tflops", "switchyard_worker_mfu",
        "switchyard_worker_loss", "switchyard_worker_aux_loss", "switchyard_worker_grad_norm",
        "switchyard_worker_lr", "switchyard_worker_generation"}) {
    std::map<std::string, double> s = Series(text, name);
    ASSERT_EQ(s.size(), 1u) << name << " " << when << "\n" << text;
    std::printf("  %s %g\n", name, s.begin()->second);
    EXPECT_EQ(s.begin()->second, 0) << name << " " << when;
  }
  for (const char* name :
       {"switchyard_worker_expert_tokens_min", "switchyard_worker_expert_tokens_max",
        "switchyard_worker_expert_tokens_mean", "switchyard_worker_expert_load_imbalance"}) {
    EXPECT_TRUE(Series(text, name).empty()) << name << " " << when << "\n" << text;
  }
}

TEST(AgentTest, TrainStopResumeMetrics) {
  FakeCoordinator fake(kToken);
  const std::string token_file = WriteTokenFile("token", kToken);
  auto a0 = StartAgent(fake, "w0", token_file, /*metrics_port=*/0);
  auto a1 = StartAgent(fake, "w1", token_file, /*metrics_port=*/-1);
  ASSERT_TRUE(a0 && a1);
  ASSERT_TRUE(fake.WaitUntil(
      [](const Workers& ws) {
        return ws.count("w0") && ws.count("w1") && ws.at("w0").heartbeats > 0 &&
               ws.at("w1").heartbeats > 0;
      },
      absl::Seconds(20)));
  {
    Workers ws = fake.Workers();
    ASSERT_EQ(ws.size(), 2u);
    for (const auto& [id, w] : ws) {
      std::printf("registered %s: host %s version %s gpu %s, heartbeat generation %lld\n",
                  id.c_str(), w.registration.host().c_str(), w.registration.version().c_str(),
                  w.registration.has_gpu() ? w.registration.gpu().name().c_str() : "(none: CPU)",
                  static_cast<long long>(w.last_heartbeat_generation));
      EXPECT_FALSE(w.registration.host().empty());
      EXPECT_FALSE(w.registration.version().empty());
      EXPECT_FALSE(w.registration.has_gpu());
      EXPECT_EQ(w.last_heartbeat_generation, 0);
    }
  }

  // Job A: world 2, EP 2, to completion.
  const std::string ckpt_a = TmpDir("ckpt_a");
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(fake.Send(absl::StrCat("w", r),
                          AssignmentMsg("job-a", 1, r, 2, 6, ckpt_a, fake.address())));
  }
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(fake.Send(absl::StrCat("w", r), StartMsg()));
  ASSERT_TRUE(fake.WaitUntil(
      [](const Workers& ws) {
        return HasExit(ws, "w0", "job-a", 1) && HasExit(ws, "w1", "job-a", 1);
      },
      absl::Seconds(120)));
  {
    Workers ws = fake.Workers();
    std::vector<std::vector<v1::StepReport>> steps;
    for (int r = 0; r < 2; ++r) {
      const WorkerRecord& w = ws.at(absl::StrCat("w", r));
      const v1::WorkerExit* e = ExitOf(w, "job-a", 1);
      std::printf("job-a rank %d: exit %d (%s), %zu step reports\n", r, e->exit_code(),
                  e->message().c_str(), StepsOf(w, "job-a", 1).size());
      EXPECT_EQ(e->exit_code(), 0) << e->message();
      steps.push_back(StepsOf(w, "job-a", 1));
      ASSERT_EQ(steps[r].size(), 6u);
      for (int i = 0; i < 6; ++i) {
        EXPECT_EQ(steps[r][i].metrics().step(), i + 1);
        ExpectSane(steps[r][i], r);
      }
    }
    for (int i = 0; i < 6; ++i) {
      const v1::StepMetrics &m0 = steps[0][i].metrics(), &m1 = steps[1][i].metrics();
      std::printf("  step %lld loss %.6f / %.6f  grad norm %.5f  imbalance L0 %.3f L2 %.3f\n",
                  static_cast<long long>(m0.step()), m0.loss(), m1.loss(), m0.grad_norm(),
                  m0.expert_load(0).imbalance(), m0.expert_load(1).imbalance());
      // The loss and the expert counts are all-reduced over the ranks: identical reports.
      EXPECT_EQ(m0.loss(), m1.loss());
      EXPECT_EQ(m0.expert_load(0).tokens_per_expert(3), m1.expert_load(0).tokens_per_expert(3));
    }
    EXPECT_LT(steps[0][5].metrics().loss(), steps[0][0].metrics().loss()) << "it learns";
    absl::StatusOr<Checkpoint> ck = LoadCheckpoint(ckpt_a);
    ASSERT_TRUE(ck.ok()) << ck.status();
    EXPECT_EQ(ck->step(), 6) << "final checkpoint";
    std::vector<std::string> keys = fake.RendezvousKeys();
    std::printf("rendezvous keys through the coordinator: %zu (e.g. %s)\n", keys.size(),
                keys.empty() ? "-" : keys.front().c_str());
    EXPECT_FALSE(keys.empty());
    for (const std::string& k : keys) EXPECT_TRUE(absl::StartsWith(k, "job-a/1/")) << k;
  }
  ASSERT_TRUE(fake.WaitUntil([](const Workers& ws) { return Idle(ws, "w0") && Idle(ws, "w1"); },
                             absl::Seconds(10)))
      << "heartbeats with generation 0 after WorkerExit";

  // The agent's /metrics after the job ended: no series keeps job A's numbers.
  ExpectMetricsReset(a0->agent->metrics_port(), "after job-a finished");

  // Job B: long, CheckpointNow, then Stop mid-training.
  const std::string ckpt_b = TmpDir("ckpt_b");
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(fake.Send(absl::StrCat("w", r),
                          AssignmentMsg("job-b", 1, r, 2, 1000000, ckpt_b, fake.address())));
  }
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(fake.Send(absl::StrCat("w", r), StartMsg()));
  ASSERT_TRUE(fake.WaitUntil(
      [](const Workers& ws) {
        return NumSteps(ws, "w0", "job-b", 1) >= 3 && NumSteps(ws, "w1", "job-b", 1) >= 3;
      },
      absl::Seconds(120)));
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(fake.Send(absl::StrCat("w", r), CheckpointMsg()));
  const absl::Time wait_ckpt = absl::Now() + absl::Seconds(60);
  while (!LoadCheckpoint(ckpt_b).ok() && absl::Now() < wait_ckpt) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(LoadCheckpoint(ckpt_b).ok()) << "CheckpointNow wrote nothing in " << ckpt_b;
  const size_t at_checkpoint = NumSteps(fake.Workers(), "w0", "job-b", 1);
  ASSERT_TRUE(fake.WaitUntil(
      [&](const Workers& ws) { return NumSteps(ws, "w0", "job-b", 1) >= at_checkpoint + 2; },
      absl::Seconds(60)));
  // The agent's /metrics over HTTP while job B runs: the last step's numbers.
  {
    const std::string text = ScrapeMetrics(a0->agent->metrics_port());
    ASSERT_FALSE(text.empty());
    for (const char* name :
         {"switchyard_worker_step", "switchyard_worker_step_seconds",
          "switchyard_worker_tokens_per_second", "switchyard_worker_tflops",
          "switchyard_worker_mfu", "switchyard_worker_loss", "switchyard_worker_generation"}) {
      std::map<std::string, double> s = Series(text, name);
      ASSERT_EQ(s.size(), 1u) << name << "\n" << text;
      std::printf("  %s %g\n", name, s.begin()->second);
    }
    EXPECT_GE(Series(text, "switchyard_worker_step").begin()->second, at_checkpoint + 2);
    EXPECT_GT(Series(text, "switchyard_worker_step_seconds").begin()->second, 0);
    EXPECT_GT(Series(text, "switchyard_worker_tokens_per_second").begin()->second, 0);
    EXPECT_GT(Series(text, "switchyard_worker_loss").begin()->second, 0);
    EXPECT_EQ(Series(text, "switchyard_worker_generation").begin()->second, 1);
    EXPECT_EQ(Series(text, "switchyard_worker_mfu").begin()->second, 0)
        << "a CPU worker exports MFU as 0 (no peak to divide by)";
    for (const char* name :
         {"switchyard_worker_expert_tokens_min", "switchyard_worker_expert_tokens_max",
          "switchyard_worker_expert_tokens_mean", "switchyard_worker_expert_load_imbalance"}) {
      std::map<std::string, double> s = Series(text, name);
      ASSERT_EQ(s.size(), 2u) << name << ": one series per MoE layer, not per expert\n" << text;
      for (const auto& [series, value] : s) std::printf("  %s %g\n", series.c_str(), value);
      EXPECT_TRUE(s.count(absl::StrCat(name, "{layer=\"0\"}"))) << text;
      EXPECT_TRUE(s.count(absl::StrCat(name, "{layer=\"2\"}"))) << text;
    }
    EXPECT_DOUBLE_EQ(Series(text, "switchyard_worker_expert_tokens_mean")
                         .at("switchyard_worker_expert_tokens_mean{layer=\"0\"}"),
                     kTokensPerStep * 2 / 8.0);
    EXPECT_FALSE(absl::StrContains(text, "expert=\"")) << "no per-expert series";
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(fake.Send(absl::StrCat("w", r), StopMsg("test: stop mid-training")));
  }
  const absl::Time stop_sent = absl::Now();
  ASSERT_TRUE(fake.WaitUntil(
      [](const Workers& ws) {
        return HasExit(ws, "w0", "job-b", 1) && HasExit(ws, "w1", "job-b", 1);
      },
      absl::Seconds(60)));
  const absl::Duration stop_latency = absl::Now() - stop_sent;
  std::printf("job-b: both exits %.0f ms after Stop\n", absl::ToDoubleMilliseconds(stop_latency));
  EXPECT_LT(stop_latency, absl::Seconds(5)) << "stop_report_after is 2 s";
  int64_t stopped_at = 0;
  {
    Workers ws = fake.Workers();
    for (int r = 0; r < 2; ++r) {
      const WorkerRecord& w = ws.at(absl::StrCat("w", r));
      const v1::WorkerExit* e = ExitOf(w, "job-b", 1);
      std::printf("job-b rank %d: exit %d (%s) after %zu steps\n", r, e->exit_code(),
                  e->message().c_str(), StepsOf(w, "job-b", 1).size());
      EXPECT_EQ(e->exit_code(), 143) << e->message();
      stopped_at = std::max<int64_t>(stopped_at, StepsOf(w, "job-b", 1).back().metrics().step());
    }
  }
  ASSERT_TRUE(fake.WaitUntil([](const Workers& ws) { return Idle(ws, "w0") && Idle(ws, "w1"); },
                             absl::Seconds(10)));
  EXPECT_EQ(a0->agent->generation(), 0);
  EXPECT_EQ(a1->agent->generation(), 0);
  ExpectMetricsReset(a0->agent->metrics_port(), "after job-b was stopped");
  absl::StatusOr<Checkpoint> saved = LoadCheckpoint(ckpt_b);
  ASSERT_TRUE(saved.ok()) << saved.status();
  const int64_t resume_step = saved->step();
  std::printf("job-b: latest checkpoint step %lld (CheckpointNow), stopped at step %lld\n",
              static_cast<long long>(resume_step), static_cast<long long>(stopped_at));
  EXPECT_LT(resume_step, stopped_at);

  // Job B generation 2: world 1 on w1, resumes from the checkpoint and finishes.
  ASSERT_TRUE(
      fake.Send("w1", AssignmentMsg("job-b", 2, 0, 1, resume_step + 3, ckpt_b, fake.address())));
  ASSERT_TRUE(fake.Send("w1", StartMsg()));
  ASSERT_TRUE(fake.WaitUntil([](const Workers& ws) { return HasExit(ws, "w1", "job-b", 2); },
                             absl::Seconds(120)));
  {
    const WorkerRecord w = fake.Workers().at("w1");
    const v1::WorkerExit* e = ExitOf(w, "job-b", 2);
    std::vector<v1::StepReport> steps = StepsOf(w, "job-b", 2);
    std::printf("job-b generation 2 (world 1): exit %d (%s), steps", e->exit_code(),
                e->message().c_str());
    for (const auto& s : steps) std::printf(" %lld", static_cast<long long>(s.metrics().step()));
    std::printf("\n");
    EXPECT_EQ(e->exit_code(), 0) << e->message();
    ASSERT_EQ(steps.size(), 3u);
    EXPECT_EQ(steps.front().metrics().step(), resume_step + 1) << "resumed from the checkpoint";
    EXPECT_EQ(steps.back().metrics().step(), resume_step + 3);
    for (const auto& s : steps) ExpectSane(s, 0);
  }
  // A first generation whose own directory already holds a checkpoint (job ids restarted by a
  // store created anew over the same volume) must not resume another job's state: exit 1 naming
  // training.save, no step.
  ASSERT_TRUE(fake.Send("w1", AssignmentMsg("job-c", 1, 0, 1, 5, ckpt_b, fake.address())));
  ASSERT_TRUE(fake.Send("w1", StartMsg()));
  ASSERT_TRUE(fake.WaitUntil([](const Workers& ws) { return HasExit(ws, "w1", "job-c", 1); },
                             absl::Seconds(60)));
  {
    const WorkerRecord w = fake.Workers().at("w1");
    const v1::WorkerExit* e = ExitOf(w, "job-c", 1);
    ASSERT_NE(e, nullptr);
    std::printf("job-c generation 1 on job-b's directory: exit %d (%s)\n", e->exit_code(),
                e->message().c_str());
    EXPECT_EQ(e->exit_code(), 1) << e->message();
    EXPECT_TRUE(absl::StrContains(e->message(), "training.save")) << e->message();
    EXPECT_TRUE(absl::StrContains(e->message(), "first generation")) << e->message();
    EXPECT_EQ(NumSteps(fake.Workers(), "w1", "job-c", 1), 0u);
  }
  // w0 saw nothing of generation 2 and stayed idle.
  EXPECT_EQ(NumSteps(fake.Workers(), "w0", "job-b", 2), 0u);
  a0->Stop();
  a1->Stop();
  EXPECT_TRUE(a0->result.ok()) << a0->result;
  EXPECT_TRUE(a1->result.ok()) << a1->result;
  EXPECT_EQ(fake.Workers().at("w0").registrations, 1) << "one stream all along";
}

// Validation loss through the Attach stream (issue 18 item 1): a job with
// training.eval_interval on a dataset in the data root reports validation_loss and
// validation_perplexity (= exp) on the steps that evaluated (2 and 4, the last) and on no other,
// each equal bit for bit to what the same spec gives in-process (RunTrainingLoop): the agent
// passes StepResult::validation_loss through its StepReport unchanged.
TEST(AgentTest, ReportsTheValidationLossOfTheStepsThatEvaluated) {
  const std::string prefix = TmpDir("agent_eval_docs");
  {
    IndexedDatasetWriter writer(IndexedDType::kUInt16);
    for (int d = 0; d < 40; ++d) {
      std::vector<int64_t> tokens;
      for (int i = 0; i < 30 + d % 17; ++i) tokens.push_back((d * 5 + i * (1 + d % 3)) % 63);
      tokens.push_back(63);
      ASSERT_TRUE(writer.Add(tokens).ok());
      writer.EndDocument();
    }
    ASSERT_TRUE(writer.Finalize(prefix).ok());
  }
  v1::CoordinatorMessage assignment =
      AssignmentMsg("job-v", 1, 0, 1, 4, TmpDir("ckpt_v"), "unused");
  v1::JobSpec* spec = assignment.mutable_assignment()->mutable_spec();
  spec->mutable_data()->set_mock_data(false);
  spec->mutable_data()->add_data_path(prefix);
  spec->mutable_data()->set_split("80,20,0");
  spec->mutable_training()->set_eval_interval(2);
  spec->mutable_training()->set_eval_iters(2);

  // The reference: the same spec in this process (the agent trains f32 on the CPU too).
  v1::JobSpec local = *spec;
  local.mutable_training()->clear_save();
  local.mutable_training()->clear_load();
  auto trainer = train::Trainer::Create(local, train::TrainerOptions());
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  std::map<int64_t, double> want;
  train::TrainingLoopHooks hooks;
  hooks.on_step = [&](const train::StepResult& r) {
    if (r.validation_loss.has_value()) want[r.step] = *r.validation_loss;
  };
  ASSERT_TRUE(train::RunTrainingLoop(trainer->get(), hooks).ok());
  ASSERT_EQ(want.size(), 2u);

  FakeCoordinator fake(kToken);
  auto a0 = StartAgent(fake, "w0", WriteTokenFile("token_v", kToken), /*metrics_port=*/-1);
  ASSERT_TRUE(a0);
  ASSERT_TRUE(
      fake.WaitUntil([](const Workers& ws) { return ws.count("w0") > 0; }, absl::Seconds(20)));
  assignment.mutable_assignment()->set_rendezvous_address(fake.address());
  ASSERT_TRUE(fake.Send("w0", assignment));
  ASSERT_TRUE(fake.Send("w0", StartMsg()));
  ASSERT_TRUE(fake.WaitUntil([](const Workers& ws) { return HasExit(ws, "w0", "job-v", 1); },
                             absl::Seconds(120)));
  const WorkerRecord w = fake.Workers().at("w0");
  EXPECT_EQ(ExitOf(w, "job-v", 1)->exit_code(), 0) << ExitOf(w, "job-v", 1)->message();
  const std::vector<v1::StepReport> steps = StepsOf(w, "job-v", 1);
  ASSERT_EQ(steps.size(), 4u);
  for (const v1::StepReport& s : steps) {
    const v1::StepMetrics& m = s.metrics();
    std::printf("job-v step %lld: %s\n", static_cast<long long>(m.step()),
                m.has_validation_loss()
                    ? absl::StrCat("validation loss ", m.validation_loss(), " ppl ",
                                   m.validation_perplexity(), " (in-process ", want[m.step()], ")")
                          .c_str()
                    : "no validation loss");
    ASSERT_EQ(m.has_validation_loss(), m.step() % 2 == 0) << m.ShortDebugString();
    EXPECT_EQ(m.has_validation_perplexity(), m.has_validation_loss());
    if (!m.has_validation_loss()) continue;
    EXPECT_EQ(m.validation_loss(), want[m.step()]);
    EXPECT_DOUBLE_EQ(m.validation_perplexity(), std::exp(m.validation_loss()));
  }
}

TEST(AgentTest, ReattachesWithTheSameIdAndKeepsTraining) {
  FakeCoordinator fake(kToken);
  auto a = StartAgent(fake, "", WriteTokenFile("token_r", kToken), -1);
  ASSERT_TRUE(a);
  const std::string id = a->agent->worker_id();
  std::printf("default worker_id: %s\n", id.c_str());
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(id, ':')).size(), 3u) << "host:pid:start";
  ASSERT_TRUE(
      fake.WaitUntil([&](const Workers& ws) { return ws.count(id) > 0; }, absl::Seconds(20)));
  ASSERT_TRUE(fake.Send(id, AssignmentMsg("job-r", 1, 0, 1, 1000000, TmpDir("ckpt_r"), "")));
  ASSERT_TRUE(fake.Send(id, StartMsg()));
  ASSERT_TRUE(fake.WaitUntil([&](const Workers& ws) { return NumSteps(ws, id, "job-r", 1) >= 2; },
                             absl::Seconds(60)));
  fake.Kick(id);
  const absl::Time kicked = absl::Now();
  ASSERT_TRUE(fake.WaitUntil(
      [&](const Workers& ws) { return ws.at(id).registrations == 2 && ws.at(id).connected; },
      absl::Seconds(20)));
  std::printf("re-attached %.0f ms after the stream was cut\n",
              absl::ToDoubleMilliseconds(absl::Now() - kicked));
  ASSERT_TRUE(fake.WaitUntil(
      [&](const Workers& ws) {
        const WorkerRecord& w = ws.at(id);
        int later = 0;
        for (int s : w.steps_session) later += s == 2 ? 1 : 0;
        return later >= 2;
      },
      absl::Seconds(60)))
      << "step reports on the new stream";
  ASSERT_TRUE(fake.Send(id, StopMsg("test done")));
  ASSERT_TRUE(fake.WaitUntil([&](const Workers& ws) { return HasExit(ws, id, "job-r", 1); },
                             absl::Seconds(30)));
  const WorkerRecord w = fake.Workers().at(id);
  int64_t before = 0, after = 0, last = 0;
  bool increasing = true;
  for (size_t i = 0; i < w.steps.size(); ++i) {
    (w.steps_session[i] == 1 ? before : after)++;
    increasing &= w.steps[i].metrics().step() > last;
    last = w.steps[i].metrics().step();
  }
  std::printf(
      "step reports: %lld on the first stream, %lld on the second (last step %lld); "
      "exit %d\n",
      static_cast<long long>(before), static_cast<long long>(after), static_cast<long long>(last),
      ExitOf(w, "job-r", 1)->exit_code());
  EXPECT_TRUE(increasing) << "no step reported twice or out of order";
  EXPECT_EQ(ExitOf(w, "job-r", 1)->exit_code(), 143);
  EXPECT_EQ(w.registration.worker_id(), id);
  a->Stop();
  EXPECT_TRUE(a->result.ok()) << a->result;
}

TEST(AgentTest, BadAssignmentIsAPermanentExit) {
  FakeCoordinator fake("");
  auto a = StartAgent(fake, "wb", "", -1);
  ASSERT_TRUE(a);
  ASSERT_TRUE(
      fake.WaitUntil([](const Workers& ws) { return ws.count("wb") > 0; }, absl::Seconds(20)));
  v1::CoordinatorMessage bad = AssignmentMsg("job-x", 1, 2, 2, 5, TmpDir("ckpt_x"), "");
  ASSERT_TRUE(fake.Send("wb", bad));
  v1::CoordinatorMessage bad_spec = AssignmentMsg("job-x", 2, 0, 1, 5, TmpDir("ckpt_x"), "");
  bad_spec.mutable_assignment()->mutable_spec()->mutable_model()->set_moe_router_topk(9);
  ASSERT_TRUE(fake.Send("wb", bad_spec));
  ASSERT_TRUE(fake.WaitUntil(
      [](const Workers& ws) {
        return HasExit(ws, "wb", "job-x", 1) && HasExit(ws, "wb", "job-x", 2);
      },
      absl::Seconds(20)));
  const WorkerRecord w = fake.Workers().at("wb");
  for (int g = 1; g <= 2; ++g) {
    const v1::WorkerExit* e = ExitOf(w, "job-x", g);
    std::printf("bad assignment %d: exit %d (%s)\n", g, e->exit_code(), e->message().c_str());
    EXPECT_EQ(e->exit_code(), 1);
  }
  EXPECT_TRUE(absl::StrContains(ExitOf(w, "job-x", 1)->message(), "assignment.rank"));
  EXPECT_TRUE(absl::StrContains(ExitOf(w, "job-x", 2)->message(), "assignment.spec"));
  // A Stop while idle is ignored: no exit.
  ASSERT_TRUE(fake.Send("wb", StopMsg("nothing to stop")));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(fake.Workers().at("wb").exits.size(), 2u);
}

// Forged assignments (a spec that never passed a coordinator's CreateJob) with paths escaping the
// agent's own roots: each is refused with WorkerExit 1 naming the field, and nothing is created
// outside the roots. The last one escapes only after the Assignment (a symlink planted before
// Start): the re-check when the generation opens its files refuses it.
TEST(AgentTest, ForgedEscapingPathsAreRefusedNamingTheField) {
  namespace fs = std::filesystem;
  const std::string base = TmpDir("forged");
  fs::remove_all(base);
  const JobRoots roots{base + "/checkpoints", base + "/data"};
  const std::string outside = base + "/outside";
  for (const std::string& d : {roots.checkpoint_root + "/jobs", roots.data_root, outside}) {
    fs::create_directories(d);
  }
  fs::create_directory_symlink(outside, roots.checkpoint_root + "/jobs/9");
  FakeCoordinator fake("");
  AgentOptions o;
  o.coordinator = fake.address();
  o.roots = roots;
  o.device = "cpu";
  o.heartbeat_interval = absl::Milliseconds(100);
  o.worker_id = "wf";
  auto agent = StartRunningAgent(o);
  ASSERT_TRUE(agent);
  ASSERT_TRUE(
      fake.WaitUntil([](const Workers& ws) { return ws.count("wf") > 0; }, absl::Seconds(20)));
  const std::string job_dir = roots.checkpoint_root + "/jobs/1";
  struct Case {
    std::string what, field;
    std::function<void(v1::JobSpec*)> forge;
  };
  const std::vector<Case> cases = {
      {"absolute save outside", "assignment.spec.training.save",
       [&](v1::JobSpec* s) { s->mutable_training()->set_save(outside + "/abs"); }},
      {"'..' save", "assignment.spec.training.save",
       [&](v1::JobSpec* s) { s->mutable_training()->set_save(job_dir + "/../../../outside/up"); }},
      {"relative save", "assignment.spec.training.save",
       [&](v1::JobSpec* s) { s->mutable_training()->set_save("../../outside/rel"); }},
      {"symlink out of the root", "assignment.spec.training.save",
       [&](v1::JobSpec* s) { s->mutable_training()->set_save(roots.checkpoint_root + "/jobs/9"); }},
      {"load outside (existence oracle)", "assignment.spec.training.load",
       [&](v1::JobSpec* s) { s->mutable_training()->set_load("/etc/shadow"); }},
      {"data outside", "assignment.spec.data.data_path[0]",
       [&](v1::JobSpec* s) { s->mutable_data()->add_data_path("/etc/shadow"); }},
      {"tokenizer in the checkpoints", "assignment.spec.data.tokenizer_model",
       [&](v1::JobSpec* s) { s->mutable_data()->set_tokenizer_model(job_dir + "/tok.json"); }},
  };
  int64_t generation = 0;
  for (const Case& c : cases) {
    ++generation;
    v1::CoordinatorMessage msg = AssignmentMsg("job-f", generation, 0, 1, 5, job_dir, "");
    c.forge(msg.mutable_assignment()->mutable_spec());
    ASSERT_TRUE(fake.Send("wf", msg));
    ASSERT_TRUE(fake.Send("wf", StartMsg()));  // ignored: nothing was prepared
    ASSERT_TRUE(
        fake.WaitUntil([&](const Workers& ws) { return HasExit(ws, "wf", "job-f", generation); },
                       absl::Seconds(20)));
    const WorkerRecord w = fake.Workers().at("wf");  // a copy: Workers() returns by value
    const v1::WorkerExit* e = ExitOf(w, "job-f", generation);
    std::printf("%-32s exit %d: %s\n", c.what.c_str(), e->exit_code(), e->message().c_str());
    EXPECT_EQ(e->exit_code(), 1) << c.what;
    EXPECT_TRUE(absl::StrContains(e->message(), c.field)) << c.what << ": " << e->message();
  }
  // Valid at the Assignment; the job directory becomes a symlink out of the root before Start.
  ++generation;
  ASSERT_TRUE(fake.Send("wf", AssignmentMsg("job-f", generation, 0, 1, 5, job_dir, "")));
  ASSERT_TRUE(fake.WaitUntil(
      [&](const Workers& ws) {
        auto it = ws.find("wf");
        return it != ws.end() && it->second.last_heartbeat_generation == generation;
      },
      absl::Seconds(20)));
  fs::create_directory_symlink(outside, job_dir);
  ASSERT_TRUE(fake.Send("wf", StartMsg()));
  ASSERT_TRUE(
      fake.WaitUntil([&](const Workers& ws) { return HasExit(ws, "wf", "job-f", generation); },
                     absl::Seconds(60)));
  const WorkerRecord w = fake.Workers().at("wf");
  const v1::WorkerExit* e = ExitOf(w, "job-f", generation);
  std::printf("%-32s exit %d: %s\n", "symlink planted before Start", e->exit_code(),
              e->message().c_str());
  EXPECT_EQ(e->exit_code(), 1);
  EXPECT_TRUE(absl::StrContains(e->message(), "training.save")) << e->message();
  EXPECT_TRUE(absl::StrContains(e->message(), "outside the checkpoint root")) << e->message();
  // Nothing was written outside the roots.
  std::vector<std::string> written;
  for (const auto& entry : fs::recursive_directory_iterator(outside)) {
    written.push_back(entry.path().string());
  }
  std::printf("entries under %s: %zu\n", outside.c_str(), written.size());
  EXPECT_TRUE(written.empty()) << written.front();
  EXPECT_FALSE(fs::exists(base + "/outside/up"));
}

TEST(AgentTest, NewAssignmentEndsTheRunningGeneration) {
  FakeCoordinator fake("");
  auto a = StartAgent(fake, "wn", "", -1);
  ASSERT_TRUE(a);
  ASSERT_TRUE(
      fake.WaitUntil([](const Workers& ws) { return ws.count("wn") > 0; }, absl::Seconds(20)));
  ASSERT_TRUE(fake.Send("wn", AssignmentMsg("job-n", 1, 0, 1, 1000000, TmpDir("ckpt_n1"), "")));
  // The same Assignment again (e.g. re-sent after a reconnect) is kept, not restarted.
  ASSERT_TRUE(fake.Send("wn", AssignmentMsg("job-n", 1, 0, 1, 1000000, TmpDir("ckpt_n1"), "")));
  ASSERT_TRUE(fake.Send("wn", StartMsg()));
  ASSERT_TRUE(fake.WaitUntil([](const Workers& ws) { return NumSteps(ws, "wn", "job-n", 1) >= 2; },
                             absl::Seconds(60)));
  ASSERT_TRUE(fake.Send("wn", AssignmentMsg("job-n", 2, 0, 1, 3, TmpDir("ckpt_n2"), "")));
  ASSERT_TRUE(fake.Send("wn", StartMsg()));
  ASSERT_TRUE(fake.WaitUntil([](const Workers& ws) { return HasExit(ws, "wn", "job-n", 2); },
                             absl::Seconds(60)));
  const WorkerRecord w = fake.Workers().at("wn");
  ASSERT_EQ(w.exits.size(), 2u);
  for (const v1::WorkerExit& e : w.exits) {
    std::printf("generation %lld: exit %d (%s)\n", static_cast<long long>(e.generation()),
                e.exit_code(), e.message().c_str());
  }
  EXPECT_EQ(w.exits[0].generation(), 1);
  EXPECT_EQ(w.exits[0].exit_code(), 143);
  EXPECT_TRUE(absl::StrContains(w.exits[0].message(), "new assignment")) << w.exits[0].message();
  EXPECT_EQ(w.exits[1].generation(), 2);
  EXPECT_EQ(w.exits[1].exit_code(), 0);
  EXPECT_EQ(NumSteps(fake.Workers(), "wn", "job-n", 2), 3u);
}

TEST(AgentTest, MissingOrWrongTokenIsRejectedWithAClearError) {
  FakeCoordinator fake(kToken);
  struct Case {
    const char* name;
    std::string token_file;
    const char* hint;
  } cases[] = {
      {"missing", "", "no token was sent"},
      {"wrong", WriteTokenFile("wrong_token", "not-the-token"), "check the token in"},
  };
  for (const Case& c : cases) {
    AgentOptions o;
    o.coordinator = fake.address();
    o.roots = testing::TestRoots();
    o.token_file = c.token_file;
    o.device = "cpu";
    o.worker_id = std::string("w-") + c.name;
    absl::StatusOr<std::unique_ptr<Agent>> agent = Agent::Create(o);
    ASSERT_TRUE(agent.ok()) << agent.status();
    const absl::Time t0 = absl::Now();
    absl::Status st = (*agent)->Run();
    std::printf("%s token: Run returned after %.0f ms: %s\n", c.name,
                absl::ToDoubleMilliseconds(absl::Now() - t0), st.ToString().c_str());
    EXPECT_EQ(st.code(), absl::StatusCode::kUnauthenticated);
    EXPECT_TRUE(absl::StrContains(st.message(), c.hint)) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), fake.address())) << st;
  }
  EXPECT_EQ(fake.rejected(), 2);
  EXPECT_TRUE(fake.Workers().empty());
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(AgentTest, TlsCoordinator) {
  if (std::system("command -v openssl > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "openssl is not installed: cannot make a test certificate";
  }
  const std::string cert = TmpDir("tls_cert.pem"), key = TmpDir("tls_key.pem");
  const std::string cmd =
      absl::StrCat("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost ",
                   "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout ", key, " -out ",
                   cert, " > /dev/null 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  FakeCoordinator fake(kToken, ReadAll(cert), ReadAll(key));
  const std::string token_file = WriteTokenFile("tls_token", kToken);
  std::vector<std::unique_ptr<RunningAgent>> agents;
  for (int r = 0; r < 2; ++r) {
    AgentOptions o;
    o.coordinator = fake.address();
    o.roots = testing::TestRoots();
    o.token_file = token_file;
    o.tls_root_cert = cert;
    o.device = "cpu";
    o.worker_id = absl::StrCat("tls-", r);
    o.heartbeat_interval = absl::Milliseconds(100);
    agents.push_back(StartRunningAgent(o));
    ASSERT_NE(agents.back(), nullptr);
  }
  ASSERT_TRUE(fake.WaitUntil([](const Workers& ws) { return ws.size() == 2; }, absl::Seconds(20)));
  // World 2: the rendezvous goes over TLS too.
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(
        fake.Send(absl::StrCat("tls-", r),
                  AssignmentMsg("job-tls", 1, r, 2, 3, TmpDir("ckpt_tls"), fake.address())));
  }
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(fake.Send(absl::StrCat("tls-", r), StartMsg()));
  ASSERT_TRUE(fake.WaitUntil(
      [](const Workers& ws) {
        return HasExit(ws, "tls-0", "job-tls", 1) && HasExit(ws, "tls-1", "job-tls", 1);
      },
      absl::Seconds(60)));
  for (int r = 0; r < 2; ++r) {
    const WorkerRecord w = fake.Workers().at(absl::StrCat("tls-", r));
    std::printf("TLS rank %d: exit %d, %zu steps\n", r, ExitOf(w, "job-tls", 1)->exit_code(),
                StepsOf(w, "job-tls", 1).size());
    EXPECT_EQ(ExitOf(w, "job-tls", 1)->exit_code(), 0);
    EXPECT_EQ(StepsOf(w, "job-tls", 1).size(), 3u);
  }
  for (auto& a : agents) {
    a->Stop();
    EXPECT_TRUE(a->result.ok()) << a->result;
  }
}

TEST(AgentTest, OptionsAreChecked) {
  AgentOptions o;
  EXPECT_EQ(Agent::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.coordinator = "127.0.0.1:1";
  o.roots = testing::TestRoots();
  o.device = "tpu";
  absl::Status st = Agent::Create(o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "device")) << st;
  o.device = "cpu";
  o.token_file = TmpDir("no_such_token_file");
  EXPECT_EQ(Agent::Create(o).status().code(), absl::StatusCode::kNotFound);
  o.token_file = WriteTokenFile("empty_token", "  ");
  EXPECT_EQ(Agent::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.token_file.clear();
  o.heartbeat_interval = absl::ZeroDuration();
  st = Agent::Create(o).status();
  EXPECT_TRUE(absl::StrContains(st.message(), "heartbeat_interval")) << st;
}

}  // namespace
}  // namespace switchyard::agent
