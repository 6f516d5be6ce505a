// q_a_proj: one cuBLAS GEMM.
#include "kernels/q_a_proj.cuh"

namespace mla::cuda {

void launch_q_a_proj(cublasHandle_t h, const bf16* x, const bf16* w_qa, bf16* q_a, int64_t T, int64_t H, int64_t Lq) {
  gemm_xwt(h, x, H, w_qa, q_a, Lq, T, H, Lq);
}

}  // namespace mla::cuda
