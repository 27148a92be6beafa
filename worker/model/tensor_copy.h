// File: worker/model/tensor_copy.h
//
// Two small tensor helpers the model and the training loop both need: a view into a flat tensor,
// and a stream-ordered copy between two tensors of the same byte size (cudaMemcpyAsync on CUDA,
// memcpy on the CPU). One copy of each, rather than one per file.
#ifndef SWITCHYARD_WORKER_MODEL_TENSOR_COPY_H_
#define SWITCHYARD_WORKER_MODEL_TENSOR_COPY_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/tensor.h"

namespace switchyard::model {

// The elements [offset, offset + numel(shape)) of `flat` viewed as `shape` (no bounds check: the
// callers compute offsets from the buffers they allocated).
Tensor Slice(const Tensor& flat, int64_t offset, std::vector<int64_t> shape);

// Copies src to dst (same bytes) in stream order (memcpy on the CPU); INTERNAL when the byte
// sizes differ.
absl::Status CopyAsync(const Stream& s, const Tensor& src, const Tensor& dst);

}  // namespace switchyard::model

#endif  // SWITCHYARD_WORKER_MODEL_TENSOR_COPY_H_
