#include "cli/megatron_args.h"

#include <cstdint>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace switchyard::cli {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Proto fields with no Megatron flag of the same name.
constexpr const char* kNotFlags[] = {"swiglu_activation", "moe_layer_pattern"};

// Megatron flags that restate Switchyard's fixed behaviour, with the values each may take.
struct IgnoredFlag {
  const char* name;
  std::vector<std::string> values;  // empty: takes no value
};

const std::vector<IgnoredFlag>& IgnoredFlags() {
  static const auto* flags = new std::vector<IgnoredFlag>{
      {"--swiglu", {}},
      {"--group-query-attention", {}},
      {"--use-mcore-models", {}},
      {"--position-embedding-type", {"rope"}},
      {"--transformer-impl", {"local", "transformer_engine"}},
  };
  return *flags;
}

bool IsFlag(const std::string& arg) { return arg.size() > 2 && arg[0] == '-' && arg[1] == '-'; }

// The sub-message of `spec` holding field `name`, and the field; false when none does.
bool FindField(const std::string& name, v1::JobSpec* spec, Message** owner,
               const FieldDescriptor** field) {
  for (const char* not_flag : kNotFlags) {
    if (name == not_flag) return false;
  }
  Message* parts[] = {spec->mutable_model(), spec->mutable_parallel(), spec->mutable_training(),
                      spec->mutable_data()};
  for (Message* part : parts) {
    const FieldDescriptor* f = part->GetDescriptor()->FindFieldByName(name);
    if (f != nullptr) {
      *owner = part;
      *field = f;
      return true;
    }
  }
  return false;
}

absl::Status BadValue(const std::string& flag, const char* want, const std::string& value) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": expected ", want, ", got '", value, "'"));
}

// Sets (or, for repeated fields, adds) one value.
absl::Status SetValue(const std::string& flag, const std::string& value, Message* owner,
                      const FieldDescriptor* f) {
  const Reflection* r = owner->GetReflection();
  const bool repeated = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: {
      int64_t v = 0;
      if (!absl::SimpleAtoi(value, &v)) return BadValue(flag, "an integer", value);
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, ": ", value, " does not fit in a 32-bit integer"));
      }
      repeated ? r->AddInt32(owner, f, static_cast<int32_t>(v))
               : r->SetInt32(owner, f, static_cast<int32_t>(v));
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      int64_t v = 0;
      if (!absl::SimpleAtoi(value, &v)) return BadValue(flag, "an integer", value);
      repeated ? r->AddInt64(owner, f, v) : r->SetInt64(owner, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      double v = 0;
      if (!absl::SimpleAtod(value, &v)) return BadValue(flag, "a number", value);
      repeated ? r->AddDouble(owner, f, v) : r->SetDouble(owner, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_STRING:
      repeated ? r->AddString(owner, f, value) : r->SetString(owner, f, value);
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": field type not supported on the command line"));
  }
}

// "[0,1,1]" or "[0, 1]" -> {0, 1, 1}.
absl::Status ParseLayerPattern(const std::string& flag, const std::string& value,
                               v1::ModelConfig* model) {
  absl::string_view inner(value);
  inner = absl::StripAsciiWhitespace(inner);
  if (!absl::ConsumePrefix(&inner, "[") || !absl::ConsumeSuffix(&inner, "]")) {
    return BadValue(flag, "an integer or a list like [0,1,1,1]", value);
  }
  model->clear_moe_layer_pattern();
  for (absl::string_view item : absl::StrSplit(inner, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(item), &v)) {
      return BadValue(flag, "an integer or a list like [0,1,1,1]", value);
    }
    model->add_moe_layer_pattern(v);
  }
  model->clear_moe_layer_freq();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> SplitCommandLine(absl::string_view text) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote == '\'') {
      if (c == '\'') {
        quote = 0;
      } else {
        word.push_back(c);
      }
    } else if (c == '\\' && i + 1 < text.size()) {
      word.push_back(text[++i]);
      in_word = true;
    } else if (quote == '"') {
      if (c == '"') {
        quote = 0;
      } else {
        word.push_back(c);
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (absl::ascii_isspace(static_cast<unsigned char>(c))) {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word.push_back(c);
      in_word = true;
    }
  }
  if (quote != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--megatron-args: unclosed ", std::string(1, quote), " quote"));
  }
  if (in_word) words.push_back(word);
  return words;
}

