// Writes rows [kv_c_norm | k_pe_rope] of the new tokens into the paged latent cache (pages of 64 rows, reached
// through the block table).
#pragma once
#include <cuda_runtime.h>

#include "kernels/device_tensor.cuh"

namespace mla::cuda {

// cache [blocks, 64, L+R]; slot_mapping int64 [T] = page·64 + slot; rows [T, L+R] receives the same rows
// (the kv_cache probe).
void launch_cache_write(bf16* cache, bf16* rows, const bf16* kv_c_norm, const bf16* k_pe_rope,
                        const int64_t* slot_mapping, int64_t T, int L, int R, cudaStream_t stream);

}  // namespace mla::cuda
