// Validation tests, part 4: input bounds (validate.h "Bounds"). Each test starts from the valid
// baseline, breaks one bound, and checks INVALID_ARGUMENT naming the field and the rule; the
// values at the limit pass, so each bound is exact.
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/config/validate.h"
#include "common/config/validate_test_util.h"
#include "gtest/gtest.h"

namespace switchyard {
namespace {

using testing::ExpectValid;
using testing::ExpectViolation;
using testing::RawBaseline;

TEST(ValidateBoundsTest, DisplayNameLength) {
  v1::JobSpec spec = RawBaseline();
  spec.set_display_name(std::string(kMaxDisplayNameBytes, 'n'));
  ExpectValid(spec);
  spec.set_display_name(std::string(kMaxDisplayNameBytes + 1, 'n'));
  ExpectViolation(spec, {"display_name (257 bytes) must be at most 256 bytes"});
}

TEST(ValidateBoundsTest, PathLength) {
  for (const char* field : {"save", "load"}) {
    v1::JobSpec spec = RawBaseline();
    std::string path = "/" + std::string(kMaxPathBytes - 1, 'p');
    auto set = [&](const std::string& p) {
      if (std::string(field) == "save") spec.mutable_training()->set_save(p);
      if (std::string(field) == "load") spec.mutable_training()->set_load(p);
    };
    set(path);
    ExpectValid(spec);
    set(path + "p");
    ExpectViolation(spec, {absl::StrCat("training.", field, " (4097 bytes) must be at most 4096")});
  }
  v1::JobSpec spec = RawBaseline();
  spec.mutable_data()->clear_data_path();
  spec.mutable_data()->add_data_path("/" + std::string(kMaxPathBytes, 'd'));
  ExpectViolation(spec, {"data.data_path[0] (4097 bytes) must be at most 4096 bytes"});
}

TEST(ValidateBoundsTest, ShortStringsHaveADefaultBound) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->set_moe_router_score_function(std::string(65, 's'));
  ExpectViolation(spec, {"model.moe_router_score_function (65 bytes) must be at most 64 bytes"});
}

TEST(ValidateBoundsTest, ControlCharactersRejectedEverywhere) {
  const std::string bad[] = {"a\x07", "a\nb", "\x1b[31mred", "del\x7f", "c1\xc2\x9b", "tab\t"};
  for (const std::string& value : bad) {
    v1::JobSpec spec = RawBaseline();
    spec.set_display_name(value);
    ExpectViolation(spec, {"display_name must not contain control characters (byte 0x"});
    spec = RawBaseline();
    spec.mutable_training()->set_save("/ckpt/" + value);
    ExpectViolation(spec, {"training.save must not contain control characters"});
    spec = RawBaseline();
    spec.mutable_data()->add_data_path("/data/" + value);
    ExpectViolation(spec, {"data.data_path[", "] must not contain control characters"});
  }
  v1::JobSpec spec = RawBaseline();
  spec.set_display_name("Ünïcode ok — 日本");
  ExpectValid(spec);
}

TEST(ValidateBoundsTest, RepeatedFieldCounts) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_model()->clear_moe_aux_loss_coeff();
  for (int i = 0; i < 9; ++i) spec.mutable_model()->add_moe_aux_loss_coeff(0.01);
  ExpectViolation(spec, {"model.moe_aux_loss_coeff (9 entries) must have at most 8 entries"});
  spec = RawBaseline();
  spec.mutable_data()->clear_data_path();
  for (int i = 0; i < 1025; ++i) spec.mutable_data()->add_data_path("/d");
  ExpectViolation(spec, {"data.data_path (1025 entries) must have at most 1024 entries"});
}

TEST(ValidateBoundsTest, TotalSizeReportedAlone) {
  v1::JobSpec spec = RawBaseline();
  spec.mutable_data()->clear_data_path();
  for (int i = 0; i < 20; ++i) {
    spec.mutable_data()->add_data_path("/" + std::string(kMaxPathBytes - 1, 'x'));
  }
  // 20 paths of 4 KiB each pass their own bounds but exceed 64 KiB together.
  ExpectViolation(spec, {"spec (", "bytes serialized) must be at most 65536 bytes"});
}

TEST(ValidateBoundsTest, FirstControlCharacter) {
  EXPECT_EQ(FirstControlCharacter("plain"), absl::string_view::npos);
  EXPECT_EQ(FirstControlCharacter("ab\x01"), 2u);
  EXPECT_EQ(FirstControlCharacter("\xc2\xa9 sign"), absl::string_view::npos);  // U+00A9
  EXPECT_EQ(FirstControlCharacter("x\xc2\x85"), 1u);                           // U+0085 NEL
  std::printf("FirstControlCharacter: C0, DEL and C1 found; printable UTF-8 passes\n");
}

}  // namespace
}  // namespace switchyard
