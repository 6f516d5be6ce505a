// The flash kernels of attention_mha: FlashAttention-2 on mma.sync (bf16, fp32 accumulators, online softmax in
// fp32, natural-log lse), no Tq×Tk matrix ever stored. The mask: causal (bottom-right), a sliding window, or a
// selection's bitmaps (FlashParams::keep, DSA's top-k). attention_mha's kernel versions, picked by the CUDA engine's
// option mha_kernel= (MhaArgs::kernel, FlashParams::version):
//   4 (the default): the Hopper kernel on wgmma and TMA (attention_flash_wgmma.cu) for D 192 / V 128 and
//     D 256 / V 256 on an sm_90 GPU with an sm_90a build; other dims and GPUs run version 3.
//   3: attention_flash3_kernel, 256-row blocks of 8 warps × 32 query rows, for D ≤ 192 / V ≤ 128; wider dims (GLM)
//     run version 2's D ≤ 256 / V ≤ 256 kernel.
//   2: attention_flash_kernel, 128-row blocks of 8 warps × 16 query rows.
//   1: not here: the simple core of attention_core.cuh (the fallback, and dims these kernels do not cover).
//
// A block owns BR query rows of one head of one sequence and walks 64-key tiles of K and V through shared memory,
// double-buffered with cp.async so that the next tile loads while this one computes. Per tile and warp: S = Q·Kᵀ
// (fp32), mask, online softmax in log2 units (ex2), P rounded to bf16 in registers and O += P·V; the warp's rows
// are then written by one epilogue (store_row). Rows are padded by 16 bytes in shared memory so that every ldmatrix
// phase hits 32 distinct banks.
//
// attention_flash_kernel has two instantiations, to keep the build small: D ≤ 192 / V ≤ 128 (DeepSeek, Kimi: Q
// fragments stay in registers) and D ≤ 256 / V ≤ 256 (GLM: Q re-read from shared memory, registers go to the
// 16×256 O); both with 128-row blocks, one per SM (BR and blocks per SM are template parameters). Smaller dims (the
// tiny preset) run zero-padded in the first. Query tiles are issued heaviest first (causal: the last rows see the
// most keys), and head-major within a tile row, so a wave holds similar work.
#include <cmath>

#include "kernels/attention_flash.cuh"
#include "kernels/attention_flash_store.cuh"
#include "kernels/mma_util.cuh"

