// File: common/config/config_yaml.h
//
// Internal to common/config: YAML text <-> JSON values. Reading keeps the YAML 1.2 core-schema
// type of each plain scalar (null, bool, int in decimal/0o/0x, float incl. .inf/.nan, else string);
// quoted and block scalars are strings; the standard tags !!str, !!int, !!float, !!bool, !!null
// are honoured and others rejected. Writing quotes every string that would read back as another
// type, so JsonToYaml -> YamlToJson is lossless.
#ifndef SWITCHYARD_COMMON_CONFIG_CONFIG_YAML_H_
#define SWITCHYARD_COMMON_CONFIG_CONFIG_YAML_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/config/config_reflect.h"

namespace switchyard {
namespace config_internal {

// Most keys accepted in one object (JSON or YAML), and most YAML nodes and scalar bytes after
// alias expansion.
inline constexpr size_t kMaxKeysPerObject = 10000;
inline constexpr size_t kMaxYamlNodes = size_t{1} << 20;
inline constexpr size_t kMaxYamlBytes = size_t{64} << 20;  // scalar bytes after aliases

// Parses exactly one YAML document. Syntax errors carry the line and column; duplicate keys,
// non-scalar keys, unknown tags, too deep nesting and alias bombs are INVALID_ARGUMENT naming the
// path (`root_label` for the document itself). Never throws.
absl::StatusOr<Json> YamlToJson(absl::string_view text, absl::string_view root_label);

// Block-style YAML; lists of scalars in flow style (`[aux_loss, z_loss]`).
std::string JsonToYaml(const Json& value);

// The JSON value of a plain (unquoted, untagged) YAML scalar under the core schema.
Json ResolvePlainScalar(const std::string& text);

}  // namespace config_internal
}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_CONFIG_CONFIG_YAML_H_
