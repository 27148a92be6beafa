// QueryBackend() must agree with cudaGetDeviceCount: devices when it reports some, "CPU only"
// with the runtime's reason otherwise. Runs on any machine (no `gpu` tag).
#include "worker/self_check.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

namespace switchyard::worker {
namespace {

TEST(SelfCheckTest, AgreesWithCudaGetDeviceCount) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  cudaGetLastError();
  const int expected = err == cudaSuccess ? count : 0;

  absl::StatusOr<BackendInfo> info = QueryBackend();
  ASSERT_TRUE(info.ok()) << info.status();
  std::printf("%s", FormatBackend(*info).c_str());
  ASSERT_EQ(static_cast<int>(info->devices.size()), expected);
  EXPECT_EQ(info->has_gpu(), expected > 0);
  EXPECT_EQ(info->cpu_only_reason.empty(), expected > 0);
  if (err != cudaSuccess) {
    EXPECT_NE(info->cpu_only_reason.find(cudaGetErrorName(err)), std::string::npos)
        << info->cpu_only_reason;
  }
  for (int i = 0; i < expected; ++i) {
    const CudaDeviceInfo& d = info->devices[i];
    EXPECT_EQ(d.index, i);
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.total_memory_gib, 0.0);
    EXPECT_GE(d.compute_major, 1);
    EXPECT_GT(d.multiprocessor_count, 0);
    EXPECT_EQ(d.uuid.size(), 40u) << d.uuid;  // "GPU-" + 32 hex digits + 4 dashes
    EXPECT_EQ(d.uuid.rfind("GPU-", 0), 0u) << d.uuid;
  }
  // The linked libraries report their versions with or without a GPU.
  EXPECT_GE(info->cuda_runtime.major, 12);
  EXPECT_GE(info->cublas.major, 12);
  EXPECT_EQ(info->nccl.major, 2);
}

TEST(SelfCheckTest, FormatsCpuOnly) {
  BackendInfo info;
  info.cpu_only_reason = "cudaErrorNoDevice: no CUDA-capable device is detected";
  info.cuda_runtime = {13, 0, 0};
  info.cublas = {13, 0, 2};
  info.nccl = {2, 28, 3};
  EXPECT_EQ(FormatBackend(info),
            "backend: CPU only (cudaErrorNoDevice: no CUDA-capable device is detected)\n"
            "CUDA driver none, CUDA runtime 13.0, cuBLAS 13.0.2, NCCL 2.28.3\n");
}

TEST(SelfCheckTest, FormatsDevices) {
  BackendInfo info;
  CudaDeviceInfo d;
  d.index = 0;
  d.name = "NVIDIA H100 80GB HBM3";
  d.total_memory_gib = 79.1875;
  d.compute_major = 9;
  d.compute_minor = 0;
  d.uuid = "GPU-0123abcd-0000-1111-2222-333344445555";
  d.multiprocessor_count = 132;
  info.devices = {d};
  info.cuda_driver = {13, 0, 0};
  info.cuda_runtime = {13, 0, 0};
  info.cublas = {13, 0, 2};
  info.nccl = {2, 28, 3};
  EXPECT_EQ(FormatBackend(info),
            "backend: CUDA, 1 device(s)\n"
            "device 0: NVIDIA H100 80GB HBM3, 79.19 GiB, compute capability 9.0, 132 SMs, "
            "GPU-0123abcd-0000-1111-2222-333344445555\n"
            "CUDA driver 13.0, CUDA runtime 13.0, cuBLAS 13.0.2, NCCL 2.28.3\n");
}

}  // namespace
}  // namespace switchyard::worker
