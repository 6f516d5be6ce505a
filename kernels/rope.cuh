// RoPE on q_pe [T, Nl, R] and k_pe [T, R]: interleaved pairs (2i, 2i+1) or neox (i, i+R/2),
// angle = position · inv_freq_i in double, cos/sin scaled by rope_mscale. Lane order kept in place.
#pragma once
#include <cuda_runtime.h>

#include "kernels/device_tensor.cuh"

namespace mla::cuda {

// x [T, rows_per_token, R] -> y (same shape). positions int32 [T]; inv_freq double [R/2] (device).
void launch_rope(const bf16* x, bf16* y, int64_t T, int64_t rows_per_token, int R, const int* positions,
                 const double* inv_freq, double cs_scale, bool neox, cudaStream_t stream);

}  // namespace mla::cuda
