// attention_mha version 4 (mha_kernel=4): the flash attention of attention_flash.cu on Hopper's warpgroup MMA
// (wgmma) with TMA loads — FlashAttention-3's plan, for the head dims of DeepSeek / Kimi (D = P + R = 192, V = 128)
// and GLM-4.7-Flash / GLM-5 (256 / 256). Same contract as versions 2 and 3 (FlashParams): causal (bottom-right) or
// not, a sliding window or a selection's bitmaps (DSA's top-k), bf16 or fp32 output and the natural-log lse.
//
// A block owns 128 query rows of one head of one sequence and walks BC-key tiles (128 keys for D 192, 64 for D 256,
// so that S and O fit the registers) of K and V through a two-slot ring in shared memory. Three warpgroups:
//   the producer (warpgroup 0, its registers given back to the others: setmaxnreg 40 / 232): one thread issues the
//     TMA loads — Q once (3-D maps over [rows, heads, lanes], 64-lane boxes with the 128-byte swizzle that wgmma
//     reads), then K(i) and V(i), each on an mbarrier of its own ("full" counts the bytes in); K(i + 2) waits until
//     both consumers' S(i) is done, V(i + 2) until their P·V(i) is ("free", eight warps);
//   two consumers of 64 query rows each: S(0) = Q·K(0)ᵀ first, then per tile i: S(i + 1) issued (wgmma, Q and K from
//     shared memory, D / 16 k-steps), O += P(i)·V(i) issued behind it (P from registers, V read N-major), the
//     softmax of tile i + 1 on S(i + 1)'s accumulators while P·V(i) runs on the tensor cores (FlashAttention-3's
//     intra-warpgroup overlap), then O rescaled and P(i + 1) packed to bf16. The softmax: the mask, the rows' max,
//     p = 2^(s·scale·log2e − m) as one FFMA and one ex2, in fp32 log2 units; O rescaled only where some row's max
//     moved. The two consumers run the same tiles independently, so one's softmax also overlaps the other's MMAs.
// Keys past a sequence's end in its last tile are masked in S; their V rows (another sequence's or zeros) are zeroed
// by the producer's warp before the tile is handed over, so that a NaN there cannot leak into this sequence
// (0 · NaN is NaN). A consumer skips the tiles past its own rows' last key (the causal diagonal), releasing them as
// they land; query tiles are issued heaviest first. With a selection a block walks the tiles up to its rows' last
// selected key (FlashParams::keep_reach) and each consumer loads the tile's bits of its rows from global memory
// while the previous tile's P·V runs.
//
// Shared memory: Q 128 rows x D, two slots of K (BC x D) and V (BC x V), ten mbarriers: 213,072 bytes for D 192
// (BC 128), 196,688 for D 256 (BC 64), of the 232,448 a block may have (plus 1 KB to align them).
#include <algorithm>
#include <cmath>

#include "kernels/attention_flash.cuh"
#include "kernels/attention_flash_store.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/flash_block_order.h"
#include "kernels/mma_util.cuh"
#include "kernels/tensor_map.cuh"
#include "kernels/wgmma.cuh"

