// File: common/model/pipeline_layout_test.cc
//
// StageLayers / ValidatePipelineSplit: Megatron's example layouts by hand, the rules with their
// field names (common/config/parallel_rules.h PipelineLayoutViolations, the one statement of them),
// and for many splits the property that walking the chunks in model order (chunk 0 of stages 0 ..
// PP − 1, then chunk 1, ...) visits every layer exactly once, in order.
#include "common/model/pipeline_layout.h"

#include <vector>

#include "gtest/gtest.h"

namespace switchyard {
namespace {

std::vector<int64_t> Counts(const PipelineSplit& s, int64_t chunk = 0) {
  std::vector<int64_t> out;
  for (int64_t p = 0; p < s.pp; ++p) {
    auto r = StageLayers(s, p, chunk);
    EXPECT_TRUE(r.ok()) << r.status();
    out.push_back(r.ok() ? r->count : -1);
  }
  return out;
}

TEST(PipelineLayoutTest, EvenAndUnevenByHand) {
  EXPECT_EQ(Counts({8, 2, 1, -1, -1}), (std::vector<int64_t>{4, 4}));
  // The example: embedding + 3 layers | 4 | 4 | 3 + LM head.
  EXPECT_EQ(Counts({14, 4, 1, 3, 3}), (std::vector<int64_t>{3, 4, 4, 3}));
  EXPECT_EQ(Counts({7, 2, 1, 3, -1}), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(Counts({7, 2, 1, -1, 3}), (std::vector<int64_t>{4, 3}));
  auto r = StageLayers({14, 4, 1, 3, 3}, 2, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->begin, 7);  // after 3 + 4
  // PP 2, VPP 2, 8 layers: stage 0 holds 0-1 and 4-5, stage 1 holds 2-3 and 6-7.
  r = StageLayers({8, 2, 2, -1, -1}, 0, 1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->begin, 4);
  EXPECT_EQ(r->count, 2);
  r = StageLayers({8, 2, 2, -1, -1}, 1, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->begin, 2);
}

TEST(PipelineLayoutTest, RulesNameTheField) {
  struct Case {
    PipelineSplit split;
    const char* needle;
  };
  for (const Case& c : std::vector<Case>{
           {{0, 1, 1, -1, -1}, "model.num_layers (0) must be at least 1"},
           {{8, 1, 2, -1, -1}, "parallel.virtual_pipeline_model_parallel_size (2) requires"},
           {{8, 1, 1, 3, -1},
            "parallel.decoder_first_pipeline_num_layers (3) requires "
            "parallel.pipeline_model_parallel_size > 1"},
           {{8, 2, 1, 6, 6}, "= -4 layers must be 0"},
           {{8, 2, 1, 3, 3}, "= 2 layers must be 0"},
           {{9, 3, 1, 2, -1},
            "model.num_layers (9) - parallel.decoder_first_pipeline_num_layers (2) - "
            "parallel.decoder_last_pipeline_num_layers (0) = 7 layers must divide into the 2 "
            "other stages"},
           {{9, 4, 1, -1, -1},
            "model.num_layers (9) must be divisible by parallel.pipeline_model_parallel_size (4)"},
           {{12, 2, 2, 3, -1},
            "parallel.decoder_first_pipeline_num_layers (3) must be divisible by "
            "parallel.virtual_pipeline_model_parallel_size (2)"},
           {{12, 4, 2, -1, -1},
            "model.num_layers (12) must be divisible by parallel.pipeline_model_parallel_size * "
            "parallel.virtual_pipeline_model_parallel_size (4 * 2 = 8)"},
           // Rules the JobSpec had and the trainer's split did not (one source now): a stage
           // count of 0, and a middle stage left without a layer.
           {{8, 2, 1, 0, -1}, "parallel.decoder_first_pipeline_num_layers (0) must be > 0"},
           {{8, 3, 1, 4, 4}, "= 0 layers must divide into the 1 other stages"},
       }) {
    absl::Status st = ValidatePipelineSplit(c.split);
    ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.needle;
    EXPECT_NE(st.message().find(c.needle), absl::string_view::npos) << st.message();
  }
  EXPECT_EQ(StageLayers({8, 2, 1, -1, -1}, 2, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StageLayers({8, 2, 2, -1, -1}, 0, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PipelineLayoutTest, ChunksInModelOrderCoverEveryLayerOnce) {
  int checked = 0;
  for (int64_t n = 1; n <= 24; ++n) {
    for (int64_t pp = 1; pp <= 6; ++pp) {
      for (int64_t vpp = 1; vpp <= 3; ++vpp) {
        for (int64_t first = -1; first <= n; ++first) {
          for (int64_t last = -1; last <= n; ++last) {
            const PipelineSplit s{n, pp, vpp, first, last};
            if (!ValidatePipelineSplit(s).ok()) continue;
            int64_t next = 0;
            for (int64_t v = 0; v < vpp; ++v) {
              for (int64_t p = 0; p < pp; ++p) {
                auto r = StageLayers(s, p, v);
                ASSERT_TRUE(r.ok()) << r.status();
                ASSERT_EQ(r->begin, next) << n << " " << pp << " " << vpp << " " << first << " "
                                          << last << " stage " << p << " chunk " << v;
                if (first >= 0 && p == 0) {
                  ASSERT_EQ(r->count * vpp, first);
                }
                if (last >= 0 && p == pp - 1) {
                  ASSERT_EQ(r->count * vpp, last);
                }
                next += r->count;
              }
            }
            ASSERT_EQ(next, n);
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 500);
  std::printf("%d valid splits checked\n", checked);
}

}  // namespace
}  // namespace switchyard
