// RMSNorm, version 1: one block per row, fp32 sum of squares (block tree reduction), then
// y = (x · inv) · w rounded once to bf16 — the reference's order of operations.
#include "kernels/block_reduce.cuh"
#include "kernels/rms_norm.cuh"

namespace mla::cuda {

namespace {
__global__ void rms_norm_kernel(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ w,
                                bf16* __restrict__ y, int64_t C, float eps) {
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const bf16* in = x + t * ldx;
  float ss = 0.f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = __bfloat162float(in[c]);
    ss += v * v;
  }
  ss = block_sum(ss, red);
  // IEEE division and sqrt (no fast-math): the reference computes 1 / sqrt(ss / C + eps) in float.
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(C) + eps);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    y[t * C + c] = __float2bfloat16_rn(__bfloat162float(in[c]) * inv * __bfloat162float(w[c]));
}
}  // namespace

void launch_rms_norm(const bf16* x, int64_t ldx, const bf16* w, bf16* y, int64_t T, int64_t C, float eps,
                     cudaStream_t stream) {
  if (T == 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(T), 256, 0, stream>>>(x, ldx, w, y, C, eps);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