namespace mla::cuda {

namespace {
using namespace mma;

constexpr int kBc = 64;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

template <int BR, int DT, int VT>
constexpr size_t flash_smem_bytes() {
  return (static_cast<size_t>(BR) * (DT + 8) + 2ull * kBc * (DT + 8) + 2ull * kBc * (VT + 8)) * sizeof(bf16);
}

// ROWS × DT tile: column d < P from `a`, P ≤ d < P + Q from `b`, zero beyond; rows ≥ valid are zero.
// vec: every dim, stride and pointer is a multiple of 16 bytes, so whole 16-byte chunks go by cp.async.
template <int THREADS, int ROWS, int DT>
__device__ __forceinline__ void load_tile(bf16* s, const AttnOperand& a, const AttnOperand& b, int64_t row0,
                                          int valid, int h, int P, int Q, bool vec) {
  constexpr int CH = DT / 8, SS = DT + 8;
  for (int i = threadIdx.x; i < ROWS * CH; i += THREADS) {
    const int r = i / CH, d0 = (i % CH) * 8;
    bf16* dst = s + r * SS + d0;
    const int64_t row = row0 + r;
    if (vec) {
      const bf16* src = a.ptr;
      bool ok = false;
      if (r < valid) {
        if (d0 < P) {
          src = a.ptr + row * a.row_stride + h * a.head_stride + d0;
          ok = true;
        } else if (d0 < P + Q) {
          src = b.ptr + row * b.row_stride + h * b.head_stride + (d0 - P);
          ok = true;
        }
      }
      cp_async_16(smem_u32(dst), src, ok);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int d = d0 + j;
        bf16 x = __float2bfloat16_rn(0.f);
        if (r < valid) {
          if (d < P) x = a.ptr[row * a.row_stride + h * a.head_stride + d];
          else if (d < P + Q) x = b.ptr[row * b.row_stride + h * b.head_stride + (d - P)];
        }
        dst[j] = x;
      }
    }
  }
}

struct FlashKernelArgs {
  FlashParams p;
  bool vec;
};

// A selection's row (FlashParams::keep) of query `row` of a block whose first query is token q_row0: nullptr for a
// row past the block's rows (none of its keys is kept), unused without a selection.
__device__ __forceinline__ const uint32_t* keep_row(const FlashParams& p, int64_t q_row0, int row, int q_rows) {
  return p.keep && row < q_rows ? p.keep + (q_row0 + row) * p.keep_words : nullptr;
}
// Whether a selection keeps `key` of a row (keep_row's pointer; nullptr keeps none).
__device__ __forceinline__ bool kept(const uint32_t* row, int key) {
  return row != nullptr && ((__ldg(row + (key >> 5)) >> (key & 31)) & 1u) != 0;
}

// A block's place (head h, sequence b, its first query row q0 of BR) and key range, with its first tiles on the
// way: Q as one cp.async group, then key/value tile 0 as the next (both kernels begin so). False when the
// block has no query rows.
struct FlashBlock {
  int h, b, q0, k_len, q_rows, offset, n_keys, n_tiles;
  int full_keys;  // every row sees the keys below this
  int64_t q_row0, k_row0;
};
template <int THREADS, int BR, int DT, int VT>
__device__ __forceinline__ bool flash_block_begin(const FlashParams& p, bool vec, bf16* sQ, bf16* sK, bf16* sV,
                                                  FlashBlock& f) {
  f.h = blockIdx.x;
  f.b = blockIdx.z;
  const int q_len = p.seq_q_len[f.b];
  f.q0 = (static_cast<int>(gridDim.y) - 1 - static_cast<int>(blockIdx.y)) * BR;
  if (f.q0 >= q_len) return false;
  f.k_len = p.seq_k_len[f.b];
  f.q_rows = min(BR, q_len - f.q0);
  f.offset = f.k_len - q_len;  // causal: query i sees keys s < i + 1 + offset
  f.n_keys = max(0, p.causal ? min(f.k_len, f.q0 + f.q_rows + f.offset) : f.k_len);
  f.n_tiles = (f.n_keys + kBc - 1) / kBc;
  f.full_keys = p.causal ? min(f.k_len, f.q0 + 1 + f.offset) : f.k_len;
  f.q_row0 = p.seq_q_start[f.b] + f.q0;
  f.k_row0 = p.seq_k_start[f.b];
  load_tile<THREADS, BR, DT>(sQ, p.q_nope, p.q_pe, f.q_row0, f.q_rows, f.h, p.P, p.R, vec);
  cp_async_commit();
  if (f.n_tiles > 0) {
    load_tile<THREADS, kBc, DT>(sK, p.k_nope, p.k_pe, f.k_row0, min(kBc, f.n_keys), f.h, p.P, p.R, vec);
    load_tile<THREADS, kBc, VT>(sV, p.v, p.v, f.k_row0, min(kBc, f.n_keys), f.h, p.V, 0, vec);
  }
  cp_async_commit();
  return true;
}

// BR query rows per block (BR / 16 warps); MIN_BLOCKS resident per SM.
template <int BR, int DT, int VT, bool QREG, int MIN_BLOCKS>
__global__ void __launch_bounds__(BR * 2, MIN_BLOCKS) attention_flash_kernel(const FlashKernelArgs args) {
  constexpr int kBr = BR, kThreads = BR * 2;
  const FlashParams& p = args.p;
  const bool vec = args.vec;
  constexpr int SQ = DT + 8, SV = VT + 8;
  constexpr int KQ = DT / 16;  // k-steps of S = Q·Kᵀ
  constexpr int NV = VT / 8;   // n-tiles of O
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // [kBr][SQ]
  bf16* sK = sQ + kBr * SQ;                      // [2][kBc][SQ]
  bf16* sV = sK + 2 * kBc * SQ;                  // [2][kBc][SV]

  FlashBlock f;
  if (!flash_block_begin<kThreads, kBr, DT, VT>(p, vec, sQ, sK, sV, f)) return;
  const int h = f.h, q0 = f.q0, k_len = f.k_len, q_rows = f.q_rows, offset = f.offset, n_keys = f.n_keys,
            n_tiles = f.n_tiles;
  const int full_keys = f.full_keys;
  const int64_t q_row0 = f.q_row0, k_row0 = f.k_row0;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int wrow = warp * 16;
  // ldmatrix row addresses: A (Q) rows lane%16, col 8·(lane/16); B from K (keys along n): key
  // 8·(lane/16) + lane%8, col 8·((lane/8)%2); B from V (transposed; keys along k): key 8·((lane/8)%2) + lane%8,
  // col 8·(lane/16).
  const uint32_t q_addr = smem_u32(sQ + (wrow + (lane & 15)) * SQ + (lane >> 4) * 8);
  const int kb_off = (((lane >> 4) << 3) + (lane & 7)) * SQ + ((lane >> 3) & 1) * 8;
  const int vb_off = ((((lane >> 3) & 1) << 3) + (lane & 7)) * SV + (lane >> 4) * 8;

  const int i0 = q0 + wrow + g, i1 = i0 + 8;  // this thread's two query rows (index among the new tokens)
  const int lim0 = p.causal ? min(k_len, i0 + 1 + offset) : k_len;
  const int lim1 = p.causal ? min(k_len, i1 + 1 + offset) : k_len;
  const int lo0 = p.window > 0 ? lim0 - p.window : 0, lo1 = p.window > 0 ? lim1 - p.window : 0;  // sliding window
  const uint32_t *keep0 = keep_row(p, q_row0, wrow + g, q_rows), *keep1 = keep_row(p, q_row0, wrow + g + 8, q_rows);
  const float sl2 = p.scale * kLog2e;

  uint32_t qf[QREG ? KQ : 1][4];
  if constexpr (QREG) {
    cp_async_wait<1>();  // the Q group
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) ldmatrix_x4(qf[kk], q_addr + kk * 32);
  }

