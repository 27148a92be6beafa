#include "common/config.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config_defaults.h"
#include "common/config_reflect.h"
#include "common/validate.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace switchyard {
namespace {

using config_internal::Json;
using google::protobuf::util::MessageDifferencer;

std::string TestdataPath(const std::string& name) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir != nullptr && workspace != nullptr) {
    return absl::StrCat(srcdir, "/", workspace, "/common/testdata/", name);
  }
  return "common/testdata/" + name;
}

std::string ReadTestdata(const std::string& name) {
  std::ifstream in(TestdataPath(name));
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_FALSE(text.str().empty()) << name;
  return text.str();
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

// Asserts INVALID_ARGUMENT whose message contains `needle` (and prints it as evidence).
void ExpectInvalid(const absl::StatusOr<v1::JobSpec>& result, const std::string& needle) {
  ASSERT_FALSE(result.ok()) << "expected an error containing: " << needle;
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_NE(result.status().message().find(needle), absl::string_view::npos)
      << "message: " << result.status().message() << "\nexpected to contain: " << needle;
  std::printf("  rejected: %s\n", std::string(result.status().message()).c_str());
}

TEST(ConfigTest, JsonAndYamlExamplesLoadTheSameSpec) {
  for (const char* base : {"mixtral_small", "qwen3_moe_small"}) {
    SCOPED_TRACE(base);
    absl::StatusOr<v1::JobSpec> yaml = LoadJobSpecFile(TestdataPath(absl::StrCat(base, ".yaml")));
    absl::StatusOr<v1::JobSpec> json = LoadJobSpecFile(TestdataPath(absl::StrCat(base, ".json")));
    ASSERT_TRUE(yaml.ok()) << yaml.status();
    ASSERT_TRUE(json.ok()) << json.status();
    std::string diff;
    MessageDifferencer differencer;
    differencer.ReportDifferencesToString(&diff);
    EXPECT_TRUE(differencer.Compare(*yaml, *json)) << diff;
    v1::JobSpec spec = *yaml;
    ApplyDefaults(&spec);
    EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  }
}

TEST(ConfigTest, ExampleValuesAndMegatronScalarLists) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(TestdataPath("mixtral_small.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->display_name(), "mixtral-small");
  EXPECT_EQ(spec->model().num_experts(), 8);
  ASSERT_EQ(spec->model().moe_router_load_balancing_type_size(), 1);
  EXPECT_EQ(spec->model().moe_router_load_balancing_type(0), "aux_loss");
  ASSERT_EQ(spec->model().moe_aux_loss_coeff_size(), 1);
  EXPECT_DOUBLE_EQ(spec->model().moe_aux_loss_coeff(0), 0.02);
  EXPECT_DOUBLE_EQ(spec->model().rotary_base(), 1e6);  // YAML integer into a double field
  EXPECT_DOUBLE_EQ(spec->model().norm_epsilon(), 1e-5);
  ASSERT_EQ(spec->data().data_path_size(), 4);
  EXPECT_EQ(spec->data().data_path(0), "0.7");
  EXPECT_TRUE(spec->training().has_bf16());
  EXPECT_FALSE(spec->model().has_kv_channels());

  absl::StatusOr<v1::JobSpec> json =
      ParseJobSpecJson(R"({"model": {"moe_router_load_balancing_type": "sinkhorn",
                                      "moe_aux_loss_coeff": 0, "hidden_size": 1024.0}})");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->model().moe_router_load_balancing_type(0), "sinkhorn");
  EXPECT_EQ(json->model().moe_aux_loss_coeff_size(), 1);
  EXPECT_EQ(json->model().hidden_size(), 1024);  // integral float into an int field
}

