// attention_mqa version 2 (the default; version 1, attention_core.cuh, stays as the fallback and the tests
// run both): split-KV decode over the paged latent cache, FlashMLA's plan on mma.sync.
//
// A block owns one sequence's query rows (s_q × heads of them, 16 or 32 per block) and one split of its
// pages; one 64-row page [64, 576] is one tile, streamed through shared memory double-buffered with
// cp.async. Per tile: each of the 4 warps computes the scores of 16 keys for every row (Q re-read from
// shared memory, K = the whole 576-lane row); the block does the online softmax on those scores in shared
// memory (fp32, log2 units) and writes P as two bf16 parts, hi = bf16(p) and lo = bf16(p − hi); each warp then
// adds P·V = hi·V + lo·V for its 128 of the 512 latent lanes (V = the first L lanes of the same rows: K and V
// share the page). Two parts keep ~16 bits of p: with one bf16 P, attn_latent after three stacked tiny layers
// came to 2.8x the bf16 reference's error, over the calibrated tolerance; the extra MMAs are free while decode
// is memory-bound. Every split writes its normalised partial
// output and its lse; the combine pass weighs the splits by exp(lse) (the LSE merge, n-way) and writes
// bf16. Splits are chosen so that sequences × row groups × splits fills the multiprocessors about once:
// decode is memory-bound and one resident block per SM streams a page while computing the previous one.
#include <algorithm>
#include <cmath>

#include "kernels/attention_mqa_split.cuh"
#include "kernels/attention_mqa_tile.cuh"
#include "kernels/mma_util.cuh"

namespace mla::cuda {

namespace {
using namespace mma;

using mqa_tile::kBc, mqa_tile::kDT, mqa_tile::kLn2, mqa_tile::kLog2e, mqa_tile::kSP, mqa_tile::kSQ, mqa_tile::kSS,
    mqa_tile::kThreads, mqa_tile::kVT;
static_assert(kBc == kCachePage, "one tile = one page");

struct SplitArgs {
  MqaSplitParams p;
  const int* seq_new_start;  // [B]
  const int* seq_new_len;    // [B]
  const int* seq_total_len;  // [B]
  const int* block_table;    // [B, max_blocks]
  int max_blocks;
  int tiles_per_split;
  float* o_part;    // [splits, T·heads, L] normalised within the split
  float* lse_part;  // [splits, T·heads] log2 units; −inf: the split saw no key for the row
};

template <int MT>
__global__ void __launch_bounds__(kThreads, 1) mqa_split_kernel(const SplitArgs a) {
  constexpr int ROWS = 16 * MT, TPR = kThreads / ROWS, KPT = kBc / TPR;
  const MqaSplitParams& p = a.p;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);               // [ROWS][kSQ]
  bf16* sKV = sQ + ROWS * kSQ;                                // [2][kBc][kSQ]
  float* sS = reinterpret_cast<float*>(sKV + 2 * kBc * kSQ);  // [ROWS][kSS] scores, log2 units
  bf16* sP = reinterpret_cast<bf16*>(sS + ROWS * kSS);        // [ROWS][kSP] bf16(p)
  bf16* sPlo = sP + ROWS * kSP;                               // [ROWS][kSP] bf16(p − bf16(p))
  float* sCorr = reinterpret_cast<float*>(sPlo + ROWS * kSP); // [ROWS]
  float* sL = sCorr + ROWS;                                   // [ROWS]
  float* sM = sL + ROWS;                                      // [ROWS]

  const int grp = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int s_q = a.seq_new_len[b], total = a.seq_total_len[b];
  const int rows_seq = s_q * p.heads;  // row = i·heads + h
  const int row0 = grp * ROWS;
  if (row0 >= rows_seq) return;
  const int rows_valid = min(ROWS, rows_seq - row0);
  const int64_t TH = static_cast<int64_t>(p.tokens) * p.heads;
  const int64_t out_row0 = static_cast<int64_t>(a.seq_new_start[b]) * p.heads + row0;  // (token·heads + h) of row 0
  const int n_tiles = (total + kBc - 1) / kBc;
  const int t_begin = split * a.tiles_per_split, t_end = min(n_tiles, t_begin + a.tiles_per_split);
  if (t_begin >= t_end) {
    for (int r = threadIdx.x; r < rows_valid; r += kThreads) a.lse_part[split * TH + out_row0 + r] = -INFINITY;
    return;
  }
  const int W = p.L + p.R;

