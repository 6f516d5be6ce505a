// attention_mqa version 3 (mqa_kernel=3): the absorbed decode on Hopper's warpgroup MMA (wgmma) with TMA loads of
// the cache pages — FlashMLA's plan. Same contract as version 2 (attention_mqa_split.cuh): split-KV over the paged
// latent cache, each split's normalised partial output and lse, then the shared combine pass (with one split the
// kernel writes the output and lse itself).
//
// A block owns 64 query rows (row = i·heads + h of one sequence) and one split of its pages; one page [64 keys,
// 576 lanes] is one tile, brought by nine TMA loads (64 keys x 64 lanes each, 128-byte swizzle) into a two-page
// ring; an mbarrier per slot says "landed" (the bytes) and one says "free" (all eight warps are done with it). Two
// warpgroups:
//   warpgroup 0        S = Q·Kᵀ for the tile (64x64, k = 576: 32 wgmma steps with Q from shared memory, the last 4
//                      with Q's rope lanes held in registers), the online softmax on its accumulators (fp32, log2
//                      units), P as hi = bf16(p) and lo = bf16(p − hi) — in registers for itself and into shared
//                      memory for warpgroup 1 — then O[:, 0:256] += P·V with P from registers;
//   warpgroup 1        O[:, 256:512] += P·V with P from shared memory, one tile behind: it runs while warpgroup 0
//                      computes the next tile's scores. Its first thread issues the loads: the first two pages at
//                      the start, page i + 2 once page i's slot is free.
// Two named barriers hand P over: "P ready" (warpgroup 0 wrote P and the rows' rescale) and "P free" (warpgroup 1's
// MMAs that read it are done). P·V uses both parts of P for the reason attention_mqa_split.cu gives.
//
// Shared memory (bytes): Q 8 chunks x 8 KB (lanes 0..511), the ring 2 x 9 x 8 KB, P hi and lo 2 x 8 KB, the rows'
// rescale, l and m, four mbarriers: 230,176 of the 232,448 a block may have.
#include <algorithm>
#include <cmath>

#include "kernels/attention_mqa_split.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/mma_util.cuh"
#include "kernels/tensor_map.cuh"
#include "kernels/wgmma.cuh"

