// File: common/config/config.cc
#include "common/config/config.h"

#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/config/config_reflect.h"
#include "common/config/config_yaml.h"
#include "common/status.h"

namespace switchyard {
namespace {

using config_internal::Json;

constexpr size_t kMaxDocumentBytes = size_t{4} << 20;
constexpr absl::string_view kJobSpecLabel = "job spec";

absl::Status CheckSize(absl::string_view text, absl::string_view label) {
  if (text.size() <= kMaxDocumentBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      label, ": document is ", text.size(), " bytes, more than the limit of ", kMaxDocumentBytes));
}

// Thrown from the parser callback to stop parsing; caught in ParseJsonText.
struct JsonRejection {
  std::string message;
};

// Tracks the open objects and arrays while nlohmann parses, to reject duplicate keys (which
// nlohmann would silently overwrite), too many keys and too deep nesting, with a field path.
class JsonGuard {
 public:
  explicit JsonGuard(absl::string_view label) : label_(label) {}

  bool operator()(int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        CountElement();
        if (frames_.size() >= static_cast<size_t>(config_internal::kMaxDepth)) {
          throw JsonRejection{absl::StrCat(Path(frames_.size(), ""), ": nested deeper than ",
                                           config_internal::kMaxDepth, " levels")};
        }
        frames_.push_back(Frame{event == Json::parse_event_t::object_start});
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        if (!frames_.empty()) frames_.pop_back();
        break;
      case Json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        Frame& top = frames_.back();
        if (!top.keys.insert(key).second) {
          throw JsonRejection{absl::StrCat(Path(frames_.size() - 1, key), ": duplicate key")};
        }
        if (top.keys.size() > config_internal::kMaxKeysPerObject) {
          throw JsonRejection{absl::StrCat(Path(frames_.size() - 1, ""), ": more than ",
                                           config_internal::kMaxKeysPerObject, " keys")};
        }
        top.key = key;
        break;
      }
      case Json::parse_event_t::value:
        CountElement();
        break;
    }
    return true;
  }

 private:
  struct Frame {
    bool is_object;
    std::string key;   // objects: the latest key
    size_t count = 0;  // arrays: elements seen
    std::unordered_set<std::string> keys;
  };

  void CountElement() {
    if (!frames_.empty() && !frames_.back().is_object) ++frames_.back().count;
  }

  // The path through the first `n` open containers (each adds its current key or index), then
  // `last` (a key) if given.
  std::string Path(size_t n, const std::string& last) const {
    std::string path;
    for (size_t i = 0; i < n; ++i) {
      const Frame& f = frames_[i];
      if (!f.is_object) {
        absl::StrAppend(&path, "[", f.count == 0 ? 0 : f.count - 1, "]");
      } else {
        absl::StrAppend(&path, path.empty() ? "" : ".", config_internal::DisplayKey(f.key));
      }
    }
    if (!last.empty()) {
      absl::StrAppend(&path, path.empty() ? "" : ".", config_internal::DisplayKey(last));
    }
    return path.empty() ? std::string(label_) : path;
  }

  absl::string_view label_;
  std::vector<Frame> frames_;
};

absl::StatusOr<Json> ParseJsonText(absl::string_view text, absl::string_view label) {
  JsonGuard guard(label);
  try {
    return Json::parse(text.begin(), text.end(), std::ref(guard));
  } catch (const JsonRejection& rejection) {
    return absl::InvalidArgumentError(rejection.message);
  } catch (const nlohmann::json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 2: ..." -> drop the tag.
    absl::string_view what(e.what());
    size_t tag_end = what.find("] ");
    if (tag_end != absl::string_view::npos) what.remove_prefix(tag_end + 2);
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON: ", config_internal::Printable(what)));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON: ", config_internal::Printable(e.what())));
  }
}

absl::Status ParseJsonInto(absl::string_view text, absl::string_view label,
                           google::protobuf::Message* message) {
  message->Clear();
  SY_RETURN_IF_ERROR(CheckSize(text, label));
  SY_ASSIGN_OR_RETURN(Json value, ParseJsonText(text, label));
  return config_internal::JsonToMessage(value, label, message);
}

absl::Status ParseYamlInto(absl::string_view text, absl::string_view label,
                           google::protobuf::Message* message) {
  message->Clear();
  SY_RETURN_IF_ERROR(CheckSize(text, label));
  SY_ASSIGN_OR_RETURN(Json value, config_internal::YamlToJson(text, label));
  return config_internal::JsonToMessage(value, label, message);
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpecJson(absl::string_view text) {
  v1::JobSpec spec;
  SY_RETURN_IF_ERROR(ParseJsonInto(text, kJobSpecLabel, &spec));
  return spec;
}

absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(absl::string_view text) {
  v1::JobSpec spec;
  SY_RETURN_IF_ERROR(ParseYamlInto(text, kJobSpecLabel, &spec));
  return spec;
}

absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path) {
  std::string extension;
  size_t dot = path.find_last_of('.');
  size_t slash = path.find_last_of('/');
  if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) {
    extension = absl::AsciiStrToLower(path.substr(dot));
  }
  const bool json = extension == ".json";
  if (!json && extension != ".yaml" && extension != ".yml") {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": job spec files must end in .json, .yaml or .yml"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::string text;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof(buffer)) || in.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxDocumentBytes) break;
  }
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read the file"));
  absl::StatusOr<v1::JobSpec> spec = json ? ParseJobSpecJson(text) : ParseJobSpecYaml(text);
  if (!spec.ok()) return Annotate(spec.status(), path);
  return spec;
}

std::string JobSpecToJson(const v1::JobSpec& spec) { return MessageToJsonText(spec); }
std::string JobSpecToYaml(const v1::JobSpec& spec) { return MessageToYamlText(spec); }

absl::Status ParseMessageJson(absl::string_view text, google::protobuf::Message* message) {
  return ParseJsonInto(text, message->GetDescriptor()->name(), message);
}

absl::Status ParseMessageYaml(absl::string_view text, google::protobuf::Message* message) {
  return ParseYamlInto(text, message->GetDescriptor()->name(), message);
}

std::string MessageToJsonText(const google::protobuf::Message& message) {
  return config_internal::MessageToJson(message).dump(2, ' ', /*ensure_ascii=*/false,
                                                      Json::error_handler_t::replace) +
         "\n";
}

std::string MessageToYamlText(const google::protobuf::Message& message) {
  return config_internal::JsonToYaml(config_internal::MessageToJson(message));
}

}  // namespace switchyard
