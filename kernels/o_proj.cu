// o_proj: one cuBLAS GEMM ([T, Nl, V] is already [T, Nl·V] in memory).
#include "kernels/o_proj.cuh"

namespace mla::cuda {

void launch_o_proj(cublasHandle_t h, const bf16* attn_out, const bf16* w_o, bf16* o_partial, int64_t T, int64_t NlV,
                   int64_t H, int64_t reduce) {
  if (reduce > 0 && reduce < NlV) {  // K = reduce with both operands' rows still Nl·V apart
    gemm_batched(h, attn_out, NlV, 0, w_o, NlV, 0, /*w_transposed=*/true, o_partial, H, 0, T, reduce, H, 1);
    return;
  }
  gemm_xwt(h, attn_out, NlV, w_o, o_partial, H, T, NlV, H);
}

}  // namespace mla::cuda
