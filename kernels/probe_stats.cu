// Device probe statistics. Every bf16 probe of the real models takes version 4 (probe_tiles_kernel below: one
// pass for the stats, the head L2 and the sketch, the sketch on the tensor cores); the rest (fp32 tensors such
// as lse, odd widths) version 2: one warp per token row, one pass over the row for the finite sum, sum of
// squares, absmax, NaN/Inf counts, the row's L2 (non-finite values included, as on the host: a NaN token shows
// as NaN), the checksum's partial sum and the sketch (in double); a second pass (from L1/L2) for the head L2. All reductions are fixed trees, so records are bit-reproducible. Earlier versions: 1 hashed
// the sketch per element (~60 ms per DeepSeek-V3 layer at T = 4096); 3 took one block per 2048-column row
// slice with seven block-wide reductions (~0.55 TB/s) and the sketch as a separate cuBLAS GEMM.
#include "kernels/block_reduce.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/mma_util.cuh"
#include "kernels/probe_stats.cuh"
#include "kernels/sketch_hash.cuh"

#include <algorithm>
#include <climits>
#include <string>

namespace mla::cuda {

namespace {
constexpr int kThreads = 256;

struct RowAcc {
  double sum = 0, sumsq = 0, sq_all = 0, amax = 0, nan = 0, inf = 0;
  unsigned long long check = 0;

