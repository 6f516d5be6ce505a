// Cache write, version 1: one block per new token, threads over the L+R lanes of its row.
#include "kernels/cache_write.cuh"

namespace mla::cuda {

namespace {
__global__ void cache_write_kernel(bf16* __restrict__ cache, bf16* __restrict__ rows,
                                   const bf16* __restrict__ kv_c_norm, const bf16* __restrict__ k_pe_rope,
                                   const int64_t* __restrict__ slot_mapping, int L, int R) {
  const int64_t t = blockIdx.x;
  const int W = L + R;
  bf16* dst = cache + slot_mapping[t] * W;
  for (int d = threadIdx.x; d < W; d += blockDim.x) {
    const bf16 v = d < L ? kv_c_norm[t * L + d] : k_pe_rope[t * R + (d - L)];
    dst[d] = v;
    rows[t * W + d] = v;
  }
}
}  // namespace

void launch_cache_write(bf16* cache, bf16* rows, const bf16* kv_c_norm, const bf16* k_pe_rope,
                        const int64_t* slot_mapping, int64_t T, int L, int R, cudaStream_t stream) {
  if (T == 0) return;
  cache_write_kernel<<<static_cast<unsigned>(T), 128, 0, stream>>>(cache, rows, kv_c_norm, k_pe_rope, slot_mapping,
                                                                   L, R);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
