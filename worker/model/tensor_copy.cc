// Slice and CopyAsync (tensor_copy.h).
#include "worker/model/tensor_copy.h"

#include <cuda_runtime.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::model {

Tensor Slice(const Tensor& flat, int64_t offset, std::vector<int64_t> shape) {
  return Tensor(flat.dtype, std::move(shape), flat.device,
                static_cast<char*>(flat.data) + offset * DTypeSize(flat.dtype));
}

absl::Status CopyAsync(const Stream& s, const Tensor& src, const Tensor& dst) {
  if (src.bytes() != dst.bytes()) {
    return absl::InternalError(
        absl::StrCat("CopyAsync: ", src.DebugString(), " -> ", dst.DebugString()));
  }
  if (src.bytes() == 0) return absl::OkStatus();
  if (!s.is_cuda()) {
    std::memcpy(dst.data, src.data, src.bytes());
    return absl::OkStatus();
  }
  SY_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDefault, s.cuda_stream));
  return absl::OkStatus();
}

}  // namespace switchyard::model
