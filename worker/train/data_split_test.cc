// File: worker/train/data_split_test.cc
//
// SplitDocuments against Megatron's _get_split_indices. The expected boundaries were computed
// with Megatron's own Python arithmetic (normalise, idx[i+1] = idx[i] + round(w_i * N), shift so
// the last is N; round() is half-to-even), not with this code.

#include "worker/train/data_split.h"

#include <array>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace switchyard::train {
namespace {

TEST(SplitDocumentsTest, MatchesMegatronSplitIndices) {
  struct Case {
    const char* split;
    int64_t docs;
    std::array<int64_t, 4> idx;  // Megatron's split_indices
  };
  const Case cases[] = {
      {"969,30,1", 1000, {0, 969, 999, 1000}},
      {"969,30,1", 10, {0, 10, 10, 10}},  // too few documents: no held-out share
      {"969,30,1", 100, {0, 97, 100, 100}},
      {"98,2", 7, {0, 7, 7, 7}},
      {"1,1,1", 10, {0, 4, 7, 10}},  // the shift moves every boundary after the first
      {"1,1", 5, {0, 3, 5, 5}},      // 2.5 rounds half-to-even, as Python's round()
      {"0,1,0", 4, {0, 0, 4, 4}},
      {"90/10", 20, {0, 18, 20, 20}},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::array<DocumentRange, 3>> got = SplitDocuments(c.split, c.docs);
    ASSERT_TRUE(got.ok()) << c.split << ": " << got.status();
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ((*got)[i].begin, c.idx[i]) << c.split << " N=" << c.docs << " range " << i;
      EXPECT_EQ((*got)[i].end, c.idx[i + 1]) << c.split << " N=" << c.docs << " range " << i;
    }
  }
}

TEST(SplitDocumentsTest, RejectsMalformedSplitNamingTheField) {
  for (const char* split : {"98,2,x", "0,0,0", "1,1,1,1", "-1,2", "", "inf,1"}) {
    absl::StatusOr<std::array<DocumentRange, 3>> got = SplitDocuments(split, 100);
    ASSERT_FALSE(got.ok()) << split;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << split;
    EXPECT_TRUE(absl::StrContains(got.status().message(), "data.split")) << got.status();
    EXPECT_TRUE(absl::StrContains(got.status().message(), "non-negative numbers")) << got.status();
  }
  EXPECT_FALSE(SplitDocuments("969,30,1", -1).ok());
}

}  // namespace
}  // namespace switchyard::train
