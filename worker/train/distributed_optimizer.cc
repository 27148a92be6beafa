// ZeRO-1 AdamW (reduce-scatter, sharded AdamW, all-gather) and its replicated reference.
#include "worker/train/distributed_optimizer.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "cuda_runtime.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/optim/grad_norm.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::train {
namespace {

Tensor Slice(const Tensor& flat, int64_t offset, int64_t count) {
  return Tensor(flat.dtype, {count}, flat.device,
                static_cast<char*>(flat.data) + offset * DTypeSize(flat.dtype));
}

Tensor Flat(const Tensor& t) { return Tensor(t.dtype, {t.numel()}, t.device, t.data); }

absl::Status CheckCommon(const char* who, comm::Communicator* dp, int64_t n, int64_t decay_end,
                         const kernels::AdamWHyperParams& hp) {
  if (dp == nullptr) return absl::InvalidArgumentError(absl::StrCat(who, ": dp_group is null"));
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat(who, ": n must be >= 1, got ", n));
  if (decay_end < 0 || decay_end > n) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": decay_end must be in [0, n = ", n, "], got ", decay_end));
  }
  if (!(hp.beta1 >= 0 && hp.beta1 < 1 && hp.beta2 >= 0 && hp.beta2 < 1 && hp.eps > 0 &&
        hp.weight_decay >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": hyper-parameters need 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0"));
  }
  return absl::OkStatus();
}

absl::Status CheckGrads(const std::string& who, const Stream& stream, Device device,
                        const Tensor& grads, int64_t expected) {
  if (stream.device != device) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": stream is on ", stream.device.ToString(),
                                                   ", the state on ", device.ToString()));
  }
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&grads}));
  if (grads.dtype != DType::kF32 || grads.numel() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": grads must be f32 with ", expected,
                                                   " elements, got ", grads.DebugString()));
  }
  return absl::OkStatus();
}

absl::Status CheckParams(const std::string& who, const Stream& stream, Device device,
                         const Tensor& params, int64_t expected, double lr, int64_t step) {
  if (stream.device != device) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": stream is on ", stream.device.ToString(),
                                                   ", the state on ", device.ToString()));
  }
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&params}));
  if ((params.dtype != DType::kF32 && params.dtype != DType::kBF16) || params.numel() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": params must be f32 or bf16 with ",
                                                   expected, " elements, got ",
                                                   params.DebugString()));
  }
  if (!(lr >= 0) || step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": need lr >= 0 and step >= 1, got lr ", lr, ", step ", step));
  }
  return absl::OkStatus();
}

absl::Status CheckStepArgs(const std::string& who, const Stream& stream, Device device,
                           const Tensor& grads, const Tensor& params, int64_t expected, double lr,
                           int64_t step) {
  SY_RETURN_IF_ERROR(CheckGrads(who, stream, device, grads, expected));
  return CheckParams(who, stream, device, params, expected, lr, step);
}

// Allocates the small norm scratch (workspace, sum_sq, norm, coef).
absl::Status AllocNormScratch(Device device, kernels::Buffer* ws, kernels::Buffer* sum_sq,
                              kernels::Buffer* norm, kernels::Buffer* coef) {
  SY_ASSIGN_OR_RETURN(
      *ws, kernels::Buffer::ForTensor(DType::kF64, {kernels::kGradNormWorkspace}, device));
  SY_ASSIGN_OR_RETURN(*sum_sq, kernels::Buffer::ForTensor(DType::kF32, {1}, device));
  SY_ASSIGN_OR_RETURN(*norm, kernels::Buffer::ForTensor(DType::kF32, {1}, device));
  SY_ASSIGN_OR_RETURN(*coef, kernels::Buffer::ForTensor(DType::kF32, {1}, device));
  return absl::OkStatus();
}

// Reads an f32 [1] device value on the host (the one synchronisation of a step). `group`'s
// collectives run on `stream` and return before they complete (communicator.h, "Completion"):
// its Synchronize() first bounds the wait by its timeout (a stuck peer fails it instead of hanging
// the stream synchronisation below, which then waits only for local work: the group's last
// operation follows everything enqueued on the stream before it).
absl::StatusOr<float> ReadScalar(const Stream& stream, const Tensor& t, comm::Communicator* group) {
  float v = 0;
  if (stream.is_cuda()) {
    SY_RETURN_IF_ERROR(group->Synchronize());
    cudaStream_t cs = stream.cuda_stream;
    SY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&v, t.data, sizeof(float), cudaMemcpyDeviceToHost, cs));
    SY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cs));
  } else {
    v = t.as<float>()[0];
  }
  return v;
}

