// File: common/config/validate_bounds.cc
//
// Input bounds of a job spec (validate.h "Bounds"): the serialized size, every string's length
// and bytes, every repeated field's count. Walks the spec by reflection, so a field added to
// config.proto is bounded by the defaults below until it gets its own row.
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/config/validate.h"
#include "common/config/validate_internal.h"
#include "google/protobuf/descriptor.h"

namespace switchyard {
namespace validate_internal {
namespace {

struct Bound {
  const char* path;  // field path without indices
  size_t max;        // bytes for a string (each element of a repeated string), else elements
};

// Strings: paths get PATH_MAX; names and choices are short. Counts: a repeated field's elements.
constexpr Bound kStringBounds[] = {
    {"display_name", kMaxDisplayNameBytes},  {"training.save", kMaxPathBytes},
    {"training.load", kMaxPathBytes},        {"data.data_path", kMaxPathBytes},
    {"data.tokenizer_model", kMaxPathBytes},
};
constexpr Bound kCountBounds[] = {
    {"data.data_path", 1024},
    {"model.moe_layer_pattern", size_t{1} << 14},  // one entry per layer (model.num_layers max)
    {"model.moe_router_load_balancing_type", 8},
    {"model.moe_aux_loss_coeff", 8},
    {"model.recompute_modules", 16},  // Megatron has 7 module names
};
constexpr size_t kDefaultStringBytes = 64;  // choices such as "softmax", "969,30,1"
constexpr size_t kDefaultCount = 64;

size_t Lookup(const Bound* begin, const Bound* end, absl::string_view path, size_t fallback) {
  for (const Bound* b = begin; b != end; ++b) {
    if (path == b->path) return b->max;
  }
  return fallback;
}

void CheckString(absl::string_view path, absl::string_view value, size_t max, Violations* v) {
  if (value.size() > max) {
    v->Add(path, " (", value.size(), " bytes) must be at most ", max, " bytes");
    return;
  }
  if (size_t at = FirstControlCharacter(value); at != absl::string_view::npos) {
    v->Add(path, " must not contain control characters (byte ",
           absl::StrFormat("0x%02X", static_cast<unsigned char>(value[at])), " at offset ", at,
           ")");
  }
}

void CheckMessage(const Message& m, const std::string& prefix, Violations* v) {
  const Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    const std::string path = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
    if (f->is_repeated()) {
      const size_t count = static_cast<size_t>(r->FieldSize(m, f));
      const size_t max =
          Lookup(std::begin(kCountBounds), std::end(kCountBounds), path, kDefaultCount);
      if (count > max) {
        v->Add(path, " (", count, " entries) must have at most ", max, " entries");
        continue;
      }
    }
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
      const size_t max =
          Lookup(std::begin(kStringBounds), std::end(kStringBounds), path, kDefaultStringBytes);
      if (!f->is_repeated()) {
        CheckString(path, r->GetString(m, f), max, v);
        continue;
      }
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        CheckString(absl::StrCat(path, "[", i, "]"), r->GetRepeatedString(m, f, i), max, v);
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (!f->is_repeated()) {
        CheckMessage(r->GetMessage(m, f), path, v);
        continue;
      }
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        CheckMessage(r->GetRepeatedMessage(m, f, i), absl::StrCat(path, "[", i, "]"), v);
      }
    }
  }
}

}  // namespace

void CheckBounds(const v1::JobSpec& spec, Violations* v) {
  const size_t bytes = spec.ByteSizeLong();
  if (bytes > kMaxSpecBytes) {
    // Reported alone: the per-field rules below would each walk a huge value.
    v->Add("spec (", bytes, " bytes serialized) must be at most ", kMaxSpecBytes, " bytes");
    return;
  }
  CheckMessage(spec, "", v);
}

}  // namespace validate_internal

size_t FirstControlCharacter(absl::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7F) return i;
    // C1 controls (U+0080..U+009F) are 0xC2 0x80..0x9F in UTF-8.
    if (c == 0xC2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
        static_cast<unsigned char>(text[i + 1]) <= 0x9F) {
      return i;
    }
  }
  return absl::string_view::npos;
}

}  // namespace switchyard
