// Config loading: the example specs in JSON and YAML, YAML scalar typing, files, printing and
// lossless round trips. Bad input is covered by config_malformed_test.cc.
#include "common/config/config.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/config_defaults.h"
#include "common/config/config_test_util.h"
#include "common/config/validate.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace switchyard {
namespace {

using google::protobuf::util::MessageDifferencer;
using testing::ExpectInvalid;
using testing::TempPath;
using testing::TestdataPath;

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

  const std::string directory = TempPath("directory.yaml");
  ASSERT_EQ(mkdir(directory.c_str(), 0755), 0);
  absl::StatusOr<v1::JobSpec> not_a_file = LoadJobSpecFile(directory);
  EXPECT_FALSE(not_a_file.ok());
  std::printf("  directory: %s\n", not_a_file.status().ToString().c_str());
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

// proto3 JSON writes int64 as a decimal string; both that and a plain number are accepted on
// input, so MessageToJsonString's output (a REST response) parses back to the same message.
TEST(ConfigTest, Int64AcceptsNumbersAndDecimalStrings) {
  v1::JobSpec from_number, from_string;
  ASSERT_TRUE(
      ParseMessageJson(R"({"training": {"train_iters": 1000, "seed": -5}})", &from_number).ok());
  ASSERT_TRUE(
      ParseMessageJson(R"({"training": {"train_iters": "1000", "seed": "-5"}})", &from_string)
          .ok());
  EXPECT_EQ(from_string.training().train_iters(), 1000);
  EXPECT_EQ(from_string.training().seed(), -5);
  EXPECT_EQ(from_number.SerializeAsString(), from_string.SerializeAsString());
  v1::JobSpec extremes;
  ASSERT_TRUE(ParseMessageJson(R"({"training": {"train_iters": "9223372036854775807", )"
                               R"("seed": "-9223372036854775808"}})",
                               &extremes)
                  .ok());
  EXPECT_EQ(extremes.training().seed(), std::numeric_limits<int64_t>::min());
  // The written form of a whole spec parses back unchanged.
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  // (Except -0.0: the writer prints "-0", which a JSON reader takes for the integer 0. Known,
  // separate from int64; the YAML path keeps the sign, see PrintingRoundTripsLosslessly.)
  v1::JobSpec tricky = TrickySpec();
  tricky.mutable_model()->set_moe_router_topk_scaling_factor(0);
  std::string written;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(tricky, &written, options).ok());
  v1::JobSpec back;
  absl::Status s = ParseMessageJson(written, &back);
  ASSERT_TRUE(s.ok()) << s << "\n" << written;
  EXPECT_EQ(back.SerializeAsString(), tricky.SerializeAsString());
  std::printf("int64 as number and as string agree; MessageToJsonString output parses back\n");
  // Anything but an optional '-' and digits, or a value out of range, is still refused.
  for (const char* bad : {R"("12x")", R"("")", R"(" 12")", R"("+12")", R"("1e3")", R"("0x10")",
                          R"("9223372036854775808")"}) {
    v1::JobSpec spec;
    s = ParseMessageJson(absl::StrCat(R"({"training": {"train_iters": )", bad, "}}"), &spec);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("training.train_iters"), absl::string_view::npos) << s;
    std::printf("  %-24s -> %s\n", bad, std::string(s.message()).c_str());
  }
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
