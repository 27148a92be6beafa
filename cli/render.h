// File: cli/render.h
//
// How syctl prints API messages on stdout: `-o json` is the proto3 JSON mapping with the proto
// field names (the coordinator's REST bodies: int64 as strings, enums by name, timestamps RFC
// 3339), `-o yaml` the same document as block YAML, `-o table` (also spelled `text`) aligned
// columns for people, `-o name` the resource names only (`jobs/7`), for scripts.
//
// Nothing the server sends reaches the terminal raw: every printed text goes through
// TerminalSafe (a value inside a line: table cells, event messages, errors) or TerminalSafeLines
// (a whole output of ours, whose newlines are kept), which write control characters (C0, DEL,
// C1) as \u00XX. In JSON and YAML output that escape is the same string (the printers already
// escape C0 inside strings; DEL and C1 appear only inside strings), so the documents still parse
// to the server's values.
//
// Thread-safe: no shared state.
#ifndef SWITCHYARD_CLI_RENDER_H_
#define SWITCHYARD_CLI_RENDER_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "switchyard/v1/job.pb.h"
#include "switchyard/v1/plan.pb.h"
#include "switchyard/v1/worker.pb.h"

namespace switchyard::cli {

enum class Output { kTable, kJson, kYaml, kName };

// `text` with every control character (C0 including newline and tab, DEL, UTF-8 C1) as \u00XX.
std::string TerminalSafe(absl::string_view text);
// The same, but newlines are kept (our own line structure).
std::string TerminalSafeLines(absl::string_view text);

// "table" | "text" | "json" | "yaml" | "name"; false for anything else.
bool ParseOutput(absl::string_view text, Output* out);

// The message as proto3 JSON (proto field names), indented when `pretty`, one line otherwise.
std::string ToJson(const google::protobuf::Message& message, bool pretty);

// JSON text as block YAML. Strings that YAML would read as another type ("12", "true", "") are
// quoted, so the YAML reads back to the same JSON document.
std::string JsonToYaml(const std::string& json);

// The message in `output` (json or yaml); the table form is per type, below.
std::string Structured(const google::protobuf::Message& message, Output output);

// "2026-11-22T18:20:39Z", or "-" when unset.
std::string FormatTime(const google::protobuf::Timestamp& time);

// "TP2 CP1 DP4 PP1 | ETP1 EP8 EDP1 | dist-opt | mbs 1 x 4".
std::string MappingText(const v1::Mapping& mapping);

// NAME DISPLAY-NAME STATE GEN RESTARTS STEP CREATED, one row per job, with a header.
std::string JobsTable(const std::vector<v1::Job>& jobs);

// ID HOST GPU STATE JOB GEN RANK CONNECTED LAST-HEARTBEAT, one row per worker, with a header.
std::string WorkersTable(const v1::ListWorkersResponse& workers);

// One job as "Key: value" lines (state, plan mapping, last step, failure reason).
std::string JobDetail(const v1::Job& job);

// The best mapping with its memory and time breakdown (and, when a job of the coordinator ran it,
// its measured step time and memory with the estimate/measured ratios), the calibration of the
// step-time model when the plan has one (its factors, from how many mappings and jobs, and the
// best's calibrated step time), then the top `alternatives` others with their estimated (EST-MS),
// calibrated (CAL-MS, only in a calibrated plan) and measured ("-": no job ran it) columns, then
// the number rejected. `gpu_memory_bytes` is the cluster's, for the "of N GiB" column.
std::string PlanTable(const v1::Plan& plan, double gpu_memory_bytes, int alternatives);

// A searched plan (Plan.search set: `syctl plan --search`): what was searched (the world, the
// sizes varied), the calibration line (or that there is none), then every ranked mapping, best
// first: # MAPPING EST-MS CAL-MS MEASURED-MS EST-GIB MEASURED-GIB ("-": not calibrated, no job
// ran it, no memory reported), then the rejected mappings with their rule. Each list shows at
// most `max_rows` rows (and says so when it is cut).
std::string SearchTable(const v1::Plan& plan, double gpu_memory_bytes, int max_rows);

// "step 12 loss 3.2100 aux 0.0123 lr 3.00e-04 gnorm 1.23 123.4 ms 12345 tok/s mfu 31.0%".
std::string StepLine(const v1::StepMetrics& step);
// "val_loss L val_ppl P" of an evaluation step (StepMetrics.validation_loss set); StepLine
// appends it to such a step's line.
std::string ValidationText(const v1::StepMetrics& step);

// "2026-11-22T18:20:39Z RUNNING gen 1 STARTED: all 8 workers attached".
std::string EventLine(const v1::JobEvent& event);

}  // namespace switchyard::cli

#endif  // SWITCHYARD_CLI_RENDER_H_