namespace mla::cuda {

namespace {

constexpr int kRows = 64, kKeys = 64, kLanes = 576, kChunk = 64;
constexpr int kChunks = kLanes / kChunk;          // 9 chunks of 64 lanes in a cache row
constexpr int kQChunks = 8;                       // Q lanes 0..511 in shared memory; 512..575 in registers
constexpr uint32_t kChunkBytes = kKeys * kChunk * 2;  // 8 KB
constexpr uint32_t kTileBytes = kChunks * kChunkBytes;
constexpr int kThreads = 256;  // two warpgroups
[[maybe_unused]] constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

constexpr uint32_t kOffQ = 0, kOffKV = kOffQ + kQChunks * kChunkBytes, kOffP = kOffKV + 2 * kTileBytes,
                   kOffCorr = kOffP + 2 * kChunkBytes, kOffL = kOffCorr + kRows * 4, kOffM = kOffL + kRows * 4,
                   kOffBar = kOffM + kRows * 4, kSmemUsed = kOffBar + 4 * 8;
constexpr size_t kSmemBytes = kSmemUsed + 1024;  // room to align the base to an atom
static_assert(kSmemBytes <= 232448, "a block's shared memory on sm_90");

// Named barriers between the two warpgroups (kBarWg0: warpgroup 0 alone).
[[maybe_unused]] constexpr int kBarPReady = 1, kBarPFree = 2, kBarWg0 = 3, kBarRows = 4;

struct WgArgs {
  MqaSplitParams p;
  const int* seq_new_start;
  const int* seq_new_len;
  const int* seq_total_len;
  const int* block_table;
  int max_blocks;
  int tiles_per_split;
  float* o_part;    // [splits, T·heads, L]
  float* lse_part;  // [splits, T·heads] log2 units
  bf16* out;        // one split: the output itself [T·heads, L] and its natural-log lse, no combine pass
  float* lse;
};

// Byte offset of (row r, 16-byte unit j) in a 128-byte-swizzled chunk.
[[maybe_unused]] __device__ __forceinline__ uint32_t swz(int r, int j) { return r * 128 + ((j ^ (r & 7)) << 4); }

// Two bf16 of query row `orow` at lanes d, d + 1 of [q_latent (L) | q_pe (R) | 0].
[[maybe_unused]] __device__ __forceinline__ uint32_t q_pair(const MqaSplitParams& p, int64_t orow, int d) {
  if (d < p.L) return *reinterpret_cast<const uint32_t*>(p.q_latent + orow * p.L + d);
  if (d < p.L + p.R) return *reinterpret_cast<const uint32_t*>(p.q_pe + orow * p.R + (d - p.L));
  return 0u;
}

__global__ void __launch_bounds__(kThreads, 1) mqa_wgmma_kernel(const __grid_constant__ CUtensorMap tmap,
                                                                const WgArgs a) {
#ifdef MLA_SM90A
  using namespace sm90;
  const MqaSplitParams& p = a.p;
  const int grp = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int s_q = a.seq_new_len[b], total = a.seq_total_len[b];
  const int rows_seq = s_q * p.heads;
  const int row0 = grp * kRows;
  if (row0 >= rows_seq) return;
  const int rows_valid = min(kRows, rows_seq - row0);
  const int64_t TH = static_cast<int64_t>(p.tokens) * p.heads;
  const int64_t out_row0 = static_cast<int64_t>(a.seq_new_start[b]) * p.heads + row0;
  const int n_tiles = (total + kKeys - 1) / kKeys;
  const int t_begin = split * a.tiles_per_split, t_end = min(n_tiles, t_begin + a.tiles_per_split);
  if (t_begin >= t_end) {  // a split past the sequence's pages (with one split: a sequence of no keys)
    for (int r = threadIdx.x; r < rows_valid; r += kThreads) {
      if (!a.out) {
        a.lse_part[split * TH + out_row0 + r] = -INFINITY;
        continue;
      }
      a.lse[out_row0 + r] = -INFINITY;
      for (int d = 0; d < p.L; ++d) a.out[(out_row0 + r) * p.L + d] = __float2bfloat16_rn(0.f);
    }
    return;
  }
  const int n = t_end - t_begin;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (mma::smem_u32(smem_raw) + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - mma::smem_u32(smem_raw));
  const uint32_t sQ = base + kOffQ, sKV = base + kOffKV, sP = base + kOffP;
  float* sCorr = reinterpret_cast<float*>(smem + kOffCorr);
  float* sL = reinterpret_cast<float*>(smem + kOffL);
  float* sM = reinterpret_cast<float*>(smem + kOffM);
  const uint32_t bar_full = base + kOffBar, bar_free = bar_full + 16;  // [2] each

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    mbar_init(bar_full, 1);
    mbar_init(bar_full + 8, 1);
    mbar_init(bar_free, 8);
    mbar_init(bar_free + 8, 8);
    mbar_init_fence();
  }
  // Q lanes 0..511 into shared memory, swizzled like the cache tiles (rows past the block's: zeros).
  if (threadIdx.x < 256) {
    for (int i = threadIdx.x; i < kRows * kQChunks * 8; i += 256) {
      const int r = i / (kQChunks * 8), u = i % (kQChunks * 8), c = u / 8, j = u % 8, d0 = u * 8;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (r < rows_valid) {
        const int64_t orow = out_row0 + r;
        v.x = q_pair(p, orow, d0);
        v.y = q_pair(p, orow, d0 + 2);
        v.z = q_pair(p, orow, d0 + 4);
        v.w = q_pair(p, orow, d0 + 6);
      }
      *reinterpret_cast<uint4*>(smem + kOffQ + c * kChunkBytes + swz(r, j)) = v;
    }
  }
  fence_proxy_async();
  __syncthreads();

  // The tile loads: thread 128 (warpgroup 1, which finishes with a tile last) issues the nine TMA loads of a page.
  const int* table = a.block_table + static_cast<int64_t>(b) * a.max_blocks;
  auto load_tile = [&](int i) {
    const int slot = i & 1;
    mbar_expect_tx(bar_full + 8 * slot, kTileBytes);
    const int row = table[t_begin + i] * kKeys;
    for (int c = 0; c < kChunks; ++c)
      tma_load_2d(sKV + slot * kTileBytes + c * kChunkBytes, &tmap, bar_full + 8 * slot, c * kChunk, row);
  };
  if (threadIdx.x == 128) {
    load_tile(0);
    if (n > 1) load_tile(1);
  }

  const int wg = warp >> 2, w = warp & 3, g = lane >> 2, t4 = lane & 3;
  const int r0 = 16 * w + g, r1 = r0 + 8;  // this thread's accumulator rows
  float o[128];                            // O[r0|r1, 256·wg + 8i + 2t4 + (0, 1)]
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;

