// File: coordinator/jobs/job_registry_test.cc
//
// The registry over a real SQLite file in the test's temporary directory.
#include "coordinator/jobs/job_registry.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/config/config.h"
#include "coordinator/jobs/job_state.h"
#include "coordinator/store/store.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace switchyard::jobs {
namespace {

using Json = nlohmann::json;

// A valid MoE spec (8 experts top-2 over EP 4, world 8), as a user would submit it.
constexpr const char* kValidSpec = R"json({
  "display_name": "mixtral-small",
  "model": {
    "num_layers": 4,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_query_groups": 2,
    "ffn_hidden_size": 1792,
    "seq_length": 1024,
    "vocab_size": 32000,
    "normalization": "RMSNorm",
    "num_experts": 8,
    "moe_router_topk": 2,
    "moe_router_load_balancing_type": ["aux_loss"],
    "moe_aux_loss_coeff": [0.02],
    "moe_token_dispatcher_type": "alltoall"
  },
  "parallel": {
    "expert_model_parallel_size": 4,
    "world_size": 8
  },
  "training": {
    "micro_batch_size": 2,
    "global_batch_size": 32,
    "train_iters": 500,
    "lr": 1.0e-4,
    "min_lr": 1.0e-5,
    "lr_warmup_iters": 50,
    "lr_decay_style": "cosine"
  },
  "data": {
    "data_path": ["0.7", "wiki_text_document", "0.3", "code_text_document"],
    "split": "969,30,1"
  },
  "max_restarts": 2
})json";

std::string TempFile(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
  for (const char* suffix : {"", "-wal", "-shm"}) std::remove((path + suffix).c_str());
  return path;
}

v1::JobSpec ValidSpec(const std::string& display_name = "mixtral-small") {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(kValidSpec);
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->set_display_name(display_name);
  return *spec;
}

v1::CreateJobRequest Request(const std::string& display_name, const std::string& request_id = "") {
  v1::CreateJobRequest request;
  *request.mutable_spec() = ValidSpec(display_name);
  request.set_request_id(request_id);
  return request;
}

class JobRegistryTest : public ::testing::Test {
 protected:
  void OpenAt(const std::string& name) {
    path_ = TempFile(name);
    Reopen();
  }
  void Reopen() {
    registry_.reset();
    store_.reset();
    auto store = store::Store::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    CoordinatorContext context;
    context.checkpoint_root = "/checkpoints";
    registry_ = std::make_unique<JobRegistry>(store_.get(), context);
  }
  int64_t Jobs() { return *store_->CountJobs(); }
  int64_t Events() { return *store_->CountJobEvents(); }

  std::string path_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<JobRegistry> registry_;
};

