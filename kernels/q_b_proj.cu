// q_b_proj: the heads' q_nope and q_pe parts each as one GEMM batched over the heads, written where they belong; or
// one GEMM into a [T, Nl·(P+R)] scratch, then the per-head split copy.
#include "kernels/q_b_proj.cuh"

namespace mla::cuda {

void launch_q_b_proj(cublasHandle_t h, cudaStream_t s, const bf16* in, const bf16* w_qb, bf16* scratch, bf16* q_nope,
                     bf16* q_pe, int64_t T, int64_t K, int64_t Nl, int64_t P, int64_t R, bool split_copy) {
  if (!split_copy) {
    gemm_xwt_heads(h, in, K, w_qb, T, K, Nl, P, R, q_nope, q_pe);
    return;
  }
  const int64_t O = Nl * (P + R);
  gemm_xwt(h, in, K, w_qb, scratch, O, T, K, O);
  launch_split_last(scratch, T, Nl, P, R, q_nope, q_pe, s);
}

}  // namespace mla::cuda
