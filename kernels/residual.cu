// residual, version 1: elementwise, grid-stride.
#include "kernels/residual.cuh"

#include <algorithm>

namespace mla::cuda {

namespace {
__global__ void residual_kernel(const bf16* __restrict__ h, const bf16* __restrict__ o, bf16* __restrict__ out,
                                int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(__bfloat162float(h[i]) + __bfloat162float(o[i]));
}
}  // namespace

void launch_residual(const bf16* h, const bf16* o, bf16* h_out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 1 << 20);
  residual_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(h, o, h_out, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