TEST_F(JobRegistryTest, CreateGetRoundTripAndReopen) {
  OpenAt("registry_round_trip.db");
  auto job = registry_->CreateJob(Request("first"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->name(), "jobs/1");
  EXPECT_EQ(job->state(), v1::Job::PENDING);
  EXPECT_EQ(job->generation(), 0);
  EXPECT_GT(job->create_time().seconds(), 1'600'000'000);
  // Stored with defaults applied: fields the user left out are filled.
  EXPECT_TRUE(job->spec().model().has_kv_channels());
  EXPECT_EQ(job->spec().model().kv_channels(), 64);
  EXPECT_EQ(job->spec().min_workers(), 8);

  // GetJob adds the latest event (CreateJob's answer has none); the rest is identical.
  auto got = registry_->GetJob("jobs/1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->last_event().reason(), "CREATED");
  got->clear_last_event();
  EXPECT_EQ(got->SerializeAsString(), job->SerializeAsString());

  Reopen();
  got = registry_->GetJob("jobs/1");
  ASSERT_TRUE(got.ok()) << got.status();
  got->clear_last_event();
  EXPECT_EQ(got->SerializeAsString(), job->SerializeAsString());
  auto events = registry_->ListEvents("jobs/1");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].reason(), "CREATED");
  EXPECT_EQ((*events)[0].state(), v1::Job::PENDING);
  EXPECT_EQ((*events)[0].sequence(), 1);

  EXPECT_EQ(registry_->GetJob("jobs/2").status().code(), absl::StatusCode::kNotFound);
  for (const char* bad : {"", "jobs/", "jobs/0", "jobs/01", "jobs/-1", "jobs/x", "job/1", "jobs/1/",
                          "jobs/99999999999999999999", "/jobs/1"}) {
    auto s = registry_->GetJob(bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("name"), absl::string_view::npos) << s;
  }
  std::printf("created %s (%s), reopened, 1 event; bad name: %s\n", job->name().c_str(),
              v1::Job::State_Name(job->state()).c_str(),
              registry_->GetJob("jobs/x").status().ToString().c_str());
}

// DeleteJob: finished jobs only (the refusal names the state and writes nothing); the job and its
// events go; the name is NOT_FOUND afterwards; a malformed name is INVALID_ARGUMENT.
TEST_F(JobRegistryTest, DeleteJobTakesFinishedJobsOnly) {
  OpenAt("registry_delete.db");
  ASSERT_TRUE(registry_->CreateJob(Request("pending")).ok());
  ASSERT_TRUE(registry_->CreateJob(Request("running")).ok());
  ASSERT_TRUE(registry_->CreateJob(Request("failed")).ok());
  ASSERT_TRUE(registry_->Transition("jobs/2", v1::Job::STARTING, "SCHEDULED").ok());
  ASSERT_TRUE(registry_->Transition("jobs/2", v1::Job::RUNNING, "ALL_RANKS_RUNNING").ok());
  ASSERT_TRUE(registry_->Transition("jobs/3", v1::Job::FAILED, "NO_FEASIBLE_PLAN").ok());
  const int64_t events = Events();
  for (const char* name : {"jobs/1", "jobs/2"}) {
    auto refused = registry_->DeleteJob(name);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
    EXPECT_NE(refused.status().message().find(name), absl::string_view::npos);
    std::printf("%s\n", refused.status().ToString().c_str());
  }
  EXPECT_NE(registry_->DeleteJob("jobs/2").status().message().find("is RUNNING"),
            absl::string_view::npos);
  EXPECT_EQ(Jobs(), 3);
  EXPECT_EQ(Events(), events);
  auto deleted = registry_->DeleteJob("jobs/3");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->state(), v1::Job::FAILED);
  EXPECT_EQ(deleted->spec().display_name(), "failed");
  EXPECT_EQ(Jobs(), 2);
  EXPECT_EQ(Events(), events - 2);
  EXPECT_EQ(registry_->GetJob("jobs/3").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_->DeleteJob("jobs/3").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_->DeleteJob("jobs/x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(JobCheckpointDir("/ckpt", 3), "/ckpt/jobs/3");
}

TEST_F(JobRegistryTest, CreateIsIdempotentPerRequestId) {
  OpenAt("registry_idempotent.db");
  auto first = registry_->CreateJob(Request("a", "6f1c2a4e-0d5b-4c8e-9a57-3b2f1e0d9c8b"));
  ASSERT_TRUE(first.ok()) << first.status();
  // Same request id, same spec: the same job, nothing written.
  auto again = registry_->CreateJob(Request("a", "6f1c2a4e-0d5b-4c8e-9a57-3b2f1e0d9c8b"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->name(), first->name());
  EXPECT_EQ(Jobs(), 1);
  EXPECT_EQ(Events(), 1);

  // Same effective spec written differently (a default made explicit) is still the same request.
  v1::CreateJobRequest explicit_default = Request("a", "6f1c2a4e-0d5b-4c8e-9a57-3b2f1e0d9c8b");
  explicit_default.mutable_spec()->mutable_model()->set_kv_channels(64);
  again = registry_->CreateJob(explicit_default);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->name(), first->name());

  // The job moved on; a retry still returns it, in its current state.
  ASSERT_TRUE(registry_->Transition(first->name(), v1::Job::STARTING, "SCHEDULED").ok());
  again = registry_->CreateJob(Request("a", "6f1c2a4e-0d5b-4c8e-9a57-3b2f1e0d9c8b"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->state(), v1::Job::STARTING);

  // Same request id, different spec.
  auto conflict = registry_->CreateJob(Request("b", "6f1c2a4e-0d5b-4c8e-9a57-3b2f1e0d9c8b"));
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kAlreadyExists) << conflict.status();
  EXPECT_NE(conflict.status().message().find("request_id"), absl::string_view::npos);
  EXPECT_NE(conflict.status().message().find("jobs/1"), absl::string_view::npos);
  std::printf("conflict: %s\n", conflict.status().ToString().c_str());

  // Survives a restart of the coordinator.
  Reopen();
  again = registry_->CreateJob(Request("a", "6f1c2a4e-0d5b-4c8e-9a57-3b2f1e0d9c8b"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->name(), first->name());
  // Without a request id every call creates a job.
  ASSERT_TRUE(registry_->CreateJob(Request("a")).ok());
  ASSERT_TRUE(registry_->CreateJob(Request("a")).ok());
  EXPECT_EQ(Jobs(), 3);

  for (const std::string& bad : {std::string("has space"), std::string(129, 'a'),
                                 std::string("quote\""), std::string("nul\0x", 5)}) {
    auto s = registry_->CreateJob(Request("a", bad)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("request_id"), absl::string_view::npos) << s;
  }
  EXPECT_EQ(Jobs(), 3);
}

// save_interval without training.save: the scheduler fills the directory (<root>/<job id>), so
// the spec is accepted and stored with save empty; two such jobs never share a directory.
TEST_F(JobRegistryTest, SaveIntervalWithoutSaveIsLeftToTheScheduler) {
  OpenAt("save_interval.db");
  v1::CreateJobRequest request = Request("ckpt");
  request.mutable_spec()->mutable_training()->clear_save();
  request.mutable_spec()->mutable_training()->set_save_interval(5);
  auto job = registry_->CreateJob(request);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->spec().training().save().empty());
  EXPECT_EQ(job->spec().training().save_interval(), 5);
  std::printf("save_interval 5 without save: %s accepted, save left to the scheduler\n",
              job->name().c_str());
}

// Every path of a spec is relative to a root of the coordinator (common/config/job_paths.h): each
// escaping form is INVALID_ARGUMENT naming the field and the rule, and stores nothing (no job,
// no event); the relative forms are stored as given (the scheduler resolves them).
TEST_F(JobRegistryTest, EscapingPathsAreRejectedAndNothingIsStored) {
  OpenAt("paths.db");
  struct Case {
    const char* field;
    std::string value;
    const char* expected;  // in the message
  };
  const Case cases[] = {
      {"save", "/etc/cron.d",
       "training.save (\"/etc/cron.d\") must be a relative path under the job's checkpoint "
       "directory: must not be absolute"},
      {"save", "../../etc", "training.save (\"../../etc\") must be a relative path"},
      {"save", "a/../../b", "must not have \"..\" components"},
      {"save", "a//b", "training.save (\"a//b\")"},
      {"save", "a\x01b", "control characters"},
      {"save", std::string("a\0b", 3), "control characters"},
      {"load", "/etc/shadow",
       "training.load (\"/etc/shadow\") must be empty (resume this job) or "
       "name a job's checkpoint"},
      {"load", "jobs/2/../../x", "training.load"},
      {"load", "elsewhere/ckpt", "must start with jobs/<id>"},
      {"data", "/etc/shadow",
       "data.data_path[1] (\"/etc/shadow\") must be a relative path under the data root"},
      {"data", "../secrets", "data.data_path[1]"},
      {"tokenizer", "/models/tok.json", "data.tokenizer_model (\"/models/tok.json\")"},
  };
  for (const Case& c : cases) {
    v1::CreateJobRequest request = Request("escape");
    v1::JobSpec& spec = *request.mutable_spec();
    const std::string field = c.field;
    if (field == "save") spec.mutable_training()->set_save(c.value);
    if (field == "load") spec.mutable_training()->set_load(c.value);
    if (field == "data") spec.mutable_data()->set_data_path(1, c.value);
    if (field == "tokenizer") spec.mutable_data()->set_tokenizer_model(c.value);
    const absl::Status s = registry_->CreateJob(request).status();
    std::printf("  %-9s \"%s\" -> %s\n", c.field, absl::CHexEscape(c.value).c_str(),
                s.ToString().c_str());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.value;
    EXPECT_NE(s.message().find(c.expected), absl::string_view::npos) << s;
  }
  EXPECT_EQ(Jobs(), 0);
  EXPECT_EQ(Events(), 0);

  v1::CreateJobRequest ok = Request("relative");
  ok.mutable_spec()->mutable_training()->set_save("run1");
  ok.mutable_spec()->mutable_training()->set_load("jobs/7/run1/step_100");
  ok.mutable_spec()->mutable_data()->set_tokenizer_model("tokenizers/gpt2.json");
  auto job = registry_->CreateJob(ok);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().training().save(), "run1");
  EXPECT_EQ(job->spec().training().load(), "jobs/7/run1/step_100");
  EXPECT_EQ(Jobs(), 1);
}

// The plan a generation starts with is stored with the STARTING transition and survives a
// reopen; a plan with any other transition is refused and writes nothing.
// Without a checkpoint root the coordinator fills no directory: the same spec is refused at
// submit, naming the rule (it would otherwise fail later in the scheduler).
TEST_F(JobRegistryTest, SaveIntervalWithoutSaveOrCheckpointRootIsRejected) {
  OpenAt("save_interval_no_root.db");
  JobRegistry bare(store_.get());
  v1::CreateJobRequest request = Request("ckpt");
  request.mutable_spec()->mutable_training()->clear_save();
  request.mutable_spec()->mutable_training()->set_save_interval(5);
  auto job = bare.CreateJob(request);
  ASSERT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << job.status();
  EXPECT_NE(job.status().message().find("training.save"), absl::string_view::npos);
  std::printf("no checkpoint root: %s\n", std::string(job.status().message()).c_str());
  EXPECT_EQ(Jobs(), 0);
}

// A wait reason is an event with the state unchanged, only while the job waits.
TEST_F(JobRegistryTest, WaitReasonsAreEventsOfWaitingJobsOnly) {
  OpenAt("wait_reason.db");
  auto job = registry_->CreateJob(Request("waits"));
  ASSERT_TRUE(job.ok()) << job.status();
  auto noted = registry_->RecordWaitReason(job->name(), "WAITING_FOR_WORKERS",
                                           "needs 8 worker(s), 0 attached");
  ASSERT_TRUE(noted.ok()) << noted.status();
  EXPECT_EQ(noted->state(), v1::Job::PENDING);
  auto got = registry_->GetJob(job->name());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->last_event().reason(), "WAITING_FOR_WORKERS");
  EXPECT_EQ(got->last_event().message(), "needs 8 worker(s), 0 attached");
  EXPECT_EQ(got->last_event().state(), v1::Job::PENDING);
  EXPECT_EQ(registry_->RecordWaitReason(job->name(), "bad reason", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(registry_->CancelJob(job->name()).ok());
  EXPECT_EQ(registry_->RecordWaitReason(job->name(), "WAITING_FOR_WORKERS", "x").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_->RecordWaitReason("jobs/99", "WAITING_FOR_WORKERS", "x").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Events(), 3);  // CREATED, the wait reason, CANCELLED
  std::printf("wait reason stored as an event: %s: %s\n", got->last_event().reason().c_str(),
              got->last_event().message().c_str());
}

// Pages stop at kMaxListPageBytes: 40 jobs of ~60 KiB each (page_size 1000) come in pages of at
// most ~1 MiB, every job exactly once, in id order.
TEST_F(JobRegistryTest, ListPagesAreBoundedInBytes) {
  OpenAt("list_bytes.db");
  for (int i = 0; i < 40; ++i) {
    v1::CreateJobRequest request = Request(absl::StrCat("big-", i));
    v1::DataConfig* data = request.mutable_spec()->mutable_data();
    data->clear_data_path();
    for (int j = 0; j < 15; ++j) data->add_data_path(std::string(4000, 'a' + j));
    ASSERT_TRUE(registry_->CreateJob(request).ok());
  }
  v1::ListJobsRequest list;
  list.set_page_size(1000);
  std::vector<std::string> names;
  int pages = 0;
  do {
    auto page = registry_->ListJobs(list);
    ASSERT_TRUE(page.ok()) << page.status();
    ++pages;
    size_t bytes = 0;
    for (const v1::Job& job : page->jobs()) {
      names.push_back(job.name());
      bytes += job.ByteSizeLong();
    }
    EXPECT_GE(page->jobs_size(), 1);
    EXPECT_LT(bytes, kMaxListPageBytes + 64 * 1024) << "page " << pages;
    std::printf("page %d: %d jobs, %zu bytes\n", pages, page->jobs_size(), bytes);
    list.set_page_token(page->next_page_token());
  } while (!list.page_token().empty());
  ASSERT_EQ(names.size(), 40u);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(names[i], absl::StrCat("jobs/", i + 1));
  EXPECT_GE(pages, 3);
  list.set_page_token(std::string(kMaxPageTokenBytes + 1, 'A'));
  auto bad = registry_->ListJobs(list);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("page_token (257 bytes) must be at most 256"),
            absl::string_view::npos)
      << bad.status();
}

TEST_F(JobRegistryTest, StartingStoresThePlan) {
  OpenAt("registry_plan.db");
  auto job = registry_->CreateJob(Request("planned"));
  ASSERT_TRUE(job.ok()) << job.status();
  v1::Plan plan;
  v1::Mapping* m = plan.mutable_best()->mutable_mapping();
  m->set_data_parallel_size(2);
  m->set_expert_model_parallel_size(2);
  const int64_t events = Events();
  EXPECT_EQ(registry_->Transition(job->name(), v1::Job::RUNNING, "BAD", "", &plan).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Events(), events);
  auto started = registry_->Transition(job->name(), v1::Job::STARTING, "SCHEDULED", "", &plan);
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ(started->plan().best().mapping().expert_model_parallel_size(), 2);
  Reopen();
  auto got = registry_->GetJob(job->name());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->plan().best().mapping().data_parallel_size(), 2);
  EXPECT_EQ(got->plan().best().mapping().expert_model_parallel_size(), 2);
  std::printf("plan stored with STARTING and read back after a reopen: DP %d EP %d\n",
              got->plan().best().mapping().data_parallel_size(),
              got->plan().best().mapping().expert_model_parallel_size());
}

