// DSA's lightning indexer (kernels/dsa_indexer.cuh).
//   RoPE on the leading lanes: one block per token, its R/2 angles (double) and their cos/sin once in shared memory,
//     applied to each of its rows; kernels/rope.cu's arithmetic.
//   Key path: one block per token, LayerNorm with fp32 block sums, then RoPE on the fp32 result, one bf16 rounding,
//     written to idx_k and to the token's index cache row.
//   Scores: a block holds 1, 2, 4 or 8 new tokens of one sequence (their Hi heads each, zero-padded to 16-row mma tiles)
//     and a split of the key tiles (one 64-row page of the index cache per tile, double-buffered with cp.async).
//     Each warp computes q·k on the tensor cores (mma.sync m16n8k16 bf16, fp32 accumulators) for one token and 16,
//     32 or 64 keys of the tile, then Σ_h w·ReLU(·D^-1/2) in registers: its own rows, then a butterfly over the
//     lanes holding the other heads. Tiles past the last key a block's tokens see are written as zeros, uncomputed.
//     A sequence's token groups are issued last first (causal: the heaviest first).
//   Top-k: one block per token; a radix select (4 passes of 8 bits, MSB first, over an order-preserving uint32 of
//     each score, shared histograms) finds the k-th highest value; one more pass emits the keys above it and the
//     lowest-index keys equal to it, in ascending key order, by a block prefix scan. The row's keys are kept in
//     shared memory after the first pass (up to kTopkCacheKeys; longer rows are re-read from global memory).
#include "kernels/dsa_indexer.cuh"

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

#include "kernels/block_reduce.cuh"
#include "kernels/linear.cuh"
#include "kernels/mma_util.cuh"

namespace mla::cuda {

namespace {
using namespace mma;

// --- RoPE on the leading lanes and the key path -------------------------------------------------------------

// cs[i] = cos, cs[half + i] = sin of position·inv_freq[i] (double angle, fp32 results), i < half.
__device__ void token_cos_sin(int position, const double* __restrict__ inv_freq, int half, float* cs) {
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    double s, c;
    sincos(static_cast<double>(position) * inv_freq[i], &s, &c);
    cs[i] = static_cast<float>(c);
    cs[half + i] = static_cast<float>(s);
  }
}

// Lane pair p of the rope lanes: (2p, 2p+1) interleaved, (p, p + half) neox.
__device__ __forceinline__ int pair_a(int p, bool neox) { return neox ? p : 2 * p; }
__device__ __forceinline__ int pair_b(int p, int half, bool neox) { return neox ? p + half : 2 * p + 1; }

// x[row, a] = xa·c − xb·s, x[row, b] = xa·s + xb·c on lanes [0, R) of every row of token t.
__global__ void rope_leading_kernel(bf16* __restrict__ x, int64_t T, int rows, int D, int R,
                                    const int* __restrict__ positions, const double* __restrict__ inv_freq,
                                    bool neox) {
  extern __shared__ float cs[];  // [half] cos, then [half] sin, of this token
  const int half = R / 2, n = rows * half;
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    __syncthreads();  // the previous token's readers are done with cs
    token_cos_sin(positions[t], inv_freq, half, cs);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int p = i % half;
      bf16* row = x + (t * rows + i / half) * D;
      const int a = pair_a(p, neox), b = pair_b(p, half, neox);
      const float cf = cs[p], sf = cs[half + p];
      const float va = __bfloat162float(row[a]), vb = __bfloat162float(row[b]);
      // Explicit round-to-nearest products: no FMA contraction, the reference's exact float arithmetic.
      row[a] = __float2bfloat16_rn(__fsub_rn(__fmul_rn(va, cf), __fmul_rn(vb, sf)));
      row[b] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(va, sf), __fmul_rn(vb, cf)));
    }
  }
}

