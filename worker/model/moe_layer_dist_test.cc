// File: worker/model/moe_layer_dist_test.cc
//
// global_aux_loss over TP×DP×CP (megatron_moe.md §2.3): forked ranks over Gloo, each running the
// MoE layer on the SAME micro-batch with the TP×DP×CP group given, must see the all-reduced counts
// c = DP·c_local and N = DP·T. The loss is then aux(P_local, DP·c, DP·T) = aux_single / DP
// (Megatron's documented 1/DP scaling of global_aux_loss, GitHub issue #3672), not aux_single /
// DP² (which is what forgetting the all-reduce while scaling N would give) nor aux_single.
//
// Expert tensor parallelism (megatron_moe.md §3.2, §3.3, §3.5): W = ETP·EP forked ranks, each with
// its OWN micro-batch and its shard of one set of weights (experts [ep·L, +L), fc1 gate and up
// columns [etp·F', +F'), fc2 rows [etp·F', +F')), run forward + backward with each dispatcher; a
// single process runs the whole layer on the rank-ordered concatenation of the micro-batches.
// Every rank's output and input gradient must equal the single process's rows of its tokens, its
// expert weight gradients the single process's slice, and the sum over ranks of the router weight
// gradient the single process's (f64, 1e-10 relative).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

MoELayerConfig EtpConfig(int ep, int etp, MoELayerConfig::Dispatcher dispatcher) {
  MoELayerConfig c;
  c.hidden_size = 16;
  c.ffn_hidden_size = 12;  // F' = 6 at ETP 2
  c.dtype = DType::kF64;
  c.router.num_experts = 8;
  c.router.topk = 3;
  c.router.seq_length = 10;
  c.router.training = true;
  c.ep_size = ep;
  c.etp_size = etp;
  c.dispatcher = dispatcher;
  return c;
}

// Values of this rank's shard of a whole-layer tensor: rows [first, first + n) of dim 0, and of
// the last dim the columns [c0, c0 + w) and (fc1's up half) [c1, c1 + w) when c1 >= 0.
std::vector<double> ShardOf(const Tensor& full, int64_t first, int64_t n, int64_t c0, int64_t w,
                            int64_t c1, int dim1_first = -1, int dim1_n = -1) {
  const int64_t d1 = full.dim(1), d2 = full.dim(2);
  const double* f = full.as<double>();
  std::vector<double> out;
  for (int64_t e = first; e < first + n; ++e) {
    for (int64_t i = 0; i < d1; ++i) {
      if (dim1_first >= 0 && (i < dim1_first || i >= dim1_first + dim1_n)) continue;
      for (int64_t j = c0; j < c0 + w; ++j) out.push_back(f[(e * d1 + i) * d2 + j]);
      if (c1 >= 0) {
        for (int64_t j = c1; j < c1 + w; ++j) out.push_back(f[(e * d1 + i) * d2 + j]);
      }
    }
  }
  return out;
}

struct LayerRun {
  std::vector<double> y, dx, router_grad, fc1_grad, fc2_grad;
  std::vector<int32_t> topk_idx;
};