TEST(ConfigTest, FileExtensionsAndMissingFiles) {
  const std::string yml = TempPath("spec.YML");
  std::ofstream(yml) << "model: {hidden_size: 64}\n";
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(yml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().hidden_size(), 64);

  const std::string bad = TempPath("spec.json");
  std::ofstream(bad) << "{\"model\": {\"hidden_size\": \"big\"}}";
  absl::StatusOr<v1::JobSpec> error = LoadJobSpecFile(bad);
  ExpectInvalid(error, absl::StrCat(bad, ": model.hidden_size: expected an integer"));

  ExpectInvalid(LoadJobSpecFile(TempPath("spec.txt")), "must end in .json, .yaml or .yml");
  absl::StatusOr<v1::JobSpec> missing = LoadJobSpecFile(TempPath("missing.yaml"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
}

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

TEST(ConfigTest, YamlScalarTypes) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(
      "display_name: '123'\n"
      "model: {hidden_size: 0x200, num_layers: 0o10, rotary_base: 1e4, norm_epsilon: .5,\n"
      "        qk_layernorm: True, moe_aux_loss_coeff: [!!float 1, -.inf]}\n"
      "training: {train_iters: +7, lr: -1, seed: -9223372036854775808}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->display_name(), "123");
  EXPECT_EQ(spec->model().hidden_size(), 512);
  EXPECT_EQ(spec->model().num_layers(), 8);
  EXPECT_DOUBLE_EQ(spec->model().rotary_base(), 1e4);
  EXPECT_DOUBLE_EQ(spec->model().norm_epsilon(), 0.5);
  EXPECT_TRUE(spec->model().qk_layernorm());
  EXPECT_DOUBLE_EQ(spec->model().moe_aux_loss_coeff(0), 1.0);
  EXPECT_TRUE(std::isinf(spec->model().moe_aux_loss_coeff(1)));
  EXPECT_EQ(spec->training().train_iters(), 7);
  EXPECT_DOUBLE_EQ(spec->training().lr(), -1.0);
  EXPECT_EQ(spec->training().seed(), INT64_MIN);
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

// Random byte mutations of valid documents: parsing (and defaults, validation, printing of what
// parses) must never crash, and every failure is INVALID_ARGUMENT.
TEST(ConfigTest, RandomMutationsNeverCrash) {
  // SY_CONFIG_FUZZ_SEED reproduces a run.
  const char* seed_env = std::getenv("SY_CONFIG_FUZZ_SEED");
  const unsigned seed =
      seed_env != nullptr ? std::strtoul(seed_env, nullptr, 10) : std::random_device{}();
  std::printf("mutation seed %u\n", seed);
  std::fflush(stdout);
  std::mt19937 rng(seed);
  // clang-format off
  const char* kTokens[] = {"{", "}", "[", "]", "\"", "'", ":", ",", "-", "\n", "\n  ", "&a ", "*a",
                           "!!str ", "? ", "|", "#", "null", "1e999", "-0", ".inf", "\t",
                           "99999999999999999999", "\\u0000", "%YAML 1.2\n", "---\n"};
  // clang-format on
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
            text.insert(pos, kTokens[rng() % (sizeof(kTokens) / sizeof(kTokens[0]))]);
            break;
        }
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

v1::JobSpec TrickySpec() {
  v1::JobSpec spec;
  spec.set_display_name("line1\nline2 \"quoted\" 'single' #hash: colon - dash \xc3\xa9 \t tab");
  spec.mutable_model()->set_hidden_size(std::numeric_limits<int32_t>::max());
  spec.mutable_model()->set_num_layers(std::numeric_limits<int32_t>::min());
  spec.mutable_model()->set_normalization("true");
  spec.mutable_model()->set_swiglu_activation("0.7");
  spec.mutable_model()->set_norm_epsilon(5e-324);
  spec.mutable_model()->set_rotary_base(1.7976931348623157e308);
  spec.mutable_model()->set_init_method_std(0.1);
  spec.mutable_model()->set_moe_router_topk_scaling_factor(-0.0);
  spec.mutable_model()->set_moe_z_loss_coeff(std::numeric_limits<double>::infinity());
  spec.mutable_model()->set_moe_grouped_gemm(false);
  for (const char* s : {"null", "~", "", "- x", ": y", "[a]", "{b}", "*c", "&d", "!e", "%f", "@g",
                        "0x10", "1e3", ".inf", "yes", "NaN", " padded "}) {
    spec.mutable_data()->add_data_path(s);
  }
  spec.mutable_model()->add_moe_aux_loss_coeff(1.0);
  spec.mutable_model()->add_moe_aux_loss_coeff(1e-300);
  spec.mutable_model()->add_moe_layer_pattern(0);
  spec.mutable_training()->set_seed(std::numeric_limits<int64_t>::min());
  spec.mutable_training()->set_train_iters(std::numeric_limits<int64_t>::max());
  spec.mutable_training()->set_lr(0.30000000000000004);
  return spec;
}

TEST(ConfigTest, PrintingRoundTripsLosslessly) {
  std::vector<v1::JobSpec> specs;
  for (const char* name : {"mixtral_small.yaml", "qwen3_moe_small.yaml"}) {
    absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(TestdataPath(name));
    ASSERT_TRUE(spec.ok()) << spec.status();
    specs.push_back(*spec);
    ApplyDefaults(&*spec);
    specs.push_back(*spec);
  }
  specs.push_back(TrickySpec());
  specs.push_back(v1::JobSpec());
  for (const v1::JobSpec& spec : specs) {
    const std::string yaml = JobSpecToYaml(spec);
    const std::string json = JobSpecToJson(spec);
    absl::StatusOr<v1::JobSpec> from_yaml = ParseJobSpecYaml(yaml);
    absl::StatusOr<v1::JobSpec> from_json = ParseJobSpecJson(json);
    ASSERT_TRUE(from_yaml.ok()) << from_yaml.status() << "\n" << yaml;
    ASSERT_TRUE(from_json.ok()) << from_json.status() << "\n" << json;
    EXPECT_TRUE(MessageDifferencer::Equals(spec, *from_yaml)) << yaml;
    EXPECT_TRUE(MessageDifferencer::Equals(spec, *from_json)) << json;
    // Bitwise too: -0.0 and denormals survive.
    EXPECT_EQ(spec.SerializeAsString(), from_yaml->SerializeAsString()) << yaml;
  }
  std::printf("%s", JobSpecToYaml(TrickySpec()).c_str());
}

TEST(ConfigTest, GenericMessageParsing) {
  v1::ParallelConfig parallel;
  absl::Status s = ParseMessageYaml("tensor_model_parallel_size: x\n", &parallel);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), R"(tensor_model_parallel_size: expected an integer, got string "x")");
  s = ParseMessageJson("[]", &parallel);
  EXPECT_EQ(s.message(), "ParallelConfig: expected an object, got array");
  ASSERT_TRUE(ParseMessageJson(R"({"world_size": 16})", &parallel).ok());
  EXPECT_EQ(parallel.world_size(), 16);
  EXPECT_EQ(MessageToJsonText(parallel), "{\n  \"world_size\": 16\n}\n");
  EXPECT_EQ(MessageToYamlText(parallel), "world_size: 16\n");
}

}  // namespace
}  // namespace switchyard