  // Q rows: [q_latent (L) | q_pe (R) | 0].
  for (int i = threadIdx.x; i < ROWS * (kDT / 8); i += kThreads) {
    const int r = i / (kDT / 8), d0 = (i % (kDT / 8)) * 8;
    const bf16* src = p.q_latent;
    bool ok = false;
    if (r < rows_valid) {
      const int64_t orow = out_row0 + r;
      if (d0 < p.L) {
        src = p.q_latent + orow * p.L + d0;
        ok = true;
      } else if (d0 < W) {
        src = p.q_pe + orow * p.R + (d0 - p.L);
        ok = true;
      }
    }
    cp_async_16(smem_u32(sQ + r * kSQ + d0), src, ok);
  }
  const int* table = a.block_table + static_cast<int64_t>(b) * a.max_blocks;
  auto load_page = [&](int t, int buf) {
    const int valid = min(kBc, total - t * kBc);
    const bf16* base = p.cache + static_cast<int64_t>(table[t]) * kBc * W;
    bf16* dst = sKV + buf * kBc * kSQ;
    for (int i = threadIdx.x; i < kBc * (kDT / 8); i += kThreads) {
      const int r = i / (kDT / 8), d0 = (i % (kDT / 8)) * 8;
      const bool ok = r < valid && d0 < W;
      cp_async_16(smem_u32(dst + r * kSQ + d0), ok ? base + r * W + d0 : p.cache, ok);
    }
  };
  load_page(t_begin, 0);
  cp_async_commit();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const uint32_t q_addr = smem_u32(sQ + (lane & 15) * kSQ + (lane >> 4) * 8);
  const uint32_t p_addr = smem_u32(sP + (lane & 15) * kSP + (lane >> 4) * 8);
  const uint32_t plo_addr = p_addr + ROWS * kSP * static_cast<uint32_t>(sizeof(bf16));
  const int kb_off = (16 * warp + ((lane >> 4) << 3) + (lane & 7)) * kSQ + ((lane >> 3) & 1) * 8;
  const int vb_off = ((((lane >> 3) & 1) << 3) + (lane & 7)) * kSQ + 128 * warp + (lane >> 4) * 8;
  const float sl2 = p.scale * kLog2e;

  // Keys visible to this thread's fragment rows (bottom-right causal: query i sees total − s_q + i + 1).
  int vis[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = mt * 16 + g + 8 * hf;
      vis[mt][hf] = r < rows_valid ? total - s_q + (row0 + r) / p.heads + 1 : 0;
    }
  // The softmax threads: TPR lanes per row, KPT keys each.
  const int srow = threadIdx.x / TPR, spart = threadIdx.x % TPR;
  float m_run = -INFINITY, l_run = 0.f;

  float o[MT][16][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int v = 0; v < 16; ++v) o[mt][v][0] = o[mt][v][1] = o[mt][v][2] = o[mt][v][3] = 0.f;

  for (int t = t_begin; t < t_end; ++t) {
    cp_async_wait<0>();
    __syncthreads();  // page t landed; the previous tile's readers are done with the other buffer and sP
    const int buf = (t - t_begin) & 1;
    if (t + 1 < t_end) load_page(t + 1, buf ^ 1);
    cp_async_commit();

    // Scores of keys [16·warp, 16·warp + 16) for all rows.
    float sc[MT][2][4];
    mqa_tile::scores<MT>(sc, smem_u32(sKV + buf * kBc * kSQ + kb_off), q_addr);
    const int key0 = t * kBc;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = mt * 16 + g + 8 * hf, key = 16 * warp + 8 * n + 2 * t4;
          const float x0 = key0 + key < vis[mt][hf] ? sc[mt][n][2 * hf] * sl2 : -INFINITY;
          const float x1 = key0 + key + 1 < vis[mt][hf] ? sc[mt][n][2 * hf + 1] * sl2 : -INFINITY;
          *reinterpret_cast<float2*>(sS + r * kSS + key) = make_float2(x0, x1);
        }
    __syncthreads();

    mqa_tile::online_softmax<KPT, TPR>(sS, sP, sPlo, sCorr, srow, spart, m_run, l_run);
    __syncthreads();
    // O (this warp's 128 lanes) = O·corr + P·V.
    mqa_tile::accumulate_pv<MT>(o, sCorr, g, p_addr, plo_addr, smem_u32(sKV + buf * kBc * kSQ + vb_off));
  }
  cp_async_wait<0>();
  if (spart == 0) {
    sL[srow] = l_run;
    sM[srow] = m_run;
  }
  __syncthreads();

#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = mt * 16 + g + 8 * hf;
      if (r >= rows_valid) continue;
      const float l = sL[r], inv = l > 0.f ? 1.0f / l : 0.f;
      float* dst = a.o_part + (split * TH + out_row0 + r) * p.L;
#pragma unroll
      for (int v = 0; v < 16; ++v) {
        const int col = 128 * warp + 8 * v + 2 * t4;
        if (col < p.L) *reinterpret_cast<float2*>(dst + col) = make_float2(o[mt][v][2 * hf] * inv, o[mt][v][2 * hf + 1] * inv);
      }
    }
  for (int r = threadIdx.x; r < rows_valid; r += kThreads) {
    const float l = sL[r];
    a.lse_part[split * TH + out_row0 + r] = l > 0.f ? sM[r] + log2f(l) : -INFINITY;
  }
}

