// File: worker/train/grad_reducer_test.cc
//
// GradReducer's completion contract (grad_reducer.h): a job only ENQUEUES its reduce-scatter
// (NCCL returns before completion), so Wait() must Synchronize() every group its jobs used, once,
// after the reducer thread went idle, and return a Synchronize() failure. On the CPU every
// communicator completes before returning, so the groups here forward to a real single-rank
// communicator and only count (or fail) Synchronize(), as alltoall_dispatcher_failure_test's
// DyingCommunicator does for AllToAllV. The reduced shard is checked too (one rank: the sum is the
// rank's own gradient).
#include "worker/train/grad_reducer.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/optim/adamw.h"
#include "worker/comm/communicator.h"
#include "worker/train/distributed_optimizer.h"

namespace switchyard::train {
namespace {

// Forwards every call to a SingleRankCommunicator; counts Synchronize() and returns `sync_status`
// from it when that is not OK.
class CountingCommunicator final : public comm::Communicator {
 public:
  explicit CountingCommunicator(std::string name)
      : inner_(std::move(*comm::SingleRankCommunicator::Create(std::move(name)))) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  absl::Status AllReduce(const Tensor& in, const Tensor& out, comm::ReduceOp op) override {
    return inner_->AllReduce(in, out, op);
  }
  absl::Status ReduceScatter(const Tensor& in, const Tensor& out, comm::ReduceOp op) override {
    ++reduce_scatters;
    return inner_->ReduceScatter(in, out, op);
  }
  absl::Status AllGather(const Tensor& in, const Tensor& out) override {
    return inner_->AllGather(in, out);
  }
  absl::Status AllGatherV(const Tensor& in, const Tensor& out,
                          absl::Span<const int64_t> counts) override {
    return inner_->AllGatherV(in, out, counts);
  }
  absl::Status AllToAllV(const Tensor& in, absl::Span<const int64_t> send_counts, const Tensor& out,
                         absl::Span<const int64_t> recv_counts) override {
    return inner_->AllToAllV(in, send_counts, out, recv_counts);
  }
  absl::Status Send(const Tensor& t, int peer, uint32_t tag) override {
    return inner_->Send(t, peer, tag);
  }
  absl::Status Recv(const Tensor& t, int peer, uint32_t tag) override {
    return inner_->Recv(t, peer, tag);
  }
  absl::Status Broadcast(const Tensor& t, int root) override { return inner_->Broadcast(t, root); }
  absl::Status Barrier() override { return inner_->Barrier(); }
  absl::Status Synchronize() override {
    ++syncs;
    if (!sync_status.ok()) return sync_status;
    return inner_->Synchronize();
  }
  void Abort() override { inner_->Abort(); }

  int syncs = 0;
  int reduce_scatters = 0;
  absl::Status sync_status;

 private:
  std::unique_ptr<comm::SingleRankCommunicator> inner_;
};

constexpr int64_t kN = 8;

struct Fixture {
  CountingCommunicator dp{"dp"};
  CountingCommunicator grad{"grad_dp"};
  std::vector<float> master = std::vector<float>(kN, 0.5f);
  std::vector<float> grads;
  std::unique_ptr<DistributedAdamW> opt;
  std::unique_ptr<GradReducer> reducer;

  Fixture() {
    for (int64_t i = 0; i < kN; ++i) grads.push_back(static_cast<float>(i + 1));
    kernels::AdamWHyperParams hp;
    // Two buckets [0, 4) and [4, 8) (one rank: any multiple of 1).
    auto o = DistributedAdamW::Create(&dp, Device::Cpu(), kN, kN,
                                      Tensor(DType::kF32, {kN}, Device::Cpu(), master.data()), hp,
                                      std::nullopt, {4, kN});
    EXPECT_TRUE(o.ok()) << o.status();
    opt = std::move(*o);
    auto r = GradReducer::Create(Device::Cpu(), Stream::Cpu());
    EXPECT_TRUE(r.ok()) << r.status();
    reducer = std::move(*r);
  }
  GradReducer::Job JobFor(int bucket, comm::Communicator* group) {
    return {opt.get(), bucket, Tensor(DType::kF32, {kN}, Device::Cpu(), grads.data()), group};
  }
};

TEST(GradReducerTest, WaitSynchronizesEveryGroupItsJobsUsedOnce) {
  Fixture f;
  ASSERT_EQ(f.opt->num_buckets(), 2);
  // Bucket 0 on the dedicated group, bucket 1 on the optimizer's own dp group (group = null).
  ASSERT_TRUE(f.reducer->Launch(Stream::Cpu(), f.JobFor(0, &f.grad)).ok());
  ASSERT_TRUE(f.reducer->Launch(Stream::Cpu(), f.JobFor(1, nullptr)).ok());
  ASSERT_TRUE(f.reducer->Wait().ok());
  EXPECT_EQ(f.grad.reduce_scatters, 1);
  EXPECT_EQ(f.dp.reduce_scatters, 1);
  EXPECT_EQ(f.grad.syncs, 1);
  EXPECT_EQ(f.dp.syncs, 1);
  // One rank: the reduced shard is the gradient itself, bucket by bucket.
  const Tensor shard = f.opt->grad_shard();
  ASSERT_EQ(shard.numel(), kN);
  for (int64_t i = 0; i < kN; ++i) EXPECT_EQ(shard.as<float>()[i], f.grads[i]) << i;
  // Nothing launched since: nothing to synchronise.
  ASSERT_TRUE(f.reducer->Wait().ok());
  EXPECT_EQ(f.grad.syncs, 1);
  EXPECT_EQ(f.dp.syncs, 1);
}

TEST(GradReducerTest, WaitReturnsTheGroupsSynchronizeFailure) {
  Fixture f;
  f.grad.sync_status = absl::DeadlineExceededError(
      "group 'grad_dp' rank 0/1 ReduceScatter: a peer did not take part within the timeout 5s "
      "(NCCL communicator aborted)");
  ASSERT_TRUE(f.reducer->Launch(Stream::Cpu(), f.JobFor(0, &f.grad)).ok());
  ASSERT_TRUE(f.reducer->Launch(Stream::Cpu(), f.JobFor(1, &f.grad)).ok());
  const absl::Status s = f.reducer->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "group 'grad_dp'")) << s;
  EXPECT_EQ(f.grad.reduce_scatters, 2);
  EXPECT_EQ(f.grad.syncs, 1);  // once per Wait, however many jobs used the group
  EXPECT_EQ(f.dp.syncs, 0);
}

}  // namespace
}  // namespace switchyard::train
