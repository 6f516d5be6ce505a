// DSA's sparse attention (kernels/attention_sparse.cuh).
//
// Absorbed form: attention_mqa_split.cu's plan over the selected keys instead of the pages. A block owns one token's
// query rows (16 or 32 of its heads) and one split of its selected keys, in tiles of 64 keys: the tile's 64 cache
// rows [64, 576] are gathered through the block table (their row numbers staged in shared memory for the whole
// split) into shared memory, double-buffered with cp.async, and read once by all the block's heads. Per tile: each
// of the 4 warps computes the scores of 16 keys for every row on the tensor cores (mma.sync bf16, fp32
// accumulators), the block does the online softmax in shared memory (fp32, log2 units; padding keys −inf) and writes
// P as hi = bf16(p) and lo = bf16(p − hi), and each warp adds P·V = hi·V + lo·V for its 128 of the 512 latent lanes
// (why two parts: attention_mqa_split.cu). One split writes bf16 and the lse directly; several write normalised
// fp32 partials and their lse, merged by a combine pass. Splits: tokens × head groups × splits fill the
// multiprocessors about once.
//
// MHA form, with the flash kernels (mha_kernel ≥ 2, dims they cover): one block per token turns its top-k into two
// bitmaps, over its sequence's context and over its new tokens (shared-memory atomics, 16 KiB of words at a time,
// stored whole), with each one's reach (last selected key + 1); attention_mha then runs its dense flow, both passes
// masked by the bitmaps instead of the causal mask, and merges them by lse. The selection costs T × (context + s_q)
// bits; the kernels skip key tiles past a block's reach and mask the rest, so their time is that of the dense causal
// attention over the same keys, whatever k.
//
// MHA form, a simple kernel (mha_kernel = 1): the context rows are gathered and up-projected through kv_b_proj once
// (into attention_mha's scratch buffers), then one warp per (token, head), four heads of a token per block: the query
// in registers (lanes own dims lane, lane + 32, ...), the token's selected keys visited one at a time (warp-reduced
// dot product, online softmax in fp32, the value row accumulated in registers), bf16 out and lse.
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/attention_flash.cuh"
#include "kernels/attention_mqa_split.cuh"
#include "kernels/attention_mqa_tile.cuh"
#include "kernels/attention_sparse.cuh"
#include "kernels/kv_b_proj.cuh"
#include "kernels/mma_util.cuh"

namespace mla::cuda {

namespace {
using namespace mma;

// --- Absorbed form ------------------------------------------------------------------------------------------

using mqa_tile::kBc, mqa_tile::kDT, mqa_tile::kLn2, mqa_tile::kLog2e, mqa_tile::kSP, mqa_tile::kSQ, mqa_tile::kSS,
    mqa_tile::kThreads, mqa_tile::kVT;  // one tile = 64 selected keys
constexpr int kMaxTilesPerSplit = 32;   // the split's staged row numbers: at most 8 KiB

struct MqaSparseParams {
  SparseMqaArgs p;
  const int* token_seq;      // [T]
  const int* seq_total_len;  // [B]
  const int* block_table;    // [B, max_blocks]
  int max_blocks;
  int tiles_per_split;
  bool direct;      // one split: bf16 out and natural-log lse written by the kernel
  float* o_part;    // [splits, T·Nl, L] normalised within the split
  float* lse_part;  // [splits, T·Nl] log2 units; −inf: the split saw no key for the row
};

template <int ROWS>
size_t mqa_sparse_smem_bytes(int tiles_per_split) {
  return mqa_tile::smem_bytes<ROWS>() + static_cast<size_t>(tiles_per_split) * kBc * sizeof(int);
}

// out[t, h] = Σ_j softmax_j(q[t,h]·row_j·scale)·row_j[:L] over token t's selected keys j in this split's tiles.
// Block: token blockIdx.x, heads [16·MT·blockIdx.y, +16·MT), tiles of split blockIdx.z.
template <int MT>
__global__ void __launch_bounds__(kThreads, 1) mqa_sparse_kernel(const MqaSparseParams a) {
  constexpr int ROWS = 16 * MT, TPR = kThreads / ROWS, KPT = kBc / TPR;
  const SparseMqaArgs& p = a.p;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);               // [ROWS][kSQ]
  bf16* sKV = sQ + ROWS * kSQ;                                // [2][kBc][kSQ]
  float* sS = reinterpret_cast<float*>(sKV + 2 * kBc * kSQ);  // [ROWS][kSS] scores, log2 units
  bf16* sP = reinterpret_cast<bf16*>(sS + ROWS * kSS);        // [ROWS][kSP] bf16(p)
  bf16* sPlo = sP + ROWS * kSP;                               // [ROWS][kSP] bf16(p − bf16(p))
  float* sCorr = reinterpret_cast<float*>(sPlo + ROWS * kSP); // [ROWS]
  float* sL = sCorr + ROWS;                                   // [ROWS]
  float* sM = sL + ROWS;                                      // [ROWS]
  int* sRow = reinterpret_cast<int*>(sM + ROWS);              // [tiles_per_split · kBc] cache row of each key, −1

