// File: worker/model/scratch_buffer.h
//
// `ScratchBuffer`: one device buffer that several layers take turns using, for tensors that live
// only inside one pass of one layer: the activations that selective recompute
// (model.recompute_modules, config.proto) does not keep between a layer's forward and its backward
// (forward: SwiGLU -> fc2; backward: the recompute -> the weight gradient), and the MoE layers'
// backward-only buffers (MoEGradScratch, worker/model/moe_layer.h: the experts' and the
// dispatcher's gradients, written and read for the last time inside one Backward). A model's
// passes run one after another on one stream (a side stream is joined before its pass returns),
// so every layer of the model and every in-flight pipeline slot can share ONE buffer per role,
// sized by its largest user, instead of keeping one per layer and slot.
//
// The users Reserve their size when they are planned (the largest wins: one allocation) and
// again when their size changes (MoELayer's expert rows follow the alltoall dispatcher's
// capacity, which only grows); View then hands out the first bytes. Growth frees the old memory,
// so a view is valid only until the next Reserve that grows: take it where it is used, never keep
// it across passes. Growth happens between kernels of the one stream: on CUDA the free
// (cudaFree) waits for the device, as MoELayer's own expert-row growth does. Use from one thread.
#ifndef SWITCHYARD_WORKER_MODEL_SCRATCH_BUFFER_H_
#define SWITCHYARD_WORKER_MODEL_SCRATCH_BUFFER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/tensor.h"
#include "kernels/runtime/buffer.h"

namespace switchyard::model {

class ScratchBuffer {
 public:
  explicit ScratchBuffer(Device device) : device_(device) {}
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;

  // Makes the buffer hold at least `bytes` (grows only; a growth invalidates earlier views).
  absl::Status Reserve(int64_t bytes);
  // The first bytes as `dtype`/`shape`. Precondition: they fit (a Reserve of at least that size
  // came first).
  Tensor View(DType dtype, std::vector<int64_t> shape) const;
  int64_t bytes() const { return static_cast<int64_t>(buffer_.bytes()); }

 private:
  Device device_;
  kernels::Buffer buffer_;
};

// `given` when it is not null; else a new ScratchBuffer on `device`, owned through `*own` (a
// layer or a dispatcher created alone keeps its own scratch).
ScratchBuffer* BorrowOrOwn(ScratchBuffer* given, Device device,
                           std::unique_ptr<ScratchBuffer>* own);

}  // namespace switchyard::model

#endif  // SWITCHYARD_WORKER_MODEL_SCRATCH_BUFFER_H_
