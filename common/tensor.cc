#include "common/tensor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace switchyard {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
    case DType::kBool:
      return "bool";
  }
  return "?";
}

std::string Device::ToString() const { return is_cuda() ? absl::StrCat("cuda:", index) : "cpu"; }

std::string Tensor::DebugString() const {
  return absl::StrCat(DTypeName(dtype), "[", absl::StrJoin(shape, ","), "]@", device.ToString());
}

absl::Status CheckTensor(const Tensor& t, absl::string_view what, DType dtype,
                         std::initializer_list<int64_t> shape) {
  bool ok = t.dtype == dtype && t.rank() == static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) {
    if (ok && s >= 0 && t.shape[i] != s) ok = false;
    ++i;
  }
  if (ok && t.numel() > 0 && t.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null data for ", t.DebugString()));
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": expected ", DTypeName(dtype), "[",
                                                 absl::StrJoin(shape, ","), "] (-1 = any), got ",
                                                 t.DebugString()));
}

absl::Status CheckDevice(const Stream& stream, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (t->device != stream.device) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t->DebugString(),
                                                     " is not on the stream's device ",
                                                     stream.device.ToString()));
    }
  }
  return absl::OkStatus();
}

}  // namespace switchyard
