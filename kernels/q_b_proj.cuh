// q_b_proj (and q_proj without q LoRA): q = in·W_qbᵀ viewed [T, Nl, P+R], split per head.
#pragma once
#include "kernels/linear.cuh"

namespace mla::cuda {

// in [T, K] (q_c, K = Lq; or x, K = H), W_qb_local [Nl·(P+R), K] -> q_nope [T, Nl, P], q_pe [T, Nl, R]: a GEMM per
// part batched over the heads, each head's output written in place (gemm_xwt_heads); with split_copy one GEMM into
// scratch [T, Nl·(P+R)], then the per-head split copy.
void launch_q_b_proj(cublasHandle_t h, cudaStream_t s, const bf16* in, const bf16* w_qb, bf16* scratch, bf16* q_nope,
                     bf16* q_pe, int64_t T, int64_t K, int64_t Nl, int64_t P, int64_t R, bool split_copy);

}  // namespace mla::cuda
