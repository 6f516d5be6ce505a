// The absorbed attention's work on one tile of 64 keys, shared by the split-KV kernel over the cache's pages
// (attention_mqa_split.cu) and DSA's sparse kernel over gathered selected rows (attention_sparse.cu). A block of
// kThreads threads owns ROWS = 16·MT query rows (heads) with their [576]-lane Q rows in shared memory and the tile's
// K rows (whose first 512 lanes are V) beside them:
//   scores          each of the 4 warps computes 16 keys' scores for every row (mma.sync __nv_bfloat16, fp32 accumulators);
//                   the kernel masks them and writes them to sS in log2 units;
//   online_softmax  TPR threads per row: the running max and sum, P as hi = bf16(p) and lo = bf16(p − hi) in sP
//                   and sPlo (two parts keep ~16 bits of p: attention_mqa_split.cu says why), the row's rescale in
//                   sCorr;
//   accumulate_pv   each warp rescales its accumulators and adds P·V = hi·V + lo·V for its 128 of the 512 lanes.
#pragma once
#include <cmath>

#include "kernels/mma_util.cuh"

namespace mla::cuda::mqa_tile {

constexpr int kThreads = 128, kBc = 64;        // one tile = 64 keys
constexpr int kDT = 576, kVT = 512;            // padded row (L + R) and value width (L)
constexpr int kSQ = kDT + 8, kSS = kBc + 4, kSP = kBc + 8;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// The shared memory both kernels lay out first: sQ [ROWS][kSQ], sKV [2][kBc][kSQ], sS [ROWS][kSS], sP and sPlo
// [ROWS][kSP], sCorr, sL, sM [ROWS].
template <int ROWS>
constexpr size_t smem_bytes() {
  return (static_cast<size_t>(ROWS) * kSQ + 2ull * kBc * kSQ) * sizeof(__nv_bfloat16) + ROWS * kSS * sizeof(float) +
         2 * ROWS * kSP * sizeof(__nv_bfloat16) + 3 * ROWS * sizeof(float);
}

// sc[mt][n]: rows 16·mt + (g, g + 8), keys 16·warp + 8n + (2·t4, 2·t4 + 1) of the tile. k_addr: the lane's K row in
// the tile's buffer; q_addr: its Q row.
template <int MT>
__device__ __forceinline__ void scores(float (&sc)[MT][2][4], uint32_t k_addr, uint32_t q_addr) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < 2; ++n) sc[mt][n][0] = sc[mt][n][1] = sc[mt][n][2] = sc[mt][n][3] = 0.f;
#pragma unroll 4
  for (int kk = 0; kk < kDT / 16; ++kk) {
    uint32_t bb[4];
    mma::ldmatrix_x4(bb, k_addr + kk * 32);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      uint32_t qa[4];
      mma::ldmatrix_x4(qa, q_addr + (mt * 16 * kSQ + kk * 16) * 2);
      mma::mma_bf16(sc[mt][0], qa, bb[0], bb[1]);
      mma::mma_bf16(sc[mt][1], qa, bb[2], bb[3]);
    }
  }
}

// Thread (srow, spart) takes keys [spart·KPT, +KPT) of row srow of sS (log2 units, −inf for keys not attended).
template <int KPT, int TPR>
__device__ __forceinline__ void online_softmax(const float* sS, __nv_bfloat16* sP, __nv_bfloat16* sPlo, float* sCorr, int srow,
                                               int spart, float& m_run, float& l_run) {
  float x[KPT];
#pragma unroll
  for (int k = 0; k < KPT; k += 4) {
    const float4 v4 = *reinterpret_cast<const float4*>(sS + srow * kSS + spart * KPT + k);
    x[k] = v4.x;
    x[k + 1] = v4.y;
    x[k + 2] = v4.z;
    x[k + 3] = v4.w;
  }
  float mx = m_run;
#pragma unroll
  for (int k = 0; k < KPT; ++k) mx = fmaxf(mx, x[k]);
#pragma unroll
  for (int off = TPR / 2; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  const float base = mx == -INFINITY ? 0.f : mx;
  const float corr = mma::exp2_approx(m_run - base);
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < KPT; k += 2) {
    const float e0 = mma::exp2_approx(x[k] - base), e1 = mma::exp2_approx(x[k + 1] - base);
    sum += e0 + e1;
    const uint32_t hi = mma::pack_bf16(e0, e1);
    const float h0 = __uint_as_float(hi << 16), h1 = __uint_as_float(hi & 0xffff0000u);
    *reinterpret_cast<uint32_t*>(sP + srow * kSP + spart * KPT + k) = hi;
    *reinterpret_cast<uint32_t*>(sPlo + srow * kSP + spart * KPT + k) = mma::pack_bf16(e0 - h0, e1 - h1);
  }
#pragma unroll
  for (int off = TPR / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  l_run = l_run * corr + sum;
  m_run = mx;
  if (spart == 0) sCorr[srow] = corr;
}

// o[mt][v]: rows 16·mt + (g, g + 8), lanes 128·warp + 8v + (2·t4, 2·t4 + 1). p_addr, plo_addr: the lane's P rows;
// v_addr: its V row in the tile's buffer.
template <int MT>
__device__ __forceinline__ void accumulate_pv(float (&o)[MT][16][4], const float* sCorr, int g, uint32_t p_addr,
                                              uint32_t plo_addr, uint32_t v_addr) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const float c0 = sCorr[mt * 16 + g], c1 = sCorr[mt * 16 + g + 8];
#pragma unroll
    for (int v = 0; v < 16; ++v) {
      o[mt][v][0] *= c0;
      o[mt][v][1] *= c0;
      o[mt][v][2] *= c1;
      o[mt][v][3] *= c1;
    }
  }
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) {
    uint32_t pa[MT][4], pl[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      mma::ldmatrix_x4(pa[mt], p_addr + (mt * 16 * kSP + kk * 16) * 2);
      mma::ldmatrix_x4(pl[mt], plo_addr + (mt * 16 * kSP + kk * 16) * 2);
    }
#pragma unroll
    for (int vp = 0; vp < 8; ++vp) {
      uint32_t bb[4];
      mma::ldmatrix_x4_trans(bb, v_addr + (kk * 16 * kSQ + vp * 16) * 2);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma::mma_bf16(o[mt][2 * vp], pa[mt], bb[0], bb[1]);
        mma::mma_bf16(o[mt][2 * vp + 1], pa[mt], bb[2], bb[3]);
        mma::mma_bf16(o[mt][2 * vp], pl[mt], bb[0], bb[1]);
        mma::mma_bf16(o[mt][2 * vp + 1], pl[mt], bb[2], bb[3]);
      }
    }
  }
}

}  // namespace mla::cuda::mqa_tile
