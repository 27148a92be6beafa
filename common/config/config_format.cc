// File: common/config/config_format.cc
//
// The printing half of config_reflect.h: messages to JSON values, and the text helpers used in
// error messages.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/config/config_reflect.h"
#include "google/protobuf/descriptor.h"

namespace switchyard {
namespace config_internal {
namespace {

constexpr size_t kMaxShownChars = 48;

Json SingleToJson(const Message& m, const FieldDescriptor* f, int index) {
  const Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return MessageToJson(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f));
    case FieldDescriptor::CPPTYPE_INT32:
      return rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f);
    case FieldDescriptor::CPPTYPE_INT64:
      return rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f);
    case FieldDescriptor::CPPTYPE_UINT32:
      return rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f);
    case FieldDescriptor::CPPTYPE_UINT64:
      return rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f);
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: {
      double d = f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE
                     ? (rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f))
                     : (rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f));
      if (std::isnan(d)) return "NaN";
      if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
      return d;
    }
    case FieldDescriptor::CPPTYPE_BOOL:
      return rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f);
    case FieldDescriptor::CPPTYPE_STRING:
      return rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
    case FieldDescriptor::CPPTYPE_ENUM: {
      const EnumValueDescriptor* e = rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f);
      return e->name();
    }
  }
  return nullptr;
}

}  // namespace

Json MessageToJson(const Message& message) {
  Json out = Json::object();
  const Reflection* r = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(message, &fields);
  for (const FieldDescriptor* f : fields) {
    if (f->is_map()) {
      Json map = Json::object();
      for (int i = 0; i < r->FieldSize(message, f); ++i) {
        const Message& entry = r->GetRepeatedMessage(message, f, i);
        Json key = SingleToJson(entry, f->message_type()->map_key(), -1);
        map[key.is_string() ? key.get<std::string>() : key.dump()] =
            SingleToJson(entry, f->message_type()->map_value(), -1);
      }
      out[f->name()] = std::move(map);
    } else if (f->is_repeated()) {
      Json list = Json::array();
      for (int i = 0; i < r->FieldSize(message, f); ++i)
        list.push_back(SingleToJson(message, f, i));
      out[f->name()] = std::move(list);
    } else {
      out[f->name()] = SingleToJson(message, f, -1);
    }
  }
  return out;
}

std::string Printable(absl::string_view text) {
  std::string out;
  for (char c : text) {
    if (absl::ascii_isprint(c)) {
      out.push_back(c);
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
    }
  }
  return out;
}

std::string FormatDouble(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::general);
  return std::string(buffer, result.ptr);
}

std::string DisplayKey(absl::string_view key) {
  bool plain = key.size() <= kMaxShownChars &&
               std::all_of(key.begin(), key.end(), [](char c) { return absl::ascii_isgraph(c); });
  if (plain && !key.empty()) return std::string(key);
  std::string shown = absl::CHexEscape(key.substr(0, kMaxShownChars));
  return absl::StrCat("\"", shown, key.size() > kMaxShownChars ? "...\"" : "\"");
}

std::string DescribeJson(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return value.get<bool>() ? "boolean true" : "boolean false";
    case Json::value_t::number_integer:
      return absl::StrCat("integer ", value.get<int64_t>());
    case Json::value_t::number_unsigned:
      return absl::StrCat("integer ", value.get<uint64_t>());
    case Json::value_t::number_float:
      return absl::StrCat("number ", FormatDouble(value.get<double>()));
    case Json::value_t::string: {
      const std::string& s = value.get_ref<const std::string&>();
      return absl::StrCat("string \"", absl::CHexEscape(s.substr(0, kMaxShownChars)),
                          s.size() > kMaxShownChars ? "...\"" : "\"");
    }
    case Json::value_t::array:
      return "array";
    case Json::value_t::object:
      return "object";
    default:
      return "invalid value";
  }
}

}  // namespace config_internal
}  // namespace switchyard
