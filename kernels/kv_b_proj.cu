// kv_b_proj: the heads' k_nope and v parts each as one GEMM batched over the heads, written where they belong; or
// one GEMM into a [T, Nl·(P+V)] scratch, then the per-head split copy.
#include "kernels/kv_b_proj.cuh"

namespace mla::cuda {

void launch_kv_b_up(cublasHandle_t h, const bf16* kv_c_norm, int64_t ld_in, const bf16* w_kvb, bf16* kv, int64_t T,
                    int64_t L, int64_t Nl, int64_t P, int64_t V) {
  const int64_t O = Nl * (P + V);
  gemm_xwt(h, kv_c_norm, ld_in, w_kvb, kv, O, T, L, O);
}

void launch_kv_b_proj(cublasHandle_t h, cudaStream_t s, const bf16* kv_c_norm, const bf16* w_kvb, bf16* scratch,
                      bf16* k_nope, bf16* v, int64_t T, int64_t L, int64_t Nl, int64_t P, int64_t V,
                      bool split_copy, bool split_by_block) {
  if (!split_copy && !split_by_block) {
    gemm_xwt_heads(h, kv_c_norm, L, w_kvb, T, L, Nl, P, V, k_nope, v);
    return;
  }
  launch_kv_b_up(h, kv_c_norm, L, w_kvb, scratch, T, L, Nl, P, V);
  if (split_by_block) launch_split_last(scratch, T, 1, Nl * P, Nl * V, k_nope, v, s);
  else launch_split_last(scratch, T, Nl, P, V, k_nope, v, s);
}

}  // namespace mla::cuda