  const int t = blockIdx.x, row0 = blockIdx.y * ROWS, split = blockIdx.z;
  if (row0 >= p.Nl) return;
  const int rows_valid = min(ROWS, p.Nl - row0);
  const int64_t TH = static_cast<int64_t>(p.T) * p.Nl;
  const int64_t out_row0 = static_cast<int64_t>(t) * p.Nl + row0;  // (token·Nl + h) of row 0
  const int n_tiles = (p.k + kBc - 1) / kBc;
  const int t_begin = split * a.tiles_per_split, t_end = min(n_tiles, t_begin + a.tiles_per_split);
  if (t_begin >= t_end) {  // a split past the last tile (the launcher makes none): it saw no key
    if (!a.direct)
      for (int r = threadIdx.x; r < rows_valid; r += kThreads) a.lse_part[split * TH + out_row0 + r] = -INFINITY;
    return;
  }
  const int W = p.L + p.R;

  // The split's keys: cache rows through the block table; padding and keys outside the sequence −1.
  {
    const int b = a.token_seq[t], total = a.seq_total_len[b];
    const int* table = a.block_table + static_cast<int64_t>(b) * a.max_blocks;
    const int* sel = p.topk + static_cast<int64_t>(t) * p.k;
    for (int j = threadIdx.x; j < (t_end - t_begin) * kBc; j += kThreads) {
      const int idx = t_begin * kBc + j;
      const int s = idx < p.k ? sel[idx] : -1;
      sRow[j] = s >= 0 && s < total ? table[s / kCachePage] * kCachePage + s % kCachePage : -1;
    }
  }
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
        src = p.q_pe_rope + orow * p.R + (d0 - p.L);
        ok = true;
      }
    }
    cp_async_16(smem_u32(sQ + r * kSQ + d0), src, ok);
  }
  __syncthreads();  // sRow staged
  auto load_tile = [&](int kt, int buf) {
    const int* rows = sRow + (kt - t_begin) * kBc;
    bf16* dst = sKV + buf * kBc * kSQ;
    for (int i = threadIdx.x; i < kBc * (kDT / 8); i += kThreads) {
      const int r = i / (kDT / 8), d0 = (i % (kDT / 8)) * 8;
      const int row = rows[r];
      const bool ok = row >= 0 && d0 < W;
      cp_async_16(smem_u32(dst + r * kSQ + d0), ok ? p.cache + static_cast<int64_t>(row) * W + d0 : p.cache, ok);
    }
  };
  load_tile(t_begin, 0);
  cp_async_commit();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const uint32_t q_addr = smem_u32(sQ + (lane & 15) * kSQ + (lane >> 4) * 8);
  const uint32_t p_addr = smem_u32(sP + (lane & 15) * kSP + (lane >> 4) * 8);
  const uint32_t plo_addr = p_addr + ROWS * kSP * static_cast<uint32_t>(sizeof(bf16));
  const int kb_off = (16 * warp + ((lane >> 4) << 3) + (lane & 7)) * kSQ + ((lane >> 3) & 1) * 8;
  const int vb_off = ((((lane >> 3) & 1) << 3) + (lane & 7)) * kSQ + 128 * warp + (lane >> 4) * 8;
  const float sl2 = p.scale * kLog2e;
  // The softmax threads: TPR lanes per row, KPT keys each.
  const int srow = threadIdx.x / TPR, spart = threadIdx.x % TPR;
  float m_run = -INFINITY, l_run = 0.f;

  float o[MT][16][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int v = 0; v < 16; ++v) o[mt][v][0] = o[mt][v][1] = o[mt][v][2] = o[mt][v][3] = 0.f;

  for (int kt = t_begin; kt < t_end; ++kt) {
    cp_async_wait<0>();
    __syncthreads();  // tile kt landed; the previous tile's readers are done with the other buffer and sP
    const int buf = (kt - t_begin) & 1;
    if (kt + 1 < t_end) load_tile(kt + 1, buf ^ 1);
    cp_async_commit();

    // Scores of keys [16·warp, 16·warp + 16) of the tile for all rows.
    float sc[MT][2][4];
    mqa_tile::scores<MT>(sc, smem_u32(sKV + buf * kBc * kSQ + kb_off), q_addr);
    const int* tile_rows = sRow + (kt - t_begin) * kBc;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = mt * 16 + g + 8 * hf, key = 16 * warp + 8 * n + 2 * t4;
          const float x0 = tile_rows[key] >= 0 ? sc[mt][n][2 * hf] * sl2 : -INFINITY;
          const float x1 = tile_rows[key + 1] >= 0 ? sc[mt][n][2 * hf + 1] * sl2 : -INFINITY;
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
      if (a.direct) {
        bf16* dst = p.attn_latent + (out_row0 + r) * p.L;
#pragma unroll
        for (int v = 0; v < 16; ++v) {
          const int col = 128 * warp + 8 * v + 2 * t4;
          if (col < p.L)
            *reinterpret_cast<__nv_bfloat162*>(dst + col) =
                __floats2bfloat162_rn(o[mt][v][2 * hf] * inv, o[mt][v][2 * hf + 1] * inv);
        }
      } else {
        float* dst = a.o_part + (split * TH + out_row0 + r) * p.L;
#pragma unroll
        for (int v = 0; v < 16; ++v) {
          const int col = 128 * warp + 8 * v + 2 * t4;
          if (col < p.L)
            *reinterpret_cast<float2*>(dst + col) = make_float2(o[mt][v][2 * hf] * inv, o[mt][v][2 * hf + 1] * inv);
        }
      }
    }
  for (int r = threadIdx.x; r < rows_valid; r += kThreads) {
    const float l = sL[r];
    if (a.direct) p.lse[out_row0 + r] = l > 0.f ? (sM[r] + log2f(l)) * kLn2 : -INFINITY;
    else a.lse_part[split * TH + out_row0 + r] = l > 0.f ? sM[r] + log2f(l) : -INFINITY;
  }
}


