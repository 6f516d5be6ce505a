// RMSNorm of input_norm, q_a_norm and kv_a_norm: y = x / sqrt(mean(x²) + eps) · w, fp32 math.
#pragma once
#include <cuda_runtime.h>

#include "kernels/device_tensor.cuh"

namespace mla::cuda {

// Planted norm bugs of the zoo (docs/bugs.md); the defaults are the right norm.
struct NormBugs {
  bool no_weight = false;   // normalized but never multiplied by w (kv-norm-no-weight)
  int64_t width = 0;        // > 0: the mean square over the first `width` channels only (q-norm-width)
  int64_t weight_wrap = 0;  // > 0: channel c multiplied by w[c % weight_wrap] (kv-norm-weight-wrap)
};

// x [T, C] (row stride ldx), w [C] -> y [T, C] (contiguous).
void launch_rms_norm(const bf16* x, int64_t ldx, const bf16* w, bf16* y, int64_t T, int64_t C, float eps,
                     cudaStream_t stream, const NormBugs& bugs = {});

}  // namespace mla::cuda