// Writes a host float into an f32 [1] device value (bounded like ReadScalar).
absl::Status WriteScalar(const Stream& stream, float v, const Tensor& t,
                         comm::Communicator* group) {
  if (stream.is_cuda()) {
    SY_RETURN_IF_ERROR(group->Synchronize());
    cudaStream_t cs = stream.cuda_stream;
    SY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(t.data, &v, sizeof(float), cudaMemcpyHostToDevice, cs));
    // &v is pageable stack memory: wait before it goes out of scope.
    SY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cs));
  } else {
    t.as<float>()[0] = v;
  }
  return absl::OkStatus();
}

// AdamW over the elements [begin, begin + count) of the global flat buffer, held in the local
// views (each of `count` elements), split at the global decay boundary: at most two launches.
absl::Status AdamWRange(const Stream& stream, kernels::AdamWHyperParams hp, int64_t begin,
                        int64_t count, int64_t decay_end, const Tensor& grads, const Tensor& coef,
                        const Tensor& master, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                        const Tensor& params) {
  const double weight_decay = hp.weight_decay;
  const int64_t split = std::min(std::max(decay_end - begin, int64_t{0}), count);  // local
  for (int group = 0; group < 2; ++group) {
    const int64_t lo = group == 0 ? 0 : split, hi = group == 0 ? split : count;
    if (hi == lo) continue;
    hp.weight_decay = group == 0 ? weight_decay : 0.0;
    SY_RETURN_IF_ERROR(kernels::AdamW(stream, hp, Slice(grads, lo, hi - lo), 1.0f, &coef,
                                      Slice(master, lo, hi - lo), Slice(exp_avg, lo, hi - lo),
                                      Slice(exp_avg_sq, lo, hi - lo), Slice(params, lo, hi - lo)));
  }
  return absl::OkStatus();
}

absl::StatusOr<kernels::Buffer> Zeros(Device device, int64_t count) {
  SY_ASSIGN_OR_RETURN(kernels::Buffer b, kernels::Buffer::ForTensor(DType::kF32, {count}, device));
  SY_RETURN_IF_ERROR(kernels::FillBytes(b.View(), 0));
  return b;
}

}  // namespace

int64_t PaddedSize(int64_t n, int dp) { return (n + dp - 1) / dp * dp; }

absl::StatusOr<std::unique_ptr<DistributedAdamW>> DistributedAdamW::Create(
    comm::Communicator* dp_group, Device device, int64_t n, int64_t decay_end,
    const Tensor& master_init, const kernels::AdamWHyperParams& hp, std::optional<float> grad_scale,
    std::vector<int64_t> bucket_ends) {
  SY_RETURN_IF_ERROR(CheckCommon("DistributedAdamW::Create", dp_group, n, decay_end, hp));
  if (grad_scale.has_value() && !(std::isfinite(*grad_scale) && *grad_scale > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DistributedAdamW::Create: grad_scale must be finite and > 0, got ", *grad_scale));
  }
  const int dp = dp_group->size();
  const int64_t padded = PaddedSize(n, dp);
  if (master_init.dtype != DType::kF32 ||
      (master_init.numel() != n && master_init.numel() != padded)) {
    return absl::InvalidArgumentError(
        absl::StrCat("DistributedAdamW::Create: master_init must be f32 with n = ", n,
                     " or padded ", padded, " elements, got ", master_init.DebugString()));
  }
  if (bucket_ends.empty()) bucket_ends.push_back(padded);
  std::unique_ptr<DistributedAdamW> o(new DistributedAdamW());
  int64_t begin = 0;
  for (size_t i = 0; i < bucket_ends.size(); ++i) {
    const int64_t end = bucket_ends[i];
    if (end <= begin || (end - begin) % dp != 0 || end > padded ||
        (i + 1 == bucket_ends.size() && end != padded)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DistributedAdamW::Create: bucket_ends[", i, "] = ", end,
          ": buckets must increase, be multiples of dp = ", dp, " long and end at ", padded));
    }
    o->buckets_.push_back(Bucket{begin, end, begin / dp});
    begin = end;
  }
  o->reduced_.assign(o->buckets_.size(), false);
  o->dp_ = dp_group;
  o->device_ = device;
  o->n_ = n;
  o->padded_n_ = padded;
  o->decay_end_ = decay_end;
  o->shard_ = padded / dp;
  o->hp_ = hp;
  o->grad_scale_ = grad_scale.value_or(1.0f / static_cast<float>(dp));
  const int64_t s = o->shard_;
  SY_ASSIGN_OR_RETURN(o->master_, Zeros(device, s));
  SY_ASSIGN_OR_RETURN(o->exp_avg_, Zeros(device, s));
  SY_ASSIGN_OR_RETURN(o->exp_avg_sq_, Zeros(device, s));
  SY_ASSIGN_OR_RETURN(o->grad_shard_, Zeros(device, s));
  SY_ASSIGN_OR_RETURN(o->param_shard_, kernels::Buffer::Allocate(device, s * sizeof(float)));
  SY_RETURN_IF_ERROR(AllocNormScratch(device, &o->norm_ws_, &o->sum_sq_, &o->norm_, &o->coef_));
  // This rank's shard of the master values; the padding stays 0.
  const int r = dp_group->rank();
  for (const Bucket& b : o->buckets_) {
    const int64_t chunk = b.chunk() / dp;
    const int64_t first = b.begin + r * chunk;
    const int64_t real = std::min(std::max(n - first, int64_t{0}), chunk);
    if (real > 0) {
      SY_RETURN_IF_ERROR(kernels::CopyTensor(Slice(Flat(master_init), first, real),
                                             Slice(o->master_.View(), b.shard_offset, real)));
    }
  }
  return o;
}

