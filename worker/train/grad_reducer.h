// File: worker/train/grad_reducer.h
//
// `GradReducer`: runs gradient reduce-scatters (DistributedAdamW::ReduceBucket) on a background
// thread while the backward pass goes on, as Megatron's DDP overlaps its bucket reductions with
// the backward pass.
//
//   compute thread:  ... layer l backward enqueued ... Launch(bucket) ... layer l-1 ...
//   reducer thread:                                   ReduceBucket(bucket) on its own group
//
// Ordering: on CUDA, Launch records an event on the compute stream and makes the reducer's
// stream (the stream its communicators run on) wait for it, so the reduce-scatter reads the
// bucket's gradients only after the kernels that wrote them; on the CPU the gradients are final
// when Launch is called. Jobs run in launch order, which is the same on every rank (the backward
// pass visits the layers in the same order), so the collectives match across ranks. Wait()
// returns once every launched job has run AND its reduce-scatter has completed: a job only
// enqueues its collective (NCCL returns before completion, communicator.h "Completion"), so
// Wait() calls Synchronize() on every group its jobs used, from the calling thread once the
// reducer thread is idle (bounded by each group's timeout; a stuck or dead peer fails it). The
// reduced shards are then complete on the device, and the compute stream, which did not wait
// for the reducer's stream, may read them (the optimizer step runs on the compute stream; a
// host wait was chosen over an event the compute stream waits on so that a failed reduction is
// reported by this Wait() rather than by a later collective). Returns the first error; after an
// error later jobs are skipped.
//
// The groups given with the jobs must not be used by any other thread meanwhile (the dedicated
// ProcessGroups::grad_* communicators). One compute thread calls Launch and Wait.
#ifndef SWITCHYARD_WORKER_TRAIN_GRAD_REDUCER_H_
#define SWITCHYARD_WORKER_TRAIN_GRAD_REDUCER_H_

#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/tensor.h"
#include "kernels/runtime/stream.h"
#include "worker/comm/communicator.h"
#include "worker/train/distributed_optimizer.h"

namespace switchyard::train {

class GradReducer {
 public:
  struct Job {
    DistributedAdamW* optimizer = nullptr;
    int bucket = 0;
    Tensor grads;  // the optimizer's full padded gradient range
    comm::Communicator* group = nullptr;
  };

  // device: where the gradients live; grad_stream: the stream the jobs' groups run on (on CUDA a
  // real stream, borrowed: it outlives the reducer; ignored on the CPU).
  static absl::StatusOr<std::unique_ptr<GradReducer>> Create(Device device,
                                                             const Stream& grad_stream);
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;
  ~GradReducer();  // waits for the running job, drops the others, joins the thread

  absl::Status Launch(const Stream& compute, const Job& job);
  absl::Status Wait();
  int64_t launched() const { return launched_; }

 private:
  GradReducer() = default;
  void Loop();

  Device device_;
  Stream grad_stream_;
  std::vector<kernels::Event> events_;  // CUDA: reused round robin
  size_t next_event_ = 0;
  int64_t launched_ = 0;
  absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;  // jobs popped, not finished
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  // Groups the jobs ran on since the last Wait() (Synchronize()d by it), in first-use order.
  std::vector<comm::Communicator*> used_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace switchyard::train

#endif  // SWITCHYARD_WORKER_TRAIN_GRAD_REDUCER_H_
