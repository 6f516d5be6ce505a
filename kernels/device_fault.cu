// The injection fault-at's kernel: kernels/device_fault.cuh.
#include <cstdint>

#include "kernels/cuda_check.cuh"
#include "kernels/device_fault.cuh"

namespace mla::cuda {

namespace {
__global__ void device_fault_kernel(volatile int* nowhere) { *nowhere = 1; }
}  // namespace

void launch_device_fault(cudaStream_t stream) {
  // The first page of the address space is never mapped on the device.
  device_fault_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<volatile int*>(uintptr_t{64}));
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