  __device__ void add(float v, uint32_t bits, uint64_t index) {
    add_value(v);
    check += checksum_term(index, bits);
  }
  __device__ void add_value(float v) {
    const double d = v;
    sq_all += d * d;
    if (isnan(v)) nan += 1;
    else if (isinf(v)) inf += 1;
    else {
      sum += d;
      sumsq += d * d;
      amax = fmax(amax, fabs(d));
    }
  }
};

__device__ inline float bf16_bits_to_float(uint32_t b) { return __uint_as_float(b << 16); }

// Folds a lane's RowAcc over the warp (butterfly: fixed order, every lane gets the result).
__device__ inline void warp_fold(RowAcc& q) {
  q.sum = warp_sum(q.sum);
  q.sumsq = warp_sum(q.sumsq);
  q.sq_all = warp_sum(q.sq_all);
  q.nan = warp_sum(q.nan);
  q.inf = warp_sum(q.inf);
  q.amax = warp_max(q.amax);
  q.check = warp_sum(q.check);
}

// A row's record: the stats the host folds, the checksum's partial sum and the token L2.
__device__ inline void store_row(const ProbeStatsArgs& a, int64_t r, const RowAcc& q) {
  double* st = a.row_stats + r * kRowStats;
  st[0] = q.sum;
  st[1] = q.sumsq;
  st[2] = q.amax;
  st[3] = q.nan;
  st[4] = q.inf;
  a.row_checksum[r] = q.check;
  a.token_l2[r] = static_cast<float>(sqrt(q.sq_all));
}

// Version 2 (fp32 tensors, odd widths): one warp per token row, warp-level reductions only.
template <class T>
__global__ void __launch_bounds__(kThreads) probe_stats_kernel(const ProbeStatsArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t r = blockIdx.x * static_cast<int64_t>(kThreads / 32) + (threadIdx.x >> 5);
  if (r >= a.rows) return;
  const T* x = static_cast<const T*>(a.data) + r * a.cols;
  const uint64_t base = static_cast<uint64_t>(r) * a.cols;
  const auto value = [&](int64_t c) {
    if constexpr (sizeof(T) == 2) return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(x)[c]);
    else return x[c];
  };
  RowAcc acc;
  double skacc[kSketchLanes];
#pragma unroll
  for (int k = 0; k < kSketchLanes; ++k) skacc[k] = 0;
  for (int64_t c = lane; c < a.cols; c += 32) {
    const float v = value(c);
    uint32_t bits;
    if constexpr (sizeof(T) == 2) bits = reinterpret_cast<const uint16_t*>(x)[c];
    else bits = __float_as_uint(v);
    acc.add(v, bits, base + c);
    if (a.sketch_bits) {
      const double d = v;
      const uint32_t* words = a.sketch_bits + (c / 8) * 8;  // lane k: word k % 8, bit 8 (k / 8) + c % 8
      const int bit = static_cast<int>(c & 7);
#pragma unroll
      for (int k = 0; k < kSketchLanes; ++k) skacc[k] += ((words[k & 7] >> (8 * (k >> 3) + bit)) & 1u) ? -d : d;
    }
  }
  warp_fold(acc);
  if (lane == 0) store_row(a, r, acc);
  if (a.sketch_bits) {
#pragma unroll
    for (int k = 0; k < kSketchLanes; ++k) {
      const double s = warp_sum(skacc[k]);
      if (lane == k) a.sketch_out[r * kSketchLanes + k] = static_cast<float>(s * kSketchScale);
    }
  }
  if (a.heads > 0) {
    const int64_t X = a.cols / a.heads;
    if (X < 32) {  // narrow heads (lse: one column each): a lane per head
      for (int h = lane; h < a.heads; h += 32) {
        double s = 0;
        for (int64_t c = 0; c < X; ++c) s += static_cast<double>(value(h * X + c)) * value(h * X + c);
        a.head_l2[r * a.heads + h] = static_cast<float>(sqrt(s));
      }
    } else {
      for (int h = 0; h < a.heads; ++h) {
        double s = 0;
        for (int64_t c = lane; c < X; c += 32) s += static_cast<double>(value(h * X + c)) * value(h * X + c);
        s = warp_sum(s);
        if (lane == 0) a.head_l2[r * a.heads + h] = static_cast<float>(sqrt(s));
      }
    }
  }
}

// Version 4, for bf16 tensors whose width and head width are multiples of 8 (every bf16 probe of the real
// models): stats, head L2 and the sketch in one pass over the tensor. One warp per (tile of 16 rows, segment
// of whole heads of at most kSegCols columns). Each step a lane loads 16 bytes (8 columns) of row g and of
// row g + 8 at two column offsets (g = lane / 4, t = lane % 4: the mma fragment's row and column group);
// the same registers are the A fragments of mma.m16n8k16 against the ±1 sketch signs (the columns of a k-step
// are taken in the order the lanes hold them, and the sign fragment is built for those columns), so the
// sketch costs tensor-core instructions and no second read. Per row: the lanes of a row (4) fold their
// partials by shuffles; per head: each chunk's sum of squares goes to shared memory and one lane sums a head
// in chunk order. A fold kernel sums the segments of each row in order. Replaces version 3 (one block per
// row slice, seven block-wide reductions per 2048 columns: ~0.55 TB/s) and the cuBLAS sketch GEMM.
constexpr int kTileRows = 16;
constexpr int kSegCols = 512;          // per warp task, whole heads (wider heads: one head per task)
constexpr int kMaxSegChunks = 128;     // heads up to 1024 columns
constexpr int kTileWarps = 4;
constexpr int64_t kWantTasks = 4096;  // warps per launch that keep an H200 busy (132 SMs x 16 resident, twice)

struct TileGeometry {
  int64_t seg_width = 0;  // columns per segment (a multiple of 8; whole heads)
  int64_t segs = 0;       // segments per row
  int64_t head_cols = 0;  // X (0: no heads axis)
  int64_t row_tiles = 0;
};

struct RowPartial {
  double sum, sumsq, sq_all, amax, nan, inf;
  unsigned long long check;
};

TileGeometry tile_geometry(const ProbeStatsArgs& a) {
  TileGeometry g;
  if (a.dtype != DType::DType_bf16 || a.cols <= 0 || a.cols % 8 != 0 ||
      (reinterpret_cast<uintptr_t>(a.data) & 15u) != 0)
    return g;
  int64_t unit = 64;  // a segment is whole heads, or whole 64-column steps
  if (a.heads > 0) {
    const int64_t X = a.cols / a.heads;
    if (X % 8 != 0 || X / 8 > kMaxSegChunks) return g;
    g.head_cols = unit = X;
  }
  g.row_tiles = (a.rows + kTileRows - 1) / kTileRows;
  // Narrower segments while there are too few warps to fill the GPU (few rows, or narrow tensors), down to one
  // unit; each segment adds a partial per row that the fold reads back.
  g.seg_width = unit * std::max<int64_t>(1, kSegCols / unit);
  const auto segs_of = [&](int64_t width) { return (a.cols + width - 1) / width; };
  while (g.seg_width > unit && g.row_tiles * segs_of(g.seg_width) < kWantTasks)
    g.seg_width = std::max<int64_t>(unit, g.seg_width / 2 / unit * unit);
  g.segs = segs_of(g.seg_width);
  return g;
}

// Per row, one lane's accumulators. A chunk of 8 bf16 values: absmax and "any non-finite" on the raw bits (bf16
// magnitudes order as integers; |h| >= 0x7F80 is Inf or NaN), sums in fp32 (8 terms), added in double; a chunk
// with a non-finite or huge value goes element by element in double (the host's way).
struct LaneRow {
  double sum = 0, sumsq = 0, sq_all = 0;
  float amax = 0;  // of the finite values (bf16: exact in fp32)
  unsigned nan = 0, inf = 0;
  unsigned long long check = 0;

