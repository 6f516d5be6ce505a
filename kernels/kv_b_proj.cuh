// kv_b_proj (MHA form): kv = kv_c_norm·W_kvbᵀ viewed [T, Nl, P+V], split into k_nope and v.
#pragma once
#include "kernels/linear.cuh"

namespace mla::cuda {

// kv_c_norm [T, L] (row stride ld_in), W_kvb_local [Nl·(P+V), L] -> kv [T, Nl·(P+V)] (no split: the
// context path of attention_mha reads k_nope and v from it with strides).
void launch_kv_b_up(cublasHandle_t h, const bf16* kv_c_norm, int64_t ld_in, const bf16* w_kvb, bf16* kv, int64_t T,
                    int64_t L, int64_t Nl, int64_t P, int64_t V);

// The stage -> k_nope [T, Nl, P], v [T, Nl, V]: a GEMM per part batched over the heads, each head's output
// written in place (gemm_xwt_heads), or with split_copy as above into `scratch`, then the per-head split copy.
// split_by_block = true plants kv-b-split (docs/bugs.md): each row split as [all heads' k_nope | all heads' v]
// (first Nl·P lanes, then Nl·V) instead of per head; it always takes the scratch and the copy.
void launch_kv_b_proj(cublasHandle_t h, cudaStream_t s, const bf16* kv_c_norm, const bf16* w_kvb, bf16* scratch,
                      bf16* k_nope, bf16* v, int64_t T, int64_t L, int64_t Nl, int64_t P, int64_t V,
                      bool split_copy, bool split_by_block = false);

}  // namespace mla::cuda