// Job.last_step: saved without an event and read back after a reopen (a coordinator restart).
TEST_F(JobRegistryTest, LastStepIsStoredWithoutAnEvent) {
  OpenAt("registry_last_step.db");
  auto job = registry_->CreateJob(Request("stepped"));
  ASSERT_TRUE(job.ok()) << job.status();
  const int64_t events = Events();
  v1::StepMetrics step;
  step.set_step(17);
  step.set_loss(3.25);
  ASSERT_TRUE(registry_->RecordLastStep(job->name(), step).ok());
  step.set_step(18);
  ASSERT_TRUE(registry_->RecordLastStep(job->name(), step).ok());
  EXPECT_EQ(Events(), events);
  EXPECT_EQ(registry_->RecordLastStep("jobs/999", step).code(), absl::StatusCode::kNotFound);
  Reopen();
  auto got = registry_->GetJob(job->name());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->last_step().step(), 18);
  EXPECT_DOUBLE_EQ(got->last_step().loss(), 3.25);
  std::printf("last step after a reopen: %lld (loss %.2f), events unchanged (%lld)\n",
              static_cast<long long>(got->last_step().step()), got->last_step().loss(),
              static_cast<long long>(Events()));
}

TEST_F(JobRegistryTest, PaginatesOver120JobsWithAndWithoutFilter) {
  OpenAt("registry_pages.db");
  for (int i = 0; i < 120; ++i) {
    auto job = registry_->CreateJob(Request(absl::StrCat("job", i)));
    ASSERT_TRUE(job.ok()) << job.status();
    if (i % 3 == 0) {
      ASSERT_TRUE(registry_->Transition(job->name(), v1::Job::STARTING, "SCHEDULED").ok());
    }
  }
  auto collect = [&](State state, int page_size, int* pages) {
    std::vector<std::string> names;
    v1::ListJobsRequest request;
    request.set_state(state);
    request.set_page_size(page_size);
    *pages = 0;
    while (true) {
      auto page = registry_->ListJobs(request);
      EXPECT_TRUE(page.ok()) << page.status();
      if (!page.ok()) break;
      ++*pages;
      EXPECT_LE(page->jobs_size(), page_size == 0 ? kDefaultPageSize : page_size);
      for (const v1::Job& job : page->jobs()) {
        names.push_back(job.name());
        EXPECT_TRUE(state == v1::Job::STATE_UNSPECIFIED || job.state() == state) << job.name();
      }
      if (page->next_page_token().empty()) break;
      request.set_page_token(page->next_page_token());
    }
    return names;
  };
  int pages = 0;
  std::vector<std::string> all = collect(v1::Job::STATE_UNSPECIFIED, 7, &pages);
  ASSERT_EQ(all.size(), 120u);
  EXPECT_EQ(pages, 18);  // 17 full pages of 7 and one of 1
  for (int i = 0; i < 120; ++i) EXPECT_EQ(all[i], absl::StrCat("jobs/", i + 1));
  std::vector<std::string> starting = collect(v1::Job::STARTING, 10, &pages);
  EXPECT_EQ(starting.size(), 40u);
  EXPECT_EQ(pages, 4);
  EXPECT_EQ(starting.front(), "jobs/1");
  EXPECT_EQ(starting.back(), "jobs/118");
  std::vector<std::string> pending = collect(v1::Job::PENDING, 0, &pages);  // default page size
  EXPECT_EQ(pending.size(), 80u);
  EXPECT_EQ(pages, 2);
  std::set<std::string> unique(all.begin(), all.end());
  EXPECT_EQ(unique.size(), 120u);
  EXPECT_TRUE(collect(v1::Job::SUCCEEDED, 10, &pages).empty());
  EXPECT_EQ(pages, 1);
  std::printf(
      "120 jobs: all in 18 pages of 7; STARTING 40 in 4 pages of 10; PENDING 80 in 2 "
      "default pages\n");

  // A token is bound to its filter, and must be one of ours.
  v1::ListJobsRequest request;
  request.set_state(v1::Job::STARTING);
  request.set_page_size(5);
  auto page = registry_->ListJobs(request);
  ASSERT_TRUE(page.ok());
  request.set_state(v1::Job::PENDING);
  request.set_page_token(page->next_page_token());
  auto mismatch = registry_->ListJobs(request);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.status().message().find("page_token"), absl::string_view::npos);
  std::printf("mismatch: %s\n", mismatch.status().ToString().c_str());
  for (const char* bad : {"garbage!", "cDE6MzoxMA", "eHg6MTox", "%%%"}) {
    request.set_page_token(bad);
    auto s = registry_->ListJobs(request).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("page_token"), absl::string_view::npos) << s;
  }
  request.set_page_token("");
  request.set_page_size(-1);
  auto negative = registry_->ListJobs(request).status();
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(negative.message().find("page_size"), absl::string_view::npos);
  request.set_page_size(0);
  request.set_state(static_cast<State>(42));
  EXPECT_EQ(registry_->ListJobs(request).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobRegistryTest, PageSizeIsCappedAt1000) {
  OpenAt("registry_cap.db");
  for (int i = 0; i < 1005; ++i) ASSERT_TRUE(registry_->CreateJob(Request("j")).ok());
  v1::ListJobsRequest request;
  request.set_page_size(5000);
  auto page = registry_->ListJobs(request);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->jobs_size(), kMaxPageSize);
  EXPECT_FALSE(page->next_page_token().empty());
  request.set_page_token(page->next_page_token());
  auto rest = registry_->ListJobs(request);
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(rest->jobs_size(), 5);
  EXPECT_TRUE(rest->next_page_token().empty());
  std::printf("page_size 5000 over 1005 jobs: pages of %d and %d\n", page->jobs_size(),
              rest->jobs_size());
}

