// o_proj: o_partial = attn_out.reshape(T, Nl·V)·W_o_localᵀ, row-parallel (a partial sum per rank).
#pragma once
#include "kernels/linear.cuh"

namespace mla::cuda {

// attn_out [T, Nl, V], W_o_local [H, Nl·V] -> o_partial [T, H]. reduce > 0 sums over the first `reduce` of the
// Nl·V columns only (o-proj-half-heads: a wrong K, docs/bugs.md).
void launch_o_proj(cublasHandle_t h, const bf16* attn_out, const bf16* w_o, bf16* o_partial, int64_t T, int64_t NlV,
                   int64_t H, int64_t reduce = 0);

}  // namespace mla::cuda
