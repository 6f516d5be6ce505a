// Attention merge, version 1: one warp per (token, head) row.
#include "kernels/attention_merge.cuh"

#include <cmath>

namespace mla::cuda {

namespace {
__global__ void attention_merge_kernel(const float* __restrict__ o1, const float* __restrict__ lse1,
                                       const float* __restrict__ o2, const float* __restrict__ lse2,
                                       bf16* __restrict__ out, float* __restrict__ lse, int64_t rows, int Dv,
                                       bool base2) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const float l1 = lse1[r];
  float w1 = 1.f, l = l1;
  const float l2 = o2 ? lse2[r] : -INFINITY;
  const float m = fmaxf(l1, l2);
  if (o2) {
    if (m == -INFINITY) {
      w1 = 0.f;
      l = -INFINITY;
    } else {
      const float e1 = base2 ? exp2f(l1 - m) : expf(l1 - m), e2 = base2 ? exp2f(l2 - m) : expf(l2 - m);
      w1 = e1 / (e1 + e2);
      l = m + (base2 ? log2f(e1 + e2) : logf(e1 + e2));
    }
  }
  for (int d = lane; d < Dv; d += 32) {
    float v;
    if (!o2) v = o1[r * Dv + d];
    else if (m == -INFINITY) v = 0.f;
    else v = w1 * o1[r * Dv + d] + (1.0f - w1) * o2[r * Dv + d];
    out[r * Dv + d] = __float2bfloat16_rn(v);
  }
  if (lane == 0) lse[r] = l;
}
}  // namespace

void launch_attention_merge(const float* o1, const float* lse1, const float* o2, const float* lse2, bf16* out,
                            float* lse, int64_t rows, int Dv, cudaStream_t stream, bool base2) {
  if (rows == 0) return;
  const int warps = 8;
  attention_merge_kernel<<<static_cast<unsigned>((rows + warps - 1) / warps), warps * 32, 0, stream>>>(
      o1, lse1, o2, lse2, out, lse, rows, Dv, base2);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
