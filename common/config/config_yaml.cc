// File: common/config/config_yaml.cc
#include "common/config/config_yaml.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <sstream>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace switchyard {
namespace config_internal {
namespace {

constexpr absl::string_view kTagPrefix = "tag:yaml.org,2002:";

template <typename... Args>
absl::Status Error(absl::string_view where, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", args...));
}

bool AllOf(absl::string_view s, bool (*pred)(unsigned char)) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!pred(static_cast<unsigned char>(c))) return false;
  }
  return true;
}
bool IsDigit(unsigned char c) { return c >= '0' && c <= '9'; }
bool IsOctal(unsigned char c) { return c >= '0' && c <= '7'; }
bool IsHex(unsigned char c) { return absl::ascii_isxdigit(c); }

// Accumulates digits in `base`; false on overflow of uint64.
bool ParseUnsigned(absl::string_view digits, int base, uint64_t* out) {
  uint64_t v = 0;
  for (char c : digits) {
    int d = IsDigit(c) ? c - '0' : absl::ascii_tolower(c) - 'a' + 10;
    if (v > (std::numeric_limits<uint64_t>::max() - d) / base) return false;
    v = v * base + d;
  }
  *out = v;
  return true;
}

// [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?, without the sign.
bool IsCoreFloat(absl::string_view s) {
  size_t i = 0, n = s.size(), mantissa_digits = 0;
  while (i < n && IsDigit(s[i])) ++i, ++mantissa_digits;
  if (i < n && s[i] == '.') {
    ++i;
    size_t fraction = 0;
    while (i < n && IsDigit(s[i])) ++i, ++fraction;
    if (mantissa_digits == 0 && fraction == 0) return false;
    mantissa_digits += fraction;
  }
  if (mantissa_digits == 0) return false;
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < n && (s[i] == '+' || s[i] == '-')) ++i;
    if (!AllOf(s.substr(i), IsDigit)) return false;
    i = n;
  }
  return i == n;
}

// Thrown by the builder to stop yaml-cpp's parser; caught in YamlToJson.
struct YamlRejection {
  absl::Status status;
};

// Builds a JSON value from yaml-cpp's parse events (yaml-cpp's own node tree is not used: its
// LoadAll loops forever on some malformed streams, and its nodes hide duplicate keys only
// partially). Enforces depth, node-count (aliases included) and key-count limits, rejects
// duplicate and non-scalar keys, and resolves scalars with the core schema.
class JsonBuilder : public YAML::EventHandler {
 public:
  explicit JsonBuilder(absl::string_view root_label) : root_label_(root_label) {}