template <int MT>
void launch_mqa_sparse(const MqaSparseParams& a, int groups, int splits, cudaStream_t stream) {
  const size_t smem = mqa_sparse_smem_bytes<16 * MT>(a.tiles_per_split);
  auto kernel = mqa_sparse_kernel<MT>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(a.p.T), static_cast<unsigned>(groups), static_cast<unsigned>(splits));
  kernel<<<grid, kThreads, smem, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

// --- MHA form -----------------------------------------------------------------------------------------------

constexpr int kMhaWarps = 4;
constexpr int kNopePL = 8, kPePL = 2, kVPL = 8;  // lanes per thread: P ≤ 256, R ≤ 64, V ≤ 256

struct MhaSparseParams {
  SparseMhaArgs p;
  const int* token_seq;      // [T]
  const int* seq_new_start;  // [B]
  const int* seq_ctx_start;  // [B] first row of each sequence's context in ctx_rows / ctx_kv
  const int* seq_ctx_len;    // [B]
  const int* seq_total_len;  // [B]
  const bf16* ctx_rows;      // [C, L+R] the context's latent rows (k_pe = the last R lanes)
  const bf16* ctx_kv;        // [C, Nl·(P+V)] the rows up-projected: per head k_nope (P), then v (V)
};

// rows [n, W] <- cache rows ctx_rows[i] (whole latent rows).
__global__ void gather_ctx_rows_kernel(const bf16* __restrict__ cache, const int64_t* __restrict__ ctx_rows,
                                       bf16* __restrict__ rows, int W) {
  const int64_t i = blockIdx.x;
  const bf16* src = cache + ctx_rows[i] * W;
  for (int d = threadIdx.x; d < W; d += blockDim.x) rows[i * W + d] = src[d];
}

