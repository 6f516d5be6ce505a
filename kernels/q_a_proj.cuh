// q_a_proj: q_a = x·W_qaᵀ.
#pragma once
#include "kernels/linear.cuh"

namespace mla::cuda {

// x [T, H], W_qa [Lq, H] -> q_a [T, Lq].
void launch_q_a_proj(cublasHandle_t h, const bf16* x, const bf16* w_qa, bf16* q_a, int64_t T, int64_t H, int64_t Lq);

}  // namespace mla::cuda