  float o[NV][4];
#pragma unroll
  for (int v = 0; v < NV; ++v) o[v][0] = o[v][1] = o[v][2] = o[v][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait<0>();
    __syncthreads();  // tile j landed; every warp is done with the buffer the next prefetch overwrites
    const int buf = j & 1;
    if (j + 1 < n_tiles) {
      const int ks = (j + 1) * kBc, nb = buf ^ 1;
      load_tile<kThreads, kBc, DT>(sK + nb * kBc * SQ, p.k_nope, p.k_pe, k_row0 + ks, min(kBc, n_keys - ks), h, p.P,
                                   p.R, vec);
      load_tile<kThreads, kBc, VT>(sV + nb * kBc * SV, p.v, p.v, k_row0 + ks, min(kBc, n_keys - ks), h, p.V, 0, vec);
    }
    cp_async_commit();

    // S = Q·Kᵀ: 16 rows × 64 keys per warp.
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    // Fragments of k-step kk + 1 are loaded before the MMAs of kk (the asm is volatile, so issue order is
    // program order: a load placed right before its MMA would stall it for the shared-memory latency).
    const uint32_t k_addr = smem_u32(sK + buf * kBc * SQ + kb_off);
    uint32_t kb[2][4][4], qa[2][4];
#pragma unroll
    for (int np = 0; np < 4; ++np) ldmatrix_x4(kb[0][np], k_addr + (np * 16 * SQ) * 2);
    if constexpr (!QREG) ldmatrix_x4(qa[0], q_addr);
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) {
      const int cur = kk & 1;
      if (kk + 1 < KQ) {
#pragma unroll
        for (int np = 0; np < 4; ++np) ldmatrix_x4(kb[cur ^ 1][np], k_addr + (np * 16 * SQ + (kk + 1) * 16) * 2);
        if constexpr (!QREG) ldmatrix_x4(qa[cur ^ 1], q_addr + (kk + 1) * 32);
      }
      const uint32_t(&a)[4] = QREG ? qf[QREG ? kk : 0] : qa[cur];
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        mma_bf16(s[2 * np], a, kb[cur][np][0], kb[cur][np][1]);
        mma_bf16(s[2 * np + 1], a, kb[cur][np][2], kb[cur][np][3]);
      }
    }

    // Scale to log2 units and mask (only tiles that reach past some row's last visible key).
    const int kbase = j * kBc;
    const bool need_mask = kbase + kBc > full_keys || p.window > 0 || p.keep;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[n][e] * sl2;
        if (need_mask) {
          const int key = kbase + n * 8 + 2 * t4 + (e & 1);
          if (key >= (e < 2 ? lim0 : lim1) || key < (e < 2 ? lo0 : lo1)) x = -INFINITY;
          if (p.keep && !kept(e < 2 ? keep0 : keep1, key)) x = -INFINITY;
        }
        s[n][e] = x;
      }

    // Online softmax; a row's max is shared by the 4 lanes holding it.
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
      mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float base0 = mx0 == -INFINITY ? 0.f : mx0, base1 = mx1 == -INFINITY ? 0.f : mx1;
    const float c0 = exp2_approx(m0 - base0), c1 = exp2_approx(m1 - base1);  // 0 while m was −inf
    m0 = mx0;
    m1 = mx1;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      s[n][0] = exp2_approx(s[n][0] - base0);
      s[n][1] = exp2_approx(s[n][1] - base0);
      s[n][2] = exp2_approx(s[n][2] - base1);
      s[n][3] = exp2_approx(s[n][3] - base1);
      sum0 += s[n][0] + s[n][1];
      sum1 += s[n][2] + s[n][3];
    }
    l0 = l0 * c0 + sum0;  // partial over this lane's columns; the quad is summed once at the end
    l1 = l1 * c1 + sum1;
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      o[v][0] *= c0;
      o[v][1] *= c0;
      o[v][2] *= c1;
      o[v][3] *= c1;
    }

    // O += P·V, P's A fragments straight from the S accumulators; V fragments one step ahead.
    uint32_t pa[kBc / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      pa[kk][0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
    const uint32_t v_addr = smem_u32(sV + buf * kBc * SV + vb_off);
    constexpr int NVP = VT / 16, STEPS = (kBc / 16) * NVP;
    uint32_t vb[2][4];
    ldmatrix_x4_trans(vb[0], v_addr);
#pragma unroll
    for (int st = 0; st < STEPS; ++st) {
      const int kk = st / NVP, vp = st % NVP, cur = st & 1;
      if (st + 1 < STEPS) {
        const int nk = (st + 1) / NVP, nv = (st + 1) % NVP;
        ldmatrix_x4_trans(vb[cur ^ 1], v_addr + (nk * 16 * SV + nv * 16) * 2);
      }
      mma_bf16(o[2 * vp], pa[kk], vb[cur][0], vb[cur][1]);
      mma_bf16(o[2 * vp + 1], pa[kk], vb[cur][2], vb[cur][3]);
    }
  }
  cp_async_wait<0>();

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = wrow + g + 8 * half;
    if (row >= q_rows) continue;
    const float l = half ? l1 : l0, m = half ? m1 : m0;  // m in log2 units
    const bool pair = (p.V & 1) == 0;
    store_row(p, h, q_row0, row, o, half, l, pair, t4, [&](float s) { return (m + log2f(s)) * kLn2; });
  }
}