absl::Status ApplyMegatronArgs(const std::vector<std::string>& args, v1::JobSpec* spec) {
  size_t i = 0;
  while (i < args.size()) {
    std::string flag = args[i++];
    if (!IsFlag(flag)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected value '", flag, "' (a Megatron flag '--name' was expected)"));
    }
    // "--flag=value" carries its value inline.
    std::vector<std::string> values;
    bool inline_value = false;
    if (size_t eq = flag.find('='); eq != std::string::npos) {
      values.push_back(flag.substr(eq + 1));
      flag = flag.substr(0, eq);
      inline_value = true;
    }
    // The values up to the next flag. A negative number ("-1") is a value, "--x" is a flag.
    auto take_values = [&]() {
      while (i < args.size() && !IsFlag(args[i])) values.push_back(args[i++]);
    };

    if (flag == "--fp16") {
      return absl::InvalidArgumentError(
          "--fp16: not supported (Switchyard trains in bf16: --bf16)");
    }
    bool ignored = false;
    for (const IgnoredFlag& ig : IgnoredFlags()) {
      if (flag != ig.name) continue;
      ignored = true;
      if (!inline_value && !ig.values.empty()) take_values();
      if (ig.values.empty() && !values.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(flag, " takes no value"));
      }
      if (!ig.values.empty()) {
        if (values.size() != 1) {
          return absl::InvalidArgumentError(absl::StrCat(flag, " takes exactly one value"));
        }
        bool ok = false;
        for (const std::string& v : ig.values) ok = ok || values[0] == v;
        if (!ok) {
          return absl::InvalidArgumentError(absl::StrCat(flag, ": '", values[0],
                                                         "' is not supported (only ",
                                                         absl::StrJoin(ig.values, ", "), ")"));
        }
      }
    }
    if (ignored) continue;

    if (flag == "--disable-bias-linear") {
      if (!values.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " takes no value"));
      spec->mutable_model()->set_add_bias_linear(false);
      continue;
    }

    const std::string name = absl::StrReplaceAll(flag.substr(2), {{"-", "_"}});
    Message* owner = nullptr;
    const FieldDescriptor* field = nullptr;
    // Megatron spells flags lower case with dashes only.
    if (flag.find('_') != std::string::npos || name != absl::AsciiStrToLower(name) ||
        !FindField(name, spec, &owner, &field)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown Megatron flag '", flag, "'"));
    }

    if (field->cpp_type() == FieldDescriptor::CPPTYPE_BOOL) {
      if (!values.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " takes no value"));
      owner->GetReflection()->SetBool(owner, field, true);
      continue;
    }
    if (!inline_value) take_values();
    if (values.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " needs a value"));
    if (name == "moe_layer_freq" && absl::StartsWith(values[0], "[")) {
      if (values.size() != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, ": write the list without spaces, e.g. [0,1,1,1]"));
      }
      SY_RETURN_IF_ERROR(ParseLayerPattern(flag, values[0], spec->mutable_model()));
      continue;
    }
    if (field->is_repeated()) {
      owner->GetReflection()->ClearField(owner, field);
    } else if (values.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " takes exactly one value, got ",
                                                     values.size(), " ('", values[1], "' ...)"));
    }
    for (const std::string& v : values) {
      SY_RETURN_IF_ERROR(SetValue(flag, v, owner, field));
    }
    if (name == "moe_layer_freq") spec->mutable_model()->clear_moe_layer_pattern();
  }
  return absl::OkStatus();
}

}  // namespace switchyard::cli