// One warp per (token, head) row: weigh the splits by 2^lse, write bf16 and the natural-log lse.
__global__ void mqa_combine_kernel(const float* __restrict__ o_part, const float* __restrict__ lse_part, int splits,
                                   int64_t TH, int L, bf16* __restrict__ out, float* __restrict__ lse) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= TH) return;
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, lse_part[s * TH + row]);
  bf16* dst = out + row * L;
  if (m == -INFINITY) {
    for (int d = lane; d < L; d += 32) dst[d] = __float2bfloat16_rn(0.f);
    if (lane == 0) lse[row] = -INFINITY;
    return;
  }
  float wsum = 0.f;
  for (int s = 0; s < splits; ++s) {
    const float l = lse_part[s * TH + row];
    if (l != -INFINITY) wsum += exp2f(l - m);
  }
  const float inv = 1.0f / wsum;
  for (int d = lane * 4; d < L; d += 128) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < splits; ++s) {
      const float l = lse_part[s * TH + row];
      if (l == -INFINITY) continue;  // its o was never written
      const float w = exp2f(l - m) * inv;
      const float4 v = *reinterpret_cast<const float4*>(o_part + (s * TH + row) * L + d);
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
    __nv_bfloat162 lo = __floats2bfloat162_rn(acc.x, acc.y), hi = __floats2bfloat162_rn(acc.z, acc.w);
    uint2 packed;
    packed.x = *reinterpret_cast<uint32_t*>(&lo);
    packed.y = *reinterpret_cast<uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(dst + d) = packed;
  }
  if (lane == 0) lse[row] = (m + log2f(wsum)) * kLn2;
}

template <int MT>
void launch_split(const SplitArgs& a, int groups, int splits, int seqs, cudaStream_t stream) {
  constexpr size_t smem = mqa_tile::smem_bytes<16 * MT>();
  auto kernel = mqa_split_kernel<MT>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(groups), static_cast<unsigned>(splits), static_cast<unsigned>(seqs));
  kernel<<<grid, kThreads, smem, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

MqaSplitPlan mqa_split_plan(const RankContext& rc, int groups, int page_keys) {
  const DeviceBatch& db = rc.batch();
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, rc.device()));
  const int n_tiles = std::max(1, (db.max_total + page_keys - 1) / page_keys);
  const int want = std::min(n_tiles, std::max(1, sms / std::max(1, db.seqs * groups)));
  MqaSplitPlan plan;
  plan.tiles_per_split = (n_tiles + want - 1) / want;
  plan.splits = (n_tiles + plan.tiles_per_split - 1) / plan.tiles_per_split;
  return plan;
}

bool mqa_split_supports(int L, int R) { return L > 0 && L <= kVT && L + R <= kDT && L % 8 == 0 && R % 8 == 0; }

void launch_attention_mqa_split(const MqaSplitParams& p, RankContext& rc) {
  if (!mqa_split_supports(p.L, p.R))
    throw EngineError("attention_mqa (split): L " + std::to_string(p.L) + ", R " + std::to_string(p.R) +
                      " outside the kernel's L <= 512, L + R <= 576, multiples of 8");
  const DeviceBatch& db = rc.batch();
  if (p.tokens == 0 || p.heads == 0 || db.seqs == 0) return;
  const int rows_seq = db.max_new * p.heads;
  const int mt = rows_seq <= 16 ? 1 : 2;
  const int groups = (rows_seq + 16 * mt - 1) / (16 * mt);
  const MqaSplitPlan plan = mqa_split_plan(rc, groups, kBc);
  const int splits = plan.splits, per = plan.tiles_per_split;

  const int64_t TH = static_cast<int64_t>(p.tokens) * p.heads;
  SplitArgs a;
  a.p = p;
  a.seq_new_start = db.i32(db.seq_new_start);
  a.seq_new_len = db.i32(db.seq_new_len);
  a.seq_total_len = db.i32(db.seq_total_len);
  a.block_table = p.block_table ? p.block_table : db.i32(db.block_table);
  a.max_blocks = db.max_blocks;
  a.tiles_per_split = per;
  a.o_part = rc.scratch_as<float>("mqa.o_part", splits * TH * p.L);
  a.lse_part = rc.scratch_as<float>("mqa.lse_part", splits * TH);
  if (mt == 1) launch_split<1>(a, groups, splits, db.seqs, rc.stream());
  else launch_split<2>(a, groups, splits, db.seqs, rc.stream());

  launch_mqa_combine(a.o_part, a.lse_part, splits, TH, p.L, p.out, p.lse, rc.stream());
}

void launch_mqa_combine(const float* o_part, const float* lse_part, int splits, int64_t TH, int L, bf16* out,
                        float* lse, cudaStream_t stream) {
  const int warps = 4;
  mqa_combine_kernel<<<static_cast<unsigned>((TH + warps - 1) / warps), warps * 32, 0, stream>>>(
      o_part, lse_part, splits, TH, L, out, lse);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