  // i0: the row-major index of the chunk's first element, a multiple of 8 (one multiplier hash per chunk).
  // Returns the chunk's sum of squares (non-finite values included).
  __device__ double chunk(uint4 w, uint64_t i0) {
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
    const uint64_t m0 = checksum_multiplier(i0);
    unsigned long long c[2] = {0, 0};  // two chains (even, odd elements): more instructions in flight
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t b = (j & 1) ? words[j >> 1] >> 16 : words[j >> 1] & 0xffffu;
      c[j & 1] += (m0 + kChecksumStep * j) * (2u * b + 1u);  // checksum_term(i0 + j, b)
    }
    check += c[0] + c[1];
    const uint32_t a0 = w.x & 0x7FFF7FFFu, a1 = w.y & 0x7FFF7FFFu, a2 = w.z & 0x7FFF7FFFu, a3 = w.w & 0x7FFF7FFFu;
    const uint32_t bad = ((a0 + 0x00800080u) | (a1 + 0x00800080u) | (a2 + 0x00800080u) | (a3 + 0x00800080u)) & 0x80008000u;
    const uint32_t mx = __vmaxu2(__vmaxu2(a0, a1), __vmaxu2(a2, a3));
    const float cmax = __uint_as_float(max(mx & 0xFFFFu, mx >> 16) << 16);
    if (bad == 0 && cmax < 1e18f) {  // every value finite, and no square overflows fp32
      float s2[2] = {0.f, 0.f}, sq2[2] = {0.f, 0.f};  // even and odd elements, then added: shorter chains
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float v = (j & 1) ? __uint_as_float(words[j >> 1] & 0xFFFF0000u) : __uint_as_float(words[j >> 1] << 16);
        s2[j & 1] += v;
        sq2[j & 1] = fmaf(v, v, sq2[j & 1]);
      }
      const float s = s2[0] + s2[1], sq = sq2[0] + sq2[1];
      sum += s;
      sumsq += sq;
      sq_all += sq;
      amax = fmaxf(amax, cmax);
      return sq;
    }
    double all = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t b = (j & 1) ? words[j >> 1] >> 16 : words[j >> 1] & 0xffffu;
      const float v = bf16_bits_to_float(b);
      const double d = v;
      all += d * d;
      if (isnan(v)) ++nan;
      else if (isinf(v)) ++inf;
      else {
        sum += d;
        sumsq += d * d;
        amax = fmaxf(amax, fabsf(v));
      }
    }
    sq_all += all;
    return all;
  }
  // Folds the four lanes of a row (lane bits 0 and 1) into every one of them.
  __device__ void fold_lanes() {
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
      sumsq += __shfl_xor_sync(0xffffffffu, sumsq, o);
      sq_all += __shfl_xor_sync(0xffffffffu, sq_all, o);
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      nan += __shfl_xor_sync(0xffffffffu, nan, o);
      inf += __shfl_xor_sync(0xffffffffu, inf, o);
      check += __shfl_xor_sync(0xffffffffu, check, o);
    }
  }
};

