// q_absorb (absorbed form): q_latent_h = W_UK_hᵀ·q_nope_h for every head.
#pragma once
#include "kernels/linear.cuh"

namespace mla::cuda {

// q_nope [T, Nl, P], W_kvb_local [Nl·(P+V), L] (W_UK_h = rows h(P+V) .. h(P+V)+P-1) -> q_latent [T, Nl, L].
// wuk_transposed = true plants wuk-transpose (docs/bugs.md): W_UK_h's [P, L] memory viewed as [L, P].
void launch_q_absorb(cublasHandle_t h, const bf16* q_nope, const bf16* w_kvb, bf16* q_latent, int64_t T, int64_t Nl,
                     int64_t P, int64_t V, int64_t L, bool wuk_transposed = false);

}  // namespace mla::cuda
