// Config parsing under bad input: every malformed document is INVALID_ARGUMENT naming the field
// path and the rule, resource limits hold, yaml-cpp's known pathologies are contained, and random
// mutations of valid documents never crash.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/config.h"
#include "common/config/config_defaults.h"
#include "common/config/config_reflect.h"
#include "common/config/config_test_util.h"
#include "common/config/validate.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"

namespace switchyard {
namespace {

using config_internal::Json;
using testing::ExpectInvalid;
using testing::ReadTestdata;

struct BadInput {
  const char* text;
  const char* expected;
};

// Each document is fed to both parsers where it is valid in both (JSON is YAML flow syntax).
TEST(ConfigTest, MalformedInputsNameThePathAndRule) {
  const BadInput kBoth[] = {
      {R"({"model": {"moe_router_topk": "eight"}})",
       R"(model.moe_router_topk: expected an integer, got string "eight")"},
      {R"({"model": {"moe_routr_topk": 8}})",
       R"(model.moe_routr_topk: unknown field (did you mean "moe_router_topk"?))"},
      {R"({"model": {"moe-router-topk": 8}})",
       R"(model.moe-router-topk: unknown field (did you mean "moe_router_topk"?))"},
      {R"({"model": {"tensor_model_parallel_size": 2}})",
       R"(model.tensor_model_parallel_size: unknown field (did you mean "parallel.tensor_model_parallel_size"?))"},
      {R"({"modle": {}})", R"(modle: unknown field (did you mean "model"?))"},
      {R"({"parallel": {"tensor_model_parallel_size": 3000000000}})",
       "parallel.tensor_model_parallel_size: 3000000000 does not fit in int32"},
      {R"({"parallel": {"world_size": -3000000000}})",
       "parallel.world_size: -3000000000 does not fit in int32"},
      {R"({"training": {"train_iters": 99999999999999999999}})",
       "training.train_iters: 1e+20 does not fit in int64"},
      {R"({"model": [1, 2]})", "model: expected an object, got array"},
      {R"([1, 2])", "job spec: expected an object, got array"},
      {R"("spec")", "job spec: expected an object, got string"},
      {R"({"model": {"hidden_size": null}})",
       "model.hidden_size: null is not allowed (omit the field to use its default)"},
      {R"({"model": {"hidden_size": 512.5}})",
       "model.hidden_size: expected an integer, got number 512.5 (has a fraction)"},
      {R"({"model": {"qk_layernorm": "yes"}})",
       R"(model.qk_layernorm: expected a boolean (true or false), got string "yes")"},
      {R"({"model": {"qk_layernorm": 1}})",
       "model.qk_layernorm: expected a boolean (true or false), got integer 1"},
      {R"({"model": {"normalization": 5}})",
       "model.normalization: expected a string, got integer 5 (quote it"},
      {R"({"model": {"norm_epsilon": "small"}})",
       R"(model.norm_epsilon: expected a number, got string "small")"},
      {R"({"model": {"moe_aux_loss_coeff": [0.1, "x"]}})",
       R"(model.moe_aux_loss_coeff[1]: expected a number, got string "x")"},
      {R"({"model": {"moe_aux_loss_coeff": [0.1, null]}})",
       "model.moe_aux_loss_coeff[1]: null is not allowed"},
      {R"({"data": {"data_path": [["a"]]}})",
       "data.data_path[0]: expected a single value, got array"},
      {R"({"data": {"data_path": [0.7, "a"]}})",
       "data.data_path[0]: expected a string, got number 0.7"},
      {R"({"training": {"lr": {"value": 1}}})", "training.lr: expected a number, got object"},
      {R"({"model": {"hidden_size": 1}, "model": {"hidden_size": 2}})", "model: duplicate key"},
      {R"({"model": {"hidden_size": 1, "hidden_size": 2}})", "model.hidden_size: duplicate key"},
  };
  for (const BadInput& input : kBoth) {
    SCOPED_TRACE(input.text);
    ExpectInvalid(ParseJobSpecJson(input.text), input.expected);
    ExpectInvalid(ParseJobSpecYaml(input.text), input.expected);
  }
  const BadInput kJsonOnly[] = {
      {R"({"model": {"hidden_size": 512)", "invalid JSON: parse error at line 1, column 30"},
      {"", "invalid JSON"},
      {R"({"model": {"hidden_size": 1e999}})", "invalid JSON"},
      {"{\"display_name\": \"\xff\"}", "invalid JSON"},
      {R"({"training": {"lr": NaN}})", "invalid JSON"},
  };
  for (const BadInput& input : kJsonOnly) {
    SCOPED_TRACE(input.text);
    ExpectInvalid(ParseJobSpecJson(input.text), input.expected);
  }
  const BadInput kYamlOnly[] = {
      {"display_name: 123\n", "display_name: expected a string, got integer 123"},
      {"model:\n  qk_layernorm: yes\n", R"(got string "yes")"},
      {"model:\n  hidden_size:\n", "model.hidden_size: null is not allowed"},
      {"model:\n  hidden_size: 1\n  hidden_size: 2\n", "model.hidden_size: duplicate key"},
      {"model: {hidden_size: [1, 2}\n", "invalid YAML at line 1"},
      {"model:\n  hidden_size: 1\n bad_indent: 2\n", "invalid YAML at line"},
      {"", "job spec: the YAML document is empty"},
      {"a: 1\n---\nb: 2\n", "expected one YAML document, found more content"},
      {"model: {hidden_size: !!str 8}\n", "model.hidden_size: expected an integer, got string"},
      {"model: {hidden_size: !custom 8}\n", "model.hidden_size: unsupported YAML tag"},
      {"model: {hidden_size: !!int x}\n", "model.hidden_size: unsupported YAML tag"},
      {"? [a, b]\n: 1\n", "job spec: keys must be scalars"},
      {"display_name: a\xff\n", "display_name: string is not valid UTF-8"},
      {"model: {hidden_size: .inf}\n", "model.hidden_size: expected an integer, got number inf"},
      {"model: {hidden_size: 0x1_0}\n", "model.hidden_size: expected an integer, got string"},
  };
  for (const BadInput& input : kYamlOnly) {
    SCOPED_TRACE(input.text);
    ExpectInvalid(ParseJobSpecYaml(input.text), input.expected);
  }
}

// Inputs that make yaml-cpp 0.7's LoadAll or scanner loop or exhaust memory (issues #499, #793,
// #1040 and the fuzzing below) are rejected quickly.
TEST(ConfigTest, YamlParserPathologies) {
  for (const char* text : {",", ", x\n", "# c\n, DP=4.\ndisplay_name: m\n",
                           "[:", "{:", "[[:", "{!\xdb:", "bad YAML: [", "- !+(.,.)", "a: &a [*a]\n",
                           "*x\n", "&a a: 1\n", "? &k\n: 1\n", "[a, b]: 1\n", "a: 1\nb\n"}) {
    SCOPED_TRACE(text);
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(text);
    EXPECT_FALSE(spec.ok());
    std::printf("  %-40s -> %s\n", absl::CHexEscape(text).c_str(),
                std::string(spec.status().message()).c_str());
  }
}

// Every field of every message, at every nesting level, given a value of the wrong type and null.
TEST(ConfigTest, WrongTypeAtEveryField) {
  int checked = 0;
  std::vector<std::pair<std::vector<std::string>, const google::protobuf::FieldDescriptor*>> todo;
  std::function<void(const google::protobuf::Descriptor*, std::vector<std::string>)> collect =
      [&](const google::protobuf::Descriptor* d, std::vector<std::string> prefix) {
        for (int i = 0; i < d->field_count(); ++i) {
          const auto* f = d->field(i);
          std::vector<std::string> path = prefix;
          path.push_back(f->name());
          todo.emplace_back(path, f);
          if (f->message_type() != nullptr) collect(f->message_type(), path);
        }
      };
  collect(v1::JobSpec::descriptor(), {});
  for (const auto& [path, field] : todo) {
    using FD = google::protobuf::FieldDescriptor;
    Json wrong = field->cpp_type() == FD::CPPTYPE_MESSAGE  ? Json("text")
                 : field->cpp_type() == FD::CPPTYPE_STRING ? Json::object()
                 : field->cpp_type() == FD::CPPTYPE_BOOL   ? Json(1)
                                                           : Json("text");
    for (const Json& value : {wrong, Json(nullptr)}) {
      Json doc = value;
      for (auto it = path.rbegin(); it != path.rend(); ++it) doc = Json{{*it, doc}};
      std::string text = doc.dump();
      std::string dotted = absl::StrJoin(path, ".");
      SCOPED_TRACE(text);
      for (bool yaml : {false, true}) {
        absl::StatusOr<v1::JobSpec> result = yaml ? ParseJobSpecYaml(text) : ParseJobSpecJson(text);
        ASSERT_FALSE(result.ok());
        EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_EQ(result.status().message().rfind(dotted + ": ", 0), 0u) << result.status();
        ++checked;
      }
    }
  }
  std::printf("checked %d wrong-type documents over %zu fields\n", checked, todo.size());
  EXPECT_GT(todo.size(), 80u);
}

TEST(ConfigTest, ResourceLimits) {
  std::string deep_json =
      "{\"model\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  ExpectInvalid(ParseJobSpecJson(deep_json), "nested deeper than 64 levels");
  std::string deep_yaml = "model: " + std::string(100000, '[') + std::string(100000, ']') + "\n";
  absl::StatusOr<v1::JobSpec> yaml = ParseJobSpecYaml(deep_yaml);
  EXPECT_EQ(yaml.status().code(), absl::StatusCode::kInvalidArgument) << yaml.status();
  std::string dashes;
  for (int i = 0; i < 5000; ++i) dashes += "- ";
  yaml = ParseJobSpecYaml(dashes + "x\n");
  EXPECT_EQ(yaml.status().code(), absl::StatusCode::kInvalidArgument) << yaml.status();

  // "Billion laughs": 9 levels of 10 aliases would expand to 10^9 nodes.
  std::string bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 10; ++i) {
    std::string prev = absl::StrCat("*a", i - 1);
    absl::StrAppend(&bomb, "a", i, ": &a", i, " [", prev);
    for (int k = 1; k < 10; ++k) absl::StrAppend(&bomb, ", ", prev);
    absl::StrAppend(&bomb, "]\n");
  }
  ExpectInvalid(ParseJobSpecYaml(bomb), "nodes (after aliases)");