// y = RoPE_[0,R)((k − mean)·rsqrt(var + eps)·w + b) per row t of k [T, D]; y -> idx_k[t] and cache[slot[t]].
__global__ void indexer_k_finish_kernel(const bf16* __restrict__ k_lin, const bf16* __restrict__ norm_w,
                                        const bf16* __restrict__ norm_b, float eps,
                                        const int* __restrict__ positions, const double* __restrict__ inv_freq,
                                        int R, bool neox, int D, bf16* __restrict__ idx_k, bf16* __restrict__ cache,
                                        const int64_t* __restrict__ slot_mapping, bool norm) {
  extern __shared__ float sm[];  // [D] the normalized row, then [R] cos/sin
  __shared__ float red[32];
  float* y = sm;
  float* cs = sm + D;
  const int64_t t = blockIdx.x;
  const bf16* in = k_lin + t * D;
  float sum = 0.f;
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    y[c] = __bfloat162float(in[c]);
    sum += y[c];
  }
  if (norm) {  // norm = false plants index-k-norm-skip: the rows rotated as they are
    const float mean = __fdiv_rn(block_sum(sum, red), static_cast<float>(D));
    float sq = 0.f;
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
      const float d = __fsub_rn(y[c], mean);
      sq = __fadd_rn(sq, __fmul_rn(d, d));
    }
    const float var = __fdiv_rn(block_sum(sq, red), static_cast<float>(D));
    // IEEE division and sqrt (no fast-math): the reference computes 1 / sqrt(var + eps) in float.
    const float inv = 1.0f / sqrtf(var + eps);
    for (int c = threadIdx.x; c < D; c += blockDim.x)
      y[c] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(y[c], mean), inv), __bfloat162float(norm_w[c])),
                       __bfloat162float(norm_b[c]));
  }
  const int half = R / 2;
  token_cos_sin(positions[t], inv_freq, half, cs);
  __syncthreads();  // every lane of y normalized, cos/sin ready
  bf16* row_cache = cache ? cache + slot_mapping[t] * D : nullptr;
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    float v = y[c];
    if (c < R) {
      const int p = neox ? (c < half ? c : c - half) : c / 2;
      const bool first = neox ? c < half : c % 2 == 0;
      const float va = y[pair_a(p, neox)], vb = y[pair_b(p, half, neox)], cf = cs[p], sf = cs[half + p];
      v = first ? __fsub_rn(__fmul_rn(va, cf), __fmul_rn(vb, sf)) : __fadd_rn(__fmul_rn(va, sf), __fmul_rn(vb, cf));
    }
    const bf16 o = __float2bfloat16_rn(v);
    idx_k[t * D + c] = o;
    if (row_cache) row_cache[c] = o;
  }
}

// x[i] = bf16(x[i]·scale).
__global__ void scale_bf16_kernel(bf16* __restrict__ x, int64_t n, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) * scale);
}

// --- Scores -------------------------------------------------------------------------------------------------

// Warps of a block of TOK tokens: 4, or one per token for 8.
template <int TOK>
constexpr int kScoreThreadsOf = 32 * (TOK > 4 ? TOK : 4);
constexpr int kKeyTile = kCachePage;       // one tile = one page of the index cache
constexpr int kIdxDMax = 128;              // head lanes the kernel holds (D ≤ 128)
constexpr int kSQI = kIdxDMax + 8;         // shared row stride in bf16: 272 bytes, ldmatrix rows on distinct banks

struct ScoreArgs {
  const bf16* q;      // [T, Hi, D]
  const bf16* w;      // [T, Hi]
  const bf16* cache;  // [blocks, 64, D]
  const int* seq_new_start;
  const int* seq_new_len;
  const int* seq_ctx_len;
  const int* seq_total_len;
  const int* block_table;  // [B, max_blocks]
  int max_blocks, Hi, D, K, groups, tiles_per_split;  // groups: token groups per sequence
  float scale;  // D^-1/2
  bool causal;
  float* scores;  // [T, K]
};

template <int MT, int TOK>
constexpr size_t score_smem_bytes() {
  return (static_cast<size_t>(TOK) * MT * 16 + 2 * kKeyTile) * kSQI * sizeof(bf16);
}