// out[t, h] = Σ_j softmax_j(q[t,h]·k_j[h]·scale)·v_j[h] over token t's selected keys j; one warp per (t, h).
__global__ void __launch_bounds__(kMhaWarps * 32) mha_sparse_kernel(const MhaSparseParams a) {
  const SparseMhaArgs& p = a.p;
  const int lane = threadIdx.x & 31;
  const int h = blockIdx.y * kMhaWarps + (threadIdx.x >> 5);
  const int64_t t = blockIdx.x;
  if (h >= p.Nl) return;
  const int b = a.token_seq[t], ctx = a.seq_ctx_len[b], total = a.seq_total_len[b];
  const int64_t new0 = a.seq_new_start[b], ctx0 = a.seq_ctx_start[b];
  const int64_t th = t * p.Nl + h;
  const int W = p.L + p.R;
  const int64_t up_row = static_cast<int64_t>(p.Nl) * (p.P + p.V);

  float qn[kNopePL], qp[kPePL], acc[kVPL];
#pragma unroll
  for (int j = 0; j < kNopePL; ++j) {
    const int d = lane + 32 * j;
    qn[j] = d < p.P ? __bfloat162float(p.q_nope[th * p.P + d]) : 0.f;
  }
#pragma unroll
  for (int j = 0; j < kPePL; ++j) {
    const int d = lane + 32 * j;
    qp[j] = d < p.R ? __bfloat162float(p.q_pe_rope[th * p.R + d]) : 0.f;
  }
#pragma unroll
  for (int j = 0; j < kVPL; ++j) acc[j] = 0.f;

  float m = -INFINITY, l = 0.f;
  const int* sel = p.topk + t * p.k;
  for (int j0 = 0; j0 < p.k; j0 += 32) {
    const int mine = j0 + lane < p.k ? sel[j0 + lane] : -1;  // 32 selected keys, one per lane
    const int cnt = min(32, p.k - j0);
    for (int jj = 0; jj < cnt; ++jj) {
      const int s = __shfl_sync(0xffffffffu, mine, jj);
      if (s < 0 || s >= total) continue;  // padding (warp-uniform)
      const bf16 *kn, *kp, *vr;
      if (s < ctx) {  // cached: the up-projected context row
        const int64_t c = ctx0 + s;
        kn = a.ctx_kv + c * up_row + static_cast<int64_t>(h) * (p.P + p.V);
        vr = kn + p.P;
        kp = a.ctx_rows + c * W + p.L;
      } else {  // this step's new token
        const int64_t u = new0 + (s - ctx);
        kn = p.k_nope + (u * p.Nl + h) * p.P;
        kp = p.k_pe_rope + u * p.R;
        vr = p.v + (u * p.Nl + h) * p.V;
      }
      float dot = 0.f;
#pragma unroll
      for (int j = 0; j < kNopePL; ++j) {
        const int d = lane + 32 * j;
        if (d < p.P) dot += qn[j] * __bfloat162float(kn[d]);
      }
#pragma unroll
      for (int j = 0; j < kPePL; ++j) {
        const int d = lane + 32 * j;
        if (d < p.R) dot += qp[j] * __bfloat162float(kp[d]);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      const float score = dot * p.scale;
      const float m_new = fmaxf(m, score);
      const float corr = expf(m - m_new);  // 0 on the first key (m = -inf)
      const float w = expf(score - m_new);
      l = l * corr + w;
#pragma unroll
      for (int j = 0; j < kVPL; ++j) {
        const int d = lane + 32 * j;
        const float vv = d < p.V ? __bfloat162float(vr[d]) : 0.f;
        acc[j] = acc[j] * corr + w * vv;
      }
      m = m_new;
    }
  }

  bf16* out = p.attn_out + th * p.V;
  const float inv = l > 0.f ? 1.0f / l : 0.f;
#pragma unroll
  for (int j = 0; j < kVPL; ++j) {
    const int d = lane + 32 * j;
    if (d < p.V) out[d] = __float2bfloat16_rn(acc[j] * inv);
  }
  if (lane == 0) p.lse[th] = l > 0.f ? m + logf(l) : -INFINITY;
}
}  // namespace

bool mqa_sparse_supports(int L, int R) { return L > 0 && L <= kVT && L + R <= kDT && L % 8 == 0 && R % 8 == 0; }

