// RoPE: one block per token; the token's R/2 angles and their cos/sin are computed once (in
// double: positions reach 1e5 and more, where an fp32 angle is already off by ~1e-2 rad) into shared memory
// and applied to all of its rows (every head shares them). Where the rope width allows, a thread rotates two lane
// pairs with 4- and 8-byte loads and stores instead of four 2-byte ones; the arithmetic and the bits are the same.
#include "kernels/rope.cuh"

#include <algorithm>
#include <cstdint>

namespace mla::cuda {

namespace {
// Explicit round-to-nearest products: no FMA contraction, the reference's exact float arithmetic.
__device__ __forceinline__ float rotate_a(float a, float b, float c, float s) {
  return __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
}
__device__ __forceinline__ float rotate_b(float a, float b, float c, float s) {
  return __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
}

// pairs2: half is even and x, y are 8-byte aligned (the two-pairs-a-thread loop's loads and stores).
__global__ void rope_kernel(const bf16* __restrict__ x, bf16* __restrict__ y, int64_t T, int rows, int R,
                            const int* __restrict__ positions, const double* __restrict__ inv_freq, double cs_scale,
                            bool neox, bool pairs2) {
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
    if (pairs2) {
      // Two lane pairs a thread, (p, p + 1) with p even: one 8-byte load and store (interleaved: lanes 2p..2p+3),
      // or two 4-byte ones (neox: lanes p, p + 1 and p + half, p + half + 1). The same products per pair.
      for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
        const int p = 2 * (i % (half / 2));
        const int64_t row = t * rows + i / (half / 2);
        const float c0 = cs[p], s0 = cs[half + p], c1 = cs[p + 1], s1 = cs[half + p + 1];
        float a0, b0, a1, b1;
        if (neox) {
          const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(x + row * R + p));
          const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(x + row * R + p + half));
          a0 = a.x, a1 = a.y, b0 = b.x, b1 = b.y;
        } else {
          const uint2 u = *reinterpret_cast<const uint2*>(x + row * R + 2 * p);
          const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
          const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
          a0 = lo.x, b0 = lo.y, a1 = hi.x, b1 = hi.y;
        }
        const __nv_bfloat162 ya = __floats2bfloat162_rn(rotate_a(a0, b0, c0, s0), rotate_a(a1, b1, c1, s1));
        const __nv_bfloat162 yb = __floats2bfloat162_rn(rotate_b(a0, b0, c0, s0), rotate_b(a1, b1, c1, s1));
        if (neox) {
          *reinterpret_cast<__nv_bfloat162*>(y + row * R + p) = ya;
          *reinterpret_cast<__nv_bfloat162*>(y + row * R + p + half) = yb;
        } else {
          uint2 u;
          *reinterpret_cast<__nv_bfloat162*>(&u.x) = __halves2bfloat162(ya.x, yb.x);
          *reinterpret_cast<__nv_bfloat162*>(&u.y) = __halves2bfloat162(ya.y, yb.y);
          *reinterpret_cast<uint2*>(y + row * R + 2 * p) = u;
        }
      }
      continue;
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int p = i % half;
      const int64_t row = t * rows + i / half;  // token · rows + r
      const float cf = cs[p], sf = cs[half + p];
      const int a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
      const float va = __bfloat162float(x[row * R + a]), vb = __bfloat162float(x[row * R + b]);
      y[row * R + a] = __float2bfloat16_rn(rotate_a(va, vb, cf, sf));
      y[row * R + b] = __float2bfloat16_rn(rotate_b(va, vb, cf, sf));
    }
  }
}
}  // namespace

void launch_rope(const bf16* x, bf16* y, int64_t T, int64_t rows_per_token, int R, const int* positions,
                 const double* inv_freq, double cs_scale, bool neox, cudaStream_t stream) {
  const int64_t total = T * rows_per_token * (R / 2);
  if (total == 0) return;
  const int per_token = static_cast<int>(rows_per_token * (R / 2));
  const bool pairs2 = (R / 2) % 2 == 0 && ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y)) & 7) == 0;
  const int threads = per_token >= 256 ? 256 : std::max(32, (per_token + 31) / 32 * 32);
  const int64_t blocks = std::min<int64_t>(T, 1 << 20);
  rope_kernel<<<static_cast<unsigned>(blocks), threads, R * sizeof(float), stream>>>(
      x, y, T, static_cast<int>(rows_per_token), R, positions, inv_freq, cs_scale, neox, pairs2);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