// scores[t, s] = Σ_h w[t,h]·max(0, q[t,h]·k[s]·scale) for the keys t sees, 0 for the other columns of the block's
// tiles. Block: TOK tokens (group blockIdx.x % groups of sequence blockIdx.x / groups) × the key tiles of split
// blockIdx.y. MT m-tiles of 16 heads per token; warp w: token w / WPT, keys [(w % WPT)·8·NT, +8·NT) of each tile.
template <int MT, int TOK>
__global__ void __launch_bounds__(kScoreThreadsOf<TOK>) index_scores_kernel(const ScoreArgs a) {
  constexpr int kScoreThreads = kScoreThreadsOf<TOK>;
  constexpr int WPT = kScoreThreads / 32 / TOK;  // warps per token
  constexpr int NT = 8 / WPT;   // n-tiles of 8 keys per warp
  constexpr int HR = MT * 16;   // query rows per token (heads, zero-padded)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // [TOK·HR][kSQI]
  bf16* sK = sQ + TOK * HR * kSQI;               // [2][kKeyTile][kSQI]

  // Groups in reverse (the last tokens see the most keys when causal): the heaviest blocks start first, so that the
  // light ones fill the last wave instead of the heavy ones running alone.
  const int grp = a.groups - 1 - static_cast<int>(blockIdx.x % a.groups), b = blockIdx.x / a.groups;
  const int split = blockIdx.y;
  const int s_q = a.seq_new_len[b], i0 = grp * TOK;
  if (i0 >= s_q) return;
  const int n_tok = min(TOK, s_q - i0);
  const int t0 = a.seq_new_start[b] + i0;
  const int ctx = a.seq_ctx_len[b], total = a.seq_total_len[b];
  const int n_cols = (a.K + kKeyTile - 1) / kKeyTile;
  const int t_begin = split * a.tiles_per_split, t_end = min(n_cols, t_begin + a.tiles_per_split);
  if (t_begin >= t_end) return;
  // Keys seen by the group's last token (the most of any of its tokens); tiles [t_begin, t_work) hold some of them.
  const int vis_last = min(a.K, a.causal ? ctx + i0 + n_tok : total);
  const int t_work = min(t_end, (vis_last + kKeyTile - 1) / kKeyTile);
  const int ksteps = (a.D + 15) / 16, chunks = ksteps * 2;  // 16-lane mma steps, 8-lane copies per row

  if (t_begin < t_work) {
    // Q rows: row tk·HR + h = q[t0 + tk, h, :], zero past the group's tokens, the heads and D.
    for (int i = threadIdx.x; i < TOK * HR * chunks; i += kScoreThreads) {
      const int r = i / chunks, d0 = (i % chunks) * 8, tk = r / HR, h = r % HR;
      const bool ok = tk < n_tok && h < a.Hi && d0 < a.D;
      const bf16* src = ok ? a.q + (static_cast<int64_t>(t0 + tk) * a.Hi + h) * a.D + d0 : a.q;
      cp_async_16(smem_u32(sQ + r * kSQI + d0), src, ok);
    }
    const int* table = a.block_table + static_cast<int64_t>(b) * a.max_blocks;
    // Tile kt = page kt of the sequence (kt·64 < vis_last ≤ total: a real page); rows past `total` zero.
    auto load_tile = [&](int kt, int buf) {
      const int valid = min(kKeyTile, total - kt * kKeyTile);
      const bf16* base = a.cache + static_cast<int64_t>(table[kt]) * kKeyTile * a.D;
      bf16* dst = sK + buf * kKeyTile * kSQI;
      for (int i = threadIdx.x; i < kKeyTile * chunks; i += kScoreThreads) {
        const int r = i / chunks, d0 = (i % chunks) * 8;
        const bool ok = r < valid && d0 < a.D;
        cp_async_16(smem_u32(dst + r * kSQI + d0), ok ? base + static_cast<int64_t>(r) * a.D + d0 : a.cache, ok);
      }
    };
    load_tile(t_begin, 0);
    cp_async_commit();  // Q and the first tile: one group

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int tk = warp / WPT, kbase = (warp % WPT) * NT * 8;
    const bool active = tk < n_tok;  // warp-uniform
    const int vis = active ? min(a.K, a.causal ? ctx + i0 + tk + 1 : total) : 0;
    // Weights of this thread's accumulator rows: heads mt·16 + g (hf 0) and mt·16 + g + 8 (hf 1); 0 past Hi.
    float wgt[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int h = mt * 16 + g + 8 * hf;
        wgt[mt][hf] = active && h < a.Hi ? __bfloat162float(a.w[static_cast<int64_t>(t0 + tk) * a.Hi + h]) : 0.f;
      }
    const uint32_t q_addr = smem_u32(sQ + (tk * HR + (lane & 15)) * kSQI + (lane >> 4) * 8);
    const int kb_off = (kbase + ((lane >> 4) << 3) + (lane & 7)) * kSQI + ((lane >> 3) & 1) * 8;
    float* out_row = a.scores + static_cast<int64_t>(t0 + tk) * a.K;

    for (int kt = t_begin; kt < t_work; ++kt) {
      cp_async_wait<0>();
      __syncthreads();  // tile kt landed; the previous tile's readers are done with the other buffer
      const int buf = (kt - t_begin) & 1;
      if (kt + 1 < t_work) load_tile(kt + 1, buf ^ 1);
      cp_async_commit();
      if (!active) continue;

      // S [HR heads, 8·NT keys] of this warp's token, per 16-lane step of D.
      float acc[MT][NT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < NT; ++n) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.f;
      const uint32_t k_addr = smem_u32(sK + buf * kKeyTile * kSQI + kb_off);
      for (int kk = 0; kk < ksteps; ++kk) {
        uint32_t kb[NT / 2][4];
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) ldmatrix_x4(kb[np], k_addr + (np * 16 * kSQI + kk * 16) * 2);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          uint32_t qa[4];
          ldmatrix_x4(qa, q_addr + (mt * 16 * kSQI + kk * 16) * 2);
#pragma unroll
          for (int np = 0; np < NT / 2; ++np) {
            mma_bf16(acc[mt][2 * np], qa, kb[np][0], kb[np][1]);
            mma_bf16(acc[mt][2 * np + 1], qa, kb[np][2], kb[np][3]);
          }
        }
      }

      // Σ over heads: this thread's rows, then the lanes of the other rows (lane bits 2..4 = g). Every lane ends
      // with the sums of columns 2·t4, 2·t4+1 of each n-tile; lane (g, t4) writes those of n-tile g.
      float out0 = 0.f, out1 = 0.f;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        float v0 = 0.f, v1 = 0.f;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          v0 += wgt[mt][0] * fmaxf(acc[mt][n][0] * a.scale, 0.f) + wgt[mt][1] * fmaxf(acc[mt][n][2] * a.scale, 0.f);
          v1 += wgt[mt][0] * fmaxf(acc[mt][n][1] * a.scale, 0.f) + wgt[mt][1] * fmaxf(acc[mt][n][3] * a.scale, 0.f);
        }
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) {
          v0 += __shfl_xor_sync(0xffffffffu, v0, o);
          v1 += __shfl_xor_sync(0xffffffffu, v1, o);
        }
        if (n == g) {
          out0 = v0;
          out1 = v1;
        }
      }
      if (g < NT) {
        const int c0 = kt * kKeyTile + kbase + 8 * g + 2 * t4;
        if (c0 < a.K) out_row[c0] = c0 < vis ? out0 : 0.f;
        if (c0 + 1 < a.K) out_row[c0 + 1] = c0 + 1 < vis ? out1 : 0.f;
      }
    }
    cp_async_wait<0>();
  }

  // Tiles none of the group's tokens sees: zeros.
  const int c_begin = max(t_begin, t_work) * kKeyTile, c_end = min(a.K, t_end * kKeyTile);
  for (int tk = 0; tk < n_tok; ++tk) {
    float* row = a.scores + static_cast<int64_t>(t0 + tk) * a.K;
    for (int c = c_begin + threadIdx.x; c < c_end; c += kScoreThreads) row[c] = 0.f;
  }
}