// Version 3 (mha_kernel=3; D ≤ 192, V ≤ 128 only, wider dims run version 2's D 256 / V 256 kernel): 256-row
// blocks of 8 warps × 32 query rows, one block per SM. Each warp holds two 16-row MMA atoms, so every K and V
// fragment read from shared memory feeds two MMAs (version 2: one): ldmatrix per MMA 0.4 instead of 0.5, the
// shared-memory read rate that bounds version 2. Q (32 rows × 192 do not fit beside the 32 × 128 fp32 O) is
// re-read from shared memory per k-step. The 64-key tiles (double-buffered by cp.async, one __syncthreads
// each, as version 2) are consumed in two 32-key steps so that S (32 × 32) stays at 32 registers. Softmax on
// raw scores: the max in raw units, p = 2^(s·scale·log2e − m·scale·log2e) as one FFMA + ex2; O is rescaled
// only when some row's max moved (warp vote: after the first tiles it rarely does); the mask only on steps
// that cross a row's last key; a warp skips the steps past its own last row's keys (the causal diagonal of
// a 256-row block spans 4 tiles) and, rows past the sequence, every step.
constexpr int kBr3 = 256, kThreads3 = 256;

template <int DT, int VT>
constexpr size_t flash3_smem_bytes() {
  return (static_cast<size_t>(kBr3) * (DT + 8) + 2ull * kBc * (DT + 8) + 2ull * kBc * (VT + 8)) * sizeof(bf16);
}

