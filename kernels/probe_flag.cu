// The probe capture's done flag: kernels/probe_flag.cuh.
#include "kernels/cuda_check.cuh"
#include "kernels/probe_flag.cuh"

namespace mla::cuda {

namespace {
__global__ void set_flag_kernel(volatile unsigned* flag, unsigned value) {
  __threadfence_system();
  *flag = value;
  __threadfence_system();
}
}  // namespace

StreamWriteValue32 find_stream_write_value32() {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return StreamWriteValue32{};
  }
  return reinterpret_cast<StreamWriteValue32>(p);
}

void launch_set_flag(unsigned* flag, unsigned value, StreamWriteValue32 write, cudaStream_t stream) {
  // A kernel needs a free block slot, which a GEMM filling every SM's registers gives up only between its CTAs;
  // the memory operation does not (and a device whose driver refuses it gets the kernel).
  if (write && write(stream, reinterpret_cast<unsigned long long>(flag), value, 0) == 0) return;
  set_flag_kernel<<<1, 1, 0, stream>>>(flag, value);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
