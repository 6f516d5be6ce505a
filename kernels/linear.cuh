// The GEMMs every projection uses (cuBLAS, bf16 in/out, fp32 accumulation) and the head split that
// turns one projection's output into its per-head parts. Row-major throughout; strides in elements.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/device_tensor.cuh"

namespace mla::cuda {

// y [T, O] (row stride ldy) = x [T, K] (row stride ldx) · W[O, K]ᵀ.
void gemm_xwt(cublasHandle_t h, const bf16* x, int64_t ldx, const bf16* w, bf16* y, int64_t ldy, int64_t T,
              int64_t K, int64_t O);

// For each of `batch` problems b: C_b [T, n] = A_b [T, k] · op(B_b), with op(B_b) = B_b [k, n]
// (b_transposed false) or B_b [n, k]ᵀ (true). A_b = a + b·stride_a (row stride lda), B_b = w + b·stride_w
// (row stride ldw), C_b = c + b·stride_c (row stride ldc). Used per head: q_absorb, v_up.
void gemm_batched(cublasHandle_t h, const bf16* a, int64_t lda, int64_t stride_a, const bf16* w, int64_t ldw,
                  int64_t stride_w, bool w_transposed, bf16* c, int64_t ldc, int64_t stride_c, int64_t T, int64_t k,
                  int64_t n, int64_t batch);

// A projection whose weight rows are grouped per head, [Nl, A+B, K], written straight into its two per-head parts:
// a [T, Nl, A] = x·(W rows 0..A-1 of each head)ᵀ and b [T, Nl, B] = x·(rows A..A+B-1)ᵀ, x [T, K] (row stride ldx).
// Two strided-batched GEMMs over the heads, no scratch and no copy: the same products as gemm_xwt into [T, Nl·(A+B)]
// followed by launch_split_last, without the copy's read and write of the whole output.
void gemm_xwt_heads(cublasHandle_t h, const bf16* x, int64_t ldx, const bf16* w, int64_t T, int64_t K, int64_t Nl,
                    int64_t A, int64_t B, bf16* a, bf16* b);

// y [rows, G, A+B] -> a [rows, G, A], b [rows, G, B] (a plain strided copy; values unchanged).
void launch_split_last(const bf16* y, int64_t rows, int64_t groups, int64_t A, int64_t B, bf16* a, bf16* b,
                       cudaStream_t stream);

}  // namespace mla::cuda