template <int DT, int VT>
__global__ void __launch_bounds__(kThreads3, 1) attention_flash3_kernel(const FlashKernelArgs args) {
  const FlashParams& p = args.p;
  const bool vec = args.vec;
  constexpr int SQ = DT + 8, SV = VT + 8;
  constexpr int KQ = DT / 16;  // k-steps of S = Q·Kᵀ
  constexpr int NV = VT / 8;   // n-tiles of O
  constexpr int NVP = VT / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // [kBr3][SQ]
  bf16* sK = sQ + kBr3 * SQ;                     // [2][kBc][SQ]
  bf16* sV = sK + 2 * kBc * SQ;                  // [2][kBc][SV]

  FlashBlock f;
  if (!flash_block_begin<kThreads3, kBr3, DT, VT>(p, vec, sQ, sK, sV, f)) return;
  const int h = f.h, q0 = f.q0, k_len = f.k_len, q_rows = f.q_rows, offset = f.offset, n_keys = f.n_keys,
            n_tiles = f.n_tiles;
  const int64_t q_row0 = f.q_row0, k_row0 = f.k_row0;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int wrow = warp * 32;
  // ldmatrix row addresses as version 2; the second atom's Q rows are 16 rows further.
  const uint32_t q_addr = smem_u32(sQ + (wrow + (lane & 15)) * SQ + (lane >> 4) * 8);
  constexpr uint32_t kAtom = 16 * SQ * 2;  // bytes between the two atoms' Q rows
  const int kb_off = (((lane >> 4) << 3) + (lane & 7)) * SQ + ((lane >> 3) & 1) * 8;
  const int vb_off = ((((lane >> 3) & 1) << 3) + (lane & 7)) * SV + (lane >> 4) * 8;

  // Row r = 2·a + hf of this thread: query q0 + wrow + 16a + 8hf + g; lim = its number of visible keys.
  int lim[4], lo[4];  // lo: the first visible key (0 unless a sliding window)
  const uint32_t* keep[4];  // the rows of a selection
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int i = q0 + wrow + 16 * (r >> 1) + 8 * (r & 1) + g;
    lim[r] = p.causal ? min(k_len, i + 1 + offset) : k_len;
    lo[r] = p.window > 0 ? lim[r] - p.window : 0;
    keep[r] = keep_row(p, q_row0, i - q0, q_rows);
  }
  // Keys some row of this warp sees (none when all its rows are past the sequence), and keys all its rows see.
  const int warp_keys =
      wrow >= q_rows ? 0 : (p.causal ? max(0, min(k_len, q0 + min(wrow + 32, q_rows) + offset)) : k_len);
  const int warp_full = p.causal ? min(k_len, q0 + wrow + 1 + offset) : k_len;
  const float sl2 = p.scale * kLog2e;

  float o[2][NV][4];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int v = 0; v < NV; ++v) o[a][v][0] = o[a][v][1] = o[a][v][2] = o[a][v][3] = 0.f;
  float m[4], l[4];  // running max (raw score units) and this lane's partial row sum, per row r
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
  }

  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait<0>();
    __syncthreads();  // tile j landed; every warp is done with the buffer the next prefetch overwrites
    const int buf = j & 1;
    if (j + 1 < n_tiles) {
      const int ks = (j + 1) * kBc, nb = buf ^ 1;
      load_tile<kThreads3, kBc, DT>(sK + nb * kBc * SQ, p.k_nope, p.k_pe, k_row0 + ks, min(kBc, n_keys - ks), h,
                                    p.P, p.R, vec);
      load_tile<kThreads3, kBc, VT>(sV + nb * kBc * SV, p.v, p.v, k_row0 + ks, min(kBc, n_keys - ks), h, p.V, 0,
                                    vec);
    }
    cp_async_commit();

#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int kbase = j * kBc + half * 32;
      if (kbase >= warp_keys) continue;  // warp-uniform: no row of this warp sees these keys

      // S = Q·Kᵀ: 2 atoms × 16 rows × 32 keys; fragments of k-step kk + 1 loaded before the MMAs of kk.
      float s[2][4][4];
#pragma unroll
      for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int n = 0; n < 4; ++n) s[a][n][0] = s[a][n][1] = s[a][n][2] = s[a][n][3] = 0.f;
      const uint32_t k_addr = smem_u32(sK + buf * kBc * SQ + half * 32 * SQ + kb_off);
      uint32_t qa[2][2][4], kb[2][2][4];
      ldmatrix_x4(qa[0][0], q_addr);
      ldmatrix_x4(qa[0][1], q_addr + kAtom);
      ldmatrix_x4(kb[0][0], k_addr);
      ldmatrix_x4(kb[0][1], k_addr + 16 * SQ * 2);