template <int MT, int TOK>
void launch_scores(const ScoreArgs& a, int splits, int seqs, cudaStream_t s) {
  constexpr size_t smem = score_smem_bytes<MT, TOK>();
  auto kernel = index_scores_kernel<MT, TOK>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(seqs) * a.groups), static_cast<unsigned>(splits));
  kernel<<<grid, kScoreThreadsOf<TOK>, smem, s>>>(a);
  CUDA_CHECK_LAUNCH();
}

// MT's kernel for `tok` tokens per block (1, 2, or 4 and 8 where MT < 4).
template <int MT>
void launch_scores_mt(const ScoreArgs& a, int tok, int splits, int seqs, cudaStream_t s) {
  if (tok == 1) {
    launch_scores<MT, 1>(a, splits, seqs, s);
  } else if (tok == 2) {
    launch_scores<MT, 2>(a, splits, seqs, s);
  } else if constexpr (MT < 4) {
    if (tok == 4) launch_scores<MT, 4>(a, splits, seqs, s);
    else launch_scores<MT, 8>(a, splits, seqs, s);
  }
}

// --- Top-k --------------------------------------------------------------------------------------------------

constexpr int kTopkThreads = 512, kTopkWarps = kTopkThreads / 32, kTopkItems = 8;
constexpr int kTopkCacheKeys = 32768;  // a row's keys kept in shared memory up to this many (128 KiB)

