// File: common/model/parallel_state_test.cc
//
// Golden groups from megatron_moe.md §5.1's worked-example table, the §5.2 rules, and a brute-force
// property test over every valid factorisation of world sizes 1..64.
#include "common/model/parallel_state.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace switchyard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Groups = std::vector<std::vector<int>>;
using G = ParallelGroup;

ParallelLayout MustCreate(const ParallelDims& d) {
  absl::StatusOr<ParallelLayout> l = ParallelLayout::Create(d);
  EXPECT_TRUE(l.ok()) << l.status();
  return *l;
}

ParallelDims Dims(int64_t w, int64_t tp, int64_t cp, int64_t pp, int64_t ep, int64_t etp) {
  ParallelDims d;
  d.world_size = w;
  d.tensor_model_parallel_size = tp;
  d.context_parallel_size = cp;
  d.pipeline_model_parallel_size = pp;
  d.expert_model_parallel_size = ep;
  d.expert_tensor_parallel_size = etp;
  return d;
}

// Table row 1: W=16, TP=2, CP=2, PP=2 (DP=2); ETP=1, EP=4 (EDP=2). The spec lists the first
// groups and elides the rest ("…"); the elided ones are written out here from the same formula,
// and the spec's listed prefixes appear verbatim at the start of each list.
TEST(ParallelStateGolden, Row1FoldingW16) {
  const ParallelLayout l = MustCreate(Dims(16, 2, 2, 2, 4, 1));
  EXPECT_EQ(l.dp(), 2);
  EXPECT_EQ(l.edp(), 2);
  EXPECT_EQ(l.AllGroups(G::kTensor),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(l.AllGroups(G::kContext),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(l.AllGroups(G::kData),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(l.AllGroups(G::kDataContext),
            (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(l.AllGroups(G::kTensorContext),
            (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(l.AllGroups(G::kPipeline),
            (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(l.AllGroups(G::kExpert),
            (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(l.AllGroups(G::kExpertData),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  // Not in the table; derived from the §5.1 formulas for this row.
  EXPECT_EQ(l.AllGroups(G::kModel),
            (Groups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  EXPECT_EQ(l.AllGroups(G::kTensorDataContext),
            (Groups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
  EXPECT_EQ(l.Group(G::kExpertTensorExpertPipeline, 5),
            (std::vector<int>{4, 5, 6, 7, 12, 13, 14, 15}));
  const AttentionCoord a = l.AttentionCoordOf(13);  // 13 = 1 + 2*(0 + 2*(1 + 2*1))
  EXPECT_EQ(std::vector<int>({a.tp, a.cp, a.dp, a.pp}), (std::vector<int>{1, 0, 1, 1}));
  const ExpertCoord e = l.ExpertCoordOf(13);  // 13 = 0 + 1*(1 + 4*(1 + 2*1))
  EXPECT_EQ(std::vector<int>({e.etp, e.ep, e.edp, e.pp}), (std::vector<int>{0, 1, 1, 1}));
}

// Table row 2: W=8, TP=2, EP=8, ETP=1.
TEST(ParallelStateGolden, Row2ExpertOverWholeWorld) {
  const ParallelLayout l = MustCreate(Dims(8, 2, 1, 1, 8, 1));
  EXPECT_EQ(l.AllGroups(G::kTensor), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.AllGroups(G::kData), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(l.AllGroups(G::kExpert), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(l.AllGroups(G::kExpertData), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(l.edp(), 1);
}

// Table row 3: W=8, TP=2, CP=2, ETP=2, EP=2.
TEST(ParallelStateGolden, Row3ExpertTensorParallel) {
  const ParallelLayout l = MustCreate(Dims(8, 2, 2, 1, 2, 2));
  EXPECT_EQ(l.AllGroups(G::kExpertTensor), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.AllGroups(G::kExpert), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.AllGroups(G::kExpertTensorExpert), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(l.AllGroups(G::kExpertData), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

// Table row 4: row 1 with order "tp-cp-ep-pp-dp".
TEST(ParallelStateGolden, Row4OrderPpBeforeDp) {
  ParallelDims d = Dims(16, 2, 2, 2, 4, 1);
  d.order = "tp-cp-ep-pp-dp";
  const ParallelLayout l = MustCreate(d);
  EXPECT_EQ(l.AllGroups(G::kPipeline),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(l.AllGroups(G::kData),
            (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(l.AllGroups(G::kExpert),
            (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
}

TEST(ParallelStateGolden, DefaultsAndTrivialWorld) {
  const ParallelLayout l = MustCreate(ParallelDims{});
  EXPECT_EQ(l.order(), "tp-cp-ep-dp-pp");
  for (ParallelGroup g : kAllParallelGroups) EXPECT_EQ(l.AllGroups(g), (Groups{{0}}));
  ParallelDims d = Dims(8, 4, 1, 1, 2, 0);  // ETP 0 -> TP
  d.order = "tp-ep-dp";                     // cp and pp (size 1) appended
  const ParallelLayout m = MustCreate(d);
  EXPECT_EQ(m.etp(), 4);
  EXPECT_EQ(m.order(), "tp-ep-dp-cp-pp");
  EXPECT_EQ(m.AllGroups(G::kExpert), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

void ExpectInvalid(const ParallelDims& d, const std::string& fragment) {
  absl::StatusOr<ParallelLayout> l = ParallelLayout::Create(d);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(l.status().message()), HasSubstr(fragment));
  std::cout << "rejected: " << l.status().message() << "\n";
}

TEST(ParallelStateValidation, Rules) {
  ExpectInvalid(Dims(0, 1, 1, 1, 1, 1), "world_size (0) must be in [1, 16777216]");
  ExpectInvalid(Dims(8, 0, 1, 1, 1, 1), "tensor_model_parallel_size (0) must be positive");
  ExpectInvalid(Dims(8, 1, 1, 1, 16, 1),
                "expert_model_parallel_size (16) must be at most world_size (8)");
  ExpectInvalid(Dims(16, 2, 1, 1, 3, 1),
                "world_size (16) must be divisible by expert_tensor_parallel_size * "
                "expert_model_parallel_size * pipeline_model_parallel_size (1 * 3 * 1 = 3)");
  ExpectInvalid(Dims(12, 8, 1, 1, 1, 1),
                "world_size (12) must be divisible by tensor_model_parallel_size * "
                "pipeline_model_parallel_size * context_parallel_size (8 * 1 * 1 = 8)");
  ParallelDims d = Dims(8, 2, 1, 1, 1, 1);
  d.num_distributed_optimizer_instances = 8;
  ExpectInvalid(d,
                "data-parallel size * context_parallel_size (4 * 1 = 4) must be divisible by "
                "num_distributed_optimizer_instances (8)");
  d = Dims(8, 1, 2, 1, 1, 4);
  d.num_distributed_optimizer_instances = 4;  // DP*CP = 8 fine, EDP = 2 not
  ExpectInvalid(d,
                "expert data-parallel size (2) must be divisible by "
                "num_distributed_optimizer_instances (4)");
  d = Dims(16, 2, 1, 2, 1, 1);  // DP = 4, EDP = 8
  d.order = "tp-cp-ep-pp-dp";
  ExpectInvalid(d, "expert data-parallel size (8) must equal the data-parallel size (4)");
  d = Dims(8, 2, 1, 1, 1, 1);
  d = Dims(8, 2, 1, 2, 2, 1);  // DP = EDP = 2, but PP strides 2 (attention) and 1 (expert)
  d.order = "tp-pp-cp-ep-dp";
  ExpectInvalid(d, "the attention and expert pipeline groups differ (pp stride 2 vs 1)");
  d = Dims(8, 2, 1, 1, 1, 1);
  d.order = "tp-cp-xp-dp-pp";
  ExpectInvalid(d, "unknown axis \"xp\"");
  d.order = "tp-cp-tp-dp-pp";
  ExpectInvalid(d, "repeats axis \"tp\"");
  d.order = "cp-ep-dp-pp";
  ExpectInvalid(d, "must contain axis \"tp\"");
}

TEST(ParallelStateValidation, DivisibilityMessagesTakeAPrefix) {
  EXPECT_THAT(ParallelDivisibilityViolations("parallel.", 16, 2, 1, 1, 3, 2, 1),
              ElementsAre(HasSubstr("parallel.world_size (16) must be divisible by "
                                    "parallel.expert_tensor_parallel_size")));
  EXPECT_TRUE(ParallelDivisibilityViolations("", 64, 2, 2, 2, 8, 1, 2).empty());
}

// Axes of a group kind, as coordinate getters: two ranks share a group iff they agree on every
// axis not in the group (in the group's grid).
using Key = std::array<int, 4>;
Key Outside(ParallelGroup g, const AttentionCoord& a, const ExpertCoord& e) {
  switch (g) {
    case G::kTensor:
      return {a.cp, a.dp, a.pp, 0};
    case G::kContext:
      return {a.tp, a.dp, a.pp, 0};
    case G::kData:
      return {a.tp, a.cp, a.pp, 0};
    case G::kDataContext:
      return {a.tp, a.pp, 0, 0};
    case G::kTensorContext:
      return {a.dp, a.pp, 0, 0};
    case G::kTensorDataContext:
      return {a.pp, 0, 0, 0};
    case G::kModel:
      return {a.cp, a.dp, 0, 0};
    case G::kPipeline:
      return {a.tp, a.cp, a.dp, 0};
    case G::kExpertTensor:
      return {e.ep, e.edp, e.pp, 0};
    case G::kExpert:
      return {e.etp, e.edp, e.pp, 0};
    case G::kExpertTensorExpert:
      return {e.edp, e.pp, 0, 0};
    case G::kExpertTensorExpertPipeline:
      return {e.edp, 0, 0, 0};
    case G::kExpertData:
      return {e.etp, e.ep, e.pp, 0};
  }
  return {};
}

// Checks one layout with ASSERTs (the caller stops at the first fatal failure).
void CheckLayout(const ParallelLayout& l, bool default_order) {
  const int w = l.world_size();
  ASSERT_EQ(l.tp() * l.cp() * l.dp() * l.pp(), w);
  ASSERT_EQ(l.etp() * l.ep() * l.edp() * l.pp(), w);
  std::vector<AttentionCoord> ac(w);
  std::vector<ExpertCoord> ec(w);
  for (int r = 0; r < w; ++r) {
    const AttentionCoord a = ac[r] = l.AttentionCoordOf(r);
    const ExpertCoord e = ec[r] = l.ExpertCoordOf(r);
    ASSERT_EQ(l.AttentionRank(a), r);
    ASSERT_EQ(l.ExpertRank(e), r);
    ASSERT_EQ(a.pp, e.pp) << "rank " << r;
    if (default_order) {
      ASSERT_EQ(r, a.tp + l.tp() * (a.cp + l.cp() * (a.dp + l.dp() * a.pp)));
      ASSERT_EQ(r, e.etp + l.etp() * (e.ep + l.ep() * (e.edp + l.edp() * e.pp)));
    }
  }
  std::vector<Groups> all;  // indexed by static_cast<int>(ParallelGroup)
  for (ParallelGroup g : kAllParallelGroups) {
    ASSERT_EQ(static_cast<int>(all.size()), static_cast<int>(g));
    all.push_back(l.AllGroups(g));
    const Groups& groups = all.back();
    ASSERT_EQ(static_cast<int>(groups.size()), l.NumGroups(g)) << ParallelGroupName(g);
    std::vector<int> seen(w, 0);
    for (int gi = 0; gi < static_cast<int>(groups.size()); ++gi) {
      const std::vector<int>& members = groups[gi];
      ASSERT_EQ(static_cast<int>(members.size()), l.GroupSize(g));
      const Key key = Outside(g, ac[members[0]], ec[members[0]]);
      for (int i = 0; i < static_cast<int>(members.size()); ++i) {
        const int r = members[i];
        ASSERT_TRUE(r >= 0 && r < w);
        ++seen[r];
        ASSERT_EQ(Outside(g, ac[r], ec[r]), key) << ParallelGroupName(g) << " rank " << r;
        ASSERT_EQ(l.GroupIndex(g, r), gi);
        ASSERT_EQ(l.RankInGroup(g, r), i);
        ASSERT_EQ(l.Group(g, r), members);
        if (default_order && i > 0) {
          ASSERT_LT(members[i - 1], r);
        }
      }
      if (default_order && gi > 0) {
        ASSERT_LT(groups[gi - 1][0], members[0]);
      }
    }
    for (int r = 0; r < w; ++r) ASSERT_EQ(seen[r], 1) << ParallelGroupName(g) << " rank " << r;
  }
  // Orthogonality: single-axis groups of one grid meet only in the rank itself.
  const std::vector<std::vector<ParallelGroup>> grids = {
      {G::kTensor, G::kContext, G::kData, G::kPipeline},
      {G::kExpertTensor, G::kExpert, G::kExpertData, G::kPipeline}};
  std::vector<int> mark(w, -1);
  int stamp = 0;
  auto intersection = [&](ParallelGroup a, ParallelGroup b, int r) {
    ++stamp;
    for (int x : all[static_cast<int>(a)][l.GroupIndex(a, r)]) mark[x] = stamp;
    int n = 0;
    for (int x : all[static_cast<int>(b)][l.GroupIndex(b, r)]) n += mark[x] == stamp;
    return n;
  };
  for (int r = 0; r < w; ++r) {
    for (const auto& kinds : grids) {
      for (size_t i = 0; i < kinds.size(); ++i) {
        for (size_t j = i + 1; j < kinds.size(); ++j) {
          ASSERT_EQ(intersection(kinds[i], kinds[j], r), 1)
              << ParallelGroupName(kinds[i]) << " x " << ParallelGroupName(kinds[j]) << " rank "
              << r;
        }
      }
    }
    // Expert-grid PP group (ranks with equal etp, ep, edp) equals the shared PP group.
    std::vector<int> expert_pp;
    const ExpertCoord e = l.ExpertCoordOf(r);
    for (int p = 0; p < l.pp(); ++p) expert_pp.push_back(l.ExpertRank({e.etp, e.ep, e.edp, p}));
    ASSERT_EQ(expert_pp, l.Group(G::kPipeline, r));
    // Composite groups are products: dp-cp contains the rank's whole DP and CP groups, etp-ep its
    // whole EP group.
    ASSERT_EQ(intersection(G::kDataContext, G::kData, r), l.dp());
    ASSERT_EQ(intersection(G::kDataContext, G::kContext, r), l.cp());
    ASSERT_EQ(intersection(G::kExpertTensorExpert, G::kExpert, r), l.ep());
  }
  // Folding: each PP stage is one TP x CP x DP block and one ETP x EP x EDP block.
  for (int p = 0; p < l.pp(); ++p) {
    std::vector<int> stage_a = all[static_cast<int>(G::kTensorDataContext)][p];
    std::vector<int> stage_e;
    for (int x = 0; x < w; ++x) {
      if (ec[x].pp == p) stage_e.push_back(x);
    }
    std::sort(stage_a.begin(), stage_a.end());
    ASSERT_EQ(stage_a, stage_e);
  }
}

TEST(ParallelStateProperty, AllFactorisationsUpTo64) {
  const auto start = std::chrono::steady_clock::now();
  int layouts = 0, rejected = 0;
  for (int w = 1; w <= 64; ++w) {
    for (int tp = 1; tp <= w; ++tp) {
      if (w % tp) continue;
      for (int cp = 1; cp <= w / tp; ++cp) {
        if ((w / tp) % cp) continue;
        for (int pp = 1; pp <= w / (tp * cp); ++pp) {
          if ((w / (tp * cp)) % pp) continue;
          for (int etp = 1; etp <= w / pp; ++etp) {
            if ((w / pp) % etp) continue;
            for (int ep = 1; ep <= w / (pp * etp); ++ep) {
              if ((w / (pp * etp)) % ep) continue;
              for (const char* order : {"tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"}) {
                // With PP = 1 the second order is the same layout; keep the second order to
                // W <= 32 so that the test stays fast.
                if ((pp == 1 || w > 32) && order != std::string("tp-cp-ep-dp-pp")) continue;
                ParallelDims d = Dims(w, tp, cp, pp, ep, etp);
                d.order = order;
                const bool default_order = order == std::string("tp-cp-ep-dp-pp");
                absl::StatusOr<ParallelLayout> l = ParallelLayout::Create(d);
                const int dp = w / (tp * cp * pp), edp = w / (etp * ep * pp);
                if (!default_order && pp > 1 && dp != edp) {
                  ASSERT_FALSE(l.ok());
                  ++rejected;
                  continue;
                }
                ASSERT_TRUE(l.ok()) << l.status();
                ASSERT_EQ(l->dp(), dp);
                ASSERT_EQ(l->edp(), edp);
                CheckLayout(*l, default_order);
                if (HasFatalFailure()) {
                  FAIL() << "w=" << w << " tp=" << tp << " cp=" << cp << " pp=" << pp
                         << " etp=" << etp << " ep=" << ep << " order=" << order;
                }
                ++layouts;
              }
            }
          }
        }
      }
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "checked " << layouts << " layouts (" << rejected
            << " rejected by the EDP == DP rule) in " << s << " s\n";
}

}  // namespace
}  // namespace switchyard