  if (wg == 0) {
    // Q's lanes 512..575 as the A fragments of the last four k-steps.
    uint32_t qpe[4][4];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int d = 512 + 16 * s + 2 * t4;
      const int64_t o0 = out_row0 + r0, o1 = out_row0 + r1;
      qpe[s][0] = r0 < rows_valid ? q_pair(p, o0, d) : 0u;
      qpe[s][1] = r1 < rows_valid ? q_pair(p, o1, d) : 0u;
      qpe[s][2] = r0 < rows_valid ? q_pair(p, o0, d + 8) : 0u;
      qpe[s][3] = r1 < rows_valid ? q_pair(p, o1, d + 8) : 0u;
    }
    // Keys visible to rows r0, r1 (bottom-right causal).
    const int vis0 = r0 < rows_valid ? total - s_q + (row0 + r0) / p.heads + 1 : 0;
    const int vis1 = r1 < rows_valid ? total - s_q + (row0 + r1) / p.heads + 1 : 0;
    const float sl2 = p.scale * kLog2e;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    for (int i = 0; i < n; ++i) {
      const int slot = i & 1, t = t_begin + i;
      const uint32_t tile = sKV + slot * kTileBytes;
      mbar_wait(bar_full + 8 * slot, (i >> 1) & 1);

      float s[32];
#pragma unroll
      for (int k = 0; k < 32; ++k) s[k] = 0.f;
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 32; ++ks) {
        const uint32_t off = (ks >> 2) * kChunkBytes + (ks & 3) * 32;
        mma_m64n64k16_ss(s, smem_desc(sQ + off, 16, 1024), smem_desc(tile + off, 16, 1024), 1);
      }
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        mma_m64n64k16_rs(s, qpe[ks], smem_desc(tile + kQChunks * kChunkBytes + ks * 32, 16, 1024), 1);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(s);

      // Online softmax over rows r0 (s[4j], s[4j+1]) and r1 (s[4j+2], s[4j+3]), keys 8j + 2t4 + (0, 1).
      const int key0 = t * kKeys;
      float mx0 = m0, mx1 = m1;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = key0 + 8 * j + 2 * t4 + e;
          s[4 * j + e] = key < vis0 ? s[4 * j + e] * sl2 : -INFINITY;
          s[4 * j + 2 + e] = key < vis1 ? s[4 * j + 2 + e] * sl2 : -INFINITY;
          mx0 = fmaxf(mx0, s[4 * j + e]);
          mx1 = fmaxf(mx1, s[4 * j + 2 + e]);
        }
#pragma unroll
      for (int off = 1; off < 4; off <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
      }
      const float b0 = mx0 == -INFINITY ? 0.f : mx0, b1 = mx1 == -INFINITY ? 0.f : mx1;
      const float c0 = mma::exp2_approx(m0 - b0), c1 = mma::exp2_approx(m1 - b1);
      m0 = mx0;
      m1 = mx1;
      uint32_t ph[4][4], pl[4][4];  // A fragments of P·V's four k-steps (16 keys each)
      float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float e00 = mma::exp2_approx(s[4 * j] - b0), e01 = mma::exp2_approx(s[4 * j + 1] - b0);
        const float e10 = mma::exp2_approx(s[4 * j + 2] - b1), e11 = mma::exp2_approx(s[4 * j + 3] - b1);
        sum0 += e00 + e01;
        sum1 += e10 + e11;
        const uint32_t h0 = mma::pack_bf16(e00, e01), h1 = mma::pack_bf16(e10, e11);
        const uint32_t q0 = mma::pack_bf16(e00 - __uint_as_float(h0 << 16), e01 - __uint_as_float(h0 & 0xffff0000u));
        const uint32_t q1 = mma::pack_bf16(e10 - __uint_as_float(h1 << 16), e11 - __uint_as_float(h1 & 0xffff0000u));
        ph[j >> 1][2 * (j & 1)] = h0;
        ph[j >> 1][2 * (j & 1) + 1] = h1;
        pl[j >> 1][2 * (j & 1)] = q0;
        pl[j >> 1][2 * (j & 1) + 1] = q1;
      }
      l0 = l0 * c0 + sum0;
      l1 = l1 * c1 + sum1;

      // The tile's key rows past the sequence hold whatever the page held: zero their V lanes (p is 0 there, and
      // 0 · NaN would not be).
      const int valid = min(kKeys, total - key0);
      if (valid < kKeys) {
        for (int k = threadIdx.x; k < (kKeys - valid) * kQChunks * 8; k += 128) {
          const int r = valid + k / (kQChunks * 8), u = k % (kQChunks * 8);
          *reinterpret_cast<uint4*>(smem + kOffKV + slot * kTileBytes + (u >> 3) * kChunkBytes + r * 128 +
                                    (u & 7) * 16) = make_uint4(0u, 0u, 0u, 0u);
        }
      }
      // Hand P and the rescale to warpgroup 1 once it is done with the previous tile's.
      if (i > 0) bar_sync(kBarPFree, 256);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int kk = j >> 1, hf = 2 * (j & 1);
        *reinterpret_cast<uint32_t*>(smem + kOffP + swz(r0, j) + 4 * t4) = ph[kk][hf];
        *reinterpret_cast<uint32_t*>(smem + kOffP + swz(r1, j) + 4 * t4) = ph[kk][hf + 1];
        *reinterpret_cast<uint32_t*>(smem + kOffP + kChunkBytes + swz(r0, j) + 4 * t4) = pl[kk][hf];
        *reinterpret_cast<uint32_t*>(smem + kOffP + kChunkBytes + swz(r1, j) + 4 * t4) = pl[kk][hf + 1];
      }
      if (t4 == 0) {
        sCorr[r0] = c0;
        sCorr[r1] = c1;
      }
      fence_proxy_async();
      bar_arrive(kBarPReady, 256);
      if (valid < kKeys) bar_sync(kBarWg0, 128);  // the zeroed rows, before this warpgroup's own P·V