struct TopkArgs {
  const float* scores;  // [T, K]
  const int* token_seq;
  const int* token_idx;
  const int* seq_ctx_len;
  const int* seq_total_len;
  int K, k, shift, cache_keys;  // cache_keys: the shared key cache's capacity (0: none)
  bool causal;
  float* topk_f;  // [T, k]
  int* topk_i;    // [T, k] or nullptr
};

// A float's bits as a uint32 in the float order (−0 and +0 equal, as the reference's comparison has them).
__device__ __forceinline__ uint32_t order_key(float v) {
  uint32_t u = __float_as_uint(v);
  if (u == 0x80000000u) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Slot `pos` of token t's selection holds key `key` (−1: padding); the planted shift moves real keys only.
__device__ __forceinline__ void emit_key(const TopkArgs& a, int64_t t, int pos, int key) {
  const int v = key < 0 ? -1 : key + a.shift;
  a.topk_f[t * a.k + pos] = static_cast<float>(v);
  if (a.topk_i) a.topk_i[t * a.k + pos] = v;
}

// The k highest of the n keys token blockIdx.x sees, ties to the lower index, ascending; −1 padding past n.
__global__ void __launch_bounds__(kTopkThreads) topk_kernel(const TopkArgs a) {
  extern __shared__ uint32_t s_keys[];  // [cache_keys] the row's order keys, written in the first pass
  __shared__ int hist[256];
  __shared__ int warp_tot[kTopkWarps], warp_scan[kTopkWarps];
  __shared__ int s_bin, s_above;
  const int64_t t = blockIdx.x;
  const int b = a.token_seq[t];
  const int n = min(a.K, a.causal ? a.seq_ctx_len[b] + a.token_idx[t] + 1 : a.seq_total_len[b]);
  if (n <= a.k) {  // every key it sees, then padding
    for (int j = threadIdx.x; j < a.k; j += kTopkThreads) emit_key(a, t, j, j < n ? j : -1);
    return;
  }
  const float* row = a.scores + t * a.K;
  const bool cached = n <= a.cache_keys;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // Radix select: after the passes, `prefix` is the k-th highest key and `want` the number of keys equal to it
  // that are selected (the rest of the k are above it).
  uint32_t prefix = 0, mask = 0;
  int want = a.k;
  for (int pass = 0; pass < 4; ++pass) {
    const int sh = 24 - 8 * pass;
    for (int i = threadIdx.x; i < 256; i += kTopkThreads) hist[i] = 0;
    __syncthreads();
    for (int base = 0; base < n; base += kTopkThreads) {  // the same trip count in every lane (match_any below)
      const int s = base + threadIdx.x;
      uint32_t u = 0;
      bool take = false;
      if (s < n) {
        if (pass == 0) {
          u = order_key(row[s]);
          if (cached) s_keys[s] = u;
        } else {
          u = cached ? s_keys[s] : order_key(row[s]);
        }
        take = (u & mask) == prefix;
      }
      // One shared atomic per distinct bin of the warp (scores cluster in few bins, the top byte above all).
      const int bin = take ? static_cast<int>((u >> sh) & 0xffu) : -1;
      const unsigned peers = __match_any_sync(0xffffffffu, bin);
      if (take && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
    }
    __syncthreads();
    if (warp == 0) {  // the bin holding the want-th highest key: lane l owns bins 8l..8l+7
      int c[8], local = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        c[j] = hist[8 * lane + j];
        local += c[j];
      }
      int suffix = local;  // keys in bins ≥ 8·lane
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_down_sync(0xffffffffu, suffix, o);
        if (lane + o < 32) suffix += v;
      }
      int above = suffix - local;  // keys in bins above this lane's
#pragma unroll
      for (int j = 7; j >= 0; --j) {
        if (above < want && above + c[j] >= want) {
          s_bin = 8 * lane + j;
          s_above = above;
        }
        above += c[j];
      }
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(s_bin) << sh;
    mask |= 0xffu << sh;
    want -= s_above;
  }

  // Emission in key order: slot of key s = (keys above the threshold before s) + min(equal keys before s, want).
  int run_gt = 0, run_eq = 0;
  for (int base = 0; base < n; base += kTopkThreads * kTopkItems) {
    const int s0 = base + threadIdx.x * kTopkItems;
    uint32_t u[kTopkItems];
    int gt = 0, eq = 0;
#pragma unroll
    for (int j = 0; j < kTopkItems; ++j) {
      const int s = s0 + j;
      u[j] = s < n ? (cached ? s_keys[s] : order_key(row[s])) : 0u;
      gt += s < n && u[j] > prefix;
      eq += s < n && u[j] == prefix;
    }
    // Block exclusive scan of (gt, eq) packed as gt·2^16 + eq (a chunk holds at most 4096 keys).
    const int packed = (gt << 16) | eq;
    int incl = packed;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == 31) warp_tot[warp] = incl;
    __syncthreads();
    if (warp == 0) {
      int v = lane < kTopkWarps ? warp_tot[lane] : 0;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int x = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += x;
      }
      if (lane < kTopkWarps) warp_scan[lane] = v;
    }
    __syncthreads();
    const int excl = (warp > 0 ? warp_scan[warp - 1] : 0) + incl - packed;
    int gt_before = run_gt + (excl >> 16), eq_before = run_eq + (excl & 0xffff);
#pragma unroll
    for (int j = 0; j < kTopkItems; ++j) {
      const int s = s0 + j;
      if (s >= n) continue;
      if (u[j] > prefix) {
        emit_key(a, t, gt_before + min(eq_before, want), s);
        ++gt_before;
      } else if (u[j] == prefix) {
        if (eq_before < want) emit_key(a, t, gt_before + eq_before, s);
        ++eq_before;
      }
    }
    const int tot = warp_scan[kTopkWarps - 1];
    run_gt += tot >> 16;
    run_eq += tot & 0xffff;
  }
}

