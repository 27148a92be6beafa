#include "cli/render.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"

namespace switchyard::cli {
namespace {

using Json = nlohmann::ordered_json;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// A plain YAML scalar only when it cannot read back as anything but this string.
bool NeedsQuotes(const std::string& s) {
  if (s.empty()) return true;
  const char first = s[0];
  if (!(absl::ascii_isalpha(static_cast<unsigned char>(first)) || first == '_' || first == '/')) {
    return true;
  }
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (!(absl::ascii_isalnum(u) || c == '_' || c == '.' || c == '/' || c == '-' || c == ' ')) {
      return true;
    }
  }
  if (s.back() == ' ') return true;
  const std::string lower = absl::AsciiStrToLower(s);
  for (const char* keyword : {"true", "false", "yes", "no", "on", "off", "null", "y", "n"}) {
    if (lower == keyword) return true;
  }
  return false;
}

std::string Scalar(const Json& v) {
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    return NeedsQuotes(s) ? v.dump() : s;  // JSON string escapes are YAML double-quoted escapes
  }
  return v.dump();
}

bool IsEmptyContainer(const Json& v) { return (v.is_object() || v.is_array()) && v.empty(); }

void EmitYaml(const Json& v, int indent, std::string* out);

// The value of a mapping key or sequence item: inline scalars, nested blocks on new lines.
void EmitValue(const Json& v, int indent, std::string* out) {
  if (IsEmptyContainer(v)) {
    absl::StrAppend(out, v.is_object() ? " {}\n" : " []\n");
  } else if (v.is_object() || v.is_array()) {
    absl::StrAppend(out, "\n");
    EmitYaml(v, indent + 2, out);
  } else {
    absl::StrAppend(out, " ", Scalar(v), "\n");
  }
}

void EmitYaml(const Json& v, int indent, std::string* out) {
  const std::string pad(indent, ' ');
  if (v.is_object()) {
    for (const auto& [key, value] : v.items()) {
      absl::StrAppend(out, pad, NeedsQuotes(key) ? Json(key).dump() : key, ":");
      EmitValue(value, indent, out);
    }
  } else if (v.is_array()) {
    for (const Json& item : v) {
      if (item.is_object() && !item.empty()) {
        // "- first: 1\n  second: 2"
        std::string block;
        EmitYaml(item, indent + 2, &block);
        absl::StrAppend(out, pad, "- ", block.substr(indent + 2));
      } else {
        absl::StrAppend(out, pad, "-");
        EmitValue(item, indent, out);
      }
    }
  } else {
    absl::StrAppend(out, pad, Scalar(v), "\n");
  }
}

std::string Escape(absl::string_view text, bool keep_newlines) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n' && keep_newlines) {
      out.push_back('\n');
    } else if (c < 0x20 || c == 0x7F) {
      absl::StrAppend(&out, absl::StrFormat("\\u%04x", c));
    } else if (c == 0xC2 && i + 1 < text.size() &&
               static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(text[i + 1]) <= 0x9F) {
      absl::StrAppend(&out, absl::StrFormat("\\u%04x", static_cast<unsigned char>(text[++i])));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

std::string Gib(double bytes) { return absl::StrFormat("%.2f", bytes / kGiB); }
std::string Ms(double seconds) { return absl::StrFormat("%.3f", seconds * 1e3); }

// Left-aligned columns separated by two spaces; cells are made TerminalSafe.
std::string Columns(std::vector<std::vector<std::string>> rows) {
  for (auto& row : rows) {
    for (std::string& cell : row) cell = Escape(cell, /*keep_newlines=*/false);
  }
  std::vector<size_t> width;
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], row[i].size());
    }
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&line, row[i]);
      if (i + 1 < row.size()) line.append(width[i] - row[i].size() + 2, ' ');
    }
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

}  // namespace

std::string TerminalSafe(absl::string_view text) { return Escape(text, false); }
std::string TerminalSafeLines(absl::string_view text) { return Escape(text, true); }