namespace mla::cuda {

namespace {

constexpr int kBr = 128;
[[maybe_unused]] constexpr int kConsumerWarps = 8;
[[maybe_unused]] constexpr int kWgRows = 64;
constexpr int kLanes = 64;  // lanes of a TMA box and of a swizzled chunk row
[[maybe_unused]] constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

template <int DT, int VT, int BC>
struct Shape {
  static constexpr int kDChunks = DT / kLanes, kVChunks = VT / kLanes;
  static constexpr uint32_t kQChunkBytes = kBr * 128, kKvChunkBytes = BC * 128;
  static constexpr uint32_t kQBytes = kDChunks * kQChunkBytes;
  static constexpr uint32_t kKBytes = kDChunks * kKvChunkBytes, kVBytes = kVChunks * kKvChunkBytes;
  static constexpr uint32_t kSlotBytes = kKBytes + kVBytes;
  static constexpr uint32_t kOffSlots = kQBytes, kOffBar = kOffSlots + 2 * kSlotBytes;
  static constexpr size_t kSmemBytes = kOffBar + 10 * 8 + 1024;  // + room to align the base to a 1024-byte atom
  static_assert(kSmemBytes <= 232448, "a block's shared memory on sm_90");
};

struct WgArgs {
  CUtensorMap qn, qp, kn, kp, v;  // q_nope, q_pe, k_nope, k_pe, v as [rows, heads (1 when shared), lanes]
  FlashParams p;
  int qp_head, kp_head;  // 1: q_pe / k_pe per head; 0: one vector per row (head coordinate 0)
  int n_qblocks;         // query blocks of the longest sequence
  int head_group;        // heads whose blocks run together (the block order below)
};

template <int N>
__device__ __forceinline__ void zero(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) d[i] = 0.f;
}

// A selection's bits (FlashParams::keep) of one row for the BC keys of a tile: word j / 4 holds key 8j + 2t4 + e at
// bit 8(j % 4) + 2t4 + e.
template <int BC>
struct TileKeep {
  uint32_t w[BC / 32];
};
// Row `row`'s bits for the tile from key kbase (a multiple of BC; the row's words 16-byte aligned); none for nullptr.
template <int BC>
__device__ __forceinline__ TileKeep<BC> load_keep(const uint32_t* row, int kbase) {
  TileKeep<BC> k{};
  if (row == nullptr) return k;
  if constexpr (BC == 128) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + kbase / 32));
    k.w[0] = v.x, k.w[1] = v.y, k.w[2] = v.z, k.w[3] = v.w;
  } else {
    static_assert(BC == 64);
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(row + kbase / 32));
    k.w[0] = v.x, k.w[1] = v.y;
  }
  return k;
}