// Drives jobs along every allowed edge of the table and checks each refused one leaves the
// store unchanged.
TEST_F(JobRegistryTest, EveryAllowedTransitionAndRefusedOnesWriteNothing) {
  OpenAt("registry_transitions.db");
  const std::vector<std::vector<State>> paths = {
      {v1::Job::STARTING, v1::Job::RUNNING, v1::Job::SUCCEEDED},
      {v1::Job::FAILED},
      {v1::Job::CANCELLED},
      {v1::Job::STARTING, v1::Job::RESTARTING, v1::Job::STARTING, v1::Job::FAILED},
      {v1::Job::STARTING, v1::Job::CANCELLED},
      {v1::Job::STARTING, v1::Job::RUNNING, v1::Job::RESTARTING, v1::Job::FAILED},
      {v1::Job::STARTING, v1::Job::RUNNING, v1::Job::RESTARTING, v1::Job::CANCELLED},
      {v1::Job::STARTING, v1::Job::RUNNING, v1::Job::FAILED},
      {v1::Job::STARTING, v1::Job::RUNNING, v1::Job::CANCELLED},
  };
  std::set<std::pair<State, State>> covered;
  for (const auto& path : paths) {
    auto job = registry_->CreateJob(Request("t"));
    ASSERT_TRUE(job.ok());
    State from = v1::Job::PENDING;
    for (State to : path) {
      auto moved = registry_->Transition(job->name(), to, "TEST_STEP", "driven by the test");
      ASSERT_TRUE(moved.ok()) << v1::Job::State_Name(from) << " -> " << v1::Job::State_Name(to)
                              << ": " << moved.status();
      EXPECT_EQ(moved->state(), to);
      covered.insert({from, to});
      from = to;
    }
    auto events = registry_->ListEvents(job->name());
    ASSERT_TRUE(events.ok());
    ASSERT_EQ(events->size(), path.size() + 1);
    for (size_t i = 0; i < path.size(); ++i) {
      EXPECT_EQ((*events)[i + 1].state(), path[i]);
      EXPECT_EQ((*events)[i + 1].sequence(), static_cast<int64_t>(i + 2));
      EXPECT_EQ((*events)[i + 1].reason(), "TEST_STEP");
    }
  }
  EXPECT_EQ(covered.size(), 14u) << "every allowed edge of job_state.h is exercised";

  // Refused transitions: FAILED_PRECONDITION naming both states, nothing written.
  auto pending = registry_->CreateJob(Request("p"));
  auto running = registry_->CreateJob(Request("r"));
  ASSERT_TRUE(running.ok() && pending.ok());
  ASSERT_TRUE(registry_->Transition(running->name(), v1::Job::STARTING, "GO").ok());
  ASSERT_TRUE(registry_->Transition(running->name(), v1::Job::RUNNING, "GO").ok());
  const struct {
    std::string name;
    State to;
    const char* needle;
  } refused[] = {
      {pending->name(), v1::Job::RUNNING, "from PENDING to RUNNING"},
      {pending->name(), v1::Job::SUCCEEDED, "from PENDING to SUCCEEDED"},
      {pending->name(), v1::Job::RESTARTING, "from PENDING to RESTARTING"},
      {pending->name(), v1::Job::PENDING, "from PENDING to PENDING"},
      {running->name(), v1::Job::STARTING, "from RUNNING to STARTING"},
      {running->name(), v1::Job::RUNNING, "from RUNNING to RUNNING"},
      {running->name(), v1::Job::STATE_UNSPECIFIED, "from RUNNING to STATE_UNSPECIFIED"},
      {"jobs/1", v1::Job::RUNNING, "from SUCCEEDED to RUNNING"},
      {"jobs/2", v1::Job::STARTING, "from FAILED to STARTING"},
      {"jobs/3", v1::Job::CANCELLED, "from CANCELLED to CANCELLED"},
  };
  const int64_t events_before = Events();
  for (const auto& r : refused) {
    auto before = registry_->GetJob(r.name);
    auto s = registry_->Transition(r.name, r.to, "TEST_STEP").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << r.needle;
    EXPECT_NE(s.message().find(r.needle), absl::string_view::npos) << s;
    EXPECT_NE(s.message().find(r.name), absl::string_view::npos) << s;
    EXPECT_EQ(registry_->GetJob(r.name)->SerializeAsString(), before->SerializeAsString());
    std::printf("  refused: %s\n", std::string(s.message()).c_str());
  }
  EXPECT_EQ(Events(), events_before);
  // Cancel of a terminal job is refused the same way; of an active one it works.
  EXPECT_EQ(registry_->CancelJob("jobs/1").status().code(), absl::StatusCode::kFailedPrecondition);
  auto cancelled = registry_->CancelJob(running->name(), "user asked");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::Job::CANCELLED);
  EXPECT_EQ(registry_->ListEvents(running->name())->back().reason(), "CANCELLED_BY_USER");
  // Bad reason and unknown job.
  EXPECT_EQ(registry_->Transition(pending->name(), v1::Job::STARTING, "lower case").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->Transition("jobs/9999", v1::Job::STARTING, "GO").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(JobRegistryTest, RestartsAreBoundedByMaxRestarts) {
  OpenAt("registry_restarts.db");
  auto job = registry_->CreateJob(Request("elastic"));  // max_restarts 2 in the spec
  ASSERT_TRUE(job.ok());
  const std::string name = job->name();
  auto go = [&](State to, const char* reason) {
    auto r = registry_->Transition(name, to, reason);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : v1::Job();
  };
  go(v1::Job::STARTING, "SCHEDULED");
  go(v1::Job::RUNNING, "ALL_WORKERS_READY");
  for (int restart = 1; restart <= 2; ++restart) {
    v1::Job j = go(v1::Job::RESTARTING, "WORKER_LOST");
    EXPECT_EQ(j.state(), v1::Job::RESTARTING);
    EXPECT_EQ(j.restart_count(), restart);
    j = go(v1::Job::STARTING, "RENDEZVOUS");
    EXPECT_EQ(j.generation(), restart + 1);
    go(v1::Job::RUNNING, "ALL_WORKERS_READY");
  }
  v1::Job last = go(v1::Job::RESTARTING, "WORKER_LOST");
  EXPECT_EQ(last.state(), v1::Job::FAILED);
  EXPECT_EQ(last.restart_count(), 2);
  EXPECT_EQ(last.generation(), 3);
  EXPECT_NE(last.failure_reason().find("RESTART_LIMIT_EXCEEDED"), std::string::npos);
  auto events = registry_->ListEvents(name);
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->back().reason(), "RESTART_LIMIT_EXCEEDED");
  EXPECT_EQ(events->back().state(), v1::Job::FAILED);
  EXPECT_EQ(events->size(), 10u);
  std::printf("after 2 restarts: %s, generation %lld, failure_reason \"%s\"\n",
              v1::Job::State_Name(last.state()).c_str(), static_cast<long long>(last.generation()),
              last.failure_reason().c_str());
  // The restart count survives a coordinator restart too.
  Reopen();
  EXPECT_EQ(registry_->GetJob(name)->restart_count(), 2);
}

