// Output formats: the YAML of a job reads back (yaml-cpp) to the same document as its JSON, with
// ambiguous strings quoted; tables carry the fields people look for.
#include "cli/render.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace switchyard::cli {
namespace {

using Json = nlohmann::ordered_json;

// YAML node -> JSON, strings staying strings only when yaml-cpp would not read them otherwise:
// the test checks types by asking yaml-cpp which tag the scalar resolves to.
Json FromYaml(const YAML::Node& n) {
  if (n.IsMap()) {
    Json j = Json::object();
    for (const auto& kv : n) j[kv.first.as<std::string>()] = FromYaml(kv.second);
    return j;
  }
  if (n.IsSequence()) {
    Json j = Json::array();
    for (const auto& item : n) j.push_back(FromYaml(item));
    return j;
  }
  const std::string s = n.Scalar();
  if (n.Tag() == "!") return s;  // quoted: a string
  if (s == "true" || s == "false") return s == "true";
  try {
    size_t used = 0;
    long long i = std::stoll(s, &used);
    if (used == s.size()) return i;
    double d = std::stod(s, &used);
    if (used == s.size()) return d;
  } catch (...) {
  }
  return s;
}

v1::Job SampleJob() {
  v1::Job job;
  job.set_name("jobs/12");
  job.set_state(v1::Job::RUNNING);
  job.set_generation(3);
  job.mutable_spec()->set_display_name("true");  // would read as a boolean unquoted
  job.mutable_spec()->mutable_model()->set_hidden_size(128);
  job.mutable_spec()->mutable_model()->add_moe_router_load_balancing_type("aux_loss");
  job.mutable_spec()->mutable_model()->add_moe_aux_loss_coeff(0.01);
  job.mutable_spec()->mutable_data()->add_data_path("0.7");  // would read as a number
  job.mutable_spec()->mutable_data()->add_data_path("a: b #c");
  job.mutable_spec()->mutable_training()->set_train_iters(100);  // int64: a JSON string
  job.mutable_create_time()->set_seconds(1795000000);
  job.mutable_last_step()->set_step(7);
  job.mutable_last_step()->set_loss(3.25);
  auto* load = job.mutable_last_step()->add_expert_load();
  load->set_layer(1);
  load->add_tokens_per_expert(5);
  load->add_tokens_per_expert(9);
  job.mutable_plan()->mutable_best()->mutable_mapping()->set_expert_model_parallel_size(2);
  return job;
}

TEST(Render, YamlReadsBackToTheJson) {
  const v1::Job job = SampleJob();
  const std::string json = ToJson(job, /*pretty=*/false);
  const std::string yaml = Structured(job, Output::kYaml);
  std::printf("json: %s\nyaml:\n%s", json.c_str(), yaml.c_str());
  const Json from_yaml = FromYaml(YAML::Load(yaml));
  EXPECT_EQ(from_yaml, Json::parse(json)) << from_yaml.dump();
}

TEST(Render, EmptyAndNested) {
  EXPECT_EQ(JsonToYaml("{}"), "{}\n");
  EXPECT_EQ(JsonToYaml(R"({"a":[],"b":{},"c":[{"d":1,"e":[2,3]}]})"),
            "a: []\nb: {}\nc:\n  - d: 1\n    e:\n      - 2\n      - 3\n");
}

TEST(Render, Tables) {
  const v1::Job job = SampleJob();
  const std::string table = JobsTable({job});
  std::printf("%s", table.c_str());
  EXPECT_NE(table.find("NAME"), std::string::npos);
  EXPECT_NE(table.find("jobs/12"), std::string::npos);
  EXPECT_NE(table.find("RUNNING"), std::string::npos);
  EXPECT_NE(table.find("2026-11-18T"), std::string::npos);
  // A waiting job shows its queue, priority, position and reason (Job.queue_status).
  v1::Job waiting = SampleJob();
  waiting.set_state(v1::Job::PENDING);
  waiting.mutable_spec()->set_queue("team-a");
  waiting.mutable_spec()->set_priority(5);
  waiting.mutable_queue_status()->set_queue("team-a");
  waiting.mutable_queue_status()->set_position(2);
  waiting.mutable_queue_status()->set_reason("QUEUE_QUOTA_EXCEEDED");
  waiting.mutable_queue_status()->set_message("queue team-a: 2 of 2 worker(s) in use, needs 2");
  const std::string queued = JobsTable({job, waiting});
  std::printf("%s", queued.c_str());
  EXPECT_NE(queued.find("QUEUE"), std::string::npos);
  EXPECT_NE(queued.find("PENDING  team-a   5     2    QUEUE_QUOTA_EXCEEDED"), std::string::npos)
      << queued;
  EXPECT_NE(JobDetail(waiting).find("Position:      2 in queue team-a: QUEUE_QUOTA_EXCEEDED"),
            std::string::npos)
      << JobDetail(waiting);
  const std::string detail = JobDetail(job);
  std::printf("%s", detail.c_str());
  EXPECT_NE(detail.find("EP2"), std::string::npos);
  EXPECT_NE(detail.find("step 7 loss 3.2500"), std::string::npos);
  EXPECT_NE(detail.find("Validation:    -"), std::string::npos) << detail;
  EXPECT_EQ(StepLine(job.last_step()).find("val_loss"), std::string::npos);
  // An evaluation step: its line (syctl watch) and the job's detail (syctl get) show it.
  v1::Job evaluated = SampleJob();
  v1::StepMetrics* v = evaluated.mutable_last_validation();
  v->set_step(6);
  v->set_validation_loss(2.5);
  v->set_validation_perplexity(12.182);
  EXPECT_NE(StepLine(*v).find("step 6 loss 0.0000"), std::string::npos) << StepLine(*v);
  EXPECT_NE(StepLine(*v).find(" val_loss 2.5000 val_ppl 12.182"), std::string::npos)
      << StepLine(*v);
  EXPECT_NE(JobDetail(evaluated).find("Validation:    step 6 val_loss 2.5000 val_ppl 12.182"),
            std::string::npos)
      << JobDetail(evaluated);

  v1::Plan plan;
  plan.mutable_best()->mutable_mapping()->set_data_parallel_size(8);
  plan.mutable_best()->mutable_memory()->set_total(10.0 * (1 << 30));
  plan.mutable_best()->mutable_time()->set_total(0.125);
  plan.add_alternatives()->mutable_mapping()->set_tensor_model_parallel_size(2);
  plan.add_rejected()->set_rejection("rule");
  const std::string text = PlanTable(plan, 80.0 * (1 << 30), 5);
  std::printf("%s", text.c_str());
  EXPECT_NE(text.find("Best mapping: TP0 CP0 DP8"), std::string::npos);
  EXPECT_NE(text.find("10.00"), std::string::npos);
  EXPECT_NE(text.find("80.00"), std::string::npos);
  EXPECT_NE(text.find("125.000"), std::string::npos);
  EXPECT_NE(text.find("Rejected: 1"), std::string::npos);
  // No job ran any of them: no measured line, "-" in the alternatives' measured columns.
  EXPECT_EQ(text.find("Measured ("), std::string::npos) << text;
  EXPECT_NE(text.find("MEASURED-MS"), std::string::npos) << text;

  // The best mapping and one alternative measured by jobs of the coordinator.
  v1::MeasuredRun* m = plan.mutable_best()->mutable_measured();
  m->set_job("jobs/7");
  m->set_step(50);
  m->set_step_seconds(0.25);
  m->set_memory_bytes(8.0 * (1 << 30));
  m->set_runs(2);
  v1::PlanCandidate* alt = plan.mutable_alternatives(0);
  alt->mutable_memory()->set_total(4.0 * (1 << 30));
  alt->mutable_time()->set_total(0.5);
  alt->mutable_measured()->set_step_seconds(0.4);
  alt->mutable_measured()->set_runs(1);  // a CPU run: no memory reported
  const std::string measured = PlanTable(plan, 80.0 * (1 << 30), 5);
  std::printf("%s", measured.c_str());
  EXPECT_NE(measured.find("Measured (jobs/7, step 50, 2 jobs): 250.000 ms, 8.00 GiB; estimate / "
                          "measured: time 0.50, memory 1.25"),
            std::string::npos)
      << measured;
  EXPECT_NE(measured.find("4.00        500.000  400.000      -"), std::string::npos) << measured;
  // Not calibrated: no calibration line, no CAL-MS column.
  EXPECT_EQ(measured.find("Calibrat"), std::string::npos) << measured;
  EXPECT_EQ(measured.find("CAL-MS"), std::string::npos) << measured;
  EXPECT_NE(measured.find("EST-MS"), std::string::npos) << measured;

  // Calibrated from those runs (the coordinator's Plan): the factors, what they were fitted on,
  // the best's calibrated time and its ratio to the run, the CAL-MS column.
  v1::Calibration* cal = plan.mutable_calibration();
  cal->set_method(v1::Calibration::PER_TERM);
  cal->set_compute_factor(1.5);
  cal->set_communication_factor(0.25);
  cal->set_ep_communication_factor(2.0);
  cal->set_bubble_factor(1.5);
  cal->set_mappings(2);
  cal->set_runs(3);
  cal->set_max_relative_error(0.0123);
  plan.mutable_best()->set_calibrated_step_seconds(0.2);
  alt->set_calibrated_step_seconds(0.45);
  const std::string calibrated = PlanTable(plan, 80.0 * (1 << 30), 5);
  std::printf("%s", calibrated.c_str());
  EXPECT_NE(
      calibrated.find(
          "Calibration (per-term fit over 2 mappings, 3 jobs): compute x1.500, "
          "communication x0.250, EP all-to-all x2.000, bubble x1.500; fit error up to 1.2%\n"),
      std::string::npos)
      << calibrated;
  EXPECT_NE(calibrated.find("Calibrated step time: 200.000 ms\n"), std::string::npos) << calibrated;
  EXPECT_NE(calibrated.find("estimate / measured: time 0.50, memory 1.25; calibrated / measured: "
                            "time 0.80\n"),
            std::string::npos)
      << calibrated;
  EXPECT_NE(calibrated.find("MEMORY-GIB  EST-MS   CAL-MS   MEASURED-MS  MEASURED-GIB"),
            std::string::npos)
      << calibrated;
  EXPECT_NE(calibrated.find("4.00        500.000  450.000  400.000      -"), std::string::npos)
      << calibrated;
  cal->set_method(v1::Calibration::SINGLE_RATIO);
  cal->set_mappings(1);
  cal->set_runs(1);
  EXPECT_NE(
      PlanTable(plan, 80.0 * (1 << 30), 5).find("Calibration (one ratio over 1 mapping, 1 job)"),
      std::string::npos);
}

// `syctl plan --search`: the searched world and sizes, the calibration line (or none), every
// ranked mapping numbered from 1 with EST-MS, CAL-MS, MEASURED-MS, EST-GIB and MEASURED-GIB ("-"
// where there is nothing), the rejected with their rule; --alternatives caps both lists.
TEST(Render, SearchTable) {
  auto mapping = [](int tp, int dp, int ep, int edp) {
    v1::Mapping m;
    m.set_tensor_model_parallel_size(tp);
    m.set_context_parallel_size(1);
    m.set_data_parallel_size(dp);
    m.set_pipeline_model_parallel_size(1);
    m.set_expert_tensor_parallel_size(1);
    m.set_expert_model_parallel_size(ep);
    m.set_expert_data_parallel_size(edp);
    m.set_use_distributed_optimizer(true);
    m.set_micro_batch_size(1);
    m.set_num_micro_batches(4 / dp);
    return m;
  };
  const double gib = 1024.0 * 1024 * 1024;
  v1::Plan plan;
  plan.mutable_search()->set_world_size(4);
  for (const char* f :
       {"tensor_model_parallel_size", "context_parallel_size", "pipeline_model_parallel_size",
        "expert_tensor_parallel_size", "expert_model_parallel_size"}) {
    plan.mutable_search()->add_varied(f);
  }
  v1::PlanCandidate* best = plan.mutable_best();
  *best->mutable_mapping() = mapping(2, 2, 4, 1);
  best->mutable_time()->set_total(0.300);
  best->mutable_memory()->set_total(20 * gib);
  v1::PlanCandidate* second = plan.add_alternatives();
  *second->mutable_mapping() = mapping(1, 4, 4, 1);
  second->mutable_time()->set_total(0.320);
  second->mutable_memory()->set_total(30 * gib);
  second->mutable_measured()->set_step_seconds(0.480);
  second->mutable_measured()->set_memory_bytes(31.5 * gib);
  v1::PlanCandidate* third = plan.add_alternatives();
  *third->mutable_mapping() = mapping(4, 1, 1, 4);
  third->mutable_time()->set_total(0.400);
  third->mutable_memory()->set_total(10 * gib);
  third->mutable_measured()->set_step_seconds(0.700);  // a CPU run: no memory
  v1::PlanCandidate* rejected = plan.add_rejected();
  *rejected->mutable_mapping() = mapping(1, 4, 1, 4);
  rejected->set_rejection("memory: per-rank estimate 90.00 GiB exceeds\x1b[31m 80 GiB");
  *plan.add_rejected()->mutable_mapping() = mapping(1, 4, 1, 4);
  plan.mutable_rejected(1)->set_rejection("model.num_experts (6) must be divisible by 4");

  const std::string text = SearchTable(plan, 80 * gib, 1 << 30);
  std::printf("%s", text.c_str());
  EXPECT_EQ(text.find("Search: every mapping of 4 ranks; varied TP, CP, PP, ETP, EP (unset in the "
                      "spec), the other sizes as the spec sets them\n"
                      "Calibration: none (no job of this workload measured a mapping; ranked by "
                      "EST-MS)\n"),
            0u)
      << text;
  EXPECT_NE(text.find("Ranked (3 feasible; per-rank memory of 80.00 GiB):\n"), std::string::npos)
      << text;
  // The header and rows, aligned.
  EXPECT_NE(
      text.find(
          "  #  MAPPING                                                 EST-MS   CAL-MS  "
          "MEASURED-MS  EST-GIB  MEASURED-GIB\n"
          "  1  TP2 CP1 DP2 PP1 | ETP1 EP4 EDP1 | dist-opt | mbs 1 x 2  300.000  -       -      "
          "      20.00    -\n"
          "  2  TP1 CP1 DP4 PP1 | ETP1 EP4 EDP1 | dist-opt | mbs 1 x 1  320.000  -       480.000"
          "      30.00    31.50\n"
          "  3  TP4 CP1 DP1 PP1 | ETP1 EP1 EDP4 | dist-opt | mbs 1 x 4  400.000  -       700.000"
          "      10.00    -\n"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("Rejected: 2 mappings:\n"), std::string::npos) << text;
  EXPECT_NE(text.find("model.num_experts (6) must be divisible by 4\n"), std::string::npos) << text;
  // A server's rule text reaches the terminal escaped.
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_NE(text.find("exceeds\\u001b[31m 80 GiB"), std::string::npos) << text;

  // Calibrated: the factors line and the CAL-MS column filled; the table is the plan's order.
  v1::Calibration* cal = plan.mutable_calibration();
  cal->set_method(v1::Calibration::PER_TERM);
  cal->set_compute_factor(1.5);
  cal->set_communication_factor(0.25);
  cal->set_ep_communication_factor(2.0);
  cal->set_bubble_factor(1.5);
  cal->set_mappings(2);
  cal->set_runs(3);
  best->set_calibrated_step_seconds(0.4);
  second->set_calibrated_step_seconds(0.48);
  third->set_calibrated_step_seconds(0.7);
  const std::string calibrated = SearchTable(plan, 80 * gib, 1 << 30);
  std::printf("%s", calibrated.c_str());
  EXPECT_NE(
      calibrated.find(
          "\nCalibration (per-term fit over 2 mappings, 3 jobs): compute x1.500, "
          "communication x0.250, EP all-to-all x2.000, bubble x1.500; fit error up to 0.0%\n"),
      std::string::npos)
      << calibrated;
  EXPECT_EQ(calibrated.find("Calibration: none"), std::string::npos) << calibrated;
  EXPECT_NE(calibrated.find("  1  TP2 CP1 DP2 PP1 | ETP1 EP4 EDP1 | dist-opt | mbs 1 x 2  300.000  "
                            "400.000  -            20.00    -\n"),
            std::string::npos)
      << calibrated;
  EXPECT_NE(calibrated.find("  2  TP1 CP1 DP4 PP1 | ETP1 EP4 EDP1 | dist-opt | mbs 1 x 1  320.000  "
                            "480.000  480.000      30.00    31.50\n"),
            std::string::npos)
      << calibrated;

  // Capped at 2 rows per list (syctl plan --search --alternatives 1).
  const std::string capped = SearchTable(plan, 80 * gib, 2);
  std::printf("%s", capped.c_str());
  EXPECT_NE(capped.find("Ranked (3 feasible, top 2;"), std::string::npos) << capped;
  EXPECT_NE(capped.find("  2  TP1"), std::string::npos) << capped;
  EXPECT_EQ(capped.find("  3  TP4"), std::string::npos) << capped;
  EXPECT_NE(capped.find("Rejected: 2 mappings:\n"), std::string::npos) << capped;
  const std::string one_rejected = SearchTable(plan, 80 * gib, 1);
  EXPECT_NE(one_rejected.find("Rejected: 2 mappings, first 1:\n"), std::string::npos)
      << one_rejected;
  EXPECT_EQ(one_rejected.find("model.num_experts"), std::string::npos) << one_rejected;
}

// Server strings with control characters (a job stored before the bounds, a hostile server) never
// reach the terminal raw, in any output form; JSON output still parses to the same strings.
TEST(Render, ControlCharactersAreEscapedEverywhere) {
  const std::string evil =
      "a\x1b[2Jb\nc\x07"
      "d\x7f e\xc2\x9b f\t";
  v1::Job job;
  job.set_name("jobs/1");
  job.set_state(v1::Job::PENDING);
  job.mutable_spec()->set_display_name(evil);
  job.set_failure_reason(evil);
  job.mutable_last_event()->set_reason("WAITING_FOR_WORKERS");
  job.mutable_last_event()->set_message(evil);
  auto raw_control = [](const std::string& text) {
    for (size_t i = 0; i < text.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(text[i]);
      if ((c < 0x20 && c != '\n') || c == 0x7F) return true;
      if (c == 0xC2 && i + 1 < text.size() &&
          (static_cast<unsigned char>(text[i + 1]) & 0xE0) == 0x80)
        return true;
    }
    return false;
  };
  const std::string table = TerminalSafeLines(JobsTable({job}));
  const std::string detail = TerminalSafeLines(JobDetail(job));
  const std::string json = TerminalSafeLines(Structured(job, Output::kJson));
  const std::string yaml = TerminalSafeLines(Structured(job, Output::kYaml));
  v1::JobEvent event = job.last_event();
  const std::string line = EventLine(event);
  for (const std::string* out : {&table, &detail, &json, &yaml, &line}) {
    EXPECT_FALSE(raw_control(*out)) << *out;
  }
  // A newline inside a value is escaped, so the table keeps one line per job.
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 2) << table;
  EXPECT_NE(detail.find("Waiting:"), std::string::npos) << detail;
  EXPECT_NE(detail.find("a\\u001b[2Jb\\u000ac\\u0007d\\u007f e\\u009b f\\u0009"), std::string::npos)
      << detail;
  EXPECT_EQ(Json::parse(json)["spec"]["display_name"].get<std::string>(),
            "a\x1b[2Jb\nc\x07"
            "d\x7f e\xc2\x9b f\t");
  EXPECT_EQ(YAML::Load(yaml)["spec"]["display_name"].as<std::string>(), evil);
  std::printf("escaped detail line: %s\n", detail.substr(detail.find("Display name:"), 60).c_str());
}

TEST(Render, ParseOutput) {
  Output o;
  EXPECT_TRUE(ParseOutput("text", &o));
  EXPECT_EQ(o, Output::kTable);
  EXPECT_TRUE(ParseOutput("yaml", &o));
  EXPECT_EQ(o, Output::kYaml);
  EXPECT_FALSE(ParseOutput("wide", &o));
}

}  // namespace
}  // namespace switchyard::cli