absl::StatusOr<OptimizerStepResult> DistributedAdamW::Step(const Stream& stream,
                                                           const Tensor& grads,
                                                           const Tensor& params, double lr,
                                                           int64_t step, float clip_grad) {
  const std::string who = absl::StrCat("DistributedAdamW::Step (", dp_->name(), " rank ",
                                       dp_->rank(), "/", dp_->size(), ")");
  // Check everything before the first collective, so a bad call fails on every rank alike.
  SY_RETURN_IF_ERROR(CheckStepArgs(who, stream, device_, grads, params, padded_n_, lr, step));
  SY_ASSIGN_OR_RETURN(const float sq, PrepareStep(stream, grads));
  return FinishStep(stream, params, sq, lr, step, clip_grad);
}

absl::StatusOr<float> DistributedAdamW::PrepareStep(const Stream& stream, const Tensor& grads) {
  const std::string who = absl::StrCat("DistributedAdamW::PrepareStep (", dp_->name(), " rank ",
                                       dp_->rank(), "/", dp_->size(), ")");
  prepared_ = false;
  SY_RETURN_IF_ERROR(CheckGrads(who, stream, device_, grads, padded_n_));
  const Tensor g = grad_shard_.View();
  // (1) Sum over the group of this rank's shard (the buckets not reduced yet), then the scale
  // (default: the data-parallel mean; skipped when 1 so that one rank stays bit-identical to the
  // trainer's path).
  for (int b = 0; b < num_buckets(); ++b) {
    if (!reduced_[b]) SY_RETURN_IF_ERROR(ReduceBucket(stream, grads, b));
  }
  reduced_.assign(buckets_.size(), false);
  if (grad_scale_ != 1.0f) {
    SY_RETURN_IF_ERROR(kernels::Axpby(stream, grad_scale_, g, 0.0f, g, g));
  }
  // (2) This instance's squared norm: local sum of squares, summed over the group.
  SY_RETURN_IF_ERROR(kernels::GradSquaredNorm(stream, g, norm_ws_.View(), sum_sq_.View()));
  SY_RETURN_IF_ERROR(dp_->AllReduce(sum_sq_.View(), sum_sq_.View(), comm::ReduceOp::kSum));
  SY_ASSIGN_OR_RETURN(const float sq, ReadScalar(stream, sum_sq_.View(), dp_));
  prepared_ = true;
  return sq;
}