#pragma unroll
      for (int kk = 0; kk < KQ; ++kk) {
        const int cur = kk & 1;
        if (kk + 1 < KQ) {
          const uint32_t dq = (kk + 1) * 32;
          ldmatrix_x4(qa[cur ^ 1][0], q_addr + dq);
          ldmatrix_x4(qa[cur ^ 1][1], q_addr + kAtom + dq);
          ldmatrix_x4(kb[cur ^ 1][0], k_addr + dq);
          ldmatrix_x4(kb[cur ^ 1][1], k_addr + 16 * SQ * 2 + dq);
        }
#pragma unroll
        for (int a = 0; a < 2; ++a)
#pragma unroll
          for (int np = 0; np < 2; ++np) {
            mma_bf16(s[a][2 * np], qa[cur][a], kb[cur][np][0], kb[cur][np][1]);
            mma_bf16(s[a][2 * np + 1], qa[cur][a], kb[cur][np][2], kb[cur][np][3]);
          }
      }

      // Mask (raw units; −inf stays −inf through the positive scale) only where a row's last key is crossed.
      if (kbase + 32 > warp_full || p.window > 0 || p.keep) {
#pragma unroll
        for (int a = 0; a < 2; ++a)
#pragma unroll
          for (int n = 0; n < 4; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = kbase + n * 8 + 2 * t4 + (e & 1), r = 2 * a + (e >> 1);
              if (key >= lim[r] || key < lo[r] || (p.keep && !kept(keep[r], key))) s[a][n][e] = -INFINITY;
            }
      }

      // Online softmax; a row's max is shared by the 4 lanes holding it.
      float mx[4], nb2[4];
      bool moved = false;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int a = r >> 1, e0 = 2 * (r & 1);
        float x = m[r];
#pragma unroll
        for (int n = 0; n < 4; ++n) x = fmaxf(x, fmaxf(s[a][n][e0], s[a][n][e0 + 1]));
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
        mx[r] = x;
        moved |= x != m[r];
        nb2[r] = x == -INFINITY ? 0.f : -x * sl2;  // −max in log2 units (0 while the row saw only −inf)
      }
      if (__any_sync(0xffffffffu, moved)) {
        float c[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          c[r] = exp2_approx(fmaf(m[r], sl2, nb2[r]));  // 0 while m was −inf; 1 where the max stayed
          l[r] *= c[r];
        }
#pragma unroll
        for (int a = 0; a < 2; ++a)
#pragma unroll
          for (int v = 0; v < NV; ++v) {
            o[a][v][0] *= c[2 * a];
            o[a][v][1] *= c[2 * a];
            o[a][v][2] *= c[2 * a + 1];
            o[a][v][3] *= c[2 * a + 1];
          }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) m[r] = mx[r];
#pragma unroll
      for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          s[a][n][0] = exp2_approx(fmaf(s[a][n][0], sl2, nb2[2 * a]));
          s[a][n][1] = exp2_approx(fmaf(s[a][n][1], sl2, nb2[2 * a]));
          s[a][n][2] = exp2_approx(fmaf(s[a][n][2], sl2, nb2[2 * a + 1]));
          s[a][n][3] = exp2_approx(fmaf(s[a][n][3], sl2, nb2[2 * a + 1]));
          l[2 * a] += s[a][n][0] + s[a][n][1];  // partial over this lane's columns; the quad sums at the end
          l[2 * a + 1] += s[a][n][2] + s[a][n][3];
        }

      // O += P·V: P's A fragments from the S accumulators; each V fragment feeds both atoms.
      uint32_t pa[2][2][4];
#pragma unroll
      for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          pa[a][kk][0] = pack_bf16(s[a][2 * kk][0], s[a][2 * kk][1]);
          pa[a][kk][1] = pack_bf16(s[a][2 * kk][2], s[a][2 * kk][3]);
          pa[a][kk][2] = pack_bf16(s[a][2 * kk + 1][0], s[a][2 * kk + 1][1]);
          pa[a][kk][3] = pack_bf16(s[a][2 * kk + 1][2], s[a][2 * kk + 1][3]);
        }
      const uint32_t v_addr = smem_u32(sV + buf * kBc * SV + half * 32 * SV + vb_off);
      constexpr int STEPS = 2 * NVP;
      uint32_t vb[2][4];
      ldmatrix_x4_trans(vb[0], v_addr);
