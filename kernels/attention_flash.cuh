// The flash kernels of attention_mha (attention_flash.cu): FlashAttention-2-style tiled kernels on the tensor cores
// (mma.sync m16n8k16 bf16, fp32 accumulators, online softmax in fp32, natural-log lse); no Tq×Tk matrix is ever
// stored. Used by attention_mha for the new tokens (causal) and for the cached context (not causal), and by DSA's
// sparse attention with the selection as the mask of both.
// FlashParams::version 3 (the engine's default, mha_kernel=3) picks the 256-row, 32-rows-per-warp kernel where it
// covers the dims; version 2 the 128-row, 16-rows-per-warp kernel; version 4 the Hopper kernel on wgmma and TMA
// (attention_flash_wgmma.cu) where flash_wgmma_supports() says so, else version 3.
#pragma once
#include "kernels/attention_core.cuh"  // AttnOperand

namespace mla::cuda {

// Queries: rows = new tokens [T]; Q row of head h = [q_nope (P) | q_pe (R)]. Keys: rows contiguous per
// sequence (row = seq_k_start[b] + s); K row = [k_nope (P) | k_pe (R)], V row = v (V). Shapes as in
// MhaArgs; k_pe has head_stride 0 (one vector per token shared by all heads).
struct FlashParams {
  AttnOperand q_nope, q_pe;     // [T, heads, P], [T, heads, R]
  AttnOperand k_nope, k_pe, v;  // [keys, heads, P], [keys, R] (shared), [keys, heads, V]
  int P = 0, R = 0, V = 0;
  int heads = 0, seqs = 0;
  int max_q_len = 0;  // longest s_q of the batch (sizes the grid)
  int64_t q_rows = 0, k_rows = 0;  // rows of the query and key tensors (version 4's TMA maps end there)
  float scale = 0.f;  // softmax scale (natural units; the kernel works in log2 units)
  const int* seq_q_start = nullptr;  // [B] first query token of each sequence
  const int* seq_q_len = nullptr;    // [B]
  const int* seq_k_start = nullptr;  // [B] first key row
  const int* seq_k_len = nullptr;    // [B]
  bool causal = false;               // query i of s_q sees keys s < i + 1 + k_len − s_q (bottom-right)
  int window = 0;                    // > 0: and only the last `window` of those (sliding-window, docs/bugs.md)
  // A selection (DSA's top-k as a mask; with causal false): query token t (its row in the query tensors) sees key s
  // of its sequence only where bit s % 32 of keep[t·keep_words + s / 32] is set. keep_reach[t]: its last selected
  // key + 1 (0: none); version 4 skips the key tiles past a block's last. keep_words: a multiple of 4.
  const uint32_t* keep = nullptr;
  const int* keep_reach = nullptr;
  int keep_words = 0;
  bf16* out_bf16 = nullptr;          // [T, heads, V] when set; else
  float* out_f32 = nullptr;          // [T, heads, V] (the chunked path merges two of these by lse)
  float* lse = nullptr;              // [T, heads] natural log; −inf for an empty key set (out 0)
  int version = 2;  // 2: 128-row blocks, 16 rows per warp; 3: 256-row blocks, 32 rows per warp (D ≤ 192, V ≤ 128;
                    // wider dims run version 2); 4: wgmma (else 3)
};

// Whether an instantiated kernel covers these head dims (P + R ≤ 256, V ≤ 256).
bool flash_supports(int P, int R, int V);
// Whether version 4 runs these params on `device`: an sm_90a build on an sm_90 GPU, P and R multiples of 64 with
// (P + R, V) = (192, 128) or (256, 256), every operand 16-byte aligned with strides a multiple of 8 elements.
bool flash_wgmma_supports(const FlashParams& p, int device);
void launch_attention_flash(const FlashParams& p, cudaStream_t stream);
// Version 4 itself (launch_attention_flash dispatches to it).
void launch_attention_flash_wgmma(const FlashParams& p, cudaStream_t stream);

}  // namespace mla::cuda