// Forward + backward of `c` (sharded as its ep/etp rank says) on tokens [t0, t0 + t) of the
// global batch, weights from seed 11 for the WHOLE layer (then sharded).
absl::StatusOr<LayerRun> RunShard(const MoELayerConfig& c, const MoEParallelGroups& groups,
                                  int64_t t0, int64_t t, int64_t global_t, int64_t max_tokens) {
  MoELayerConfig whole = c;
  whole.ep_size = 1;
  whole.ep_rank = 0;
  whole.etp_size = 1;
  whole.etp_rank = 0;
  SY_ASSIGN_OR_RETURN(MoELayerTensors full,
                      MoELayerTensors::Create(whole, Device::Cpu(), DType::kF64, DType::kF64));
  std::mt19937_64 rng(11);
  SY_RETURN_IF_ERROR(full.RandomizeOnCpu(rng, 0.4f));
  SY_ASSIGN_OR_RETURN(MoELayerTensors w,
                      MoELayerTensors::Create(c, Device::Cpu(), DType::kF64, DType::kF64));
  const int64_t l = c.num_local_experts(), f = c.ffn_hidden_size, fl = c.local_ffn_size();
  const int64_t first = c.ep_rank * l, col = c.etp_rank * fl;
  auto put = [](const std::vector<double>& v, const Tensor& dst) -> absl::Status {
    if (static_cast<int64_t>(v.size()) != dst.numel()) {
      return absl::InternalError(
          absl::StrCat("shard has ", v.size(), " values, want ", dst.numel()));
    }
    std::copy(v.begin(), v.end(), dst.as<double>());
    return absl::OkStatus();
  };
  SY_RETURN_IF_ERROR(
      put(ShardOf(full.Param("experts.fc1"), first, l, col, fl, f + col), w.Param("experts.fc1")));
  SY_RETURN_IF_ERROR(put(ShardOf(full.Param("experts.fc2"), first, l, 0, c.hidden_size, -1,
                                 static_cast<int>(col), static_cast<int>(fl)),
                         w.Param("experts.fc2")));
  const Tensor rw = full.Param("router.weight");
  SY_RETURN_IF_ERROR(put(std::vector<double>(rw.as<double>(), rw.as<double>() + rw.numel()),
                         w.Param("router.weight")));
  // The global batch, from one seed; this rank takes its rows.
  const int64_t h = c.hidden_size;
  std::vector<double> gx(global_t * h), gdy(global_t * h);
  std::normal_distribution<double> n(0.0, 1.0);
  std::mt19937_64 drng(5);
  for (double& v : gx) v = n(drng);
  for (double& v : gdy) v = n(drng);
  std::vector<double> x(gx.begin() + t0 * h, gx.begin() + (t0 + t) * h);
  std::vector<double> dy(gdy.begin() + t0 * h, gdy.begin() + (t0 + t) * h);
  LayerRun out;
  out.y.assign(t * h, 0.0);
  out.dx.assign(t * h, 0.0);
  SY_ASSIGN_OR_RETURN(std::unique_ptr<MoELayer> layer,
                      MoELayer::Create(c, Device::Cpu(), max_tokens, groups));
  const Tensor tx(DType::kF64, {t, h}, Device::Cpu(), x.data());
  const Tensor ty(DType::kF64, {t, h}, Device::Cpu(), out.y.data());
  const Tensor tdy(DType::kF64, {t, h}, Device::Cpu(), dy.data());
  const Tensor tdx(DType::kF64, {t, h}, Device::Cpu(), out.dx.data());
  SY_RETURN_IF_ERROR(layer->Forward(Stream::Cpu(), w.params(), w.router_state(), tx, ty));
  SY_RETURN_IF_ERROR(layer->Backward(Stream::Cpu(), w.params(), w.grads(), tdy, tdx, 1.0,
                                     MoELayer::GradMode::kOverwrite));
  const Tensor& idx = layer->topk_idx();
  out.topk_idx.assign(idx.as<int32_t>(), idx.as<int32_t>() + t * c.router.topk);
  auto take = [](const Tensor& g) {
    return std::vector<double>(g.as<double>(), g.as<double>() + g.numel());
  };
  out.router_grad = take(w.Grad("router.weight"));
  out.fc1_grad = take(w.Grad("experts.fc1"));
  out.fc2_grad = take(w.Grad("experts.fc2"));
  return out;
}

double MaxRelDiff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return 1e300;
  double scale = 1e-30, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::abs(b[i]));
    diff = std::max(diff, std::abs(a[i] - b[i]));
  }
  return diff / scale;
}