#pragma unroll
      for (int k = 0; k < 32; ++k) {
        o[4 * k] *= c0;
        o[4 * k + 1] *= c0;
        o[4 * k + 2] *= c1;
        o[4 * k + 3] *= c1;
      }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint64_t dv = smem_desc(tile + kk * 2048, kChunkBytes, 1024);
        mma_m64n256k16_rs_bmn(o, ph[kk], dv, 1);
        mma_m64n256k16_rs_bmn(o, pl[kk], dv, 1);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(o);
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_free + 8 * slot);
    }
    // The rows' sums over the quad, for both warpgroups.
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
      l0 += __shfl_xor_sync(0xffffffffu, l0, off);
      l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
    if (t4 == 0) {
      sL[r0] = l0;
      sL[r1] = l1;
      sM[r0] = m0;
      sM[r1] = m1;
    }
    bar_arrive(kBarRows, 256);
    __syncwarp();
  } else {
    for (int i = 0; i < n; ++i) {
      const int slot = i & 1;
      const uint32_t tile = sKV + slot * kTileBytes;
      mbar_wait(bar_full + 8 * slot, (i >> 1) & 1);
      bar_sync(kBarPReady, 256);
      const float c0 = sCorr[r0], c1 = sCorr[r1];
#pragma unroll
      for (int k = 0; k < 32; ++k) {
        o[4 * k] *= c0;
        o[4 * k + 1] *= c0;
        o[4 * k + 2] *= c1;
        o[4 * k + 3] *= c1;
      }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint64_t dv = smem_desc(tile + 4 * kChunkBytes + kk * 2048, kChunkBytes, 1024);
        mma_m64n256k16_ss_bmn(o, smem_desc(sP + kk * 32, 16, 1024), dv, 1);
        mma_m64n256k16_ss_bmn(o, smem_desc(sP + kChunkBytes + kk * 32, 16, 1024), dv, 1);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(o);
      if (i + 1 < n) bar_arrive(kBarPFree, 256);
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_free + 8 * slot);
      if (threadIdx.x == 128 && i + 2 < n) {  // once all eight warps are done with the slot: the page after next
        mbar_wait(bar_free + 8 * slot, (i >> 1) & 1);
        load_tile(i + 2);
      }
      __syncwarp();
    }
    bar_sync(kBarRows, 256);
  }

  // Each warpgroup writes its 256 lanes of the normalised partial output; warpgroup 0 the lse. With one split,
  // what the combine pass would make of it: the bf16 output and the natural-log lse (0 and −inf for a row that saw
  // no key).
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = hf ? r1 : r0;
    if (r >= rows_valid) continue;
    const float l = sL[r], inv = l > 0.f ? 1.0f / l : 0.f;
    const int64_t orow = out_row0 + r;
    if (a.out) {
      bf16* dst = a.out + orow * p.L;
#pragma unroll
      for (int k = 0; k < 32; ++k) {
        const int col = 256 * wg + 8 * k + 2 * t4;
        if (col < p.L)
          *reinterpret_cast<uint32_t*>(dst + col) =
              mma::pack_bf16(o[4 * k + 2 * hf] * inv, o[4 * k + 2 * hf + 1] * inv);
      }
      if (wg == 0 && t4 == 0) a.lse[orow] = l > 0.f ? (sM[r] + log2f(l)) * kLn2 : -INFINITY;
    } else {
      float* dst = a.o_part + (split * TH + orow) * p.L;
#pragma unroll
      for (int k = 0; k < 32; ++k) {
        const int col = 256 * wg + 8 * k + 2 * t4;
        if (col < p.L)
          *reinterpret_cast<float2*>(dst + col) = make_float2(o[4 * k + 2 * hf] * inv, o[4 * k + 2 * hf + 1] * inv);
      }
      if (wg == 0 && t4 == 0) a.lse_part[split * TH + orow] = l > 0.f ? sM[r] + log2f(l) : -INFINITY;
    }
  }
