// File: common/config/config_reflect.cc
#include "common/config/config_reflect.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"

namespace switchyard {
namespace config_internal {
namespace {

template <typename... Args>
absl::Status Error(absl::string_view where, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", args...));
}

std::string Join(const std::string& path, absl::string_view name) {
  return path.empty() ? std::string(name) : absl::StrCat(path, ".", name);
}

bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    int extra;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= s.size()) return false;
    for (int k = 1; k <= extra; ++k) {
      unsigned char cc = s[i + k];
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += extra + 1;
  }
  return true;
}

// Optimal string alignment distance: insertions, deletions, substitutions and transpositions of
// adjacent characters ("modle" -> "model" is 1).
size_t EditDistance(absl::string_view a, absl::string_view b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

// Finds `name` as a field of a message nested under `d` (not `d` itself), e.g. a parallel size
// written under `model`; returns its dotted path relative to `d`, or "".
std::string FindElsewhere(const Descriptor* d, const std::string& name, const Descriptor* skip,
                          int depth) {
  if (depth > 3) return "";
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE || f->is_map()) continue;
    const Descriptor* sub = f->message_type();
    if (sub != skip && sub->FindFieldByName(name) != nullptr) return Join(f->name(), name);
    std::string deeper = FindElsewhere(sub, name, skip, depth + 1);
    if (!deeper.empty()) return Join(f->name(), deeper);
  }
  return "";
}

class Walker {
 public:
  Walker(const Descriptor* root, absl::string_view root_label)
      : root_(root), root_label_(root_label) {}

