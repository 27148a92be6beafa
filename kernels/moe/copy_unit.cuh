// File: kernels/moe/copy_unit.cuh
//
// The unit the row-copy kernels of permute.cu and sort_chunks.cu move rows in: the widest of
// uint4, uint2, uint32_t, uint16_t and uint8_t whose size divides the row size and both base
// addresses, so every load and store of a row is aligned. Host code (picks the kernel to launch).
#ifndef SWITCHYARD_KERNELS_MOE_COPY_UNIT_CUH_
#define SWITCHYARD_KERNELS_MOE_COPY_UNIT_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace switchyard::kernels::internal {

// Largest power-of-two unit (<= 16 bytes) dividing the row size and both base addresses.
inline int UnitBytes(int64_t row_bytes, const void* a, const void* b) {
  for (int u : {16, 8, 4, 2}) {
    if (row_bytes % u == 0 && reinterpret_cast<uintptr_t>(a) % u == 0 &&
        reinterpret_cast<uintptr_t>(b) % u == 0) {
      return u;
    }
  }
  return 1;
}

// Returns fn(Unit{}), Unit the type of UnitBytes(row_bytes, a, b) bytes (the kernels are
// templated on it).
template <typename Fn>
auto WithCopyUnit(int64_t row_bytes, const void* a, const void* b, Fn&& fn) {
  switch (UnitBytes(row_bytes, a, b)) {
    case 16:
      return fn(uint4{});
    case 8:
      return fn(uint2{});
    case 4:
      return fn(uint32_t{});
    case 2:
      return fn(uint16_t{});
    default:
      return fn(uint8_t{});
  }
}

}  // namespace switchyard::kernels::internal

#endif  // SWITCHYARD_KERNELS_MOE_COPY_UNIT_CUH_