TEST_F(JobRegistryTest, CheckpointSteps) {
  OpenAt("registry_checkpoints.db");
  auto job = registry_->CreateJob(Request("ckpt"));
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(registry_->RecordCheckpoint(job->name(), 10).status().code(),
            absl::StatusCode::kFailedPrecondition);  // not RUNNING
  ASSERT_TRUE(registry_->Transition(job->name(), v1::Job::STARTING, "GO").ok());
  ASSERT_TRUE(registry_->Transition(job->name(), v1::Job::RUNNING, "GO").ok());
  ASSERT_TRUE(registry_->RecordCheckpoint(job->name(), 100).ok());
  ASSERT_TRUE(registry_->RecordCheckpoint(job->name(), 200).ok());
  EXPECT_EQ(registry_->RecordCheckpoint(job->name(), 200).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_->RecordCheckpoint(job->name(), -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  Reopen();
  auto step = registry_->LastCheckpointStep(job->name());
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(*step, 200);
  EXPECT_EQ(registry_->ListEvents(job->name())->back().reason(), "CHECKPOINT_SAVED");
  EXPECT_EQ(registry_->GetJob(job->name())->state(), v1::Job::RUNNING);
}

// --- invalid specs -----------------------------------------------------------------------------

struct Mutation {
  const char* pointer;  // JSON pointer into the valid spec; "" with `text` set: raw text
  const char* value;    // JSON text of the new value; nullptr: remove the key
  const char* needle;   // the field path (and rule) the error must name
  const char* text = nullptr;
};

const Mutation kMutations[] = {
    // Wrong types.
    {"/model/hidden_size", R"("512")", "model.hidden_size"},
    {"/model/num_layers", "4.5", "model.num_layers"},
    {"/model/num_attention_heads", "true", "model.num_attention_heads"},
    {"/model/moe_router_topk", "[2]", "model.moe_router_topk"},
    {"/model/moe_router_load_balancing_type", "5", "model.moe_router_load_balancing_type"},
    {"/model/normalization", "1", "model.normalization"},
    {"/parallel", R"("tp2")", "parallel"},
    {"/training/lr", R"("fast")", "training.lr"},
    {"/training/train_iters", "null", "training.train_iters"},
    {"/data/data_path", R"({"a": 1})", "data.data_path"},
    {"/parallel/sequence_parallel", R"("yes")", "parallel.sequence_parallel"},
    {"/max_restarts", R"("3")", "max_restarts"},
    {"/model", "[]", "model"},
    {"/training/seed", "1.5", "training.seed"},
    {"/model/moe_aux_loss_coeff", R"(["x"])", "model.moe_aux_loss_coeff"},
    {"/display_name", "7", "display_name"},
    // Unknown fields.
    {"/model/moe_routr_topk", "2", "model.moe_routr_topk"},
    {"/parallel/tensor_parallel", "2", "parallel.tensor_parallel"},
    {"/trainig", "{}", "trainig"},
    {"/training/learning_rate", "0.0001", "training.learning_rate"},
    {"/data/path", R"("x")", "data.path"},
    {"/model/num_experts_per_tok", "2", "model.num_experts_per_tok"},
    // Required fields missing.
    {"/model/hidden_size", nullptr, "model.hidden_size"},
    {"/training/train_iters", nullptr, "training.train_iters"},
    // Divisibility and cross-field rules.
    {"/model/num_experts", "6",
     "model.num_experts (6) must be divisible by "
     "parallel.expert_model_parallel_size (4)"},
    {"/model/hidden_size", "500", "model.hidden_size"},
    {"/model/num_query_groups", "3", "model.num_query_groups"},
    {"/parallel/world_size", "6", "parallel.world_size"},
    {"/training/global_batch_size", "30", "training.global_batch_size"},
    {"/parallel/tensor_model_parallel_size", "3", "parallel.tensor_model_parallel_size"},
    {"/model/moe_router_topk", "9", "model.moe_router_topk"},
    {"/parallel/pipeline_model_parallel_size", "3", "parallel.pipeline_model_parallel_size"},
    {"/model/moe_aux_loss_coeff", "[0.02, 0.01]", "model.moe_aux_loss_coeff"},
    {"/min_workers", "16", "min_workers"},
    {"/training/lr_warmup_iters", "600", "training.lr_warmup_iters"},
    // Negative and zero sizes.
    {"/model/hidden_size", "-512", "model.hidden_size"},
    {"/model/num_layers", "-1", "model.num_layers"},
    {"/parallel/tensor_model_parallel_size", "-2", "parallel.tensor_model_parallel_size"},
    {"/parallel/expert_model_parallel_size", "0", "parallel.expert_model_parallel_size"},
    {"/training/micro_batch_size", "-2", "training.micro_batch_size"},
    {"/training/train_iters", "-500", "training.train_iters"},
    {"/training/lr", "-1", "training.lr"},
    {"/max_restarts", "-1", "max_restarts"},
    {"/min_workers", "-1", "min_workers"},
    {"/model/seq_length", "0", "model.seq_length"},
    {"/model/num_experts", "-8", "model.num_experts"},
    {"/model/moe_aux_loss_coeff", "[-0.02]", "model.moe_aux_loss_coeff"},
    // Huge values.
    {"/model/hidden_size", "3000000000", "model.hidden_size"},
    {"/parallel/world_size", "1e12", "parallel.world_size"},
    {"/training/train_iters", "1e30", "training.train_iters"},
    {"/model/num_layers", "100000000", "model.num_layers"},
    {"/model/vocab_size", "99999999999", "model.vocab_size"},
    {"/max_restarts", "2000000", "max_restarts"},
    {"/parallel/expert_model_parallel_size", "1048576", "parallel.expert_model_parallel_size"},
    {"/model/seq_length", "2147483647", "model.seq_length"},
    // Bad enumerations and strings.
    {"/model/moe_router_score_function", R"("softmx")", "model.moe_router_score_function"},
    {"/model/moe_token_dispatcher_type", R"("alltoallv")", "model.moe_token_dispatcher_type"},
    {"/training/lr_decay_style", R"("exp")", "training.lr_decay_style"},
    {"/model/normalization", R"("BatchNorm")", "model.normalization"},
    {"/data/split", R"("a,b,c")", "data.split"},
    {"/data/data_path", R"(["0.7", "/a", "0.3"])", "data.data_path"},
    {"/model/moe_router_load_balancing_type", R"(["aux_loss", "bogus"])",
     "model.moe_router_load_balancing_type"},
    {"/model/norm_epsilon", R"("NaN")", "model.norm_epsilon"},
    // Not a spec at all.
    {"", nullptr, "job spec", "[]"},
    {"", nullptr, "invalid JSON", R"({"model": {"hidden_size": 512)"},
    {"", nullptr, "model.hidden_size: duplicate key",
     R"({"model": {"hidden_size": 512, "hidden_size": 512}})"},
};

TEST_F(JobRegistryTest, InvalidSpecsAreRejectedNamingTheFieldAndWriteNothing) {
  OpenAt("registry_invalid.db");
  ASSERT_TRUE(registry_->CreateJob(Request("baseline")).ok());  // the store is not empty
  const int64_t jobs_before = Jobs();
  const int64_t events_before = Events();
  const Json base = Json::parse(kValidSpec);
  int count = 0;
  for (const Mutation& m : kMutations) {
    std::string text;
    if (m.text != nullptr) {
      text = m.text;
    } else {
      Json doc = base;
      Json::json_pointer pointer(m.pointer);
      if (m.value == nullptr) {
        doc[pointer.parent_pointer()].erase(pointer.back());
      } else {
        doc[pointer] = Json::parse(m.value);
      }
      text = doc.dump();
    }
    // Every case also carries a request id, which must not be consumed by a rejected request.
    std::string request_id = absl::StrCat("req-invalid-", count);
    auto job = registry_->CreateJobFromJson(text, request_id);
    ++count;
    ASSERT_FALSE(job.ok()) << m.pointer << " = " << (m.value ? m.value : "(removed)")
                           << " was accepted";
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << job.status();
    EXPECT_NE(job.status().message().find(m.needle), absl::string_view::npos)
        << m.pointer << " = " << (m.value ? m.value : "(removed)")
        << "\n  message: " << job.status().message() << "\n  expected to name: " << m.needle;
    EXPECT_EQ(Jobs(), jobs_before);
    EXPECT_EQ(Events(), events_before);
    std::printf("  %-40s %-12s -> %s\n", m.text ? "(raw text)" : m.pointer,
                m.value ? std::string(m.value).substr(0, 12).c_str() : "(removed)",
                std::string(job.status().message()).c_str());
  }
  EXPECT_GE(count, 50);
  // The request ids of rejected requests stay free.
  auto later = registry_->CreateJobFromJson(kValidSpec, "req-invalid-0");
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(Jobs(), jobs_before + 1);
  // The unmodified text is valid (so each case above fails for its mutation alone), in YAML too.
  auto yaml = registry_->CreateJobFromYaml(JobSpecToYaml(ValidSpec()), "");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  std::printf(
      "%d invalid specs rejected; store unchanged by each (%lld jobs, %lld events before)\n", count,
      static_cast<long long>(jobs_before), static_cast<long long>(events_before));
}

// Two threads on one registry and two more on a second connection create jobs at once; the
// store stays consistent (ids unique and dense, one event per job, integrity intact).
TEST_F(JobRegistryTest, ConcurrentCreatesDoNotCorruptTheStore) {
  OpenAt("registry_concurrent.db");
  auto second_store = store::Store::Open(path_);
  ASSERT_TRUE(second_store.ok());
  JobRegistry second(second_store->get());
  constexpr int kPerThread = 40;
  std::atomic<int> failures{0};
  auto work = [&](JobRegistry* registry, int thread) {
    for (int i = 0; i < kPerThread; ++i) {
      // Half the requests use a request id shared by all threads: exactly one job each.
      std::string request_id = i % 2 == 0 ? absl::StrCat("shared-", i) : "";
      auto job = registry->CreateJob(Request(absl::StrCat("t", i), request_id));
      if (!job.ok()) {
        ++failures;
        std::printf("thread %d: %s\n", thread, job.status().ToString().c_str());
      }
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(work, registry_.get(), 0);
  threads.emplace_back(work, registry_.get(), 1);
  threads.emplace_back(work, &second, 2);
  threads.emplace_back(work, &second, 3);
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  const int64_t expected = 4 * kPerThread / 2 + kPerThread / 2;
  EXPECT_EQ(Jobs(), expected);
  EXPECT_EQ(Events(), expected);
  v1::ListJobsRequest request;
  request.set_page_size(1000);
  auto all = registry_->ListJobs(request);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->jobs_size(), expected);
  for (int i = 0; i < expected; ++i) EXPECT_EQ(all->jobs(i).name(), absl::StrCat("jobs/", i + 1));
  std::printf("4 threads x %d creates over 2 connections: %lld jobs, %lld events\n", kPerThread,
              static_cast<long long>(Jobs()), static_cast<long long>(Events()));
}

// Racing transitions of one job apply one after the other: of 8 threads cancelling the same
// job exactly one wins; of 8 threads failing a running job with restarts, the restart budget is
// never overspent.
TEST_F(JobRegistryTest, ConcurrentTransitionsOfOneJobSerialize) {
  OpenAt("registry_race.db");
  auto job = registry_->CreateJob(Request("race"));
  ASSERT_TRUE(job.ok());
  std::atomic<int> won{0};
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      auto r = registry_->CancelJob(job->name());
      if (r.ok()) {
        ++won;
      } else if (r.status().code() == absl::StatusCode::kFailedPrecondition) {
        ++refused;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(refused.load(), 7);
  EXPECT_EQ(registry_->ListEvents(job->name())->size(), 2u);

  auto elastic = registry_->CreateJob(Request("elastic"));  // max_restarts 2
  ASSERT_TRUE(elastic.ok());
  ASSERT_TRUE(registry_->Transition(elastic->name(), v1::Job::STARTING, "GO").ok());
  ASSERT_TRUE(registry_->Transition(elastic->name(), v1::Job::RUNNING, "GO").ok());
  threads.clear();
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 3; ++i) {
        // Each thread tries to push the job around the restart loop; most attempts are refused.
        (void)registry_->Transition(elastic->name(), v1::Job::RESTARTING, "WORKER_LOST");
        (void)registry_->Transition(elastic->name(), v1::Job::STARTING, "RENDEZVOUS");
        (void)registry_->Transition(elastic->name(), v1::Job::RUNNING, "READY");
      }
    });
  }
  for (auto& t : threads) t.join();
  auto final_job = registry_->GetJob(elastic->name());
  ASSERT_TRUE(final_job.ok());
  EXPECT_EQ(final_job->state(), v1::Job::FAILED);
  EXPECT_EQ(final_job->restart_count(), 2);
  EXPECT_EQ(final_job->generation(), 3);
  auto events = registry_->ListEvents(elastic->name());
  ASSERT_TRUE(events.ok());
  // PENDING, STARTING, RUNNING, then 2 x (RESTARTING, STARTING, maybe RUNNING), then FAILED: a
  // thread's RESTARTING may land while another's STARTING has not reached RUNNING yet (STARTING
  // -> RESTARTING is allowed: a worker lost while starting), so 8 to 10 events. Whatever the
  // interleaving: the log is one legal path of the state machine, numbered without gaps, with
  // exactly 2 restarts and the generation bumped on every STARTING.
  ASSERT_GE(events->size(), 8u);
  ASSERT_LE(events->size(), 10u);
  int restarts = 0;
  int64_t generation = 0;
  for (size_t i = 0; i < events->size(); ++i) {
    const v1::JobEvent& e = (*events)[i];
    EXPECT_EQ(e.sequence(), int64_t(i + 1));
    if (i == 0) {
      EXPECT_EQ(e.state(), v1::Job::PENDING);
    } else {
      EXPECT_TRUE(jobs::CheckTransition((*events)[i - 1].state(), e.state()).ok())
          << "event " << i + 1 << ": " << v1::Job::State_Name((*events)[i - 1].state()) << " -> "
          << v1::Job::State_Name(e.state());
    }
    if (e.state() == v1::Job::RESTARTING) ++restarts;
    if (e.state() == v1::Job::STARTING) ++generation;
    EXPECT_EQ(e.generation(), generation) << "event " << i + 1;
  }
  EXPECT_EQ(restarts, 2);
  EXPECT_EQ(events->back().state(), v1::Job::FAILED);
  EXPECT_EQ(events->back().reason(), jobs::kRestartLimitExceeded);
  std::printf(
      "8 racing cancels: %d won, %d refused; racing restarts: %s after %d restarts, %zu "
      "events\n",
      won.load(), refused.load(), v1::Job::State_Name(final_job->state()).c_str(),
      final_job->restart_count(), events->size());
}

}  // namespace
}  // namespace switchyard::jobs
