// RMSNorm, version 1: one block per row, fp32 sum of squares (block tree reduction), then
// y = (x · inv) · w rounded once to bf16 — the reference's order of operations.
#include "kernels/block_reduce.cuh"
#include "kernels/rms_norm.cuh"

namespace mla::cuda {

namespace {
// width (channels in the mean square) and wrap (weight index period) are C in the right norm; w null: no weight.
__global__ void rms_norm_kernel(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ w,
                                bf16* __restrict__ y, int64_t C, float eps, int64_t width, int64_t wrap) {
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const bf16* in = x + t * ldx;
  float ss = 0.f;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
    const float v = __bfloat162float(in[c]);
    ss += v * v;
  }
  ss = block_sum(ss, red);
  // IEEE division and sqrt (no fast-math): the reference computes 1 / sqrt(ss / C + eps) in float.
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(width) + eps);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = __bfloat162float(in[c]) * inv;
    y[t * C + c] = __float2bfloat16_rn(w ? v * __bfloat162float(w[c < wrap ? c : c % wrap]) : v);
  }
}
}  // namespace

void launch_rms_norm(const bf16* x, int64_t ldx, const bf16* w, bf16* y, int64_t T, int64_t C, float eps,
                     cudaStream_t stream, const NormBugs& bugs) {
  if (T == 0) return;
  const int64_t width = bugs.width > 0 && bugs.width < C ? bugs.width : C;
  const int64_t wrap = bugs.weight_wrap > 0 ? bugs.weight_wrap : C;
  rms_norm_kernel<<<static_cast<unsigned>(T), 256, 0, stream>>>(x, ldx, bugs.no_weight ? nullptr : w, y, C, eps,
                                                                width, wrap);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
