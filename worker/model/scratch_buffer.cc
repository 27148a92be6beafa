#include "worker/model/scratch_buffer.h"

#include <cassert>
#include <utility>

#include "common/status.h"

namespace switchyard::model {

absl::Status ScratchBuffer::Reserve(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("ScratchBuffer::Reserve: negative size");
  if (bytes <= this->bytes()) return absl::OkStatus();
  // Release first, then allocate: the old and the new buffer never exist at once (the peak is
  // the larger one).
  buffer_ = kernels::Buffer();
  SY_ASSIGN_OR_RETURN(buffer_, kernels::Buffer::Allocate(device_, static_cast<size_t>(bytes)));
  return absl::OkStatus();
}

Tensor ScratchBuffer::View(DType dtype, std::vector<int64_t> shape) const {
  Tensor t(dtype, std::move(shape), device_, buffer_.data());
  assert(t.bytes() <= buffer_.bytes() && "ScratchBuffer::View past the reserved size");
  return t;
}

ScratchBuffer* BorrowOrOwn(ScratchBuffer* given, Device device,
                           std::unique_ptr<ScratchBuffer>* own) {
  if (given != nullptr) return given;
  *own = std::make_unique<ScratchBuffer>(device);
  return own->get();
}

}  // namespace switchyard::model