int checked_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw EngineError(std::string("dsa indexer: ") + what + " = " + std::to_string(v) + " does not fit an int");
  return static_cast<int>(v);
}
}  // namespace

void launch_rope_leading(bf16* x, int64_t rows, int64_t rows_per_token, int D, int R, const int* positions,
                         const double* inv_freq, bool neox, cudaStream_t s) {
  if (R % 2 != 0 || R > D || rows_per_token <= 0 || rows % rows_per_token != 0)
    throw EngineError("rope_leading: R " + std::to_string(R) + ", D " + std::to_string(D) + ", rows " +
                      std::to_string(rows) + " of " + std::to_string(rows_per_token) + " per token");
  const int64_t T = rows / rows_per_token;
  if (T == 0 || R == 0) return;
  const int64_t per_token = rows_per_token * (R / 2);
  const int threads = per_token >= 256 ? 256 : static_cast<int>(std::max<int64_t>(32, (per_token + 31) / 32 * 32));
  const int64_t blocks = std::min<int64_t>(T, 1 << 20);
  rope_leading_kernel<<<static_cast<unsigned>(blocks), threads, R * sizeof(float), s>>>(
      x, T, checked_int(rows_per_token, "rows per token"), D, R, positions, inv_freq, neox);
  CUDA_CHECK_LAUNCH();
}