absl::StatusOr<OptimizerStepResult> DistributedAdamW::FinishStep(const Stream& stream,
                                                                 const Tensor& params,
                                                                 float total_sq_norm, double lr,
                                                                 int64_t step, float clip_grad) {
  const std::string who = absl::StrCat("DistributedAdamW::FinishStep (", dp_->name(), " rank ",
                                       dp_->rank(), "/", dp_->size(), ")");
  if (!prepared_) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": FinishStep needs a successful PrepareStep before it"));
  }
  SY_RETURN_IF_ERROR(CheckParams(who, stream, device_, params, padded_n_, lr, step));
  prepared_ = false;
  const Tensor g = grad_shard_.View();
  // The clip coefficient from the combined squared norm.
  SY_RETURN_IF_ERROR(WriteScalar(stream, total_sq_norm, sum_sq_.View(), dp_));
  SY_RETURN_IF_ERROR(
      kernels::ClipCoefficient(stream, sum_sq_.View(), clip_grad, norm_.View(), coef_.View()));
  OptimizerStepResult r;
  SY_ASSIGN_OR_RETURN(r.grad_norm, ReadScalar(stream, norm_.View(), dp_));
  r.skipped = !std::isfinite(r.grad_norm);  // the same on every rank (total_sq_norm is)
  if (r.skipped) return r;
  // (3) AdamW on the shard, split at the decay boundary.
  kernels::AdamWHyperParams hp = hp_;
  hp.lr = lr;
  hp.step = step;
  const Tensor shard_params = param_shard_.View(params.dtype, {shard_});
  for (const Bucket& b : buckets_) {
    const int64_t chunk = Chunk(b), off = b.shard_offset;
    SY_RETURN_IF_ERROR(AdamWRange(
        stream, hp, b.begin + dp_->rank() * chunk, chunk, decay_end_, Slice(g, off, chunk),
        coef_.View(), Slice(master_.View(), off, chunk), Slice(exp_avg_.View(), off, chunk),
        Slice(exp_avg_sq_.View(), off, chunk), Slice(shard_params, off, chunk)));
  }
  // (4) Every rank gets every updated shard, bucket by bucket.
  for (const Bucket& b : buckets_) {
    SY_RETURN_IF_ERROR(dp_->AllGather(Slice(shard_params, b.shard_offset, Chunk(b)),
                                      Slice(Flat(params), b.begin, b.chunk())));
  }
  SY_ASSIGN_OR_RETURN(r.clip_coef, ReadScalar(stream, coef_.View(), dp_));
  return r;
}

absl::Status DistributedAdamW::ReduceBucket(const Stream& stream, const Tensor& grads, int b,
                                            comm::Communicator* group) {
  if (b < 0 || b >= num_buckets()) {
    return absl::InvalidArgumentError(absl::StrCat("DistributedAdamW::ReduceBucket: bucket ", b,
                                                   " outside [0, ", num_buckets(), ")"));
  }
  comm::Communicator* c = group != nullptr ? group : dp_;
  if (c->size() != dp_->size() || c->rank() != dp_->rank()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DistributedAdamW::ReduceBucket: group '", c->name(), "' (rank ", c->rank(), "/", c->size(),
        ") is not the data-parallel group's ranks (", dp_->rank(), "/", dp_->size(), ")"));
  }
  if (grads.numel() != padded_n_ || grads.dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("DistributedAdamW::ReduceBucket: grads must be f32 with ", padded_n_,
                     " elements, got ", grads.DebugString()));
  }
  const Bucket& k = buckets_[b];
  SY_RETURN_IF_ERROR(c->ReduceScatter(Slice(Flat(grads), k.begin, k.chunk()),
                                      Slice(grad_shard_.View(), k.shard_offset, Chunk(k)),
                                      comm::ReduceOp::kSum));
  reduced_[b] = true;
  return absl::OkStatus();
}

absl::Status DistributedAdamW::ScatterFull(const Tensor& full, const Tensor& shard) const {
  if (full.numel() != padded_n_ || shard.numel() != shard_ || full.dtype != DType::kF32 ||
      shard.dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("DistributedAdamW::ScatterFull: need f32 full [", padded_n_, "] and shard [",
                     shard_, "], got ", full.DebugString(), " and ", shard.DebugString()));
  }
  for (const Bucket& b : buckets_) {
    SY_RETURN_IF_ERROR(
        kernels::CopyTensor(Slice(Flat(full), b.begin + dp_->rank() * Chunk(b), Chunk(b)),
                            Slice(Flat(shard), b.shard_offset, Chunk(b))));
  }
  return absl::OkStatus();
}

