// v_up, version 1: one strided-batched cuBLAS GEMM over heads, [T, L]·W_UV_hᵀ per head, W_UV_h read in place.
#include "kernels/v_up.cuh"

namespace mla::cuda {

void launch_v_up(cublasHandle_t h, const bf16* attn_latent, const bf16* w_kvb, bf16* attn_out, int64_t T, int64_t Nl,
                 int64_t P, int64_t V, int64_t L, bool last_head_from_previous) {
  if (last_head_from_previous && Nl >= 2) {
    const int64_t last = Nl - 1;
    gemm_batched(h, attn_latent, Nl * L, L, w_kvb + P * L, L, (P + V) * L, true, attn_out, Nl * V, V, T, L, V, last);
    gemm_batched(h, attn_latent + last * L, Nl * L, 0, w_kvb + ((last - 1) * (P + V) + P) * L, L, 0, true,
                 attn_out + last * V, Nl * V, 0, T, L, V, 1);
    return;
  }
  gemm_batched(h, attn_latent, Nl * L, L, w_kvb + P * L, L, (P + V) * L, /*w_transposed=*/true, attn_out, Nl * V, V, T,
               L, V, Nl);
}

}  // namespace mla::cuda
