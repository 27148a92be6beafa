// File: common/config/validate_internal.h
//
// Internal to common/validate: the violation collector, shared rule helpers and the rule groups
// (one .cc per area).
#ifndef SWITCHYARD_COMMON_CONFIG_VALIDATE_INTERNAL_H_
#define SWITCHYARD_COMMON_CONFIG_VALIDATE_INTERNAL_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/config/config_reflect.h"
#include "switchyard/v1/config.pb.h"

namespace switchyard {
namespace validate_internal {

// The rules walk the spec by reflection (validate.cc, validate_bounds.cc).
using config_internal::FieldDescriptor;
using config_internal::Message;
using config_internal::Reflection;

class Violations {
 public:
  template <typename... Args>
  void Add(const Args&... args) {
    list_.push_back(absl::StrCat(args...));
  }
  std::vector<std::string>& list() { return list_; }

 private:
  std::vector<std::string> list_;
};

// The parallel sizes Megatron would use: set values, else 1 (ETP: TP). `world` is 0 when unset.
// `valid` is false when any size is not positive (those are reported by the range rules, and
// arithmetic on them is skipped).
struct ParallelSizes {
  int64_t tp, pp, cp, ep, etp, vpp, instances, world;
  bool valid;
  static ParallelSizes From(const v1::ParallelConfig& p);
  // W / (TP*CP*PP) and W / (ETP*EP*PP), or 0 when the world size is unknown or not divisible.
  int64_t DataParallel() const;
  int64_t ExpertDataParallel() const;
};

// Shortest round-trip text of a double, for messages ("0.9", "1e-05", "inf").
inline std::string Num(double d) { return config_internal::FormatDouble(d); }

// "\"a\", \"b\"".
std::string QuoteList(std::initializer_list<absl::string_view> values);
bool IsOneOf(absl::string_view value, std::initializer_list<absl::string_view> allowed);

// `<path_a> (a) must be divisible by <path_b> (b)` when both are positive and b does not divide a.
void CheckDivisible(Violations* v, absl::string_view path_a, int64_t a, absl::string_view path_b,
                    int64_t b);

// `<path> ("x") must be one of "a", "b"` for a non-empty value outside `allowed` (empty means
// "default" and is accepted).
void CheckOneOf(Violations* v, absl::string_view path, const std::string& value,
                std::initializer_list<absl::string_view> allowed);

// Rule groups, in the order ValidateJobSpec runs them (bounds alone when broken).
void CheckBounds(const v1::JobSpec& spec, Violations* v);             // validate_bounds.cc
void CheckRequiredAndRanges(const v1::JobSpec& spec, Violations* v);  // validate.cc
void CheckModel(const v1::JobSpec& spec, Violations* v);              // validate.cc
void CheckMoe(const v1::JobSpec& spec, Violations* v);                // validate_moe.cc
void CheckParallel(const v1::JobSpec& spec, Violations* v);           // validate_parallel.cc
void CheckTraining(const v1::JobSpec& spec, Violations* v);           // validate_parallel.cc
void CheckElasticAndData(const v1::JobSpec& spec, Violations* v);     // validate_parallel.cc
void CheckKnobs(const v1::JobSpec& spec, Violations* v);              // validate_knobs.cc

}  // namespace validate_internal
}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_CONFIG_VALIDATE_INTERNAL_H_
