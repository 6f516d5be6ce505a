// residual: h_out = h + o (fp32 add, one bf16 rounding).
#pragma once
#include <cuda_runtime.h>

#include "kernels/device_tensor.cuh"

namespace mla::cuda {

void launch_residual(const bf16* h, const bf16* o, bf16* h_out, int64_t n, cudaStream_t stream);

}  // namespace mla::cuda