bool ParseOutput(absl::string_view text, Output* out) {
  if (text == "table" || text == "text") {
    *out = Output::kTable;
  } else if (text == "json") {
    *out = Output::kJson;
  } else if (text == "yaml") {
    *out = Output::kYaml;
  } else if (text == "name") {
    *out = Output::kName;
  } else {
    return false;
  }
  return true;
}

std::string ToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string out;
  // Printing a valid in-memory message cannot fail (no Any fields in the API).
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!pretty) return out;
  return Json::parse(out).dump(2);
}

std::string JsonToYaml(const std::string& json) {
  const Json v = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return json + "\n";
  if (IsEmptyContainer(v)) return v.is_object() ? "{}\n" : "[]\n";
  std::string out;
  EmitYaml(v, 0, &out);
  return out;
}

std::string Structured(const google::protobuf::Message& message, Output output) {
  if (output == Output::kYaml) return JsonToYaml(ToJson(message, /*pretty=*/false));
  return ToJson(message, /*pretty=*/true) + "\n";
}

std::string FormatTime(const google::protobuf::Timestamp& time) {
  if (time.seconds() == 0 && time.nanos() == 0) return "-";
  const std::time_t t = static_cast<std::time_t>(time.seconds());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string MappingText(const v1::Mapping& m) {
  return absl::StrFormat(
      "TP%d CP%d DP%d PP%d | ETP%d EP%d EDP%d |%s mbs %d x %d", m.tensor_model_parallel_size(),
      m.context_parallel_size(), m.data_parallel_size(), m.pipeline_model_parallel_size(),
      m.expert_tensor_parallel_size(), m.expert_model_parallel_size(),
      m.expert_data_parallel_size(), m.use_distributed_optimizer() ? " dist-opt |" : "",
      m.micro_batch_size(), m.num_micro_batches());
}

std::string JobsTable(const std::vector<v1::Job>& jobs) {
  std::vector<std::vector<std::string>> rows = {{"NAME", "DISPLAY-NAME", "STATE", "QUEUE", "PRIO",
                                                 "POS", "WAITING", "GEN", "RESTARTS", "STEP",
                                                 "CREATED"}};
  for (const v1::Job& job : jobs) {
    // POS and WAITING: a waiting job's place in its queue and why it waits (Job.queue_status,
    // coordinator/jobs/scheduler.h "Queues"); "-" for jobs that do not wait.
    const bool queued = job.has_queue_status();
    rows.push_back(
        {job.name(), job.spec().display_name().empty() ? "-" : job.spec().display_name(),
         v1::Job::State_Name(job.state()),
         job.spec().queue().empty() ? "default" : job.spec().queue(),
         absl::StrCat(job.spec().priority()),
         queued ? absl::StrCat(job.queue_status().position()) : "-",
         queued && !job.queue_status().reason().empty() ? job.queue_status().reason() : "-",
         absl::StrCat(job.generation()), absl::StrCat(job.restart_count()),
         job.has_last_step() ? absl::StrCat(job.last_step().step()) : "-",
         FormatTime(job.create_time())});
  }
  return Columns(rows);
}

std::string WorkersTable(const v1::ListWorkersResponse& workers) {
  std::vector<std::vector<std::string>> rows = {
      {"ID", "HOST", "GPU", "STATE", "JOB", "GEN", "RANK", "CONNECTED", "LAST-HEARTBEAT"}};
  for (const v1::WorkerStatus& w : workers.workers()) {
    const bool busy = w.state() == v1::WorkerStatus::BUSY;
    rows.push_back({w.worker_id(), w.host().empty() ? "-" : w.host(),
                    w.has_gpu() ? w.gpu().name() : "cpu", v1::WorkerStatus::State_Name(w.state()),
                    busy ? w.job() : "-", busy ? absl::StrCat(w.generation()) : "-",
                    busy ? absl::StrCat(w.rank()) : "-", w.connected() ? "yes" : "no",
                    FormatTime(w.last_heartbeat_time())});
  }
  return Columns(rows);
}

std::string JobDetail(const v1::Job& job) {
  std::vector<std::vector<std::string>> rows = {
      {"Name:", job.name()},
      {"Display name:", job.spec().display_name().empty() ? "-" : job.spec().display_name()},
      {"State:", v1::Job::State_Name(job.state())},
      {"Generation:", absl::StrCat(job.generation())},
      {"Restarts:", absl::StrCat(job.restart_count())},
      {"Queue:", absl::StrCat(job.spec().queue().empty() ? "default" : job.spec().queue(),
                              ", priority ", job.spec().priority())},
      {"Created:", FormatTime(job.create_time())},
      {"Updated:", FormatTime(job.update_time())},
      {"Train iters:", job.spec().training().has_train_iters()
                           ? absl::StrCat(job.spec().training().train_iters())
                           : "-"},
      {"Mapping:", job.plan().has_best() ? MappingText(job.plan().best().mapping()) : "-"},
      {"Last step:", job.has_last_step() ? StepLine(job.last_step()) : "-"},
      {"Validation:", job.has_last_validation()
                          ? absl::StrCat("step ", job.last_validation().step(), " ",
                                         ValidationText(job.last_validation()))
                          : "-"},
  };
  if (!job.failure_reason().empty()) rows.push_back({"Failure:", job.failure_reason()});
  if (job.has_queue_status()) {
    const v1::QueueStatus& q = job.queue_status();
    rows.push_back({"Position:", absl::StrCat(q.position(), " in queue ", q.queue(),
                                              q.reason().empty() ? "" : ": ", q.reason(),
                                              q.message().empty() ? "" : ": ", q.message())});
  }
  const bool waits = job.state() == v1::Job::PENDING || job.state() == v1::Job::RESTARTING;
  if (job.has_last_event()) {
    const v1::JobEvent& e = job.last_event();
    rows.push_back({waits ? "Waiting:" : "Last event:",
                    absl::StrCat(e.reason(), e.message().empty() ? "" : ": ", e.message())});
  }
  return Columns(rows);
}

namespace {

// "Calibration (per-term fit over 2 mappings, 3 jobs): compute x1.500, communication x0.250,
// EP all-to-all x2.000, bubble x1.500; fit error up to 1.2%\n". "communication" is
// Calibration.communication_factor, all but the EP all-to-all (TP, CP, DP, PP).
std::string CalibrationLine(const v1::Calibration& cal) {
  return absl::StrCat(
      "Calibration (", cal.method() == v1::Calibration::PER_TERM ? "per-term fit" : "one ratio",
      " over ", cal.mappings(), cal.mappings() == 1 ? " mapping, " : " mappings, ", cal.runs(),
      cal.runs() == 1 ? " job" : " jobs",
      absl::StrFormat("): compute x%.3f, communication x%.3f, EP all-to-all x%.3f, bubble x%.3f; "
                      "fit error up to %.1f%%\n",
                      cal.compute_factor(), cal.communication_factor(),
                      cal.ep_communication_factor(), cal.bubble_factor(),
                      cal.max_relative_error() * 100));
}

// "TP" for "tensor_model_parallel_size", ... (SearchScope.varied); the field itself otherwise.
std::string SizeAbbreviation(const std::string& field) {
  static const std::pair<const char*, const char*> kNames[] = {
      {"tensor_model_parallel_size", "TP"},   {"context_parallel_size", "CP"},
      {"pipeline_model_parallel_size", "PP"}, {"expert_tensor_parallel_size", "ETP"},
      {"expert_model_parallel_size", "EP"},
  };
  for (const auto& [name, abbreviation] : kNames) {
    if (field == name) return abbreviation;
  }
  return field;
}

}  // namespace

std::string SearchTable(const v1::Plan& plan, double gpu_memory_bytes, int max_rows) {
  const v1::SearchScope& scope = plan.search();
  std::vector<std::string> varied;
  for (const std::string& field : scope.varied()) varied.push_back(SizeAbbreviation(field));
  std::string out = absl::StrCat("Search: every mapping of ", scope.world_size(),
                                 scope.world_size() == 1 ? " rank" : " ranks", "; varied ",
                                 varied.empty() ? "none" : absl::StrJoin(varied, ", "),
                                 " (unset in the spec), the other sizes as the spec sets them\n");
  // The step-time model fitted to this workload's runs (coordinator/planner/calibration.h); the
  // ranking follows the calibrated times when there is one.
  absl::StrAppend(&out, plan.has_calibration()
                            ? CalibrationLine(plan.calibration())
                            : "Calibration: none (no job of this workload measured a mapping; "
                              "ranked by EST-MS)\n");
  std::vector<const v1::PlanCandidate*> ranked;
  if (plan.has_best()) ranked.push_back(&plan.best());
  for (const v1::PlanCandidate& c : plan.alternatives()) ranked.push_back(&c);
  const size_t shown = std::min(ranked.size(), static_cast<size_t>(std::max(max_rows, 0)));
  std::vector<std::vector<std::string>> rows = {
      {"  #", "MAPPING", "EST-MS", "CAL-MS", "MEASURED-MS", "EST-GIB", "MEASURED-GIB"}};
  for (size_t i = 0; i < shown; ++i) {
    const v1::PlanCandidate& c = *ranked[i];
    const bool measured = c.has_measured();
    const bool memory = measured && c.measured().memory_bytes() > 0;
    rows.push_back({absl::StrCat("  ", i + 1), MappingText(c.mapping()), Ms(c.time().total()),
                    c.has_calibrated_step_seconds() ? Ms(c.calibrated_step_seconds()) : "-",
                    measured ? Ms(c.measured().step_seconds()) : "-", Gib(c.memory().total()),
                    memory ? Gib(c.measured().memory_bytes()) : "-"});
  }
  absl::StrAppend(&out, "\nRanked (", ranked.size(), " feasible",
                  shown < ranked.size() ? absl::StrCat(", top ", shown) : "",
                  "; per-rank memory of ", Gib(gpu_memory_bytes), " GiB):\n", Columns(rows));
  const size_t rejected = static_cast<size_t>(plan.rejected_size());
  const size_t shown_rejected = std::min(rejected, static_cast<size_t>(std::max(max_rows, 0)));
  absl::StrAppend(&out, "\nRejected: ", rejected, rejected == 1 ? " mapping" : " mappings",
                  shown_rejected < rejected ? absl::StrCat(", first ", shown_rejected) : "",
                  shown_rejected > 0 ? ":" : "", "\n");
  if (shown_rejected > 0) {
    std::vector<std::vector<std::string>> why = {{"  MAPPING", "RULE"}};
    for (size_t i = 0; i < shown_rejected; ++i) {
      const v1::PlanCandidate& c = plan.rejected(static_cast<int>(i));
      why.push_back({"  " + MappingText(c.mapping()), c.rejection()});
    }
    absl::StrAppend(&out, Columns(why));
  }
  return out;
}

std::string PlanTable(const v1::Plan& plan, double gpu_memory_bytes, int alternatives) {
  const v1::PlanCandidate& best = plan.best();
  const v1::MemoryEstimate& mem = best.memory();
  const v1::TimeEstimate& time = best.time();
  std::string out = absl::StrCat("Best mapping: ", MappingText(best.mapping()), "\n\n");
  absl::StrAppend(
      &out, "Memory per rank (GiB):\n",
      Columns({{"  weights", "gradients", "optimizer", "activations", "total", "of"},
               {"  " + Gib(mem.weights()), Gib(mem.gradients()), Gib(mem.optimizer_states()),
                Gib(mem.activations()), Gib(mem.total()), Gib(gpu_memory_bytes)}}),
      "\n");
  absl::StrAppend(
      &out, "Step time (ms):\n",
      Columns({{"  compute", "tp-comm", "ep-comm", "dp-comm", "pp-comm", "bubble", "total"},
               {"  " + Ms(time.compute()), Ms(time.tp_communication()), Ms(time.ep_communication()),
                Ms(time.dp_communication()), Ms(time.pp_communication()),
                Ms(time.pipeline_bubble()), Ms(time.total())}}));
  // What this coordinator's jobs of the same workload measured on the mapping (Plan fills it).
  if (best.has_measured()) {
    const v1::MeasuredRun& m = best.measured();
    absl::StrAppend(
        &out, "Measured (", TerminalSafe(m.job()), ", step ", m.step(), ", ", m.runs(),
        m.runs() == 1 ? " job" : " jobs", "): ", Ms(m.step_seconds()), " ms",
        m.memory_bytes() > 0 ? absl::StrCat(", ", Gib(m.memory_bytes()), " GiB") : "",
        "; estimate / measured: time ", absl::StrFormat("%.2f", time.total() / m.step_seconds()),
        m.memory_bytes() > 0 ? absl::StrFormat(", memory %.2f", mem.total() / m.memory_bytes())
                             : "",
        best.has_calibrated_step_seconds()
            ? absl::StrFormat("; calibrated / measured: time %.2f",
                              best.calibrated_step_seconds() / m.step_seconds())
            : "",
        "\n");
  }
  // The step-time model fitted to those runs (coordinator/planner/calibration.h); the ranking
  // follows the calibrated times.
  const bool calibrated = plan.has_calibration();
  if (calibrated) {
    absl::StrAppend(&out, CalibrationLine(plan.calibration()), "Calibrated step time: ",
                    best.has_calibrated_step_seconds() ? Ms(best.calibrated_step_seconds()) : "-",
                    " ms\n");
  }
  if (plan.alternatives_size() > 0) {
    std::vector<std::vector<std::string>> rows;
    rows.push_back({"  #", "MAPPING", "MEMORY-GIB", "EST-MS"});
    if (calibrated) rows.back().push_back("CAL-MS");
    rows.back().insert(rows.back().end(), {"MEASURED-MS", "MEASURED-GIB"});
    for (int i = 0; i < plan.alternatives_size() && i < alternatives; ++i) {
      const v1::PlanCandidate& c = plan.alternatives(i);
      const bool measured = c.has_measured();
      const bool memory = measured && c.measured().memory_bytes() > 0;
      rows.push_back({absl::StrCat("  ", i + 2), MappingText(c.mapping()), Gib(c.memory().total()),
                      Ms(c.time().total())});
      if (calibrated) {
        rows.back().push_back(c.has_calibrated_step_seconds() ? Ms(c.calibrated_step_seconds())
                                                              : "-");
      }
      rows.back().insert(rows.back().end(), {measured ? Ms(c.measured().step_seconds()) : "-",
                                             memory ? Gib(c.measured().memory_bytes()) : "-"});
    }
    absl::StrAppend(&out, "\nAlternatives (", plan.alternatives_size(), " feasible, top ",
                    std::min(alternatives, plan.alternatives_size()), "):\n", Columns(rows));
  }
  absl::StrAppend(&out, "\nRejected: ", plan.rejected_size(),
                  plan.rejected_size() > 0 ? " mappings (-o json lists each rule)" : "", "\n");
  return out;
}

std::string StepLine(const v1::StepMetrics& s) {
  // Workers without a known peak (CPU) report a negative MFU.
  const std::string mfu = s.mfu() < 0 ? "-" : absl::StrFormat("%.1f%%", s.mfu() * 100.0);
  std::string line = absl::StrFormat(
      "step %d loss %.4f aux %.4f lr %.2e gnorm %.3f %.1f ms %.0f tok/s mfu %s", s.step(), s.loss(),
      s.aux_loss(), s.lr(), s.grad_norm(), s.step_ms(), s.tokens_per_second(), mfu);
  // An evaluation step (training.eval_interval) also carries the held-out loss.
  if (s.has_validation_loss()) absl::StrAppend(&line, " ", ValidationText(s));
  return line;
}

std::string ValidationText(const v1::StepMetrics& s) {
  return absl::StrFormat("val_loss %.4f val_ppl %.3f", s.validation_loss(),
                         s.validation_perplexity());
}

std::string EventLine(const v1::JobEvent& e) {
  std::string line = absl::StrCat(FormatTime(e.time()), " ", v1::Job::State_Name(e.state()),
                                  " gen ", e.generation());
  if (!e.reason().empty()) absl::StrAppend(&line, " ", TerminalSafe(e.reason()));
  if (!e.message().empty()) {
    absl::StrAppend(&line, e.reason().empty() ? " " : ": ", TerminalSafe(e.message()));
  }
  return line;
}

}  // namespace switchyard::cli
