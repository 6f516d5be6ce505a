// RoPE, version 2: one block per token; the token's R/2 angles and their cos/sin are computed once (in
// double: positions reach 1e5 and more, where an fp32 angle is already off by ~1e-2 rad) into shared memory
// and applied to all of its rows (every head shares them). Version 1 recomputed them per head with 64-bit
// index divisions per lane pair: ~0.25 ms of a DeepSeek-V3 layer at T = 4096. Same arithmetic, same bits.
#include "kernels/rope.cuh"

#include <algorithm>

namespace mla::cuda {

namespace {
__global__ void rope_kernel(const bf16* __restrict__ x, bf16* __restrict__ y, int64_t T, int rows, int R,
                            const int* __restrict__ positions, const double* __restrict__ inv_freq, double cs_scale,
                            bool neox) {
  extern __shared__ float cs[];  // [half] cos, then [half] sin, of this token
  const int half = R / 2, n = rows * half;
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    __syncthreads();  // the previous token's readers are done with cs
    for (int p = threadIdx.x; p < half; p += blockDim.x) {
      double s, c;
      sincos(static_cast<double>(positions[t]) * inv_freq[p], &s, &c);
      cs[p] = static_cast<float>(c * cs_scale);
      cs[half + p] = static_cast<float>(s * cs_scale);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int p = i % half;
      const int64_t row = t * rows + i / half;  // token · rows + r
      const float cf = cs[p], sf = cs[half + p];
      const int a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
      const float va = __bfloat162float(x[row * R + a]), vb = __bfloat162float(x[row * R + b]);
      // Explicit round-to-nearest products: no FMA contraction, the reference's exact float arithmetic.
      y[row * R + a] = __float2bfloat16_rn(__fsub_rn(__fmul_rn(va, cf), __fmul_rn(vb, sf)));
      y[row * R + b] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(va, sf), __fmul_rn(vb, cf)));
    }
  }
}
}  // namespace

void launch_rope(const bf16* x, bf16* y, int64_t T, int64_t rows_per_token, int R, const int* positions,
                 const double* inv_freq, double cs_scale, bool neox, cudaStream_t stream) {
  const int64_t total = T * rows_per_token * (R / 2);
  if (total == 0) return;
  const int per_token = static_cast<int>(rows_per_token * (R / 2));
  const int threads = per_token >= 256 ? 256 : std::max(32, (per_token + 31) / 32 * 32);
  const int64_t blocks = std::min<int64_t>(T, 1 << 20);
  rope_kernel<<<static_cast<unsigned>(blocks), threads, R * sizeof(float), stream>>>(
      x, y, T, static_cast<int>(rows_per_token), R, positions, inv_freq, cs_scale, neox);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
