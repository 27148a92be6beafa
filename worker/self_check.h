// File: worker/self_check.h
//
// What `switchyard-worker --self-check` reports: the compute backend this process can use. A
// worker host either has usable CUDA devices (then every device is listed with the facts the
// planner cares about, plus the driver, runtime, cuBLAS and NCCL versions the process actually
// loaded) or it runs CPU-only, with the reason the CUDA runtime gave. Both are valid outcomes;
// only a device that is present but cannot be queried is an error.
#ifndef SWITCHYARD_WORKER_SELF_CHECK_H_
#define SWITCHYARD_WORKER_SELF_CHECK_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace switchyard::worker {

// One CUDA device as the runtime sees it (indices are after CUDA_VISIBLE_DEVICES).
struct CudaDeviceInfo {
  int index = 0;
  std::string name;             // "NVIDIA H100 80GB HBM3"
  double total_memory_gib = 0;  // cudaDeviceProp::totalGlobalMem / 2^30
  int compute_major = 0;        // compute capability, e.g. 9.0 for Hopper
  int compute_minor = 0;
  std::string uuid;  // nvidia-smi form: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  int multiprocessor_count = 0;
};

// A library version as major.minor.patch (patch 0 where the library does not report one).
struct LibraryVersion {
  int major = 0;
  int minor = 0;
  int patch = 0;
};

// The backend found by QueryBackend(). Invariant: `devices` is empty iff `cpu_only_reason` is
// non-empty.
struct BackendInfo {
  std::vector<CudaDeviceInfo> devices;
  std::string cpu_only_reason;  // why there is no usable GPU (from cudaGetDeviceCount)
  // Versions. The driver version is {0,0,0} when no driver is installed; the runtime, cuBLAS
  // and NCCL versions are those of the libraries linked into this process, GPU or not.
  LibraryVersion cuda_driver;
  LibraryVersion cuda_runtime;
  LibraryVersion cublas;
  LibraryVersion nccl;

  bool has_gpu() const { return !devices.empty(); }
};

// Queries the CUDA runtime. Never fails for "no driver" or "no device" (those yield a CPU-only
// BackendInfo); returns INTERNAL/FAILED_PRECONDITION when a device that cudaGetDeviceCount reported
// cannot be queried, or when a library refuses to report its version.
absl::StatusOr<BackendInfo> QueryBackend();

// Formats `info` as the lines `--self-check` prints (each ending in '\n'):
//   backend: CUDA, 2 device(s)
//   device 0: NVIDIA H100 80GB HBM3, 79.19 GiB, compute capability 9.0, 132 SMs, GPU-....
//   CUDA driver 13.0, CUDA runtime 13.0, cuBLAS 13.0.2, NCCL 2.28.3
// or, without a GPU:
//   backend: CPU only (<reason>)
//   CUDA driver none, CUDA runtime 13.0, cuBLAS 13.0.2, NCCL 2.28.3
std::string FormatBackend(const BackendInfo& info);

}  // namespace switchyard::worker

#endif  // SWITCHYARD_WORKER_SELF_CHECK_H_