  bool done() const { return done_; }
  Json& root() { return root_; }

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}

  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    if (ExpectingKey()) Fail(mark, Where(), "keys must be non-empty scalars");
    Deliver(mark, Json(nullptr), anchor, Cost{1, 0});
  }

  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    if (ExpectingKey()) Fail(mark, Where(), "keys must be scalars, not aliases");
    auto it = anchors_.find(anchor);
    if (it == anchors_.end()) Fail(mark, Where(), "alias of an unfinished or unknown anchor");
    Deliver(mark, it->second.first, YAML::NullAnchor, it->second.second);
  }

  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    if (ExpectingKey()) {
      Frame& map = stack_.back();
      std::string path = ChildPath(DisplayKey(value));
      if (!map.keys.insert(value).second) Fail(mark, path, "duplicate key");
      if (map.keys.size() > kMaxKeysPerObject) {
        Fail(mark, Label(map.path), absl::StrCat("more than ", kMaxKeysPerObject, " keys"));
      }
      map.key = value;
      map.have_key = true;
      return;
    }
    Deliver(mark, ResolveScalar(mark, tag, value), anchor, Cost{1, value.size()});
  }

  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    Open(mark, Json::array(), anchor);
  }
  void OnSequenceEnd() override { Close(); }

  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    Open(mark, Json::object(), anchor);
  }
  void OnMapEnd() override { Close(); }

 private:
  // Nodes and scalar bytes in a subtree, aliases expanded.
  struct Cost {
    size_t nodes = 0;
    size_t bytes = 0;
  };

  struct Frame {
    Json value;
    YAML::anchor_t anchor;
    std::string path;
    Cost cost{1, 0};  // of this subtree so far
    std::string key;  // maps: the key awaiting its value
    bool have_key = false;
    std::unordered_set<std::string> keys;
    YAML::Mark mark;
  };

  [[noreturn]] void Fail(const YAML::Mark& mark, const std::string& where,
                         absl::string_view rule) const {
    std::string at = mark.is_null() ? "" : absl::StrCat(" (line ", mark.line + 1, ")");
    throw YamlRejection{absl::InvalidArgumentError(absl::StrCat(where, ": ", rule, at))};
  }

  // `path`, or the document's label for the root.
  std::string Label(const std::string& path) const {
    return path.empty() ? std::string(root_label_) : path;
  }

  // The path of the innermost open collection.
  std::string Where() const { return Label(stack_.empty() ? "" : stack_.back().path); }

  bool ExpectingKey() const {
    return !stack_.empty() && stack_.back().value.is_object() && !stack_.back().have_key;
  }

  // The path of the next value delivered to the top frame (`key` given: of that key).
  std::string ChildPath(const std::string& key = "") const {
    if (stack_.empty()) return "";
    const Frame& top = stack_.back();
    if (top.value.is_array()) return absl::StrCat(top.path, "[", top.value.size(), "]");
    const std::string& name = key.empty() ? DisplayKey(top.key) : key;
    return top.path.empty() ? name : absl::StrCat(top.path, ".", name);
  }

  Json ResolveScalar(const YAML::Mark& mark, const std::string& tag, const std::string& text) {
    if (tag == "?") return ResolvePlainScalar(text);
    if (tag == "!" || tag == absl::StrCat(kTagPrefix, "str")) return text;
    Json resolved = ResolvePlainScalar(text);
    if (tag == absl::StrCat(kTagPrefix, "int") && resolved.is_number_integer()) return resolved;
    if (tag == absl::StrCat(kTagPrefix, "float") && resolved.is_number()) {
      return resolved.get<double>();
    }
    if (tag == absl::StrCat(kTagPrefix, "bool") && resolved.is_boolean()) return resolved;
    if (tag == absl::StrCat(kTagPrefix, "null") && resolved.is_null()) return resolved;
    Fail(mark, Label(ChildPath()),
         absl::StrCat("unsupported YAML tag \"", DisplayKey(tag), "\" for value ",
                      DescribeJson(Json(text))));
  }

  void Count(const YAML::Mark& mark, Cost cost) {
    total_.nodes += cost.nodes;
    total_.bytes += cost.bytes;
    if (total_.nodes > kMaxYamlNodes) {
      Fail(mark, Label(ChildPath()),
           absl::StrCat("document has more than ", kMaxYamlNodes, " nodes (after aliases)"));
    }
    if (total_.bytes > kMaxYamlBytes) {
      Fail(mark, Label(ChildPath()),
           absl::StrCat("document has more than ", kMaxYamlBytes,
                        " bytes of scalars (after aliases)"));
    }
  }

  void Open(const YAML::Mark& mark, Json value, YAML::anchor_t anchor) {
    if (ExpectingKey()) Fail(mark, Where(), "keys must be scalars");
    if (done_) Fail(mark, std::string(root_label_), "more than one root value");
    if (stack_.size() >= static_cast<size_t>(kMaxDepth)) {
      Fail(mark, Label(ChildPath()), absl::StrCat("nested deeper than ", kMaxDepth, " levels"));
    }
    Count(mark, Cost{1, 0});
    Frame frame;
    frame.path = ChildPath();
    frame.value = std::move(value);
    frame.anchor = anchor;
    frame.mark = mark;
    stack_.push_back(std::move(frame));
  }

  void Close() {
    if (stack_.empty()) return;
    Frame frame = std::move(stack_.back());
    stack_.pop_back();
    if (frame.have_key) Fail(frame.mark, Label(frame.path), "map key without a value");
    total_.nodes -= frame.cost.nodes;  // Deliver counts the whole subtree again
    total_.bytes -= frame.cost.bytes;
    Deliver(frame.mark, std::move(frame.value), frame.anchor, frame.cost);
  }

  void Deliver(const YAML::Mark& mark, Json value, YAML::anchor_t anchor, Cost cost) {
    Count(mark, cost);
    if (anchor != YAML::NullAnchor) anchors_[anchor] = {value, cost};
    if (stack_.empty()) {
      if (done_) Fail(mark, std::string(root_label_), "more than one root value");
      root_ = std::move(value);
      done_ = true;
      return;
    }
    Frame& top = stack_.back();
    top.cost.nodes += cost.nodes;
    top.cost.bytes += cost.bytes;
    if (top.value.is_array()) {
      top.value.push_back(std::move(value));
      return;
    }
    // ordered_map is a vector: append directly (its operator[] is a linear search); `keys`
    // already rejected duplicates.
    auto& entries = static_cast<Json::object_t::Container&>(top.value.get_ref<Json::object_t&>());
    entries.emplace_back(std::move(top.key), std::move(value));
    top.key.clear();
    top.have_key = false;
  }

  absl::string_view root_label_;
  std::vector<Frame> stack_;
  std::map<YAML::anchor_t, std::pair<Json, Cost>> anchors_;
  Cost total_;
  Json root_;
  bool done_ = false;
};

bool IsPrimitive(const Json& v) { return !v.is_object() && !v.is_array(); }

void EmitString(const std::string& s, YAML::Emitter* out) {
  if (s.empty() || !ResolvePlainScalar(s).is_string()) {
    *out << YAML::DoubleQuoted << s;
  } else {
    *out << s;
  }
}

