// RoPE, version 1: one thread per (token, row, lane pair). The angle and its cos/sin are computed in
// double: positions reach 1e5 and more, where an fp32 angle is already off by ~1e-2 rad.
#include "kernels/rope.cuh"

#include <algorithm>

namespace mla::cuda {

namespace {
__global__ void rope_kernel(const bf16* __restrict__ x, bf16* __restrict__ y, int64_t T, int64_t rows, int R,
                            const int* __restrict__ positions, const double* __restrict__ inv_freq, double cs_scale,
                            bool neox) {
  const int half = R / 2;
  const int64_t total = T * rows * half;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int p = static_cast<int>(i % half);
    const int64_t row = i / half;  // token · rows + r
    const int64_t t = row / rows;
    double s, c;
    sincos(static_cast<double>(positions[t]) * inv_freq[p], &s, &c);
    const float cf = static_cast<float>(c * cs_scale), sf = static_cast<float>(s * cs_scale);
    const int a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
    const float va = __bfloat162float(x[row * R + a]), vb = __bfloat162float(x[row * R + b]);
    // Explicit round-to-nearest products: no FMA contraction, the reference's exact float arithmetic.
    y[row * R + a] = __float2bfloat16_rn(__fsub_rn(__fmul_rn(va, cf), __fmul_rn(vb, sf)));
    y[row * R + b] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(va, sf), __fmul_rn(vb, cf)));
  }
}
}  // namespace

void launch_rope(const bf16* x, bf16* y, int64_t T, int64_t rows_per_token, int R, const int* positions,
                 const double* inv_freq, double cs_scale, bool neox, cudaStream_t stream) {
  const int64_t total = T * rows_per_token * (R / 2);
  if (total == 0) return;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 1 << 20);
  rope_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(x, y, T, rows_per_token, R, positions, inv_freq,
                                                                      cs_scale, neox);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
