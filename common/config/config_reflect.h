// File: common/config/config_reflect.h
//
// Internal to common/config: the descriptor-driven walker between nlohmann::ordered_json values
// and protobuf messages. Both config front ends (JSON text, YAML text converted to JSON values)
// go through JsonToMessage, so every input error is reported the same way:
//
//   model.moe_router_topk: expected an integer, got string "eight"
//   model.moe_routr_topk: unknown field (did you mean "moe_router_topk"?)
//   parallel.tensor_model_parallel_size: 3000000000 does not fit in int32
//   model: expected an object, got array
//
// Rules: field names are the proto names (no camelCase JSON names); null is rejected everywhere;
// integer fields take integers or floats without a fraction, in range; double fields take any
// number and the strings "NaN", "Infinity", "-Infinity" (as proto3 JSON does); a single value is
// accepted where a repeated field is expected; strings must be valid UTF-8; enums take their value
// name or number. Maps with string, integer or bool keys are supported; well-known types are
// treated as ordinary messages.
#ifndef SWITCHYARD_COMMON_CONFIG_CONFIG_REFLECT_H_
#define SWITCHYARD_COMMON_CONFIG_CONFIG_REFLECT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "nlohmann/json.hpp"

namespace switchyard {
namespace config_internal {

using Json = nlohmann::ordered_json;
// The protobuf reflection types the config code (and validate_internal.h) walks messages with.
using google::protobuf::Descriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Deepest nesting of objects and arrays accepted in a document.
inline constexpr int kMaxDepth = 64;

// Merges `value` into `message` (callers pass a cleared message). `root_label` names the document
// in errors about the root itself ("job spec: expected an object, got array"). Every error is
// INVALID_ARGUMENT; the walker never throws.
absl::Status JsonToMessage(const Json& value, absl::string_view root_label,
                           google::protobuf::Message* message);

// The fields of `message` that are set (proto3 presence: optional fields when present, implicit
// scalars when non-zero, repeated fields when non-empty, in field-number order) as a JSON object.
// Doubles that are not finite become the strings "NaN", "Infinity", "-Infinity".
Json MessageToJson(const google::protobuf::Message& message);

// Shortest text that reads back to the same double, printf-%g style ("0.7", "0.0003", "1e-05",
// "3", "3e+09"); "inf", "-inf", "nan".
std::string FormatDouble(double value);

// "null", "boolean true", "integer 8", "number 2.5", "string \"eight\"" (escaped, truncated),
// "array", "object": the "got ..." part of a type error.
std::string DescribeJson(const Json& value);

// `text` with bytes outside printable ASCII written as \xNN (for error messages that quote input).
std::string Printable(absl::string_view text);

// `key` as it may appear in a field path: printable ASCII kept, the rest C-escaped, truncated.
std::string DisplayKey(absl::string_view key);

}  // namespace config_internal
}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_CONFIG_CONFIG_REFLECT_H_