  absl::Status Object(const Json& v, const std::string& path, Message* m, int depth) {
    if (!v.is_object()) return Error(Where(path), "expected an object, got ", DescribeJson(v));
    if (depth > kMaxDepth) return Error(Where(path), "nested deeper than ", kMaxDepth, " levels");
    const Descriptor* d = m->GetDescriptor();
    const Reflection* r = m->GetReflection();
    for (const auto& item : v.items()) {
      const std::string& key = item.key();
      std::string field_path = Join(path, DisplayKey(key));
      const FieldDescriptor* f = d->FindFieldByName(key);
      if (f == nullptr) return Error(field_path, "unknown field", Suggestion(d, key));
      if (const auto* oneof = f->containing_oneof(); oneof != nullptr && r->HasOneof(*m, oneof)) {
        return Error(field_path, "conflicts with \"", r->GetOneofFieldDescriptor(*m, oneof)->name(),
                     "\" (both in oneof \"", oneof->name(), "\")");
      }
      absl::Status s = Field(item.value(), field_path, m, f, depth);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  std::string Where(const std::string& path) const {
    return path.empty() ? std::string(root_label_) : path;
  }

  std::string Suggestion(const Descriptor* d, const std::string& key) const {
    if (key.size() > 128) return "";
    std::string normalized = absl::AsciiStrToLower(key);
    std::replace(normalized.begin(), normalized.end(), '-', '_');
    if (d->FindFieldByName(normalized) != nullptr) {
      return absl::StrCat(" (did you mean \"", normalized, "\"?)");
    }
    std::string elsewhere = FindElsewhere(root_, normalized, d, 0);
    if (!elsewhere.empty()) return absl::StrCat(" (did you mean \"", elsewhere, "\"?)");
    const size_t limit = std::max<size_t>(1, std::min<size_t>(3, key.size() / 3));
    const FieldDescriptor* best = nullptr;
    size_t best_distance = limit + 1;
    for (int i = 0; i < d->field_count(); ++i) {
      size_t distance = EditDistance(normalized, d->field(i)->name());
      if (distance < best_distance) best = d->field(i), best_distance = distance;
    }
    if (best == nullptr) return "";
    return absl::StrCat(" (did you mean \"", best->name(), "\"?)");
  }

  absl::Status Field(const Json& v, const std::string& path, Message* m, const FieldDescriptor* f,
                     int depth) {
    if (v.is_null()) return Error(path, "null is not allowed (omit the field to use its default)");
    if (f->is_map()) return Map(v, path, m, f, depth);
    if (!f->is_repeated() || !v.is_array()) return Value(v, path, m, f, depth);
    for (size_t i = 0; i < v.size(); ++i) {
      std::string element_path = absl::StrCat(path, "[", i, "]");
      const Json& element = v[i];
      if (element.is_null()) return Error(element_path, "null is not allowed");
      if (element.is_array()) return Error(element_path, "expected a single value, got array");
      absl::Status s = Value(element, element_path, m, f, depth);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status Map(const Json& v, const std::string& path, Message* m, const FieldDescriptor* f,
                   int depth) {
    if (!v.is_object()) return Error(path, "expected an object, got ", DescribeJson(v));
    const FieldDescriptor* key_field = f->message_type()->map_key();
    const FieldDescriptor* value_field = f->message_type()->map_value();
    for (const auto& item : v.items()) {
      std::string entry_path = Join(path, DisplayKey(item.key()));
      Message* entry = m->GetReflection()->AddMessage(m, f);
      Json key;
      if (key_field->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
        key = item.key();
      } else if (key_field->cpp_type() == FieldDescriptor::CPPTYPE_BOOL) {
        if (item.key() != "true" && item.key() != "false") {
          return Error(entry_path, "map key must be \"true\" or \"false\"");
        }
        key = item.key() == "true";
      } else {
        key = Json::parse(item.key(), nullptr, /*allow_exceptions=*/false);
        if (!key.is_number()) return Error(entry_path, "map key must be an integer");
      }
      absl::Status s = Value(key, entry_path, entry, key_field, depth + 1);
      if (s.ok()) s = Field(item.value(), entry_path, entry, value_field, depth + 1);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  template <typename T>
  static absl::Status ToInteger(const Json& v, const std::string& path, const char* type, T* out) {
    using Limits = std::numeric_limits<T>;
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(Limits::max()))
        return Error(path, u, " does not fit in ", type);
      *out = static_cast<T>(u);
      return absl::OkStatus();
    }
    if (v.is_number_integer()) {
      int64_t i = v.get<int64_t>();
      bool fits =
          Limits::is_signed
              ? (i >= static_cast<int64_t>(Limits::min()) &&
                 i <= static_cast<int64_t>(Limits::max()))
              : (i >= 0 && static_cast<uint64_t>(i) <= static_cast<uint64_t>(Limits::max()));
      if (!fits) return Error(path, i, " does not fit in ", type);
      *out = static_cast<T>(i);
      return absl::OkStatus();
    }
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (!std::isfinite(d))
        return Error(path, "expected an integer, got number ", FormatDouble(d));
      if (d != std::trunc(d)) {
        return Error(path, "expected an integer, got number ", FormatDouble(d),
                     " (has a fraction)");
      }
      // Both bounds are powers of two (or 0), so they are exact doubles.
      const double lo = static_cast<double>(Limits::min());
      const double hi_exclusive = std::ldexp(1.0, Limits::digits);
      if (d < lo || d >= hi_exclusive)
        return Error(path, FormatDouble(d), " does not fit in ", type);
      *out = static_cast<T>(d);
      return absl::OkStatus();
    }
    if (v.is_string() && Limits::digits >= 63) {
      // proto3 JSON writes int64/uint64 as decimal strings ("1000"), so that a value written by
      // MessageToJsonString (a REST response, `syctl get -o json`) can be sent back.
      const std::string& s = v.get_ref<const std::string&>();
      const size_t sign = !s.empty() && s[0] == '-' ? 1 : 0;
      const bool decimal =
          s.size() > sign && s.size() - sign <= 20 &&
          std::all_of(s.begin() + sign, s.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!decimal) {
        return Error(path, "expected an integer (a number or a decimal string), got ",
                     DescribeJson(v));
      }
      if (!absl::SimpleAtoi(s, out)) return Error(path, "\"", s, "\" does not fit in ", type);
      return absl::OkStatus();
    }
    return Error(path, "expected an integer, got ", DescribeJson(v));
  }

  static absl::Status ToDouble(const Json& v, const std::string& path, double* out) {
    if (v.is_number()) {
      *out = v.get<double>();
      return absl::OkStatus();
    }
    if (v.is_string()) {
      // proto3 JSON's spellings of the non-finite doubles.
      const std::string& s = v.get_ref<const std::string&>();
      const double inf = std::numeric_limits<double>::infinity();
      if (s == "NaN" || s == "Infinity" || s == "-Infinity") {
        *out = s == "NaN" ? std::numeric_limits<double>::quiet_NaN() : (s[0] == '-' ? -inf : inf);
        return absl::OkStatus();
      }
    }
    return Error(path, "expected a number, got ", DescribeJson(v));
  }

  absl::Status Value(const Json& v, const std::string& path, Message* m, const FieldDescriptor* f,
                     int depth) {
    const Reflection* r = m->GetReflection();
    const bool rep = f->is_repeated();
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE: {
        Message* sub = rep ? r->AddMessage(m, f) : r->MutableMessage(m, f);
        return Object(v, path, sub, depth + 1);
      }
#define SY_CONFIG_INTEGER_CASE(CPPTYPE, T, TYPE_NAME, METHOD) \
  case FieldDescriptor::CPPTYPE: {                            \
    T x = 0;                                                  \
    absl::Status s = ToInteger<T>(v, path, TYPE_NAME, &x);    \
    if (!s.ok()) return s;                                    \
    rep ? r->Add##METHOD(m, f, x) : r->Set##METHOD(m, f, x);  \
    return absl::OkStatus();                                  \
  }
        SY_CONFIG_INTEGER_CASE(CPPTYPE_INT32, int32_t, "int32", Int32)
        SY_CONFIG_INTEGER_CASE(CPPTYPE_INT64, int64_t, "int64", Int64)
        SY_CONFIG_INTEGER_CASE(CPPTYPE_UINT32, uint32_t, "uint32", UInt32)
        SY_CONFIG_INTEGER_CASE(CPPTYPE_UINT64, uint64_t, "uint64", UInt64)
#undef SY_CONFIG_INTEGER_CASE
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT: {
        double x = 0;
        absl::Status s = ToDouble(v, path, &x);
        if (!s.ok()) return s;
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
          rep ? r->AddDouble(m, f, x) : r->SetDouble(m, f, x);
          return absl::OkStatus();
        }
        if (std::isfinite(x) && std::fabs(x) > std::numeric_limits<float>::max()) {
          return Error(path, FormatDouble(x), " does not fit in float");
        }
        rep ? r->AddFloat(m, f, static_cast<float>(x)) : r->SetFloat(m, f, static_cast<float>(x));
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_BOOL: {
        if (!v.is_boolean()) {
          return Error(path, "expected a boolean (true or false), got ", DescribeJson(v));
        }
        rep ? r->AddBool(m, f, v.get<bool>()) : r->SetBool(m, f, v.get<bool>());
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_STRING: {
        if (!v.is_string()) {
          const char* hint = v.is_primitive() ? " (quote it to pass it as text)" : "";
          return Error(path, "expected a string, got ", DescribeJson(v), hint);
        }
        const std::string& s = v.get_ref<const std::string&>();
        if (f->type() == FieldDescriptor::TYPE_STRING && !IsValidUtf8(s)) {
          return Error(path, "string is not valid UTF-8");
        }
        rep ? r->AddString(m, f, s) : r->SetString(m, f, s);
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_ENUM: {
        const EnumValueDescriptor* e = nullptr;
        if (v.is_string()) {
          e = f->enum_type()->FindValueByName(v.get_ref<const std::string&>());
        } else if (v.is_number_integer()) {
          int32_t number = 0;
          if (ToInteger<int32_t>(v, path, "int32", &number).ok()) {
            e = f->enum_type()->FindValueByNumber(number);
          }
        }
        if (e == nullptr) {
          std::vector<std::string> names;
          for (int i = 0; i < f->enum_type()->value_count(); ++i) {
            names.push_back(absl::StrCat("\"", f->enum_type()->value(i)->name(), "\""));
          }
          return Error(path, DescribeJson(v), " is not one of ", absl::StrJoin(names, ", "));
        }
        rep ? r->AddEnum(m, f, e) : r->SetEnum(m, f, e);
        return absl::OkStatus();
      }
    }
    return Error(path, "unsupported field type");
  }

  const Descriptor* root_;
  absl::string_view root_label_;
};

}  // namespace

absl::Status JsonToMessage(const Json& value, absl::string_view root_label, Message* message) {
  return Walker(message->GetDescriptor(), root_label).Object(value, "", message, 0);
}

}  // namespace config_internal
}  // namespace switchyard
