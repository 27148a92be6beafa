#include "worker/self_check.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/runtime/cuda_status.h"

namespace switchyard::worker {
namespace {

// CUDA encodes versions as 1000 * major + 10 * minor (13000 -> 13.0).
LibraryVersion FromCudaVersion(int v) { return {v / 1000, (v % 1000) / 10, 0}; }

// NCCL >= 2.9 encodes 10000 * major + 100 * minor + patch (22803 -> 2.28.3); older releases
// used 1000 * major + 100 * minor + patch.
LibraryVersion FromNcclVersion(int v) {
  if (v >= 10000) return {v / 10000, (v % 10000) / 100, v % 100};
  return {v / 1000, (v % 1000) / 100, v % 100};
}

std::string FormatUuid(const cudaUUID_t& uuid) {
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    absl::StrAppendFormat(&out, "%02x", static_cast<unsigned char>(uuid.bytes[i]));
  }
  return out;
}

std::string FormatVersion(const LibraryVersion& v, bool with_patch) {
  if (with_patch) return absl::StrFormat("%d.%d.%d", v.major, v.minor, v.patch);
  return absl::StrFormat("%d.%d", v.major, v.minor);
}

absl::Status QueryDevice(int index, CudaDeviceInfo* out) {
  cudaDeviceProp prop;
  SY_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, index));
  out->index = index;
  out->name = prop.name;
  out->total_memory_gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
  out->compute_major = prop.major;
  out->compute_minor = prop.minor;
  out->uuid = FormatUuid(prop.uuid);
  out->multiprocessor_count = prop.multiProcessorCount;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BackendInfo> QueryBackend() {
  BackendInfo info;
  int count = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&count);
  if (count_err != cudaSuccess) {
    info.cpu_only_reason =
        absl::StrCat(cudaGetErrorName(count_err), ": ", cudaGetErrorString(count_err));
    cudaGetLastError();  // not sticky: clear it so that later runtime calls start clean
  } else if (count == 0) {
    info.cpu_only_reason = "cudaGetDeviceCount found 0 devices";
  } else {
    info.devices.resize(count);
    for (int i = 0; i < count; ++i) SY_RETURN_IF_ERROR(QueryDevice(i, &info.devices[i]));
  }

  // cudaDriverGetVersion reports 0 (and succeeds) when no driver is installed.
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) {
    driver = 0;
    cudaGetLastError();
  }
  info.cuda_driver = FromCudaVersion(driver);

  int runtime = 0;
  SY_CUDA_RETURN_IF_ERROR(cudaRuntimeGetVersion(&runtime));
  info.cuda_runtime = FromCudaVersion(runtime);

  SY_CUBLAS_RETURN_IF_ERROR(cublasGetProperty(MAJOR_VERSION, &info.cublas.major));
  SY_CUBLAS_RETURN_IF_ERROR(cublasGetProperty(MINOR_VERSION, &info.cublas.minor));
  SY_CUBLAS_RETURN_IF_ERROR(cublasGetProperty(PATCH_LEVEL, &info.cublas.patch));

  int nccl = 0;
  SY_NCCL_RETURN_IF_ERROR(ncclGetVersion(&nccl));
  info.nccl = FromNcclVersion(nccl);
  return info;
}

std::string FormatBackend(const BackendInfo& info) {
  std::string out;
  if (info.has_gpu()) {
    absl::StrAppend(&out, "backend: CUDA, ", info.devices.size(), " device(s)\n");
    for (const CudaDeviceInfo& d : info.devices) {
      absl::StrAppendFormat(&out, "device %d: %s, %.2f GiB, compute capability %d.%d, %d SMs, %s\n",
                            d.index, d.name, d.total_memory_gib, d.compute_major, d.compute_minor,
                            d.multiprocessor_count, d.uuid);
    }
  } else {
    absl::StrAppend(&out, "backend: CPU only (", info.cpu_only_reason, ")\n");
  }
  const bool has_driver = info.cuda_driver.major > 0;
  absl::StrAppend(
      &out, "CUDA driver ", has_driver ? FormatVersion(info.cuda_driver, false) : "none",
      ", CUDA runtime ", FormatVersion(info.cuda_runtime, false), ", cuBLAS ",
      FormatVersion(info.cublas, true), ", NCCL ", FormatVersion(info.nccl, true), "\n");
  return out;
}

}  // namespace switchyard::worker