// The B fragment register of bf16 ±1 for two consecutive columns whose sign bits (1: −1) are bits p, p + 1
// of `m`: the low half the first column.
__device__ __forceinline__ uint32_t sign_pair(uint32_t m, int p) {
  return 0x3F803F80u | ((m >> p) & 1u) << 15 | ((m >> (p + 1)) & 1u) << 31;
}

__global__ void __launch_bounds__(kTileWarps * 32) probe_tiles_kernel(const ProbeStatsArgs a, TileGeometry g,
                                                                     RowPartial* part, float* sketch_part) {
  extern __shared__ double chunk_sq_all[];  // [kTileWarps][16 rows][segment chunks], heads only
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kTileWarps + warp;
  if (task >= g.row_tiles * g.segs) return;
  const int64_t tile = task / g.segs, seg = task % g.segs;
  const int gr = lane >> 2, t = lane & 3;
  const int64_t r0 = tile * kTileRows + gr, r1 = r0 + 8;
  const bool v0 = r0 < a.rows, v1 = r1 < a.rows;
  const int64_t c_begin = seg * g.seg_width, c_end = min(c_begin + g.seg_width, a.cols);
  const int seg_chunks = static_cast<int>(g.seg_width / 8);
  double* chunk_sq = chunk_sq_all + static_cast<size_t>(warp) * kTileRows * seg_chunks;
  const bf16* x = static_cast<const bf16*>(a.data);
  const bool sketch = a.sketch_bits != nullptr;

  LaneRow row0, row1;
  float c[4][4] = {};  // sketch accumulators: n-tile j = lanes 8j..8j+7
  // Each step's four 16-byte loads are issued one step ahead (while the previous step computes).
  uint4 w[2][2];  // [half][row g, row g + 8]
  bool in[2];
  const auto load = [&](int64_t c0, uint4 (&dst)[2][2], bool (&ok)[2]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t col = c0 + 32 * half + 8 * t;
      ok[half] = col < c_end;
      dst[half][0] = dst[half][1] = make_uint4(0, 0, 0, 0);
      if (ok[half] && v0) dst[half][0] = *reinterpret_cast<const uint4*>(x + r0 * a.cols + col);
      if (ok[half] && v1) dst[half][1] = *reinterpret_cast<const uint4*>(x + r1 * a.cols + col);
    }
  };
  load(c_begin, w, in);
  for (int64_t c0 = c_begin; c0 < c_end; c0 += 64) {
    uint4 next[2][2];
    bool next_in[2] = {false, false};
    if (c0 + 64 < c_end) load(c0 + 64, next, next_in);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t col = c0 + 32 * half + 8 * t;
      const uint4 w0 = w[half][0], w1 = w[half][1];
      const int ch = static_cast<int>((col - c_begin) / 8);
      if (in[half] && v0) {
        const double sq = row0.chunk(w0, static_cast<uint64_t>(r0) * a.cols + col);
        if (g.head_cols) chunk_sq[gr * seg_chunks + ch] = sq;
      }
      if (in[half] && v1) {
        const double sq = row1.chunk(w1, static_cast<uint64_t>(r1) * a.cols + col);
        if (g.head_cols) chunk_sq[(gr + 8) * seg_chunks + ch] = sq;
      }
      if (sketch) {  // warp-uniform: every lane takes part in the mma; one without columns multiplies zeros
        // Sign bits of this lane's 8 columns for sketch lanes gr + 8j: byte j of one word.
        const uint32_t m = in[half] ? a.sketch_bits[(col / 8) * 8 + gr] : 0u;
        // k-step 1 takes the lanes' columns 0..3, k-step 2 columns 4..7 (A: a0/a2 row g, a1/a3 row g + 8).
        const uint32_t A1[4] = {w0.x, w1.x, w0.y, w1.y}, A2[4] = {w0.z, w1.z, w0.w, w1.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t mj = m >> (8 * j);
          mma::mma_bf16(c[j], A1, sign_pair(mj, 0), sign_pair(mj, 2));
          mma::mma_bf16(c[j], A2, sign_pair(mj, 4), sign_pair(mj, 6));
        }
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      w[half][0] = next[half][0];
      w[half][1] = next[half][1];
      in[half] = next_in[half];
    }
  }
  row0.fold_lanes();
  row1.fold_lanes();
  if (t == 0) {
    const auto put = [&](const LaneRow& q, int64_t r) {
      part[r * g.segs + seg] = RowPartial{q.sum, q.sumsq, q.sq_all, q.amax, static_cast<double>(q.nan),
                                          static_cast<double>(q.inf), q.check};
    };
    if (v0) put(row0, r0);
    if (v1) put(row1, r1);
  }
  if (sketch) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int k = 8 * j + 2 * t;
      if (v0) {
        float* o = sketch_part + (r0 * g.segs + seg) * kSketchLanes + k;
        o[0] = c[j][0];
        o[1] = c[j][1];
      }
      if (v1) {
        float* o = sketch_part + (r1 * g.segs + seg) * kSketchLanes + k;
        o[0] = c[j][2];
        o[1] = c[j][3];
      }
    }
  }
  if (g.head_cols > 0) {
    __syncwarp();
    const int per = static_cast<int>(g.head_cols / 8);
    const int heads_here = static_cast<int>((c_end - c_begin) / g.head_cols);
    for (int item = lane; item < kTileRows * heads_here; item += 32) {
      const int rr = item / heads_here, h = item % heads_here;
      const int64_t r = tile * kTileRows + rr;
      if (r >= a.rows) continue;
      double s = 0;
      for (int k = 0; k < per; ++k) s += chunk_sq[rr * seg_chunks + h * per + k];
      a.head_l2[r * a.heads + c_begin / g.head_cols + h] = static_cast<float>(sqrt(s));
    }
  }
}