// One tile's online softmax on a thread's two rows r0 (s[4j], s[4j + 1]) and r1 (s[4j + 2], s[4j + 3]), keys
// kbase + 8j + 2t4 + (0, 1): the mask where asked (keys at or past lim, or before lo, or, with a selection (SEL),
// whose bit in k0 / k1 is clear), the rows' max over the quad (raw score units), s replaced by p = 2^(s·sl2 − m·sl2),
// l by l·c + Σp, and c = 2^((m_old − m)·sl2), the factor O is to be rescaled by; returns whether any row of the warp
// moved its max (else c is 1 for all of them).
template <int BC, bool SEL>
__device__ __forceinline__ bool tile_softmax(float (&s)[BC / 2], int kbase, bool mask, int lim0, int lo0, int lim1,
                                             int lo1, const TileKeep<BC>& k0, const TileKeep<BC>& k1, int t4, float sl2,
                                             float& m0, float& m1, float& l0, float& l1, float& c0, float& c1) {
  if (mask) {
#pragma unroll
    for (int j = 0; j < BC / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = kbase + 8 * j + 2 * t4 + e, bit = 8 * (j & 3) + 2 * t4 + e;
        if (key >= lim0 || key < lo0 || (SEL && !((k0.w[j >> 2] >> bit) & 1u))) s[4 * j + e] = -INFINITY;
        if (key >= lim1 || key < lo1 || (SEL && !((k1.w[j >> 2] >> bit) & 1u))) s[4 * j + 2 + e] = -INFINITY;
      }
  }
  float mx0 = m0, mx1 = m1;
#pragma unroll
  for (int j = 0; j < BC / 8; ++j) {
    mx0 = fmaxf(mx0, fmaxf(s[4 * j], s[4 * j + 1]));
    mx1 = fmaxf(mx1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
  }
  const float nb0 = mx0 == -INFINITY ? 0.f : -mx0 * sl2, nb1 = mx1 == -INFINITY ? 0.f : -mx1 * sl2;
  const bool moved = __any_sync(0xffffffffu, mx0 != m0 || mx1 != m1);
  c0 = c1 = 1.f;
  if (moved) {
    c0 = mma::exp2_approx(fmaf(m0, sl2, nb0));  // 0 while m was −inf
    c1 = mma::exp2_approx(fmaf(m1, sl2, nb1));
  }
  m0 = mx0;
  m1 = mx1;
  float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
  for (int j = 0; j < BC / 8; ++j) {
    s[4 * j] = mma::exp2_approx(fmaf(s[4 * j], sl2, nb0));
    s[4 * j + 1] = mma::exp2_approx(fmaf(s[4 * j + 1], sl2, nb0));
    s[4 * j + 2] = mma::exp2_approx(fmaf(s[4 * j + 2], sl2, nb1));
    s[4 * j + 3] = mma::exp2_approx(fmaf(s[4 * j + 3], sl2, nb1));
    sum0 += s[4 * j] + s[4 * j + 1];
    sum1 += s[4 * j + 2] + s[4 * j + 3];
  }
  l0 = l0 * c0 + sum0;
  l1 = l1 * c1 + sum1;
  return moved;
}

// P (bf16) as the A fragments of P·V's k-steps of 16 keys.
template <int BC>
__device__ __forceinline__ void pack_p(const float (&s)[BC / 2], uint32_t (&pa)[BC / 16][4]) {
#pragma unroll
  for (int j = 0; j < BC / 8; ++j) {
    pa[j >> 1][2 * (j & 1)] = mma::pack_bf16(s[4 * j], s[4 * j + 1]);
    pa[j >> 1][2 * (j & 1) + 1] = mma::pack_bf16(s[4 * j + 2], s[4 * j + 3]);
  }
}

template <int NV>
__device__ __forceinline__ void rescale(float (&o)[NV], float c0, float c1) {
#pragma unroll
  for (int k = 0; k < NV / 4; ++k) {
    o[4 * k] *= c0;
    o[4 * k + 1] *= c0;
    o[4 * k + 2] *= c1;
    o[4 * k + 3] *= c1;
  }
}

constexpr int kThreads = 384;  // three warpgroups
// SEL: FlashParams::keep is set (a selection); a template parameter so that the causal kernels carry none of it.
template <int DT, int VT, int BC, bool SEL>
__global__ void __launch_bounds__(kThreads, 1) flash_wgmma_kernel(const __grid_constant__ WgArgs a) {
#ifdef MLA_SM90A
  using namespace sm90;
  using S = Shape<DT, VT, BC>;
  const FlashParams& p = a.p;
  // Blocks in groups of heads that share L2 (kernels/flash_block_order.h).
  const FlashBlock blk = flash_block(static_cast<int>(blockIdx.x), a.n_qblocks, p.heads, a.head_group);
  const int h = blk.head, b = blockIdx.z;
  const int q_len = p.seq_q_len[b];
  const int q0 = blk.qblock * kBr;
  if (q0 >= q_len) return;
  const int k_len = p.seq_k_len[b];
  const int q_rows = min(kBr, q_len - q0);
  const int offset = k_len - q_len;
  const int64_t q_row0 = p.seq_q_start[b] + q0;
  const int k_row0 = p.seq_k_start[b];
  int n_keys = max(0, p.causal ? min(k_len, q0 + q_rows + offset) : k_len);
  if constexpr (SEL) {  // the keys up to the block's last selected one (each warp finds it)
    int reach = 0;
    for (int r = threadIdx.x & 31; r < q_rows; r += 32) reach = max(reach, __ldg(p.keep_reach + q_row0 + r));
    n_keys = min(k_len, __reduce_max_sync(0xffffffffu, reach));
  }
  const int n_tiles = (n_keys + BC - 1) / BC;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (mma::smem_u32(smem_raw) + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - mma::smem_u32(smem_raw));
  const uint32_t sQ = base, sSlots = base + S::kOffSlots;
  // mbarriers: Q, then [2] each of K full, V full, K free, V free, then the last tile's V before its zeroing.
  const uint32_t bar_q = base + S::kOffBar, full_k = bar_q + 8, full_v = bar_q + 24, free_k = bar_q + 40,
                 free_v = bar_q + 56, bar_tail = bar_q + 72;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    mbar_init(bar_q, 1);
    for (int i = 0; i < 2; ++i) {
      mbar_init(full_k + 8 * i, 1);
      mbar_init(full_v + 8 * i, 1);
      mbar_init(free_k + 8 * i, kConsumerWarps);
      mbar_init(free_v + 8 * i, kConsumerWarps);
    }
    mbar_init(bar_tail, 1);
    mbar_init_fence();
  }
  __syncthreads();

  if (warp < 4) {  // the producer: its first warp (lane 0 issues, all 32 lanes zero the tail)
    setmaxnreg_dec<40>();
    if (warp != 0) return;
    const int p_chunks = p.P / kLanes;  // chunks from q_nope / k_nope; the rest from q_pe / k_pe
    if (lane == 0) {
      mbar_expect_tx(bar_q, S::kQBytes);
      for (int c = 0; c < S::kDChunks; ++c) {
        const uint32_t dst = sQ + c * S::kQChunkBytes;
        if (c < p_chunks) tma_load_3d(dst, &a.qn, bar_q, c * kLanes, h, static_cast<int>(q_row0));
        else tma_load_3d(dst, &a.qp, bar_q, (c - p_chunks) * kLanes, h * a.qp_head, static_cast<int>(q_row0));
      }
    }
    for (int i = 0; i < n_tiles; ++i) {
      const int slot = i & 1, row = k_row0 + i * BC;
      const uint32_t sK = sSlots + slot * S::kSlotBytes, sV = sK + S::kKBytes;
      // The sequence's last tile when it ends inside it (one per block at most): its V lands on bar_tail, the warp
      // zeroes the rows past the keys, then full_v is arrived on by hand.
      const bool tail = i * BC + BC > k_len;
      const uint32_t v_bar = tail ? bar_tail : full_v + 8 * slot;
      if (lane == 0) {
        if (i >= 2) mbar_wait(free_k + 8 * slot, ((i >> 1) - 1) & 1);
        mbar_expect_tx(full_k + 8 * slot, S::kKBytes);
        for (int c = 0; c < S::kDChunks; ++c) {
          const uint32_t dst = sK + c * S::kKvChunkBytes;
          if (c < p_chunks) tma_load_3d(dst, &a.kn, full_k + 8 * slot, c * kLanes, h, row);
          else tma_load_3d(dst, &a.kp, full_k + 8 * slot, (c - p_chunks) * kLanes, h * a.kp_head, row);
        }
        if (i >= 2) mbar_wait(free_v + 8 * slot, ((i >> 1) - 1) & 1);
        mbar_expect_tx(v_bar, S::kVBytes);
        for (int c = 0; c < S::kVChunks; ++c) tma_load_3d(sV + c * S::kKvChunkBytes, &a.v, v_bar, c * kLanes, h, row);
      }
      if (tail) {
        mbar_wait(bar_tail, 0);
        const int valid = k_len - i * BC;
        for (int k = lane; k < (BC - valid) * S::kVChunks * 8; k += 32) {
          const int r = valid + k / (S::kVChunks * 8), u = k % (S::kVChunks * 8);
          *reinterpret_cast<uint4*>(smem + (sV - base) + (u >> 3) * S::kKvChunkBytes + r * 128 + (u & 7) * 16) =
              make_uint4(0u, 0u, 0u, 0u);
        }
        fence_proxy_async();
        __syncwarp();
        if (lane == 0) mbar_arrive(full_v + 8 * slot);
      }
    }
    return;
  }
  setmaxnreg_inc<232>();

  const int wg = (warp >> 2) - 1, w = warp & 3, g = lane >> 2, t4 = lane & 3;
  const int r0 = 16 * w + g, r1 = r0 + 8;
  const int wg_row = kWgRows * wg;
  const int i0 = q0 + wg_row + r0, i1 = i0 + 8;
  const int lim0 = p.causal ? min(k_len, i0 + 1 + offset) : k_len;
  const int lim1 = p.causal ? min(k_len, i1 + 1 + offset) : k_len;
  const int lo0 = p.window > 0 ? lim0 - p.window : 0, lo1 = p.window > 0 ? lim1 - p.window : 0;
  const int wg_keys =
      wg_row >= q_rows
          ? 0
          : (SEL ? n_keys : (p.causal ? max(0, min(k_len, q0 + min(wg_row + kWgRows, q_rows) + offset)) : k_len));
  const int wg_full = SEL ? 0 : (p.causal ? min(k_len, q0 + wg_row + 1 + offset) : k_len);
  const int n_wg = (wg_keys + BC - 1) / BC;  // the tiles this warpgroup computes (the first n_wg)
  const float sl2 = p.scale * kLog2e;
  const uint32_t* keep0 = SEL && wg_row + r0 < q_rows ? p.keep + (q_row0 + wg_row + r0) * p.keep_words : nullptr;
  const uint32_t* keep1 = SEL && wg_row + r1 < q_rows ? p.keep + (q_row0 + wg_row + r1) * p.keep_words : nullptr;
  TileKeep<BC> k0{}, k1{};  // the selection's bits of the tile the next softmax masks

  float o[VT / 2], s[BC / 2];
  uint32_t pa[BC / 16][4];
  zero(o);
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  auto release = [&](uint32_t bar, int i) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar + 8 * (i & 1));
  };
  auto issue_s = [&](int i) {  // S(i) = Q·K(i)ᵀ, committed, not waited for
    const uint32_t sK = sSlots + (i & 1) * S::kSlotBytes;
    mbar_wait(full_k + 8 * (i & 1), (i >> 1) & 1);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < DT / 16; ++ks) {  // the first k-step overwrites S (scale-d 0)
      const uint32_t koff = (ks & 3) * 32;
      const uint64_t da = smem_desc(sQ + (ks >> 2) * S::kQChunkBytes + wg_row * 128 + koff, 16, 1024);
      const uint64_t db = smem_desc(sK + (ks >> 2) * S::kKvChunkBytes + koff, 16, 1024);
      if constexpr (BC == 128) mma_m64n128k16_ss(s, da, db, ks > 0);
      else mma_m64n64k16_ss(s, da, db, ks > 0);
    }
    wgmma_commit();
  };
  auto issue_pv = [&](int i) {  // O += P(i)·V(i), committed
    const uint32_t sV = sSlots + (i & 1) * S::kSlotBytes + S::kKBytes;
    mbar_wait(full_v + 8 * (i & 1), (i >> 1) & 1);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      const uint64_t dv = smem_desc(sV + kk * 2048, S::kKvChunkBytes, 1024);
      if constexpr (VT == 128) mma_m64n128k16_rs_bmn(o, pa[kk], dv, 1);
      else mma_m64n256k16_rs_bmn(o, pa[kk], dv, 1);
    }
    wgmma_commit();
  };
  auto mask_of = [&](int i) { return i * BC + BC > wg_full || p.window > 0; };  // always with a selection
  auto keep_of = [&](int i) {  // its bits of tile i, loaded while the tensor cores run
    if constexpr (SEL) {
      k0 = load_keep<BC>(keep0, i * BC);
      k1 = load_keep<BC>(keep1, i * BC);
    }
  };

  mbar_wait(bar_q, 0);
  if (n_wg > 0) {
    float c0, c1;
    keep_of(0);
    issue_s(0);
    wgmma_wait<0>();
    fence_regs(s);
    release(free_k, 0);
    // (O is 0 still)
    tile_softmax<BC, SEL>(s, 0, mask_of(0), lim0, lo0, lim1, lo1, k0, k1, t4, sl2, m0, m1, l0, l1, c0, c1);
    pack_p<BC>(s, pa);
    for (int i = 0; i + 1 < n_wg; ++i) {  // (the last tile after the loop: no branch inside keeps ptxas overlapping)
      issue_s(i + 1);
      issue_pv(i);
      keep_of(i + 1);
      wgmma_wait<1>();  // S(i + 1); P·V(i) may still run
      fence_regs(s);
      release(free_k, i + 1);
      const bool moved = tile_softmax<BC, SEL>(s, (i + 1) * BC, mask_of(i + 1), lim0, lo0, lim1, lo1, k0, k1, t4,
                                               sl2, m0, m1, l0, l1, c0, c1);
      wgmma_wait<0>();
      fence_regs(o);
      release(free_v, i);
      if (moved) rescale(o, c0, c1);
      pack_p<BC>(s, pa);
    }
    issue_pv(n_wg - 1);
    wgmma_wait<0>();
    fence_regs(o);
    release(free_v, n_wg - 1);
  }
  for (int i = n_wg; i < n_tiles; ++i) {  // tiles past this warpgroup's rows: released as they land
    mbar_wait(full_k + 8 * (i & 1), (i >> 1) & 1);
    release(free_k, i);
    mbar_wait(full_v + 8 * (i & 1), (i >> 1) & 1);
    release(free_v, i);
  }