void launch_attention_mqa_sparse(const SparseMqaArgs& p, RankContext& rc) {
  if (!mqa_sparse_supports(p.L, p.R))
    throw EngineError("attention_mqa (sparse): L " + std::to_string(p.L) + ", R " + std::to_string(p.R) +
                      " outside the kernel's L <= 512, L + R <= 576, multiples of 8");
  if (p.k < 0) throw EngineError("attention_mqa (sparse): k = " + std::to_string(p.k));
  if (p.T == 0 || p.Nl == 0) return;
  const DeviceBatch& db = rc.batch();
  const int mt = p.Nl <= 16 ? 1 : 2;
  const int groups = (p.Nl + 16 * mt - 1) / (16 * mt);
  const int n_tiles = (p.k + kBc - 1) / kBc;
  int splits = 0, per = 0;
  if (n_tiles > 0) {  // fill the multiprocessors about once (one resident block each)
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, rc.device()));
    const int64_t base = static_cast<int64_t>(p.T) * groups;
    const int want = static_cast<int>(std::clamp<int64_t>(sms / base, 1, n_tiles));
    per = std::min((n_tiles + want - 1) / want, kMaxTilesPerSplit);
    splits = (n_tiles + per - 1) / per;
  }
  const int64_t TH = static_cast<int64_t>(p.T) * p.Nl;
  MqaSparseParams a;
  a.p = p;
  a.token_seq = db.i32(db.token_seq);
  a.seq_total_len = db.i32(db.seq_total_len);
  a.block_table = p.block_table ? p.block_table : db.i32(db.block_table);  // another: page-off-by-one planted
  a.max_blocks = db.max_blocks;
  a.tiles_per_split = per;
  a.direct = splits == 1;
  a.o_part = nullptr;
  a.lse_part = nullptr;
  if (!a.direct) {
    a.o_part = rc.scratch_as<float>("mqa_sparse.o_part", std::max(splits, 1) * TH * p.L);
    a.lse_part = rc.scratch_as<float>("mqa_sparse.lse_part", std::max(splits, 1) * TH);
  }
  if (splits > 0) {
    if (mt == 1) launch_mqa_sparse<1>(a, groups, splits, rc.stream());
    else launch_mqa_sparse<2>(a, groups, splits, rc.stream());
  }
  if (a.direct) return;
  launch_mqa_combine(a.o_part, a.lse_part, splits, TH, p.L, p.attn_latent, p.lse, rc.stream());
}

bool mha_sparse_supports(int P, int R, int V) {
  return P >= 0 && P <= kNopePL * 32 && R >= 0 && R <= kPePL * 32 && V > 0 && V <= kVPL * 32;
}

