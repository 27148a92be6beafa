// global_aux_loss over TP×DP×CP (megatron_moe.md §2.3): forked ranks over Gloo, each running the
// MoE layer on the SAME micro-batch with the TP×DP×CP group given, must see the all-reduced counts
// c = DP·c_local and N = DP·T. The loss is then aux(P_local, DP·c, DP·T) = aux_single / DP
// (Megatron's documented 1/DP scaling of global_aux_loss, GitHub issue #3672), not aux_single /
// DP² (which is what forgetting the all-reduce while scaling N would give) nor aux_single.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "worker/comm/testing/forked_ranks.h"
#include "worker/model/moe_layer.h"
#include "worker/model/moe_layer_tensors.h"
#include "worker/model/testing/ep_fork.h"

namespace switchyard::model {
namespace {

namespace ct = ::switchyard::comm::testing;

MoELayerConfig Config() {
  MoELayerConfig c;
  c.hidden_size = 16;
  c.ffn_hidden_size = 8;
  c.dtype = DType::kF64;
  c.router.num_experts = 8;
  c.router.topk = 2;
  c.router.seq_length = 12;
  c.router.training = true;
  c.router.aux_losses = {{kernels::AuxLossType::kGlobalAuxLoss, 0.1}};
  return c;
}

// The global_aux_loss value of one forward on a fixed micro-batch (the same on every rank).
absl::StatusOr<double> GlobalAux(comm::Communicator* tdc) {
  const MoELayerConfig c = Config();
  const int64_t t = 24, h = c.hidden_size;
  SY_ASSIGN_OR_RETURN(MoELayerTensors w,
                      MoELayerTensors::Create(c, Device::Cpu(), DType::kF64, DType::kF64));
  std::mt19937_64 rng(7);
  SY_RETURN_IF_ERROR(w.RandomizeOnCpu(rng, 0.5f));
  SY_ASSIGN_OR_RETURN(std::unique_ptr<MoELayer> layer,
                      MoELayer::Create(c, Device::Cpu(), t, MoEParallelGroups{nullptr, tdc}));
  std::vector<double> x(t * h), y(t * h);
  std::normal_distribution<double> n(0.0, 1.0);
  for (double& v : x) v = n(rng);
  const Tensor tx(DType::kF64, {t, h}, Device::Cpu(), x.data());
  const Tensor ty(DType::kF64, {t, h}, Device::Cpu(), y.data());
  SY_RETURN_IF_ERROR(layer->Forward(Stream::Cpu(), w.params(), w.router_state(), tx, ty));
  return layer->losses().as<double>()[0];
}

TEST(MoELayerDistTest, GlobalAuxLossCountsAreAllReducedOverTheGroup) {
  absl::StatusOr<double> single = GlobalAux(nullptr);
  ASSERT_TRUE(single.ok()) << single.status();
  for (int world : {2, 3}) {
    const std::string dir = ct::UniqueStoreDir("global_aux");
    const std::vector<int> codes = ct::RunProcesses(world, absl::Seconds(60), [&](int rank) {
      auto group = ep_test::ConnectGloo(dir, rank, world);
      SY_CHILD_OK(group.status());
      absl::StatusOr<double> aux = GlobalAux(group->get());
      SY_CHILD_OK(aux.status());
      const double want = *single / world;
      std::printf(
          "rank %d/%d: global_aux_loss %.12g, single process %.12g, want single/%d = %.12g\n", rank,
          world, *aux, *single, world, want);
      SY_CHILD_CHECK(std::abs(*aux - want) <= 1e-12 * std::abs(want));
      return 0;
    });
    for (int r = 0; r < world; ++r) EXPECT_EQ(codes[r], 0) << "world " << world << " rank " << r;
  }
}

}  // namespace
}  // namespace switchyard::model
