// all_reduce's local sum, version 1: elementwise over the partials, fp32 accumulation, one rounding.
#include "kernels/all_reduce.cuh"

#include <algorithm>

namespace mla::cuda {

namespace {
__global__ void sum_partials_kernel(PartialList parts, bf16* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = __bfloat162float(parts.p[0][i]);
    for (int r = 1; r < parts.count; ++r) s += __bfloat162float(parts.p[r][i]);
    out[i] = __float2bfloat16_rn(s);
  }
}
}  // namespace

void launch_sum_partials(const PartialList& parts, bf16* out, int64_t n, cudaStream_t stream) {
  if (n == 0 || parts.count == 0) return;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 1 << 20);
  sum_partials_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(parts, out, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
