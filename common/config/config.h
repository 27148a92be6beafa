// File: common/config/config.h
//
// Job specs (switchyard.v1.JobSpec) from JSON or YAML text and back. Parsing is strict and never
// crashes or throws on any input: every problem is INVALID_ARGUMENT naming the field path and the
// rule, e.g.
//
//   model.moe_router_topk: expected an integer, got string "eight"
//   model.moe_routr_topk: unknown field (did you mean "moe_router_topk"?)
//   parallel.tensor_model_parallel_size: 3000000000 does not fit in int32
//   model: expected an object, got array
//   model.hidden_size: duplicate key
//
// Field names are the proto (Megatron-LM argument) names. A scalar is accepted where a list is
// expected (`moe_router_load_balancing_type: aux_loss`); integers are accepted for doubles; floats
// with a fraction are rejected for integers; null is rejected (omit a field to get its default).
// YAML scalars keep their YAML 1.2 core-schema types: plain `8` is an integer, `0.7` and `1e-3`
// floats, `true` a boolean, `"8"` (quoted) a string; so a string field given a plain number is an
// error. Duplicate keys are rejected in both formats. Documents over 4 MiB, nested deeper than 64
// levels, with more than 10000 keys in one object or, after YAML alias expansion, more than 2^20
// nodes or 64 MiB of scalars are rejected. YAML goes through yaml-cpp's event parser, never its
// LoadAll, which loops forever on some malformed streams (yaml-cpp issue #1040).
//
// Thread-safe: no shared state.
//
// Parsing does not apply defaults or validate: call ApplyDefaults
// (common/config/config_defaults.h), then ValidateJobSpec (common/config/validate.h).
#ifndef SWITCHYARD_COMMON_CONFIG_CONFIG_H_
#define SWITCHYARD_COMMON_CONFIG_CONFIG_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "switchyard/v1/config.pb.h"

namespace switchyard {

absl::StatusOr<v1::JobSpec> ParseJobSpecJson(absl::string_view text);
absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(absl::string_view text);

// Reads `path` and parses it by extension: ".json", ".yaml" or ".yml" (any case). A missing or
// unreadable file is NOT_FOUND / INVALID_ARGUMENT; errors are prefixed with the path.
absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path);

// The set fields of `spec` (see config_internal::MessageToJson) as pretty JSON (2-space indent) or
// block YAML. Both read back to an equal message with the parsers above. Non-finite doubles are
// written as the strings "NaN", "Infinity", "-Infinity" (which the parsers accept for doubles, as
// does proto3 JSON; YAML's .nan and .inf are accepted too).
std::string JobSpecToJson(const v1::JobSpec& spec);
std::string JobSpecToYaml(const v1::JobSpec& spec);

// The same, for any message type (`message` is cleared first). Errors about the document root use
// the message's type name.
absl::Status ParseMessageJson(absl::string_view text, google::protobuf::Message* message);
absl::Status ParseMessageYaml(absl::string_view text, google::protobuf::Message* message);
std::string MessageToJsonText(const google::protobuf::Message& message);
std::string MessageToYamlText(const google::protobuf::Message& message);

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_CONFIG_CONFIG_H_