// One warp per row: lane l folds segments l, l + 32, ... (then a butterfly over the lanes: a fixed order), and
// sums sketch lane l over the segments in order.
__global__ void fold_tiles_kernel(const ProbeStatsArgs a, TileGeometry g, const RowPartial* part,
                                  const float* sketch_part) {
  const int lane = threadIdx.x & 31;
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (r >= a.rows) return;
  if (a.sketch_out) {
    float s = 0.f;
    const float* p = sketch_part + r * g.segs * kSketchLanes + lane;
#pragma unroll 8
    for (int64_t k = 0; k < g.segs; ++k) s += p[k * kSketchLanes];
    a.sketch_out[r * kSketchLanes + lane] = s * kSketchScale;
  }
  RowAcc t;
  for (int64_t k = lane; k < g.segs; k += 32) {
    const RowPartial& p = part[r * g.segs + k];
    t.sum += p.sum;
    t.sumsq += p.sumsq;
    t.sq_all += p.sq_all;
    t.amax = fmax(t.amax, p.amax);
    t.nan += p.nan;
    t.inf += p.inf;
    t.check += p.check;
  }
  warp_fold(t);
  if (lane == 0) store_row(a, r, t);
}

// Word (colgroup, g) of the sign-bit table: byte j, bit i = 1 when the entry of column 8·colgroup + i, sketch
// lane g + 8j is −1/sqrt(32).
__global__ void sketch_sign_bits_kernel(uint64_t key, int64_t col0, int64_t cols, uint32_t* out) {
  const int64_t words = (cols + 7) / 8 * 8;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; w < words;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t group = w / 8;
    const int g = static_cast<int>(w % 8);
    uint32_t bits = 0;
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 8; ++i) {
        const int64_t col = group * 8 + i;
        if (col < cols && !sketch_sign(key, col0 + col, g + 8 * j)) bits |= 1u << (8 * j + i);
      }
    out[w] = bits;
  }
}