void launch_indexer_q(cublasHandle_t h, cudaStream_t s, const bf16* q_c, int64_t ld_qc, const bf16* wq_b, bf16* idx_q,
                      int64_t T, int64_t Lq, int Hi, int D, int R, const int* positions, const double* inv_freq,
                      bool neox) {
  const int64_t O = static_cast<int64_t>(Hi) * D;
  gemm_xwt(h, q_c, ld_qc, wq_b, idx_q, O, T, Lq, O);
  launch_rope_leading(idx_q, T * Hi, Hi, D, R, positions, inv_freq, neox, s);
}

void launch_indexer_k_finish(const bf16* k_lin, const bf16* norm_w, const bf16* norm_b, float eps,
                             const int* positions, const double* inv_freq, int R, bool neox, int64_t T, int D,
                             bf16* idx_k, bf16* index_cache, const int64_t* slot_mapping, cudaStream_t s,
                             bool norm) {
  if (R % 2 != 0 || R > D)
    throw EngineError("indexer_k: R " + std::to_string(R) + " rope lanes in a head of D " + std::to_string(D));
  if (T == 0 || D == 0) return;
  const size_t smem = static_cast<size_t>(D + R) * sizeof(float);
  if (smem > 48 * 1024) throw EngineError("indexer_k: head of " + std::to_string(D) + " lanes is too wide");
  indexer_k_finish_kernel<<<static_cast<unsigned>(checked_int(T, "T")), 128, smem, s>>>(
      k_lin, norm_w, norm_b, eps, positions, inv_freq, R, neox, D, idx_k, index_cache, slot_mapping, norm);
  CUDA_CHECK_LAUNCH();
}

template <class V>
__global__ void fill_kernel(V* __restrict__ x, int64_t n, V v) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[j] = v;
}

template <class V>
void launch_fill(V* x, int64_t n, V v, cudaStream_t s) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 1 << 16);
  fill_kernel<<<static_cast<unsigned>(blocks), 256, 0, s>>>(x, n, v);
  CUDA_CHECK_LAUNCH();
}

void launch_fill_f32(float* x, int64_t n, float v, cudaStream_t s) { launch_fill(x, n, v, s); }
void launch_fill_bf16(bf16* x, int64_t n, float v, cudaStream_t s) { launch_fill(x, n, __float2bfloat16_rn(v), s); }

__global__ void topk_indices_kernel(const float* __restrict__ f, int* __restrict__ i, int64_t n) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x)
    i[j] = static_cast<int>(f[j]);
}

void launch_topk_indices(const float* topk_f, int* topk_i, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 1 << 16);
  topk_indices_kernel<<<static_cast<unsigned>(blocks), 256, 0, s>>>(topk_f, topk_i, n);
  CUDA_CHECK_LAUNCH();
}

void launch_scale_bf16(bf16* x, int64_t n, float scale, cudaStream_t s) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 1 << 16);
  scale_bf16_kernel<<<static_cast<unsigned>(blocks), 256, 0, s>>>(x, n, scale);
  CUDA_CHECK_LAUNCH();
}

