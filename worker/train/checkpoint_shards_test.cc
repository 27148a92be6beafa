// File: worker/train/checkpoint_shards_test.cc
//
// ModelParallelSlice against the model's own copy functions: for TP2, TP4 (4 query groups),
// EP2, EP2·ETP2 and TP2·EP2 layouts of the tiny MoE model, every rank's shard of every tensor,
// cut from a random global tensor by CopyTpShard / CopyShard, must equal the global elements the
// slice names, element by element (a slice that names the wrong runs would save or load the
// wrong weights in a sharded checkpoint).
#include "worker/train/checkpoint_shards.h"

#include <random>
#include <vector>

#include "common/config/config.h"
#include "common/config/config_defaults.h"
#include "gtest/gtest.h"
#include "worker/train/testing/tiny_moe_spec.h"

namespace switchyard::train {
namespace {

// Global row-major index of every local element of `s`.
std::vector<int64_t> GlobalIndices(const ShardSlice& s) {
  std::vector<std::vector<int64_t>> per_dim;
  for (const auto& dim : s.runs) {
    std::vector<int64_t> idx;
    for (const DimRun& r : dim) {
      for (int64_t k = 0; k < r.length; ++k) idx.push_back(r.global_begin + k);
    }
    per_dim.push_back(idx);
  }
  const std::vector<int64_t> shape = s.LocalShape();
  std::vector<int64_t> out;
  for (int64_t flat = 0; flat < s.LocalNumel(); ++flat) {
    int64_t rem = flat, g = 0, gstride = 1;
    std::vector<int64_t> local(shape.size());
    for (size_t d = shape.size(); d-- > 0;) {
      local[d] = rem % shape[d];
      rem /= shape[d];
    }
    for (size_t d = shape.size(); d-- > 0;) {
      g += per_dim[d][local[d]] * gstride;
      gstride *= s.global_shape[d];
    }
    out.push_back(g);
  }
  return out;
}

struct Mapping {
  int tp = 1, ep = 1, etp = 1, query_groups = 2;
};

class ModelParallelSliceTest : public ::testing::TestWithParam<Mapping> {};

TEST_P(ModelParallelSliceTest, MatchesTheModelsShardCopies) {
  const Mapping m = GetParam();
  auto spec = ParseJobSpecYaml(test_specs::TinyMoeSpecYaml(4, false));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ApplyDefaults(&*spec);
  spec->mutable_model()->set_num_query_groups(m.query_groups);
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  int checked = 0;
  for (int tp_rank = 0; tp_rank < m.tp; ++tp_rank) {
    for (int ep_rank = 0; ep_rank < m.ep; ++ep_rank) {
      for (int etp_rank = 0; etp_rank < m.etp; ++etp_rank) {
        auto c = model::GptConfig::FromProto(spec->model(), DType::kF64);
        ASSERT_TRUE(c.ok()) << c.status();
        c->tp_size = m.tp;
        c->tp_rank = tp_rank;
        c->moe.ep_size = m.ep;
        c->moe.ep_rank = ep_rank;
        c->moe.etp_size = m.etp;
        c->moe.etp_rank = etp_rank;
        const model::GptParamLayout lay = model::MakeGptParamLayout(*c);
        for (const model::ParamInfo& p : lay.params) {
          const ShardSlice s = ModelParallelSlice(p, *c);
          ASSERT_TRUE(ValidateShardSlice(s, p.name).ok());
          ASSERT_EQ(s.LocalShape(), p.shape) << p.name;
          int64_t n = 1;
          for (int64_t d : p.global_shape) n *= d;
          std::vector<double> global(n), shard(p.numel, -99);
          for (double& x : global) x = u(rng);
          if (p.expert) {
            ASSERT_TRUE(
                model::CopyShard(p, p.global_offset,
                                 Tensor(DType::kF64, {n}, Device::Cpu(), global.data()),
                                 Tensor(DType::kF64, {p.numel}, Device::Cpu(), shard.data()),
                                 /*to_global=*/false)
                    .ok());
          } else {
            model::CopyTpShard(p, c->tp_size, c->tp_rank, sizeof(double), /*to_shard=*/true,
                               global.data(), shard.data());
          }
          const std::vector<int64_t> idx = GlobalIndices(s);
          ASSERT_EQ(static_cast<int64_t>(idx.size()), p.numel);
          for (int64_t i = 0; i < p.numel; ++i) {
            ASSERT_EQ(shard[i], global[idx[i]])
                << p.name << " element " << i << " tp_rank " << tp_rank << " ep_rank " << ep_rank
                << " etp_rank " << etp_rank;
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Mappings, ModelParallelSliceTest,
                         ::testing::Values(Mapping{2, 1, 1, 2}, Mapping{4, 1, 1, 4},
                                           Mapping{1, 2, 1, 2}, Mapping{1, 2, 2, 2},
                                           Mapping{2, 2, 2, 2}, Mapping{2, 4, 1, 2}));

}  // namespace
}  // namespace switchyard::train
