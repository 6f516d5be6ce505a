// cuBLAS GEMMs (bf16 operands, CUBLAS_COMPUTE_32F, bf16 output rounded once) and the head-split copy.
// cuBLAS is column-major: a row-major [r, c] matrix with row stride ld is its column-major transpose
// [c, r] with leading dimension ld, so y = x·Wᵀ becomes yᵀ = W·xᵀ with W taken transposed.
#include "kernels/linear.cuh"

#include <algorithm>
#include <climits>
#include <string>

namespace mla::cuda {

namespace {
int as_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw EngineError(std::string("cuda gemm: ") + what + " = " + std::to_string(v) + " does not fit cuBLAS's int");
  return static_cast<int>(v);
}
}  // namespace

void gemm_xwt(cublasHandle_t h, const bf16* x, int64_t ldx, const bf16* w, bf16* y, int64_t ldy, int64_t T,
              int64_t K, int64_t O) {
  if (T == 0 || O == 0) return;
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, as_int(O, "O"), as_int(T, "T"), as_int(K, "K"), &alpha, w,
                            CUDA_R_16BF, as_int(K, "K"), x, CUDA_R_16BF, as_int(ldx, "ldx"), &beta, y, CUDA_R_16BF,
                            as_int(ldy, "ldy"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void gemm_batched(cublasHandle_t h, const bf16* a, int64_t lda, int64_t stride_a, const bf16* w, int64_t ldw,
                  int64_t stride_w, bool w_transposed, bf16* c, int64_t ldc, int64_t stride_c, int64_t T, int64_t k,
                  int64_t n, int64_t batch) {
  if (T == 0 || n == 0 || batch == 0) return;
  const float alpha = 1.0f, beta = 0.0f;
  // Cᵀ [n, T] = op(B)ᵀ [n, k] · Aᵀ [k, T]. B row-major [k, n] is column-major [n, k]: no transpose;
  // B row-major [n, k] (w_transposed) is column-major [k, n]: transpose.
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h, w_transposed ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, as_int(n, "n"), as_int(T, "T"), as_int(k, "k"), &alpha,
      w, CUDA_R_16BF, as_int(ldw, "ldw"), stride_w, a, CUDA_R_16BF, as_int(lda, "lda"), stride_a, &beta, c,
      CUDA_R_16BF, as_int(ldc, "ldc"), stride_c, as_int(batch, "batch"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void gemm_xwt_heads(cublasHandle_t h, const bf16* x, int64_t ldx, const bf16* w, int64_t T, int64_t K, int64_t Nl,
                    int64_t A, int64_t B, bf16* a, bf16* b) {
  // Head n of part a: a[:, n, :] [T, A] (row stride Nl·A) = x [T, K] · W_n[A, K]ᵀ, W_n = w + n·(A+B)·K; x is
  // shared by every head (stride 0).
  gemm_batched(h, x, ldx, 0, w, K, (A + B) * K, /*w_transposed=*/true, a, Nl * A, A, T, K, A, Nl);
  gemm_batched(h, x, ldx, 0, w + A * K, K, (A + B) * K, /*w_transposed=*/true, b, Nl * B, B, T, K, B, Nl);
}

namespace {
__global__ void split_last_kernel(const bf16* __restrict__ y, int64_t n_rows, int64_t A, int64_t B,
                                  bf16* __restrict__ a, bf16* __restrict__ b) {
  const int64_t W = A + B;
  const int64_t total = n_rows * W;  // n_rows = rows · groups
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / W, c = i % W;
    if (c < A) a[r * A + c] = y[i];
    else b[r * B + (c - A)] = y[i];
  }
}

// The same split in 16-byte chunks (A and B multiples of 8 elements, 16-byte aligned pointers): 32-bit index
// arithmetic once per 8 elements instead of a 64-bit division per element (~0.6 ms saved per DeepSeek-V3 layer
// at T = 4096).
__global__ void split_last_vec_kernel(const uint4* __restrict__ y, uint32_t n_chunks, uint32_t CA, uint32_t CB,
                                      uint4* __restrict__ a, uint4* __restrict__ b) {
  const uint32_t CW = CA + CB;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n_chunks; i += gridDim.x * blockDim.x) {
    const uint32_t r = i / CW, c = i - r * CW;
    const uint4 v = y[i];
    if (c < CA) a[static_cast<size_t>(r) * CA + c] = v;
    else b[static_cast<size_t>(r) * CB + (c - CA)] = v;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
}  // namespace

void launch_split_last(const bf16* y, int64_t rows, int64_t groups, int64_t A, int64_t B, bf16* a, bf16* b,
                       cudaStream_t stream) {
  const int64_t total = rows * groups * (A + B);
  if (total == 0) return;
  const int threads = 256;
  if (A % 8 == 0 && B % 8 == 0 && total / 8 < (int64_t{1} << 31) && aligned16(y) && aligned16(a) && aligned16(b)) {
    const int64_t chunks = total / 8;
    const int64_t blocks = std::min<int64_t>((chunks + threads - 1) / threads, 4096);
    split_last_vec_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        reinterpret_cast<const uint4*>(y), static_cast<uint32_t>(chunks), static_cast<uint32_t>(A / 8),
        static_cast<uint32_t>(B / 8), reinterpret_cast<uint4*>(a), reinterpret_cast<uint4*>(b));
    CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 65535 * 8);
  split_last_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(y, rows * groups, A, B, a, b);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