#pragma unroll
      for (int st = 0; st < STEPS; ++st) {
        const int kk = st / NVP, vp = st % NVP, cur = st & 1;
        if (st + 1 < STEPS) {
          const int nk = (st + 1) / NVP, nv = (st + 1) % NVP;
          ldmatrix_x4_trans(vb[cur ^ 1], v_addr + (nk * 16 * SV + nv * 16) * 2);
        }
#pragma unroll
        for (int a = 0; a < 2; ++a) {
          mma_bf16(o[a][2 * vp], pa[a][kk], vb[cur][0], vb[cur][1]);
          mma_bf16(o[a][2 * vp + 1], pa[a][kk], vb[cur][2], vb[cur][3]);
        }
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 4; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const bool pair = (p.V & 1) == 0;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int a = r >> 1, hf = r & 1;
    const int row = wrow + 16 * a + 8 * hf + g;
    if (row >= q_rows) continue;
    const float mr = m[r];  // raw score units
    store_row(p, h, q_row0, row, o[a], hf, l[r], pair, t4, [&](float s) { return (mr * sl2 + log2f(s)) * kLn2; });
  }
}

template <int DT, int VT>
void launch_impl3(const FlashKernelArgs& args, cudaStream_t stream) {
  constexpr size_t smem = flash3_smem_bytes<DT, VT>();
  auto kernel = attention_flash3_kernel<DT, VT>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(args.p.heads),
                  static_cast<unsigned>((args.p.max_q_len + kBr3 - 1) / kBr3), static_cast<unsigned>(args.p.seqs));
  kernel<<<grid, kThreads3, smem, stream>>>(args);
  CUDA_CHECK_LAUNCH();
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }
bool operand_vec(const AttnOperand& o) {
  return aligned16(o.ptr) && o.row_stride % 8 == 0 && o.head_stride % 8 == 0;
}

template <int BR, int DT, int VT, bool QREG, int MIN_BLOCKS>
void launch_impl(const FlashKernelArgs& args, cudaStream_t stream) {
  constexpr size_t smem = flash_smem_bytes<BR, DT, VT>();
  auto kernel = attention_flash_kernel<BR, DT, VT, QREG, MIN_BLOCKS>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  if (MIN_BLOCKS > 1)  // the whole 228 KB as shared memory, so that MIN_BLOCKS blocks fit on one SM
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    static_cast<int>(cudaSharedmemCarveoutMaxShared)));
  const dim3 grid(static_cast<unsigned>(args.p.heads), static_cast<unsigned>((args.p.max_q_len + BR - 1) / BR),
                  static_cast<unsigned>(args.p.seqs));
  kernel<<<grid, BR * 2, smem, stream>>>(args);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

bool flash_supports(int P, int R, int V) { return P + R <= 256 && V <= 256 && P >= 0 && R >= 0 && V > 0; }

void launch_attention_flash(const FlashParams& p, cudaStream_t stream) {
  if (!flash_supports(p.P, p.R, p.V))
    throw EngineError("attention_mha (flash): head dims " + std::to_string(p.P) + " + " + std::to_string(p.R) +
                      ", v " + std::to_string(p.V) + " exceed the kernel's 256 / 256");
  if (p.heads == 0 || p.seqs == 0 || p.max_q_len == 0) return;
  if (p.version == 4) {  // the Hopper kernel where it covers the dims, else version 3
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    if (flash_wgmma_supports(p, device)) {
      launch_attention_flash_wgmma(p, stream);
      return;
    }
  }
  FlashKernelArgs args{p, false};
  args.vec = p.P % 8 == 0 && p.R % 8 == 0 && p.V % 8 == 0 && operand_vec(p.q_nope) && operand_vec(p.q_pe) &&
             operand_vec(p.k_nope) && operand_vec(p.k_pe) && operand_vec(p.v);
  // 128-row blocks (8 warps), one per SM. Measured on an H200: 64-row blocks of 4 warps, two per
  // SM (112 KB each), ran DeepSeek-V3's T = 4096 attention in 4.61 ms against 3.72 ms for these.
  // Version 3 (256-row blocks, 32 rows per warp) for D ≤ 192 / V ≤ 128; wider dims keep version 2's kernel.
  const bool narrow = p.P + p.R <= 192 && p.V <= 128;
  if (narrow && p.version >= 3) launch_impl3<192, 128>(args, stream);
  else if (narrow) launch_impl<128, 192, 128, true, 1>(args, stream);
  else launch_impl<128, 256, 256, false, 1>(args, stream);
}

}  // namespace mla::cuda