  std::string huge = "{\"display_name\": \"" + std::string(5 << 20, 'x') + "\"}";
  ExpectInvalid(ParseJobSpecJson(huge), "more than the limit");
  ExpectInvalid(ParseJobSpecYaml(huge), "more than the limit");

  std::string wide = "{";
  for (int i = 0; i <= 10000; ++i) absl::StrAppend(&wide, i ? "," : "", "\"k", i, "\": 1");
  ExpectInvalid(ParseJobSpecJson(wide + "}"), "job spec: more than 10000 keys");
  ExpectInvalid(ParseJobSpecYaml(wide + "}"), "more than 10000 keys");
}

// SY_CONFIG_FUZZ_SEED reproduces a run; otherwise a fresh seed, printed.
unsigned FuzzSeed(const char* what) {
  const char* seed_env = std::getenv("SY_CONFIG_FUZZ_SEED");
  const unsigned seed =
      seed_env != nullptr ? std::strtoul(seed_env, nullptr, 10) : std::random_device{}();
  std::printf("%s seed %u\n", what, seed);
  std::fflush(stdout);
  return seed;
}

// Syntax fragments of both formats and of the inputs known to upset yaml-cpp.
// clang-format off
const char* const kTokens[] = {"{", "}", "[", "]", "\"", "'", ":", ",", "-", "\n", "\n  ", "&a ", "*a",
                               "!!str ", "? ", "|", ">", "#", "null", "1e999", "-0", ".inf", "\t",
                               "99999999999999999999", "\\u0000", "%YAML 1.2\n", "---\n", "...\n",
                               "model", "hidden_size", "moe_router_topk", "8", "x", " ", "!", "%",
                               "@", "`", "\xff", "\xc3", "\r\n", "<<"};
// clang-format on
constexpr size_t kNumTokens = sizeof(kTokens) / sizeof(kTokens[0]);

// Random byte mutations of valid documents: parsing (and defaults, validation, printing of what
// parses) must never crash, and every failure is INVALID_ARGUMENT.
TEST(ConfigTest, RandomMutationsNeverCrash) {
  std::mt19937 rng(FuzzSeed("mutation"));
  int ok = 0, rejected = 0;
  for (const char* name : {"mixtral_small.yaml", "mixtral_small.json", "qwen3_moe_small.yaml",
                           "qwen3_moe_small.json"}) {
    const std::string original = ReadTestdata(name);
    const bool json = absl::EndsWith(name, ".json");
    for (int iteration = 0; iteration < 1500; ++iteration) {
      std::string text = original;
      const int mutations = 1 + rng() % 3;
      for (int k = 0; k < mutations && !text.empty(); ++k) {
        size_t pos = rng() % text.size();
        switch (rng() % 5) {
          case 0:
            text[pos] = static_cast<char>(rng() % 256);
            break;
          case 1:
            text.insert(pos, 1, static_cast<char>(rng() % 256));
            break;
          case 2:
            text.erase(pos, 1 + rng() % 16);
            break;
          case 3:
            text.insert(pos, text.substr(rng() % text.size(), rng() % 64));
            break;
          default:
            text.insert(pos, kTokens[rng() % kNumTokens]);
            break;
        }
      }
      if (json) {  // JSON text is (nearly) YAML flow syntax: feed it to the YAML parser too
        absl::StatusOr<v1::JobSpec> as_yaml = ParseJobSpecYaml(text);
        ASSERT_TRUE(as_yaml.ok() || as_yaml.status().code() == absl::StatusCode::kInvalidArgument)
            << as_yaml.status();
      }
      absl::StatusOr<v1::JobSpec> spec = json ? ParseJobSpecJson(text) : ParseJobSpecYaml(text);
      if (!spec.ok()) {
        ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status() << "\n"
                                                                            << text;
        for (char c : spec.status().message()) {
          ASSERT_TRUE(absl::ascii_isprint(c)) << "unprintable byte in: " << spec.status();
        }
        ++rejected;
        continue;
      }
      ++ok;
      v1::JobSpec copy = *spec;
      ApplyDefaults(&copy);
      AllViolations(copy);
      absl::StatusOr<v1::JobSpec> again = ParseJobSpecYaml(JobSpecToYaml(copy));
      ASSERT_TRUE(again.ok()) << again.status() << "\n" << JobSpecToYaml(copy);
    }
  }
  std::printf("mutated documents: %d parsed, %d rejected\n", ok, rejected);
}

// Documents of random syntax fragments explore structures that mutations of valid documents
// rarely reach (unbalanced flows, stray indicators, anchors, directives).
TEST(ConfigTest, RandomTokenSoupsNeverCrash) {
  std::mt19937 rng(FuzzSeed("token soup"));
  int ok = 0, rejected = 0;
  for (int iteration = 0; iteration < 20000; ++iteration) {
    std::string text;
    const int tokens = 1 + rng() % 40;
    for (int k = 0; k < tokens; ++k) text += kTokens[rng() % kNumTokens];
    for (bool yaml : {true, false}) {
      absl::StatusOr<v1::JobSpec> spec = yaml ? ParseJobSpecYaml(text) : ParseJobSpecJson(text);
      ASSERT_TRUE(spec.ok() || spec.status().code() == absl::StatusCode::kInvalidArgument)
          << spec.status() << "\n"
          << absl::CHexEscape(text);
      spec.ok() ? ++ok : ++rejected;
    }
  }
  std::printf("token soups: %d parsed, %d rejected\n", ok, rejected);
}

}  // namespace
}  // namespace switchyard