void launch_indexer_weights(cublasHandle_t h, const bf16* x, int64_t ldx, const bf16* weights_proj, bf16* idx_w,
                            int64_t T, int64_t H, int Hi) {
  if (T == 0 || Hi == 0) return;
  // The reference's scale: float(1/sqrt(Hi)) computed in double.
  const float alpha = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Hi))), beta = 0.0f;
  // Row-major y [T, Hi] = x·Wᵀ is column-major yᵀ [Hi, T] = W·xᵀ (kernels/linear.cu).
  CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, Hi, checked_int(T, "T"), checked_int(H, "H"), &alpha,
                            weights_proj, CUDA_R_16BF, checked_int(H, "H"), x, CUDA_R_16BF, checked_int(ldx, "ldx"),
                            &beta, idx_w, CUDA_R_16BF, Hi, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void launch_index_scores(const bf16* idx_q, const bf16* idx_w, const bf16* index_cache, const DeviceBatch& b, int T,
                         int Hi, int D, int K, float* scores, bool causal, cudaStream_t s) {
  if (Hi <= 0 || Hi > 64 || D <= 0 || D > kIdxDMax || D % 8 != 0)
    throw EngineError("index_scores: Hi " + std::to_string(Hi) + ", D " + std::to_string(D) +
                      " outside the kernel's Hi <= 64, D <= 128 (a multiple of 8)");
  if (T == 0 || K <= 0 || b.seqs == 0 || b.max_new == 0) return;
  ScoreArgs a;
  a.q = idx_q;
  a.w = idx_w;
  a.cache = index_cache;
  a.seq_new_start = b.i32(b.seq_new_start);
  a.seq_new_len = b.i32(b.seq_new_len);
  a.seq_ctx_len = b.i32(b.seq_ctx_len);
  a.seq_total_len = b.i32(b.seq_total_len);
  a.block_table = b.i32(b.block_table);
  a.max_blocks = b.max_blocks;
  a.Hi = Hi;
  a.D = D;
  a.K = K;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  a.causal = causal;
  a.scores = scores;

  // Tokens per block: 1 for decode (the 4 warps split each tile's keys), else 2, 4 or 8 (8: a warp per token, two
  // blocks of 8 warps an SM where 4-token blocks fit three of 4 warps; at most 64 accumulators a thread: MT·NT·4).
  const int MT = Hi <= 16 ? 1 : Hi <= 32 ? 2 : 4;
  const int tok = b.max_new == 1 ? 1 : (MT == 4 || b.max_new < 4) ? 2 : b.max_new < 8 ? 4 : 8;
  const int groups = (b.max_new + tok - 1) / tok;
  if (static_cast<int64_t>(b.seqs) * groups > INT_MAX) throw EngineError("index_scores: too many token groups");
  a.groups = groups;
  // Splits of the key tiles: about 4 blocks per multiprocessor in all (2 or 3 fit at once; the rest balance the
  // ragged causal work), whole tiles per split.
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int n_cols = (K + kKeyTile - 1) / kKeyTile;
  const int64_t base = static_cast<int64_t>(b.seqs) * groups;
  const int want = static_cast<int>(std::clamp<int64_t>(4LL * sms / base, 1, n_cols));
  a.tiles_per_split = (n_cols + want - 1) / want;
  const int splits = (n_cols + a.tiles_per_split - 1) / a.tiles_per_split;
  if (MT == 1) launch_scores_mt<1>(a, tok, splits, b.seqs, s);
  else if (MT == 2) launch_scores_mt<2>(a, tok, splits, b.seqs, s);
  else launch_scores_mt<4>(a, tok, splits, b.seqs, s);
}

void launch_topk(const float* scores, const DeviceBatch& b, int T, int K, int k, bool causal, float* topk_f,
                 int* topk_i, int shift, cudaStream_t s) {
  if (k < 0) throw EngineError("topk: k = " + std::to_string(k));
  if (T == 0 || k == 0) return;
  TopkArgs a;
  a.scores = scores;
  a.token_seq = b.i32(b.token_seq);
  a.token_idx = b.i32(b.token_idx);
  a.seq_ctx_len = b.i32(b.seq_ctx_len);
  a.seq_total_len = b.i32(b.seq_total_len);
  a.K = std::max(K, 0);
  a.k = k;
  a.shift = shift;
  a.cache_keys = a.K <= kTopkCacheKeys ? a.K : 0;
  a.causal = causal;
  a.topk_f = topk_f;
  a.topk_i = topk_i;
  const size_t smem = static_cast<size_t>(a.cache_keys) * sizeof(uint32_t);
  CUDA_CHECK(cudaFuncSetAttribute(topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  topk_kernel<<<static_cast<unsigned>(T), kTopkThreads, smem, s>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
