// File: kernels/loss/thread_all_reduce_testing.h
//
// Test helper of the vocabulary-parallel cross-entropy tests: the TP ranks run as threads of one
// process and VocabShard::all_reduce joins them through this in-process all-reduce (the kernels
// layer has no communicator; the real Gloo/NCCL path is exercised by
// worker/train/tensor_parallel_trainer_test and distributed_gpu_test).
#ifndef SWITCHYARD_KERNELS_LOSS_THREAD_ALL_REDUCE_TESTING_H_
#define SWITCHYARD_KERNELS_LOSS_THREAD_ALL_REDUCE_TESTING_H_

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "common/tensor.h"

namespace switchyard::kernels::loss_testing {

// An all-reduce of host tensors (any float dtype) between `n` threads (the TP ranks of a test):
// every rank deposits its (host) tensor, the last one reduces them in rank order, all copy the
// result out. Calls must come in the same order on every rank (as the kernel's collectives do).
class ThreadAllReduce {
 public:
  explicit ThreadAllReduce(int n) : n_(n), slots_(n) {}
  absl::Status Run(int rank, const Tensor& t, bool max) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = gen_;
    slots_[rank] = t;
    if (++arrived_ == n_) {
      const int64_t len = t.numel();
      result_.assign(len, 0.0);
      for (int64_t i = 0; i < len; ++i) {
        double acc = LoadAsDouble(slots_[0], i);
        for (int r = 1; r < n_; ++r) {
          const double x = LoadAsDouble(slots_[r], i);
          acc = max ? std::max(acc, x) : acc + x;
        }
        result_[i] = acc;
      }
      arrived_ = 0;
      copied_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen; });
    }
    for (int64_t i = 0; i < t.numel(); ++i) StoreFromDouble(t, i, result_[i]);
    // The next call must not overwrite result_ before every rank copied it.
    if (++copied_ == n_) cv_.notify_all();
    cv_.wait(lock, [&] { return copied_ == n_ || gen_ != gen + 1; });
    return absl::OkStatus();
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Tensor> slots_;
  std::vector<double> result_;
  int arrived_ = 0, copied_ = 0;
  uint64_t gen_ = 0;
};

}  // namespace switchyard::kernels::loss_testing

#endif  // SWITCHYARD_KERNELS_LOSS_THREAD_ALL_REDUCE_TESTING_H_