std::string FormatYamlFloat(double d) {
  if (std::isnan(d)) return ".nan";
  if (std::isinf(d)) return d > 0 ? ".inf" : "-.inf";
  // Shortest round-trip text, fixed or scientific, whichever is shorter ("1000000", "1e-05").
  char buffer[64];
  std::string text(buffer, std::to_chars(buffer, buffer + sizeof(buffer), d).ptr);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

void Emit(const Json& v, YAML::Emitter* out) {
  switch (v.type()) {
    case Json::value_t::object:
      *out << YAML::BeginMap;
      for (const auto& item : v.items()) {
        *out << YAML::Key;
        EmitString(item.key(), out);
        *out << YAML::Value;
        Emit(item.value(), out);
      }
      *out << YAML::EndMap;
      return;
    case Json::value_t::array: {
      bool flat = std::all_of(v.begin(), v.end(), IsPrimitive);
      if (flat) *out << YAML::Flow;
      *out << YAML::BeginSeq;
      for (const Json& element : v) Emit(element, out);
      *out << YAML::EndSeq;
      return;
    }
    case Json::value_t::string:
      EmitString(v.get_ref<const std::string&>(), out);
      return;
    case Json::value_t::boolean:
      *out << (v.get<bool>() ? "true" : "false");
      return;
    case Json::value_t::number_integer:
      *out << absl::StrCat(v.get<int64_t>());
      return;
    case Json::value_t::number_unsigned:
      *out << absl::StrCat(v.get<uint64_t>());
      return;
    case Json::value_t::number_float:
      *out << FormatYamlFloat(v.get<double>());
      return;
    default:
      *out << YAML::Null;
      return;
  }
}

}  // namespace

Json ResolvePlainScalar(const std::string& text) {
  absl::string_view s(text);
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  if (s == ".nan" || s == ".NaN" || s == ".NAN") return std::numeric_limits<double>::quiet_NaN();
  const bool negative = s[0] == '-';
  absl::string_view body = (s[0] == '-' || s[0] == '+') ? s.substr(1) : s;
  if (body == ".inf" || body == ".Inf" || body == ".INF") {
    return negative ? -std::numeric_limits<double>::infinity()
                    : std::numeric_limits<double>::infinity();
  }
  uint64_t u = 0;
  if (AllOf(body, IsDigit) && ParseUnsigned(body, 10, &u)) {
    if (!negative) return u;
    if (u <= uint64_t{1} << 63) return static_cast<int64_t>(0 - u);  // two's complement wrap
  }
  if (s.size() > 2 && s[0] == '0' && s[1] == 'o' && AllOf(s.substr(2), IsOctal) &&
      ParseUnsigned(s.substr(2), 8, &u)) {
    return u;
  }
  if (s.size() > 2 && s[0] == '0' && s[1] == 'x' && AllOf(s.substr(2), IsHex) &&
      ParseUnsigned(s.substr(2), 16, &u)) {
    return u;
  }
  // Decimal integers too large for 64 bits fall through to here and become doubles, as in JSON.
  double d = 0;
  if (IsCoreFloat(body) && absl::SimpleAtod(body, &d)) return negative ? -d : d;
  return text;
}

absl::StatusOr<Json> YamlToJson(absl::string_view text, absl::string_view root_label) {
  try {
    std::istringstream stream{std::string(text)};
    YAML::Parser parser(stream);
    JsonBuilder builder(root_label);
    // One HandleNextDocument call per document; never yaml-cpp's LoadAll, which can loop forever
    // on a malformed stream (yaml-cpp issue #1040, fixed after 0.8).
    if (!parser.HandleNextDocument(builder) || !builder.done()) {
      return Error(root_label, "the YAML document is empty");
    }
    JsonBuilder next(root_label);
    if (parser.HandleNextDocument(next)) {
      // yaml-cpp 0.7 also "ends" a document at a token it cannot start a node with (`, x`).
      if (builder.root().is_null()) {
        return absl::InvalidArgumentError("invalid YAML: unexpected token where a value starts");
      }
      return Error(root_label, "expected one YAML document, found more content after the first");
    }
    return std::move(builder.root());
  } catch (const YamlRejection& rejection) {
    return rejection.status;
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) {
      return absl::InvalidArgumentError(absl::StrCat("invalid YAML: ", Printable(e.msg)));
    }
    return absl::InvalidArgumentError(absl::StrCat("invalid YAML at line ", e.mark.line + 1,
                                                   ", column ", e.mark.column + 1, ": ",
                                                   Printable(e.msg)));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("invalid YAML: ", Printable(e.what())));
  }
}

std::string JsonToYaml(const Json& value) {
  YAML::Emitter out;
  out.SetIndent(2);
  Emit(value, &out);
  return absl::StrCat(out.c_str(), "\n");
}

}  // namespace config_internal
}  // namespace switchyard
