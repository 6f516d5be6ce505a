// kv_a_proj (kv_a_proj_with_mqa): kv_a = x·W_kvaᵀ split into kv_c [T, L] and k_pe [T, R].
#pragma once
#include "kernels/linear.cuh"

namespace mla::cuda {

// x [T, H], W_kva [L+R, H], scratch [T, L+R] -> kv_c [T, L], k_pe [T, R].
void launch_kv_a_proj(cublasHandle_t h, cudaStream_t s, const bf16* x, const bf16* w_kva, bf16* scratch, bf16* kv_c,
                      bf16* k_pe, int64_t T, int64_t H, int64_t L, int64_t R);

}  // namespace mla::cuda
