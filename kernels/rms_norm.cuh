// RMSNorm of input_norm, q_a_norm and kv_a_norm: y = x / sqrt(mean(x²) + eps) · w, fp32 math.
#pragma once
#include <cuda_runtime.h>

#include "kernels/device_tensor.cuh"

namespace mla::cuda {

// x [T, C] (row stride ldx), w [C] -> y [T, C] (contiguous).
void launch_rms_norm(const bf16* x, int64_t ldx, const bf16* w, bf16* y, int64_t T, int64_t C, float eps,
                     cudaStream_t stream);

}  // namespace mla::cuda