namespace {
constexpr int kBitmapThreads = 256;
constexpr int kBitmapChunkWords = 4096;  // the words one pass of a block builds in shared memory (16 KiB)

// Token blockIdx.x's selection as the bitmaps of MhaSelection: key s < ctx of its sequence sets bit s of its context
// row, key s ≥ ctx bit s − ctx of its new-token row; padding (outside 0 .. total − 1) sets nothing, and a key
// selected twice counts once (the engine's top-k never repeats one). The two rows are one run of words_ctx + words_new
// words, built kBitmapChunkWords at a time in shared memory and stored whole.
__global__ void __launch_bounds__(kBitmapThreads) selection_bitmap_kernel(
    const int* __restrict__ topk, int k, const int* __restrict__ token_seq, const int* __restrict__ seq_ctx_len,
    const int* __restrict__ seq_total_len, MhaSelection sel) {
  __shared__ uint32_t bits[kBitmapChunkWords];
  __shared__ int reach[2];  // context, new
  const int64_t t = blockIdx.x;
  const int b = token_seq[t], ctx = seq_ctx_len[b], total = seq_total_len[b];
  const int* row = topk + t * k;
  const int words = sel.words_ctx + sel.words_new;
  if (threadIdx.x < 2) reach[threadIdx.x] = 0;
  for (int w0 = 0; w0 < words; w0 += kBitmapChunkWords) {
    const int n = min(kBitmapChunkWords, words - w0);
    for (int w = threadIdx.x; w < n; w += blockDim.x) bits[w] = 0u;
    __syncthreads();
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
      const int s = row[j];
      if (s < 0 || s >= total) continue;
      const bool cached = s < ctx;
      const int key = cached ? s : s - ctx;                               // within its bitmap
      const int bit = (cached ? 0 : 32 * sel.words_ctx) + key - 32 * w0;  // within this chunk of the run
      if (w0 == 0) atomicMax(&reach[cached ? 0 : 1], key + 1);
      if (bit >= 0 && bit < 32 * n) atomicOr(&bits[bit / 32], 1u << (bit % 32));
    }
    __syncthreads();
    for (int w = threadIdx.x; w < n; w += blockDim.x) {
      const int v = w0 + w;
      if (v < sel.words_ctx) sel.keep_ctx[t * sel.words_ctx + v] = bits[w];
      else sel.keep_new[t * sel.words_new + v - sel.words_ctx] = bits[w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (sel.words_ctx > 0) sel.reach_ctx[t] = reach[0];
    sel.reach_new[t] = reach[1];
  }
}

// Words per bitmap row covering n keys: rounded up to 128 keys (the flash kernels read a tile's bits whole).
int selection_words(int n) { return (n + 127) / 128 * 4; }
}  // namespace

void launch_attention_mha_sparse(const SparseMhaArgs& a, RankContext& rc) {
  if (a.k < 0) throw EngineError("attention_mha (sparse): k = " + std::to_string(a.k));
  if (a.kernel >= 2 && flash_supports(a.P, a.R, a.V)) {  // the flash kernels with the selection as their mask
    if (a.T == 0 || a.Nl == 0) return;
    const DeviceBatch& db = rc.batch();
    MhaSelection sel;
    sel.words_new = selection_words(db.max_new);
    sel.words_ctx = db.ctx_total > 0 ? selection_words(db.max_ctx) : 0;
    sel.keep_new = rc.scratch_as<uint32_t>("dsa.keep_new", static_cast<int64_t>(a.T) * sel.words_new);
    sel.reach_new = rc.scratch_as<int>("dsa.reach_new", a.T);
    if (sel.words_ctx > 0) {
      sel.keep_ctx = rc.scratch_as<uint32_t>("dsa.keep_ctx", static_cast<int64_t>(a.T) * sel.words_ctx);
      sel.reach_ctx = rc.scratch_as<int>("dsa.reach_ctx", a.T);
    }
    selection_bitmap_kernel<<<static_cast<unsigned>(a.T), kBitmapThreads, 0, rc.stream()>>>(
        a.topk, a.k, db.i32(db.token_seq), db.i32(db.seq_ctx_len), db.i32(db.seq_total_len), sel);
    CUDA_CHECK_LAUNCH();
    MhaArgs dense = a;
    dense.selection = &sel;
    launch_attention_mha(dense, rc);
    return;
  }
  if (!mha_sparse_supports(a.P, a.R, a.V))
    throw EngineError("attention_mha (sparse): head dims (" + std::to_string(a.P) + " + " + std::to_string(a.R) +
                      ", v " + std::to_string(a.V) + ") exceed the kernel's limits (256 + 64, v 256)");
  if (a.T == 0 || a.Nl == 0) return;
  const DeviceBatch& db = rc.batch();
  const int W = a.L + a.R;
  const int64_t C = db.ctx_total;
  MhaSparseParams m;
  m.p = a;
  m.token_seq = db.i32(db.token_seq);
  m.seq_new_start = db.i32(db.seq_new_start);
  m.seq_ctx_start = db.i32(db.seq_ctx_start);
  m.seq_ctx_len = db.i32(db.seq_ctx_len);
  m.seq_total_len = db.i32(db.seq_total_len);
  m.ctx_rows = nullptr;
  m.ctx_kv = nullptr;
  if (C > 0) {  // attention_mha's scratch: the context rows and their up-projection
    bf16* rows = rc.scratch_as<bf16>("mha.ctx_rows", C * W);
    bf16* up = rc.scratch_as<bf16>("mha.ctx_kv", C * a.Nl * (a.P + a.V));
    gather_ctx_rows_kernel<<<static_cast<unsigned>(C), 128, 0, rc.stream()>>>(a.cache, db.i64(db.ctx_rows), rows, W);
    CUDA_CHECK_LAUNCH();
    launch_kv_b_up(rc.cublas(), rows, W, a.w_kvb, up, C, a.L, a.Nl, a.P, a.V);
    m.ctx_rows = rows;
    m.ctx_kv = up;
  }
  const dim3 grid(static_cast<unsigned>(a.T), static_cast<unsigned>((a.Nl + kMhaWarps - 1) / kMhaWarps));
  mha_sparse_kernel<<<grid, kMhaWarps * 32, 0, rc.stream()>>>(m);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