#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  const auto& o4 = *reinterpret_cast<const float(*)[VT / 8][4]>(o);
  const bool pair = (p.V & 1) == 0;
  if (wg_row + r0 < q_rows)
    store_row(p, h, q_row0, wg_row + r0, o4, 0, l0, pair, t4, [&](float l) { return (m0 * sl2 + log2f(l)) * kLn2; });
  if (wg_row + r1 < q_rows)
    store_row(p, h, q_row0, wg_row + r1, o4, 1, l1, pair, t4, [&](float l) { return (m1 * sl2 + log2f(l)) * kLn2; });
#else
  __trap();  // built without sm_90a code: sm90a_available() said no, and nothing launches this
#endif
}

// An operand [rows, heads, width] (head_stride 0: [rows, width], one vector a row) as a 3-D TMA map of boxes of
// `box_rows` rows x 1 head x 64 lanes.
CUtensorMap operand_map(const AttnOperand& o, int width, int heads, int64_t rows, int box_rows, const char* what) {
  const bool shared = o.head_stride == 0;
  const uint64_t dims[3] = {static_cast<uint64_t>(width), static_cast<uint64_t>(shared ? 1 : heads),
                            static_cast<uint64_t>(rows)};
  const uint64_t strides[2] = {static_cast<uint64_t>(shared ? o.row_stride : o.head_stride) * sizeof(bf16),
                               static_cast<uint64_t>(o.row_stride) * sizeof(bf16)};
  const uint32_t box[3] = {kLanes, 1, static_cast<uint32_t>(box_rows)};
  return tensor_map_bf16(o.ptr, 3, dims, strides, box, what);
}

