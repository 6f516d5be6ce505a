// DSA's lightning indexer on the device (GLM-5, DeepSeek-V3.2; docs/mla.md, "Sparse attention"; the reference is
// reference/dsa_indexer.cpp): RoPE on the indexer head's leading lanes, the key path (LayerNorm, RoPE, the paged
// index cache), the head weights, the scores of every key a token sees, and the top-k keys of each token.
//
// Key numbering (scores, top-k, attention_sparse.cuh): the keys of a new token t of sequence b are s = 0 ..
// seq_total_len[b] − 1 in cache order (s < seq_ctx_len[b]: the cached context; s ≥ seq_ctx_len[b]: this step's new
// tokens), key s at cache row block_table[b, s/64]·64 + s%64. Token t, the i-th new token of its sequence, sees
// keys s ≤ seq_ctx_len[b] + i (causal, bottom-right), or all of its sequence's keys without the mask.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/rank_context.cuh"

namespace mla::cuda {

// RoPE in place on lanes [0, R) of every D-lane row of x [rows, D]; row r belongs to token r / rows_per_token.
// Interleaved pairs (2i, 2i+1) or neox pairs (i, i + R/2); angle = positions[token]·inv_freq[i] in double, cos/sin
// unscaled; the arithmetic of kernels/rope.cu. positions int32 [rows / rows_per_token], inv_freq double [R/2].
void launch_rope_leading(bf16* x, int64_t rows, int64_t rows_per_token, int D, int R, const int* positions,
                         const double* inv_freq, bool neox, cudaStream_t s);

// idx_q [T, Hi, D] = (q_c·wq_bᵀ) viewed per head, then RoPE on each head's first R lanes.
// q_c [T, Lq] (row stride ld_qc), wq_b [Hi·D, Lq]. The GEMM output is rounded to bf16 before the rotation; h runs
// on stream s.
void launch_indexer_q(cublasHandle_t h, cudaStream_t s, const bf16* q_c, int64_t ld_qc, const bf16* wq_b, bf16* idx_q,
                      int64_t T, int64_t Lq, int Hi, int D, int R, const int* positions, const double* inv_freq,
                      bool neox);

// The key path after its GEMM: idx_k = RoPE(LayerNorm(k_lin)) on lanes [0, R), written to idx_k [T, D] and to row
// slot_mapping[t] of index_cache [blocks, 64, D]. k_lin [T, D] = x·W_kᵀ (bf16). LayerNorm in fp32: mean, biased
// variance, (v − mean)·rsqrt(var + eps)·w + b; its result stays fp32 through the rotation and is rounded to bf16
// once. index_cache may be nullptr (idx_k only). norm = false plants index-k-norm-skip: the LayerNorm left out.
void launch_indexer_k_finish(const bf16* k_lin, const bf16* norm_w, const bf16* norm_b, float eps,
                             const int* positions, const double* inv_freq, int R, bool neox, int64_t T, int D,
                             bf16* idx_k, bf16* index_cache, const int64_t* slot_mapping, cudaStream_t s,
                             bool norm = true);

// topk_i[i] = (int) topk_f[i] for i < n: the selection as the sparse attention kernels read it, from the topk
// probe's floats (which an isolation run may have uploaded).
void launch_topk_indices(const float* topk_f, int* topk_i, int64_t n, cudaStream_t s);
// x[i] = v for i < n.
void launch_fill_f32(float* x, int64_t n, float v, cudaStream_t s);
void launch_fill_bf16(bf16* x, int64_t n, float v, cudaStream_t s);
// x[i] = bf16(x[i]·scale) for i < n.
void launch_scale_bf16(bf16* x, int64_t n, float scale, cudaStream_t s);

// idx_weights [T, Hi] = (x·W_wᵀ)·Hi^-1/2, the scale applied to the fp32 accumulator as the GEMM's alpha (one bf16
// rounding, not two). x [T, H] (row stride ldx), weights_proj [Hi, H]. Runs on h's stream.
void launch_indexer_weights(cublasHandle_t h, const bf16* x, int64_t ldx, const bf16* weights_proj, bf16* idx_w,
                            int64_t T, int64_t H, int Hi);

// scores [T, K] fp32: scores[t, s] = Σ_h w[t,h] · max(0, q[t,h]·key_s · D^-1/2) for every key s < K that t sees, and
// exactly 0 for every other column s < K. idx_q [T, Hi, D], idx_w [T, Hi], index_cache [blocks, 64, D] (this step's
// rows already written). K: at least the batch's max_total (keys at or past K are not scored). causal = false
// plants the mask left off: every key of the sequence is scored. Tensor cores (mma.sync bf16, fp32 accumulators);
// limits Hi ≤ 64, D ≤ 128 and a multiple of 8.
void launch_index_scores(const bf16* idx_q, const bf16* idx_w, const bf16* index_cache, const DeviceBatch& b, int T,
                         int Hi, int D, int K, float* scores, bool causal, cudaStream_t s);

// For each token t: among the keys it sees (the batch's visibility, as launch_index_scores; keys < K), the k of
// highest score, a tie going to the lower key index (reference topk_keys' rule), written in ascending key order
// to topk_i [T, k] (may be nullptr) and as exact floats to topk_f [T, k]; a token that sees n < k keys selects all
// of them and pads with −1. scores [T, K] fp32 (columns it does not see are not read). shift ≠ 0 plants an
// off-by-one in the indices: each selected key s is written as s + shift (the padding stays −1).
void launch_topk(const float* scores, const DeviceBatch& b, int T, int K, int k, bool causal, float* topk_f,
                 int* topk_i, int shift, cudaStream_t s);

}  // namespace mla::cuda