TEST(MoELayerDistTest, ExpertTensorParallelMatchesOneProcess) {
  using D = MoELayerConfig::Dispatcher;
  // Uneven micro-batches, so the ETP reduce-scatters see uneven row counts.
  const std::vector<int64_t> tokens4 = {10, 20, 10, 20};
  for (auto [etp, ep] : {std::pair<int, int>{2, 1}, {2, 2}}) {
    for (D dispatcher : {D::kAllToAll, D::kAllGather}) {
      const int world = etp * ep;
      int64_t global_t = 0;
      for (int r = 0; r < world; ++r) global_t += tokens4[r];
      const MoELayerConfig sc = EtpConfig(1, 1, dispatcher);
      absl::StatusOr<LayerRun> single = RunShard(sc, {}, 0, global_t, global_t, global_t);
      ASSERT_TRUE(single.ok()) << single.status();
      const char* dname = dispatcher == D::kAllToAll ? "alltoall" : "allgather";
      const std::string dir = ct::UniqueStoreDir(absl::StrCat("etp", etp, "ep", ep, dname));
      const std::vector<int> codes = ct::RunProcesses(world, absl::Seconds(60), [&](int rank) {
        auto wg = ep_test::ConnectGloo(dir, rank, world);
        SY_CHILD_OK(wg.status());
        // Rank = etp_rank + ETP * ep_rank (the expert grid's "tp-ep" order, ETP fastest).
        const int etp_rank = rank % etp, ep_rank = rank / etp;
        std::vector<int> etp_members, ep_members, all;
        for (int t = 0; t < etp; ++t) etp_members.push_back(ep_rank * etp + t);
        for (int e = 0; e < ep; ++e) ep_members.push_back(e * etp + etp_rank);
        for (int r = 0; r < world; ++r) all.push_back(r);
        auto etp_g = (*wg)->CreateSubgroup(etp_members, "etp");
        SY_CHILD_OK(etp_g.status());
        auto ep_g = (*wg)->CreateSubgroup(ep_members, "ep");
        SY_CHILD_OK(ep_g.status());
        MoELayerConfig c = EtpConfig(ep, etp, dispatcher);
        c.ep_rank = ep_rank;
        c.etp_rank = etp_rank;
        MoEParallelGroups groups;
        groups.ep = ep_g->get();
        groups.etp = etp_g->get();
        groups.etp_ep = wg->get();
        int64_t t0 = 0;
        for (int r = 0; r < rank; ++r) t0 += tokens4[r];
        const int64_t t = tokens4[rank], h = sc.hidden_size, k = sc.router.topk;
        absl::StatusOr<LayerRun> mine = RunShard(c, groups, t0, t, global_t, /*max_tokens=*/20);
        SY_CHILD_OK(mine.status());
        // Routing: identical slots.
        for (int64_t i = 0; i < t * k; ++i) {
          SY_CHILD_CHECK(mine->topk_idx[i] == single->topk_idx[t0 * k + i]);
        }
        const std::vector<double> want_y(single->y.begin() + t0 * h,
                                         single->y.begin() + (t0 + t) * h);
        const std::vector<double> want_dx(single->dx.begin() + t0 * h,
                                          single->dx.begin() + (t0 + t) * h);
        const int64_t l = c.num_local_experts(), f = c.ffn_hidden_size, fl = c.local_ffn_size();
        const int64_t first = ep_rank * l, col = etp_rank * fl;
        const Tensor g1(DType::kF64, {8, h, 2 * f}, Device::Cpu(),
                        const_cast<double*>(single->fc1_grad.data()));
        const Tensor g2(DType::kF64, {8, f, h}, Device::Cpu(),
                        const_cast<double*>(single->fc2_grad.data()));
        const std::vector<double> want_fc1 = ShardOf(g1, first, l, col, fl, f + col);
        const std::vector<double> want_fc2 =
            ShardOf(g2, first, l, 0, h, -1, static_cast<int>(col), static_cast<int>(fl));
        // The router gradient of this rank's tokens; summed over the ranks it is the single's.
        std::vector<double> router_sum(mine->router_grad.size());
        const Tensor rg(DType::kF64, {static_cast<int64_t>(router_sum.size())}, Device::Cpu(),
                        mine->router_grad.data());
        const Tensor rs(DType::kF64, {static_cast<int64_t>(router_sum.size())}, Device::Cpu(),
                        router_sum.data());
        SY_CHILD_OK((*wg)->AllReduce(rg, rs, comm::ReduceOp::kSum));
        const double dy_err = MaxRelDiff(mine->y, want_y), dx_err = MaxRelDiff(mine->dx, want_dx);
        const double fc1_err = MaxRelDiff(mine->fc1_grad, want_fc1);
        const double fc2_err = MaxRelDiff(mine->fc2_grad, want_fc2);
        const double router_err = MaxRelDiff(router_sum, single->router_grad);
        std::printf(
            "%s ETP%d EP%d rank %d (etp %d, ep %d): T=%ld, max rel diff vs one process: y %.3g "
            "dx %.3g fc1 grad %.3g fc2 grad %.3g router grad (summed) %.3g\n",
            dname, etp, ep, rank, etp_rank, ep_rank, static_cast<long>(t), dy_err, dx_err, fc1_err,
            fc2_err, router_err);
        for (double err : {dy_err, dx_err, fc1_err, fc2_err, router_err}) {
          SY_CHILD_CHECK(err <= 1e-10);
        }
        return 0;
      });
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(codes[r], 0) << dname << " ETP" << etp << " EP" << ep << " rank " << r;
      }
    }
  }
}

TEST(MoELayerDistTest, FfnNotDivisibleByEtpIsRejected) {
  MoELayerConfig c = EtpConfig(1, 1, MoELayerConfig::Dispatcher::kAllToAll);
  c.ffn_hidden_size = 13;
  c.etp_size = 2;
  const absl::Status s = c.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("moe_ffn_hidden_size (13) must be divisible by "
                             "expert_tensor_parallel_size (2)"),
            std::string::npos)
      << s;
}

}  // namespace
}  // namespace switchyard::model
