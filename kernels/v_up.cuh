// v_up (absorbed form): attn_out_h = W_UV_h·attn_latent_h for every head.
#pragma once
#include "kernels/linear.cuh"

namespace mla::cuda {

// attn_latent [T, Nl, L], W_kvb_local [Nl·(P+V), L] (W_UV_h = the V rows after W_UK_h) -> attn_out [T, Nl, V].
// last_head_from_previous: head Nl-1 reads head Nl-2's W_UV (v-up-head, an off-by-one head index; docs/bugs.md).
void launch_v_up(cublasHandle_t h, const bf16* attn_latent, const bf16* w_kvb, bf16* attn_out, int64_t T, int64_t Nl,
                 int64_t P, int64_t V, int64_t L, bool last_head_from_previous = false);

}  // namespace mla::cuda