#else
  __trap();  // built without sm_90a code: sm90a_available() said no, and nothing launches this
#endif
}

// The cache [rows, L + R] bf16 as a 2-D tensor for TMA: boxes of 64 rows x 64 lanes, 128-byte swizzle, lanes past
// L + R read as zeros.
CUtensorMap cache_map(const MqaSplitParams& p) {
  const uint64_t dims[2] = {static_cast<uint64_t>(p.L + p.R), static_cast<uint64_t>(p.cache_rows)};
  const uint64_t strides[1] = {static_cast<uint64_t>(p.L + p.R) * sizeof(bf16)};
  const uint32_t box[2] = {kChunk, kKeys};
  return tensor_map_bf16(p.cache, 2, dims, strides, box, "attention_mqa (wgmma): the latent cache");
}
}  // namespace

void launch_attention_mqa_wgmma(const MqaSplitParams& p, RankContext& rc) {
  if (!mqa_split_supports(p.L, p.R))
    throw EngineError("attention_mqa (wgmma): L " + std::to_string(p.L) + ", R " + std::to_string(p.R) +
                      " outside the kernel's L <= 512, L + R <= 576, multiples of 8");
  if (!sm90a_available(rc.device()))
    throw EngineError(
        "attention_mqa (wgmma): needs an sm_90 GPU and a build for sm_90a (CMAKE_CUDA_ARCHITECTURES=90a)");
  const DeviceBatch& db = rc.batch();
  if (p.tokens == 0 || p.heads == 0 || db.seqs == 0) return;
  const int rows_seq = db.max_new * p.heads;
  const int groups = (rows_seq + kRows - 1) / kRows;
  const MqaSplitPlan plan = mqa_split_plan(rc, groups, kKeys);
  const int splits = plan.splits, per = plan.tiles_per_split;

  const int64_t TH = static_cast<int64_t>(p.tokens) * p.heads;
  WgArgs a;
  a.p = p;
  a.seq_new_start = db.i32(db.seq_new_start);
  a.seq_new_len = db.i32(db.seq_new_len);
  a.seq_total_len = db.i32(db.seq_total_len);
  a.block_table = p.block_table ? p.block_table : db.i32(db.block_table);
  a.max_blocks = db.max_blocks;
  a.tiles_per_split = per;
  a.out = splits == 1 ? p.out : nullptr;
  a.lse = splits == 1 ? p.lse : nullptr;
  a.o_part = splits == 1 ? nullptr : rc.scratch_as<float>("mqa.o_part", splits * TH * p.L);
  a.lse_part = splits == 1 ? nullptr : rc.scratch_as<float>("mqa.lse_part", splits * TH);
  const CUtensorMap map = cache_map(p);
  CUDA_CHECK(cudaFuncSetAttribute(mqa_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kSmemBytes)));
  const dim3 grid(static_cast<unsigned>(groups), static_cast<unsigned>(splits), static_cast<unsigned>(db.seqs));
  mqa_wgmma_kernel<<<grid, kThreads, kSmemBytes, rc.stream()>>>(map, a);
  CUDA_CHECK_LAUNCH();
  if (splits > 1) launch_mqa_combine(a.o_part, a.lse_part, splits, TH, p.L, p.out, p.lse, rc.stream());
}

}  // namespace mla::cuda