__global__ void set_flag_kernel(volatile unsigned* flag, unsigned value) {
  __threadfence_system();
  *flag = value;
  __threadfence_system();
}

}  // namespace

size_t sketch_sign_bits_words(int64_t cols) { return static_cast<size_t>((cols + 7) / 8 * 8); }

size_t probe_stats_workspace(const ProbeStatsArgs& a) {
  const TileGeometry g = tile_geometry(a);
  if (g.segs == 0) return 0;
  const size_t n = static_cast<size_t>(a.rows * g.segs);
  return n * sizeof(RowPartial) + n * kSketchLanes * sizeof(float);
}

void launch_probe_stats(const ProbeStatsArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (a.rows > INT_MAX) throw EngineError("probe stats: " + std::to_string(a.rows) + " rows");
  const TileGeometry g = tile_geometry(a);
  const int64_t tasks = g.row_tiles * g.segs;
  if (g.segs > 0 && a.workspace && (tasks + kTileWarps - 1) / kTileWarps <= INT_MAX) {
    auto* part = static_cast<RowPartial*>(a.workspace);
    auto* sketch_part = reinterpret_cast<float*>(part + a.rows * g.segs);
    const size_t smem = g.head_cols ? static_cast<size_t>(kTileWarps) * kTileRows * (g.seg_width / 8) * sizeof(double) : 0;
    if (smem > 48 * 1024)  // heads wider than 384 columns (a per-device attribute: set it each time)
      CUDA_CHECK(cudaFuncSetAttribute(probe_tiles_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)));
    probe_tiles_kernel<<<static_cast<unsigned>((tasks + kTileWarps - 1) / kTileWarps), kTileWarps * 32, smem, stream>>>(
        a, g, part, sketch_part);
    CUDA_CHECK_LAUNCH();
    fold_tiles_kernel<<<static_cast<unsigned>((a.rows + 7) / 8), 256, 0, stream>>>(a, g, part, sketch_part);
    CUDA_CHECK_LAUNCH();
    return;
  }
  const auto blocks = static_cast<unsigned>((a.rows + kThreads / 32 - 1) / (kThreads / 32));
  if (a.dtype == DType::DType_bf16)
    probe_stats_kernel<bf16><<<blocks, kThreads, 0, stream>>>(a);
  else
    probe_stats_kernel<float><<<blocks, kThreads, 0, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

void launch_sketch_sign_bits(uint64_t key, int64_t col0, int64_t cols, uint32_t* bits, cudaStream_t stream) {
  if (cols == 0) return;
  sketch_sign_bits_kernel<<<128, 256, 0, stream>>>(key, col0, cols, bits);
  CUDA_CHECK_LAUNCH();
}

void launch_set_flag(unsigned* flag, unsigned value, cudaStream_t stream) {
  set_flag_kernel<<<1, 1, 0, stream>>>(flag, value);
  CUDA_CHECK_LAUNCH();
}

std::vector<float> device_sketch_coeffs(uint64_t key, int64_t col0, int64_t cols) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::vector<uint32_t> bits(sketch_sign_bits_words(cols));
  DeviceBuffer buf(dev, bits.size() * sizeof(uint32_t));
  launch_sketch_sign_bits(key, col0, cols, static_cast<uint32_t*>(buf.get()), nullptr);
  CUDA_CHECK(cudaMemcpy(bits.data(), buf.get(), bits.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  std::vector<float> coeffs(static_cast<size_t>(cols) * kSketchLanes);
  for (int64_t c = 0; c < cols; ++c)
    for (int k = 0; k < kSketchLanes; ++k) {
      const bool negative = (bits[(c / 8) * 8 + k % 8] >> (8 * (k / 8) + c % 8)) & 1u;
      coeffs[c * kSketchLanes + k] = negative ? -kSketchScale : kSketchScale;
    }
  return coeffs;
}

}  // namespace mla::cuda
