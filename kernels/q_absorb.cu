// q_absorb, version 1: one strided-batched cuBLAS GEMM over heads, [T, P]·[P, L] per head, reading
// W_UK_h in place inside W_kvb (batch stride (P+V)·L).
#include "kernels/q_absorb.cuh"

namespace mla::cuda {

void launch_q_absorb(cublasHandle_t h, const bf16* q_nope, const bf16* w_kvb, bf16* q_latent, int64_t T, int64_t Nl,
                     int64_t P, int64_t V, int64_t L, bool wuk_transposed) {
  if (wuk_transposed)  // the bug: the same P·L elements read as a row-major [L, P] matrix (row stride P)
    gemm_batched(h, q_nope, Nl * P, P, w_kvb, P, (P + V) * L, /*w_transposed=*/true, q_latent, Nl * L, L, T, P, L, Nl);
  else
    gemm_batched(h, q_nope, Nl * P, P, w_kvb, L, (P + V) * L, /*w_transposed=*/false, q_latent, Nl * L, L, T, P, L, Nl);
}

}  // namespace mla::cuda