// Heads per group of the block order, for one sequence's share of the keys.
int head_group(const FlashParams& p) {
  int dev = 0, l2 = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  return flash_head_group(l2, p.k_rows / std::max(1, p.seqs), p.P, p.V, p.heads);
}

template <int DT, int VT, int BC, bool SEL>
void launch_impl(const FlashParams& p, cudaStream_t stream) {
  WgArgs a;
  a.p = p;
  a.qn = operand_map(p.q_nope, p.P, p.heads, p.q_rows, kBr, "attention_mha (wgmma): q_nope");
  a.qp = operand_map(p.q_pe, p.R, p.heads, p.q_rows, kBr, "attention_mha (wgmma): q_pe");
  a.kn = operand_map(p.k_nope, p.P, p.heads, p.k_rows, BC, "attention_mha (wgmma): k_nope");
  a.kp = operand_map(p.k_pe, p.R, p.heads, p.k_rows, BC, "attention_mha (wgmma): k_pe");
  a.v = operand_map(p.v, p.V, p.heads, p.k_rows, BC, "attention_mha (wgmma): v");
  a.qp_head = p.q_pe.head_stride != 0;
  a.kp_head = p.k_pe.head_stride != 0;
  constexpr size_t smem = Shape<DT, VT, BC>::kSmemBytes;
  auto kernel = flash_wgmma_kernel<DT, VT, BC, SEL>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  a.n_qblocks = (p.max_q_len + kBr - 1) / kBr;
  a.head_group = head_group(p);
  const dim3 grid(static_cast<unsigned>(p.heads * a.n_qblocks), 1, static_cast<unsigned>(p.seqs));
  kernel<<<grid, kThreads, smem, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

bool tma_operand(const AttnOperand& o) {
  return (reinterpret_cast<uintptr_t>(o.ptr) & 15u) == 0 && o.row_stride % 8 == 0 && o.head_stride % 8 == 0 &&
         o.row_stride > 0;
}
}  // namespace

bool flash_wgmma_supports(const FlashParams& p, int device) {
  const int D = p.P + p.R;
  const bool dims = p.P > 0 && p.R > 0 && p.P % kLanes == 0 && p.R % kLanes == 0 &&
                    ((D == 192 && p.V == 128) || (D == 256 && p.V == 256));
  return dims && p.q_rows > 0 && p.k_rows > 0 && tma_operand(p.q_nope) && tma_operand(p.q_pe) &&
         tma_operand(p.k_nope) && tma_operand(p.k_pe) && tma_operand(p.v) && sm90a_available(device);
}

void launch_attention_flash_wgmma(const FlashParams& p, cudaStream_t stream) {
  if (p.heads == 0 || p.seqs == 0 || p.max_q_len == 0) return;
  const bool sel = p.keep != nullptr, narrow = p.P + p.R == 192;
  if (narrow && sel) launch_impl<192, 128, 128, true>(p, stream);
  else if (narrow) launch_impl<192, 128, 128, false>(p, stream);
  else if (sel) launch_impl<256, 256, 64, true>(p, stream);
  else launch_impl<256, 256, 64, false>(p, stream);
}

}  // namespace mla::cuda