std::vector<DistributedAdamW::OwnedRun> DistributedAdamW::OwnedRuns() const {
  std::vector<OwnedRun> out;
  for (const Bucket& b : buckets_) {
    out.push_back({b.begin + dp_->rank() * Chunk(b), b.shard_offset, Chunk(b)});
  }
  return out;
}

absl::Status DistributedAdamW::GatherFull(const Tensor& shard, const Tensor& full) const {
  if (full.numel() != padded_n_ || shard.numel() != shard_ || full.dtype != DType::kF32 ||
      shard.dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("DistributedAdamW::GatherFull: need f32 full [", padded_n_, "] and shard [",
                     shard_, "], got ", full.DebugString(), " and ", shard.DebugString()));
  }
  for (const Bucket& b : buckets_) {
    SY_RETURN_IF_ERROR(dp_->AllGather(Slice(Flat(shard), b.shard_offset, Chunk(b)),
                                      Slice(Flat(full), b.begin, b.chunk())));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ReplicatedAdamW>> ReplicatedAdamW::Create(
    comm::Communicator* dp_group, Device device, int64_t n, int64_t decay_end,
    const Tensor& master_init, const kernels::AdamWHyperParams& hp) {
  SY_RETURN_IF_ERROR(CheckCommon("ReplicatedAdamW::Create", dp_group, n, decay_end, hp));
  if (master_init.dtype != DType::kF32 || master_init.numel() < n) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReplicatedAdamW::Create: master_init must be f32 with at least n = ", n,
                     " elements, got ", master_init.DebugString()));
  }
  std::unique_ptr<ReplicatedAdamW> o(new ReplicatedAdamW());
  o->dp_ = dp_group;
  o->device_ = device;
  o->n_ = n;
  o->decay_end_ = decay_end;
  o->hp_ = hp;
  SY_ASSIGN_OR_RETURN(o->master_, Zeros(device, n));
  SY_ASSIGN_OR_RETURN(o->exp_avg_, Zeros(device, n));
  SY_ASSIGN_OR_RETURN(o->exp_avg_sq_, Zeros(device, n));
  SY_ASSIGN_OR_RETURN(o->reduced_, Zeros(device, n));
  SY_RETURN_IF_ERROR(AllocNormScratch(device, &o->norm_ws_, &o->sum_sq_, &o->norm_, &o->coef_));
  SY_RETURN_IF_ERROR(kernels::CopyTensor(Slice(Flat(master_init), 0, n), o->master_.View()));
  return o;
}

absl::StatusOr<OptimizerStepResult> ReplicatedAdamW::Step(const Stream& stream, const Tensor& grads,
                                                          const Tensor& params, double lr,
                                                          int64_t step, float clip_grad) {
  const std::string who = absl::StrCat("ReplicatedAdamW::Step (", dp_->name(), " rank ",
                                       dp_->rank(), "/", dp_->size(), ")");
  SY_RETURN_IF_ERROR(CheckStepArgs(who, stream, device_, grads, params, n_, lr, step));
  const Tensor g = reduced_.View();
  SY_RETURN_IF_ERROR(dp_->AllReduce(Flat(grads), g, comm::ReduceOp::kSum));
  if (dp_->size() > 1) {
    SY_RETURN_IF_ERROR(
        kernels::Axpby(stream, 1.0f / static_cast<float>(dp_->size()), g, 0.0f, g, g));
  }
  SY_RETURN_IF_ERROR(kernels::GradSquaredNorm(stream, g, norm_ws_.View(), sum_sq_.View()));
  SY_RETURN_IF_ERROR(
      kernels::ClipCoefficient(stream, sum_sq_.View(), clip_grad, norm_.View(), coef_.View()));
  OptimizerStepResult r;
  SY_ASSIGN_OR_RETURN(r.grad_norm, ReadScalar(stream, norm_.View(), dp_));
  r.skipped = !std::isfinite(r.grad_norm);
  if (r.skipped) return r;
  kernels::AdamWHyperParams hp = hp_;
  hp.lr = lr;
  hp.step = step;
  SY_RETURN_IF_ERROR(AdamWRange(stream, hp, 0, n_, decay_end_, g, coef_.View(), master_.View(),
                                exp_avg_.View(), exp_avg_sq_.View(), Flat(params)));
  SY_ASSIGN_OR_RETURN(r.clip_coef, ReadScalar(stream, coef_.View(), dp_));
  return r;
}

}  // namespace switchyard::train
