// kv_a_proj, version 1: one GEMM into a [T, L+R] scratch, then the split copy.
#include "kernels/kv_a_proj.cuh"

namespace mla::cuda {

void launch_kv_a_proj(cublasHandle_t h, cudaStream_t s, const bf16* x, const bf16* w_kva, bf16* scratch, bf16* kv_c,
                      bf16* k_pe, int64_t T, int64_t H, int64_t L, int64_t R) {
  gemm_xwt(h, x, H, w_kva, scratch, L + R, T, H, L + R);
  launch_split_last(scratch, T, 1, L, R, kv_c, k_pe, s);
}

}  // namespace mla::cuda
