// The softmax-attention core shared by attention_mha and attention_mqa (included by their .cu files only).
//
// Version 1 (this file; mha_kernel=1, mqa_kernel=1): one warp per (query token, head), four heads of one token per
// block (they read the same keys in the MQA form). The query row lives in registers, lanes own dims lane, lane+32,
// ...; keys are visited one at a time: a warp-reduced dot product, an online-softmax update in fp32, and the
// value row accumulated into per-lane registers. Nothing of size Tq×Tk is ever stored. Simple and exact
// enough to be the fallback; the tiled tensor-core kernels (attention_flash.cu, attention_mqa_split.cu) are
// tested against it.
//
// Keys of a query token t in sequence b: rows 0 .. key_len[b]-1 of that sequence, either contiguous
// (row = key_start[b] + s) or paged through the block table (row = block_table[b, s/64]·64 + s%64).
// Causal: query i of s_q new tokens sees min(key_len, i + 1 + key_len − s_q) keys (bottom-right).
// An empty key set gives out 0 and lse −inf. lse is the natural log of Σ exp(score).
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "kernels/rank_context.cuh"

namespace mla::cuda {

struct AttnOperand {
  const bf16* ptr = nullptr;  // element (row, head, 0) at ptr + row·row_stride + head·head_stride
  int64_t row_stride = 0;
  int64_t head_stride = 0;  // 0: shared by all heads (k_pe, the latent cache)
};

struct AttnCoreParams {
  AttnOperand q_nope, q_pe;     // rows = query tokens [T]
  AttnOperand k_nope, k_pe, v;  // rows = key rows (contiguous or paged)
  int nope_dim = 0, pe_dim = 0, v_dim = 0;
  int tokens = 0, heads = 0;
  float scale = 0.f;
  const int* token_seq = nullptr;  // [T]
  const int* token_idx = nullptr;  // [T] index among the sequence's new tokens
  const int* seq_new_len = nullptr;    // [B] s_q
  const int* seq_key_len = nullptr;    // [B]
  const int* seq_key_start = nullptr;  // [B] contiguous keys (nullptr when paged)
  const int* block_table = nullptr;    // [B, max_blocks] paged keys (nullptr when contiguous)
  int max_blocks = 0;
  bool causal = false;
  int window = 0;        // > 0: each query sees only the last `window` of its visible keys (sliding-window)
  float* out = nullptr;  // [T, heads, v_dim] fp32
  float* lse = nullptr;  // [T, heads] fp32
};

constexpr int kAttnWarps = 4;

template <int NOPE_PL, int PE_PL, int V_PL>
__global__ void __launch_bounds__(kAttnWarps * 32) attention_core_kernel(const AttnCoreParams p) {
  const int lane = threadIdx.x & 31;
  const int h = blockIdx.y * kAttnWarps + (threadIdx.x >> 5);
  const int t = blockIdx.x;
  if (h >= p.heads) return;
  const int b = p.token_seq[t], i = p.token_idx[t];
  const int key_len = p.seq_key_len[b];
  const int visible = p.causal ? min(key_len, i + 1 + key_len - p.seq_new_len[b]) : key_len;
  const int first = p.window > 0 ? max(0, visible - p.window) : 0;

  float qn[NOPE_PL], qp[PE_PL], acc[V_PL];
  const bf16* qn_row = p.q_nope.ptr + t * p.q_nope.row_stride + h * p.q_nope.head_stride;
  const bf16* qp_row = p.q_pe.ptr + t * p.q_pe.row_stride + h * p.q_pe.head_stride;
#pragma unroll
  for (int j = 0; j < NOPE_PL; ++j) {
    const int d = lane + 32 * j;
    qn[j] = d < p.nope_dim ? __bfloat162float(qn_row[d]) : 0.f;
  }
#pragma unroll
  for (int j = 0; j < PE_PL; ++j) {
    const int d = lane + 32 * j;
    qp[j] = d < p.pe_dim ? __bfloat162float(qp_row[d]) : 0.f;
  }
#pragma unroll
  for (int j = 0; j < V_PL; ++j) acc[j] = 0.f;

  float m = -INFINITY, l = 0.f;
  for (int s = first; s < visible; ++s) {
    const int64_t row = p.block_table
                            ? static_cast<int64_t>(p.block_table[b * p.max_blocks + s / kCachePage]) * kCachePage +
                                  s % kCachePage
                            : static_cast<int64_t>(p.seq_key_start[b]) + s;
    const bf16* kn = p.k_nope.ptr + row * p.k_nope.row_stride + h * p.k_nope.head_stride;
    const bf16* kp = p.k_pe.ptr + row * p.k_pe.row_stride + h * p.k_pe.head_stride;
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < NOPE_PL; ++j) {
      const int d = lane + 32 * j;
      if (d < p.nope_dim) dot += qn[j] * __bfloat162float(kn[d]);
    }
#pragma unroll
    for (int j = 0; j < PE_PL; ++j) {
      const int d = lane + 32 * j;
      if (d < p.pe_dim) dot += qp[j] * __bfloat162float(kp[d]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float score = dot * p.scale;
    const float m_new = fmaxf(m, score);
    const float corr = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float w = expf(score - m_new);
    l = l * corr + w;
    const bf16* vr = p.v.ptr + row * p.v.row_stride + h * p.v.head_stride;
#pragma unroll
    for (int j = 0; j < V_PL; ++j) {
      const int d = lane + 32 * j;
      const float vv = d < p.v_dim ? __bfloat162float(vr[d]) : 0.f;
      acc[j] = acc[j] * corr + w * vv;
    }
    m = m_new;
  }

  float* o = p.out + (static_cast<int64_t>(t) * p.heads + h) * p.v_dim;
  const float inv = l > 0.f ? 1.0f / l : 0.f;
#pragma unroll
  for (int j = 0; j < V_PL; ++j) {
    const int d = lane + 32 * j;
    if (d < p.v_dim) o[d] = acc[j] * inv;
  }
  if (lane == 0) p.lse[static_cast<int64_t>(t) * p.heads + h] = l > 0.f ? m + logf(l) : -INFINITY;
}

template <int NOPE_PL, int PE_PL, int V_PL>
void launch_attention_core(const AttnCoreParams& p, cudaStream_t stream, const char* who) {
  if (p.nope_dim > NOPE_PL * 32 || p.pe_dim > PE_PL * 32 || p.v_dim > V_PL * 32)
    throw EngineError(std::string(who) + ": head dims (" + std::to_string(p.nope_dim) + " + " +
                      std::to_string(p.pe_dim) + ", v " + std::to_string(p.v_dim) + ") exceed this kernel's limits (" +
                      std::to_string(NOPE_PL * 32) + " + " + std::to_string(PE_PL * 32) + ", v " +
                      std::to_string(V_PL * 32) + ")");
  if (p.tokens == 0 || p.heads == 0) return;
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>((p.heads + kAttnWarps - 1) / kAttnWarps));
  attention_core_kernel<NOPE_PL, PE_PL, V_PL><<<grid, kAttnWarps * 32, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
