// File: common/config/validate_test_util.h
//
// Test helpers for the job-spec validation tests: a valid baseline spec and the assertion that a
// spec breaks a given rule.
#ifndef SWITCHYARD_COMMON_CONFIG_VALIDATE_TEST_UTIL_H_
#define SWITCHYARD_COMMON_CONFIG_VALIDATE_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "switchyard/v1/config.pb.h"

namespace switchyard {
namespace testing {

// A valid MoE spec as a user would write it (defaults not applied): 8 layers, hidden 1024,
// 16 heads / 4 query groups, 16 experts top-2, alltoall; world 32 = TP 2 (SP) x PP 2 x DP 8, and
// experts ETP 1 x EP 4 x EDP 4 x PP 2; distributed optimizer; weighted data paths. Derived
// fields (global batch, min/max workers, kv_channels, ...) are left to ApplyDefaults, so tests
// that change a size keep the derived values consistent.
v1::JobSpec RawBaseline();

// Applies defaults to `spec`, then asserts INVALID_ARGUMENT from ValidateJobSpec whose message
// contains every needle (field paths and rule text), and, when `only` is true, that this is the
// only violation (AllViolations has one entry), i.e. exactly one rule is broken. Prints the
// message as evidence.
void ExpectViolation(v1::JobSpec spec, const std::vector<std::string>& needles, bool only = true);

// Applies defaults and asserts that the spec is valid.
void ExpectValid(v1::JobSpec spec);

// Sets the singular integer field at a dotted path ("parallel.world_size") by reflection.
void SetIntField(v1::JobSpec* spec, absl::string_view path, int64_t value);

}  // namespace testing
}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_CONFIG_VALIDATE_TEST_UTIL_H_
