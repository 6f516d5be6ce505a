// The probe's tile kernel, for bf16 tensors whose width is a multiple of 8 and whose heads (if any) are a multiple of
// 32 columns (every bf16 probe of the real models): stats, head L2 and the sketch in one pass, the sums and the
// sketch on the tensor cores. One warp per (tile of 16 rows, segment of whole heads of at most kSegCols columns). A
// step is 64 columns of the tile: each lane copies 16 bytes (8 columns) of row g and of row g + 8 at two column
// offsets (g = lane / 4, t = lane % 4: the mma fragment's row and column group) into a kStages-deep shared-memory
// ring with cp.async (ring_index: conflict-free for the copies and for ldmatrix), so several steps are in flight per
// warp without holding registers. The lane's own 16 bytes feed the checksum, the absmax and the sketch:
// mma.m16n8k16 transposed — (32 sketch lanes x columns) · (columns x 16 rows), the B fragments the lane's words as
// they are (the columns of a k-step taken in the order the lanes hold them), the A fragments the ±1 signs of those
// columns, one shift and one LOP3 per register (the table's bit layout sign_bit). The rows' sums and sums of squares
// come from ldmatrix reads of the whole tile (ring_sums): A against a column of ones and the Gram diagonal, over a
// whole step at once where no head ends inside it, and every lane of the row adds them (LaneRow). A step (or half)
// whose sum of squares is not finite (a NaN, an Inf, a square past fp32) goes element by element in double instead;
// one vote a step finds that no row of the tile needs it. Per row: the four lanes of a row fold their partials by
// shuffles; per head: the sums of squares of its steps or halves, folded when the head ends (heads are whole
// 32-column halves). The checksum of a chunk of 8 elements with multipliers H·A^q + s·j is H·A^q·Σ(2b_j + 1) +
// s·Σ j·(2b_j + 1) (mod 2^64): two dp2a chains per chunk and one 64-bit multiply-add by the lane's running power A^q
// (times A^8 per step; a second half's chunks, A^(q+4), into a sum of their own that is multiplied by A^4 once), the
// row's hash H and the step s applied once per segment (the second sum kept in 32 bits) — the same value as the
// per-element terms.
//
// With at least a tile per SM (T >= 2112 rows on an H200) one block takes a tile, a warp per segment, and folds it
// through shared memory at the end (the ring's memory; no partials in global memory, no fences, no counters); its
// segments are the narrowest whose blocks still fit in one wave. With fewer tiles, blocks of four warps take (tile,
// segment) tasks, and up to kInlineFoldSegs segments per row the last warp to finish a tile's segments folds the
// tile's rows (a counter per tile, left at zero), its loads in flight together; segments as narrow as one wave of
// warps allows; with more segments fold_rows_kernel folds the rows after the launch. The folds add in the same
// order, so a record does not depend on which one ran. The geometry is chosen on the host (probe_launch_plan.cpp).
#include <cfloat>
#include <type_traits>

#include "kernels/cuda_check.cuh"
#include "kernels/mma_util.cuh"
#include "kernels/probe_kernels.cuh"
#include "kernels/probe_rows_device.cuh"
#include "kernels/probe_stats_device.cuh"

namespace mla::cuda {

namespace {
using namespace probe_device;

// Where lane (g, t)'s 16-byte chunk (row g's or g + 8's columns 8t..8t + 7 of a half step) sits in a ring plane: 4g
// + (t XOR (g / 2) % 4). Shared memory serves 128 bytes a cycle: the 8 lanes of a quarter warp (rows 2q, 2q + 1) then
// copy and read 8 different 16-byte bank groups, and so do the 8 rows of a chunk (an ldmatrix matrix) — with 4g + t
// the latter would be 4-way conflicts, with 8t + g the former.
__host__ __device__ constexpr int ring_index(int g, int t) { return 4 * g + (t ^ ((g >> 1) & 3)); }
constexpr bool ring_index_is_a_permutation() {
  bool seen[32] = {};
  for (int g = 0; g < 8; ++g)
    for (int t = 0; t < 4; ++t) {
      const int i = ring_index(g, t);
      if (i < 0 || i >= 32 || seen[i]) return false;
      seen[i] = true;
    }
  return true;
}
static_assert(ring_index_is_a_permutation(), "every lane's chunk has its own place in a plane");

// The checksum's dp2a weights (two bytes each: Σ 2b_j and Σ 2j·b_j over a word's two bf16 values j, j + 1) and bf16
// 1.0 twice (the sketch's sign fragments and the sums' column of ones). As literals the compiler set the weights into
// uniform registers again every half step (ten UMOVs a step, counted with Nsight Compute); from constant memory they
// are operands of the dp2a itself.
struct DotWeights {
  uint32_t two = 0x0202u, j01 = 0x0200u, j23 = 0x0604u, j45 = 0x0A08u, j67 = 0x0E0Cu;
  static constexpr uint32_t ones = 0x3F803F80u;
};
__constant__ DotWeights kDotWeights{};
__device__ __forceinline__ const DotWeights& dot_weights() { return kDotWeights; }

// Per row, one lane's accumulators. The finite sum and sum of squares of a run (a step's 64 columns of the row, or a
// half step's 32) come from the tensor cores (ring_sums below), and each of the row's four lanes adds them (the same
// values in the same order: the lanes' sums are equal, so four of them add up to 4x exactly and the fold takes a
// quarter, exact); a run with a non-finite value or a huge square goes element by element in double, every lane its
// own chunks (the host's way), added times 4 (exact) so that the quarter leaves it once. The checksum and the absmax
// are per lane and chunk of 8 values.
struct LaneRow {
  double sum = 0, sumsq = 0;  // finite values
  // The largest finite values' bits per 16-bit lane as unsigned numbers (the largest negative magnitude once there
  // is a negative value, else the largest positive) and as signed ones (the largest positive magnitude once there
  // is a positive value, else the largest negative): the absmax is the larger of the two without their sign bits
  // (absmax_bits). Two 3-way maxima per 4 words each, where masking every word first took 4 more instructions.
  uint32_t amax_u = 0, amax_s = 0;
  uint32_t nan_inf = 0;       // NaN count + 2^16 · Inf count (a lane holds at most kSegCols / 4 values of a row)
  // Σ A^q · Σ(2b + 1) over the chunks of first halves (q: the chunk's first column / 8)
  unsigned long long check = 0;
  unsigned long long check_hi = 0;  // the same over second halves' chunks, each without its factor A^4 (fold_lanes)
  unsigned jsum = 0;                // Σ Σ j·(2b + 1) over the chunks (< 2^22 per chunk, <= 128 per lane and row)

  // The checksum's part of a chunk; power: A^q for the first column c = 8q of the step's half (the row's hash
  // multiplies the sum once, in fold_lanes; a second half's chunks go to check_hi, whose A^4 is also applied there).
  template <bool kSecondHalf>
  __device__ __forceinline__ void checksum(uint4 w, uint64_t power, const DotWeights& k) {
    // Σ(2b_j + 1) = Σ 2b_j + 8 and Σ j(2b_j + 1) = Σ 2j·b_j + 28, two 16-bit lanes per word (dp2a: lo·byte0 +
    // hi·byte1).
    unsigned b2 = __dp2a_lo(w.x, k.two, 8u);
    b2 = __dp2a_lo(w.y, k.two, b2);
    b2 = __dp2a_lo(w.z, k.two, b2);
    b2 = __dp2a_lo(w.w, k.two, b2);
    unsigned j2 = __dp2a_lo(w.x, k.j01, jsum + 28u);
    j2 = __dp2a_lo(w.y, k.j23, j2);
    j2 = __dp2a_lo(w.z, k.j45, j2);
    jsum = __dp2a_lo(w.w, k.j67, j2);
    if constexpr (kSecondHalf) check_hi += power * b2;
    else check += power * b2;
  }
  // A fast run (a half step or a step): `run_sum` and `sq` are the row's (every lane of the row has them), `w` the
  // lane's chunks (all finite). Returns what the run adds to the row's head sum of squares in this lane (4x, as the
  // sums: row_quarter_sum folds it).
  __device__ __forceinline__ double fast(float run_sum, float sq, uint4 w) {
    add_to_absmax(w);
    sum += run_sum;
    sumsq += sq;
    return sq;
  }
  __device__ __forceinline__ double fast(float run_sum, float sq, uint4 w, uint4 w2) {
    add_to_absmax(w2);
    return fast(run_sum, sq, w);
  }
  __device__ __forceinline__ void add_to_absmax(uint4 w) {
    amax_u = __vimax3_u16x2(amax_u, w.x, w.y);
    amax_u = __vimax3_u16x2(amax_u, w.z, w.w);
    amax_s = __vimax3_s16x2(amax_s, w.x, w.y);
    amax_s = __vimax3_s16x2(amax_s, w.z, w.w);
  }
  __device__ __forceinline__ uint32_t absmax_bits() const {
    return __vmaxu2(amax_u & 0x7FFF7FFFu, amax_s & 0x7FFF7FFFu);
  }
  // Element by element in double, the host's way, times 4. Returns 4x the chunk's sum of squares (non-finite values
  // included).
  __device__ __forceinline__ double slow_chunk(uint4 w) {
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
    double all = 0;
    for (int j = 0; j < 8; ++j) {
      const uint32_t b = (j & 1) ? words[j >> 1] >> 16 : words[j >> 1] & 0xffffu;
      const float v = bf16_bits_to_float(b);
      const double d = v;
      all += 4.0 * (d * d);
      if (isnan(v)) nan_inf += 1u;
      else if (isinf(v)) nan_inf += 1u << 16;
      else {
        sum += 4.0 * d;
        sumsq += 4.0 * (d * d);
        amax_s = __vmaxs2(amax_s, b & 0x7FFFu);  // a magnitude, into the low lane
      }
    }
    return all;
  }
  // Folds the four lanes of a row (lane bits 0 and 1) into every one of them (the sums a quarter of the lanes'
  // total: see above); the checksum gets the row's hash and its kChecksumStep · Σ j(2b + 1) part.
  __device__ void fold_lanes(uint64_t row_hash) {
    constexpr uint64_t kA4 = pow_mod64(kChecksumBase, 4);
    check = row_hash * (check + kA4 * check_hi) + kChecksumStep * jsum;
    amax_u = absmax_bits();
    amax_s = 0;
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
      sumsq += __shfl_xor_sync(0xffffffffu, sumsq, o);
      amax_u = __vmaxu2(amax_u, __shfl_xor_sync(0xffffffffu, amax_u, o));
      nan_inf += __shfl_xor_sync(0xffffffffu, nan_inf, o);
      check += __shfl_xor_sync(0xffffffffu, check, o);
    }
    sum *= 0.25;
    sumsq *= 0.25;
  }
  __device__ float amax() const {  // after fold_lanes
    return __uint_as_float(max(amax_u & 0xFFFFu, amax_u >> 16) << 16);
  }
  __device__ unsigned nan() const { return nan_inf & 0xFFFFu; }
  __device__ unsigned inf() const { return nan_inf >> 16; }
};

// The rows' sums and sums of squares over `kHalves` half steps of a ring slot, on the tensor cores. A k-step takes
// two 8-column chunks of the half's four (the sums do not depend on which columns go together) by two ldmatrix.x4:
// A (rows 0-7 and 8-15 of either chunk: the mma's A fragments) and G, the same four matrices in the order (0, 2, 1,
// 3), whose register pairs are the B fragments of A's rows 0-7 and 8-15 (a0, a2 and a1, a3). The sum is A times a
// column of ones: every lane gets its rows' sums. The sum of squares is the diagonal of the Gram matrix A·Aᵀ, one
// mma per 8 rows: row g's lands in the lane with t = g / 2, which shuffles it to the row's other lanes (each needs
// it to tell a non-finite run). bf16 products are exact in fp32; the tensor cores add a k-step's 16 to the fp32
// accumulator and round once. A run is fast when its sum of squares is finite (NaN compares false with FLT_MAX).
// a_addr[k], g_addr[k]: the lane's row addresses of the A and G matrices of k-step k of a slot's first half (ring
// slot 0: `off` adds the slot's and the half's offset).
struct RunSums {
  float sum0, sum1, sq0, sq1;  // rows g and g + 8
};
template <int kHalves>
__device__ __forceinline__ RunSums ring_sums(const uint32_t (&a_addr)[2], const uint32_t (&g_addr)[2], uint32_t off,
                                              int lane, uint32_t ones) {
  float cs[4] = {0.f, 0.f, 0.f, 0.f}, lo[4] = {0.f, 0.f, 0.f, 0.f}, hi[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int kk = 0; kk < 2 * kHalves; ++kk) {
    // Half kk / 2 (two planes on: 1024 bytes), chunks 2·(kk % 2) and 2·(kk % 2) + 1.
    const uint32_t at = off + (kk >> 1) * 1024u;
    uint32_t A[4], G[4];
    mma::ldmatrix_x4(A, a_addr[kk & 1] + at);
    mma::ldmatrix_x4(G, g_addr[kk & 1] + at);
    mma::mma_bf16_pure(cs, A, ones, ones);
    mma::mma_bf16_pure(lo, A, G[0], G[1]);
    mma::mma_bf16_pure(hi, A, G[2], G[3]);
  }
  const int gr = lane >> 2, from = (lane & ~3) | (gr >> 1);
  const float sq0 = (gr & 1) ? lo[1] : lo[0], sq1 = (gr & 1) ? hi[3] : hi[2];
  return {cs[0], cs[2], __shfl_sync(0xffffffffu, sq0, from), __shfl_sync(0xffffffffu, sq1, from)};
}

// sqrt of a head's sum of squares as a float: in fp32 where the sum fits it (within an ulp of the double's
// rounded root; a double sqrt is ~40 instructions), else in double; NaN and Inf pass through.
__device__ __forceinline__ float head_norm(double sq) {
  return sq < 1e38 ? sqrtf(static_cast<float>(sq)) : static_cast<float>(sqrt(sq));
}

// A quarter of the sum over the four lanes of a row (lane bits 0 and 1), every one of them gets it (the lanes add
// each fast half's value and 4x their own slow chunks': LaneRow).
__device__ inline double row_quarter_sum(double v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return 0.25 * (v + __shfl_xor_sync(0xffffffffu, v, 2));
}

// The sketch's fragment register (A of the transposed product) of bf16 ±1 for columns 2u, 2u + 1 of a lane's 8 and
// sketch lanes g + 8j, from the lane's sign word `m`: their bits sit at sign_bit(j, 2u) and 16 above it, so one
// shift puts them on the two bf16 sign bits (bits 15 and 31) and one LOP3 keeps those and sets the magnitude 1.0
// (0x3F80) in both halves.
__device__ __forceinline__ uint32_t sign_pair(uint32_t m, int j, int u, uint32_t ones) {
  // (m << k) & 0x80008000 | ones as one LOP3 (ones in a register: the compiler would otherwise spend an AND and an
  // OR, a LOP3 taking one immediate).
  uint32_t r;
  asm("lop3.b32 %0, %1, 0x80008000, %2, 0xEA;" : "=r"(r) : "r"(m << (15 - 4 * j - u)), "r"(ones));
  return r;
}

// Row r's record from its segments' partials, by one warp (fold_rows_kernel, for many segments): lane l folds
// segments l, l + 32, ... (then a butterfly over the lanes: a fixed order) and sums sketch lane l over the
// segments in order. The sum is a chain of adds, but its loads are not: they go out kFoldLoads at a time, so that a
// row of 128 segments waits for 4 round trips to L2, not 16.
constexpr int kFoldLoads = 32;
__device__ void fold_row(const ProbeStatsArgs& a, const TileGeometry& g, const RowPartial* part,
                         const float* sketch_part, int64_t r, int lane) {
  if (a.sketch_out) {
    float s = 0.f;
    const float* p = sketch_part + r * g.segs * kSketchLanes + lane;
    int64_t k = 0;
    for (; k + kFoldLoads <= g.segs; k += kFoldLoads) {
      float v[kFoldLoads];
#pragma unroll
      for (int i = 0; i < kFoldLoads; ++i) v[i] = __ldcg(p + (k + i) * kSketchLanes);
#pragma unroll
      for (int i = 0; i < kFoldLoads; ++i) s += v[i];
    }
#pragma unroll 8
    for (; k < g.segs; ++k) s += __ldcg(p + k * kSketchLanes);
    a.sketch_out[r * kSketchLanes + lane] = s * kSketchScale;
  }
  RowAcc t;
#pragma unroll 4
  for (int64_t k = lane; k < g.segs; k += 32) t.add_partial(part + r * g.segs + k);
  warp_fold(t);
  if (lane == 0) store_row(a, r, t);
}

constexpr int kFoldSegsAhead = 4;
// The tile's rows from their segments' partials, by one warp, in a fixed order (the same for both folds, so a
// record does not depend on which one ran): lane rr folds row tile·16 + rr's stats over the segments in order;
// every lane sums its sketch lane over the tile's rows, segment by segment, so that a segment's 16 loads (and the
// next ones) are in flight together (a row at a time would make them a chain of L2 round trips, ~15 µs per tile).
// part, sketch_part: the tile's first row's partials ([16 rows][segs], [16 rows][segs][32]); kShared: in this
// block's shared memory, else in global memory written by other blocks.
template <bool kShared>
__device__ void fold_tile(const ProbeStatsArgs& a, const TileGeometry& g, int64_t tile, const RowPartial* part,
                          const float* sketch_part, int lane) {
  const int rows_here = static_cast<int>(min(static_cast<int64_t>(kTileRows), a.rows - tile * kTileRows));
  RowAcc acc;  // zero in lanes past the tile's rows
  if (lane < rows_here) {
#pragma unroll 4
    for (int64_t k = 0; k < g.segs; ++k) acc.add_partial<kShared>(part + lane * g.segs + k);
    store_token_l2(a, tile * kTileRows + lane, acc);
  }
  // The tile is the unit: its rows' stats folded here (a fixed order), so the host reads one unit per 16 rows.
  warp_fold(acc);
  if (lane == 0) store_stats(a, tile, acc);
  if (a.sketch_out) {
    const float* p = sketch_part + lane;  // row rr, segment k: p + (rr·segs + k)·32
    float sum[kTileRows] = {};
    // Each row's sum adds the segments in order; from global memory the loads of kFoldSegsAhead segments go out
    // together (one segment at a time made a tile of 6 segments wait for 6 round trips to L2).
    int64_t k = 0;
    for (; !kShared && k + kFoldSegsAhead <= g.segs; k += kFoldSegsAhead) {
      float v[kFoldSegsAhead][kTileRows];
#pragma unroll
      for (int i = 0; i < kFoldSegsAhead; ++i)
#pragma unroll
        for (int rr = 0; rr < kTileRows; ++rr)
          v[i][rr] = rr < rows_here ? load_partial<kShared>(p + (rr * g.segs + k + i) * kSketchLanes) : 0.f;
#pragma unroll
      for (int i = 0; i < kFoldSegsAhead; ++i)
#pragma unroll
        for (int rr = 0; rr < kTileRows; ++rr)
          if (rr < rows_here) sum[rr] += v[i][rr];
    }
    for (; k < g.segs; ++k)
#pragma unroll
      for (int rr = 0; rr < kTileRows; ++rr)
        if (rr < rows_here) sum[rr] += load_partial<kShared>(p + (rr * g.segs + k) * kSketchLanes);
#pragma unroll
    for (int rr = 0; rr < kTileRows; ++rr)
      if (rr < rows_here) a.sketch_out[(tile * kTileRows + rr) * kSketchLanes + lane] = sum[rr] * kSketchScale;
  }
}

// kBlockFold: one block per tile, warp w takes segment w, and the block folds the tile through shared memory at
// the end (no partials in global memory, no counters, no fences); else blocks of kTileWarps warps, a warp per
// (tile, segment) in turn, the partials in global memory, folded by the tile's last warp (or fold_rows_kernel).
// The block's work (`block`: its index in the tensor's own launch), shared by the one-tensor kernel and the batch
// kernel (probe_tiles_batch_kernel), which computes the same partials in the same order for each of its tensors.
template <bool kBlockFold>
__device__ __forceinline__ void tiles_block(const ProbeStatsArgs& a, const TileGeometry& g, RowPartial* part,
                                            float* sketch_part, unsigned* tile_done, int64_t block,
                                            TileStage* ring) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t tile = block, seg = warp;
  if constexpr (!kBlockFold) {
    const int64_t task = block * kTileWarps + warp;
    if (task >= g.row_tiles * g.segs) return;
    tile = task / g.segs;
    seg = task % g.segs;
  }
  const int gr = lane >> 2, t = lane & 3;
  const int64_t r0 = tile * kTileRows + gr, r1 = r0 + 8;
  const bool v0 = r0 < a.rows, v1 = r1 < a.rows;
  const int64_t c_begin = seg * g.seg_width;
  const int width = static_cast<int>(min(g.seg_width, a.cols - c_begin));  // <= kSegCols
  const int steps = (width + 63) / 64;
  const bf16* x = static_cast<const bf16*>(a.data);
  const bool sketch = a.sketch_bits != nullptr;
  TileStage* my = ring + warp * kStages;
  // This lane's first column of the segment (8t) in rows r0, r1 and in the sign table; a step adds 64 columns, a
  // half 32 (sign words: 8 per column group of 8).
  const int64_t i0 = r0 * a.cols + c_begin + 8 * t, i1 = i0 + 8 * a.cols;  // row-major indices (multiples of 8)
  const bf16* p0 = x + (v0 ? i0 : 0);
  const bf16* p1 = x + (v1 ? i1 : 0);
  const uint32_t* sg = sketch ? a.sketch_bits + (c_begin / 8 + t) * 8 + gr : nullptr;

  // Step s's copies into ring slot `slot`; lanes past the segment's end (or rows past the tensor's) write zeros.
  // A whole step (64 columns inside the segment: every step but a segment's last when its width is not a multiple
  // of 64) takes the short way: no column tests, the addresses a multiply-add from the lane's first.
  const int idx = ring_index(gr, t);  // this lane's chunk in a ring plane (TileStage)
  const uint32_t lane_dst = mma::smem_u32(&my[0].data[0][idx]), lane_sign_dst = mma::smem_u32(&my[0].signs[0][lane]);
  // Whole steps: a row's source advances 128 bytes a step (0 for a row past the tensor's, whose copies read 0 bytes).
  const uint32_t stride0 = v0 ? 128u : 0u, stride1 = v1 ? 128u : 0u, bytes0 = v0 ? 16u : 0u, bytes1 = v1 ? 16u : 0u;
  const auto issue = [&](int s, int slot) {
    const uint32_t dst = lane_dst + slot * static_cast<uint32_t>(sizeof(TileStage));
    const uint32_t sdst = lane_sign_dst + slot * static_cast<uint32_t>(sizeof(TileStage));
    constexpr uint32_t kPlane = 32 * sizeof(uint4);  // data[k] to data[k + 1]
    if (64 * (s + 1) <= width) {
      // Rows past the tensor's stay at the tensor's start (their copies read nothing: zero bytes).
      static_assert(kPlane == 512, "the copies' immediate offsets");
      asm volatile(
          "{\n .reg .u64 q0, q1;\n"
          " mad.wide.u32 q0, %2, %3, %4;\n"
          " mad.wide.u32 q1, %2, %5, %6;\n"
          " cp.async.cg.shared.global [%0], [q0], 16, %1;\n"
          " cp.async.cg.shared.global [%0+512], [q1], 16, %7;\n"
          " cp.async.cg.shared.global [%0+1024], [q0+64], 16, %1;\n"
          " cp.async.cg.shared.global [%0+1536], [q1+64], 16, %7;\n}\n" ::"r"(dst),
          "r"(bytes0), "r"(s), "r"(stride0), "l"(p0), "r"(stride1), "l"(p1), "r"(bytes1)
          : "memory");
      if (sketch)
        asm volatile(
            "{\n .reg .u64 q;\n"
            " mad.wide.u32 q, %1, 256, %2;\n"
            " cp.async.ca.shared.global [%0], [q], 4;\n"
            " cp.async.ca.shared.global [%0+128], [q+128], 4;\n}\n" ::"r"(sdst),
            "r"(s), "l"(sg)
            : "memory");
      return;
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int off = 64 * s + 32 * half;  // columns from the lane's first
      const bool ok = off + 8 * t < width;
      mma::cp_async_16(dst + 2 * half * kPlane, ok && v0 ? p0 + off : x, ok && v0);
      mma::cp_async_16(dst + (2 * half + 1) * kPlane, ok && v1 ? p1 + off : x, ok && v1);
      if (sketch)
        mma::cp_async_4(sdst + half * 32 * sizeof(uint32_t), ok ? sg + off : a.sketch_bits, ok);
    }
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) issue(s, s);
    mma::cp_async_commit();
  }

  LaneRow row0, row1;
  // Sketch accumulators, transposed: c[m][n] is sketch lanes 16m..16m + 15 x tile rows 8n..8n + 7 (c[m][n][e]: lane
  // 16m + gr + 8·(e / 2), row 8n + 2t + e % 2).
  float c[2][2][4] = {};
  const int halves_per_head = static_cast<int>(g.head_cols / 32);
  int head_left = halves_per_head;
  int64_t head = g.head_cols ? c_begin / g.head_cols : 0;
  double head_sq0 = 0, head_sq1 = 0;
  const auto& dw = dot_weights();
  // Whole steps take the rows' sums over both halves at once (one vote a step) when no head ends inside a step.
  const bool step_sums = g.head_cols % 64 == 0;
  // The lane's ldmatrix row addresses in slot 0 (ring_sums): lane l gives row l % 8 of matrix l / 8, whose plane
  // (rows 0-7 or 8-15) and chunk are (l / 8 % 2, l / 16) in A's order and (l / 16, l / 8 % 2) in G's.
  const int mat = lane >> 3, mrow = lane & 7;
  uint32_t sums_a[2], sums_g[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    sums_a[k] = mma::smem_u32(&my[0].data[mat & 1][ring_index(mrow, 2 * k + (mat >> 1))]);
    sums_g[k] = mma::smem_u32(&my[0].data[mat >> 1][ring_index(mrow, 2 * k + (mat & 1))]);
  }
  // The checksum multiplier's power of A for this lane's chunk of the step's first half (the second half's chunks
  // take the same power into check_hi): A^((c_begin + 8t + 64s) / 8), the same in both rows.
  constexpr uint64_t kA8 = pow_mod64(kChecksumBase, 8);
  uint64_t power = pow_mod64(kChecksumBase, static_cast<uint64_t>(c_begin / 8 + t));
  // The sketch of a half step's chunks w0, w1 (rows g and g + 8).
  const auto sketch_half = [&](const TileStage& st, int half, uint4 w0, uint4 w1) {
    if (!sketch) return;  // warp-uniform: every lane takes part in the mma
    // Transposed, (sketch lanes x columns) · (columns x rows): the B fragments are the lanes' own words (b0:
    // columns 0-1 of the k-step's 4, b1: columns 2-3, row g; rows g + 8 the second n-tile), the A fragments the
    // signs of this lane's 8 columns for sketch lanes gr + 8j, j = 0..3: one word (0 past the end).
    const uint32_t mh = st.signs[half][lane];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const uint32_t S[4] = {sign_pair(mh, 2 * m, 2 * k, dw.ones), sign_pair(mh, 2 * m + 1, 2 * k, dw.ones),
                               sign_pair(mh, 2 * m, 2 * k + 1, dw.ones), sign_pair(mh, 2 * m + 1, 2 * k + 1, dw.ones)};
        mma::mma_bf16_pure(c[m][0], S, k ? w0.z : w0.x, k ? w0.w : w0.y);
        mma::mma_bf16_pure(c[m][1], S, k ? w1.z : w1.x, k ? w1.w : w1.y);
      }
    }
  };
  // `halves` halves' sums of squares of rows g, g + 8 (what this lane adds: LaneRow) into their heads' sums.
  const auto add_to_heads = [&](double hsq0, double hsq1, int halves) {
    if (halves_per_head == 0) return;
    head_sq0 += hsq0;
    head_sq1 += hsq1;
    head_left -= halves;
    if (head_left == 0) {
      const double h0 = row_quarter_sum(head_sq0), h1 = row_quarter_sum(head_sq1);
      if (t == 0 && v0) a.head_l2[r0 * a.heads + head] = head_norm(h0);
      if (t == 0 && v1) a.head_l2[r1 * a.heads + head] = head_norm(h1);
      head_sq0 = head_sq1 = 0;
      head_left = halves_per_head;
      ++head;
    }
  };
  // One step on slot `slot`; kWhole: all 64 columns inside the segment (no lane past its end).
  const auto step = [&](int s, int slot, auto whole) {
    constexpr bool kWhole = decltype(whole)::value;
    const TileStage& st = my[slot];
    const uint32_t slot_off = slot * static_cast<uint32_t>(sizeof(TileStage));
    if (kWhole && step_sums) {  // both halves, the sums over the step
      const uint4 w00 = st.data[0][idx], w01 = st.data[1][idx], w10 = st.data[2][idx], w11 = st.data[3][idx];
      row0.checksum<false>(w00, power, dw);
      row1.checksum<false>(w01, power, dw);
      row0.checksum<true>(w10, power, dw);
      row1.checksum<true>(w11, power, dw);
      sketch_half(st, 0, w00, w01);
      sketch_half(st, 1, w10, w11);
      double hsq0 = 0, hsq1 = 0;  // what this lane adds to the heads' sums of squares, rows g and g + 8 (LaneRow)
      const RunSums hs = ring_sums<2>(sums_a, sums_g, slot_off, lane, dw.ones);
      const bool fast0 = hs.sq0 <= FLT_MAX, fast1 = hs.sq1 <= FLT_MAX;
      if (__all_sync(0xffffffffu, fast0 && fast1)) {  // every row of the tile: the usual case, no divergence
        hsq0 = row0.fast(hs.sum0, hs.sq0, w00, w10);
        hsq1 = row1.fast(hs.sum1, hs.sq1, w01, w11);
      } else {
        hsq0 = fast0 ? row0.fast(hs.sum0, hs.sq0, w00, w10)
                     : row0.slow_chunk(w00) + row0.slow_chunk(w10);
        hsq1 = fast1 ? row1.fast(hs.sum1, hs.sq1, w01, w11)
                     : row1.slow_chunk(w01) + row1.slow_chunk(w11);
      }
      add_to_heads(hsq0, hsq1, 2);
      return;
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int off = 64 * s + 32 * half;
      // Lanes past the segment's end (and rows past the tensor's) hold zeros.
      const bool in = kWhole || off + 8 * t < width;
      const uint4 w0 = st.data[2 * half][idx], w1 = st.data[2 * half + 1][idx];
      // A row past the tensor's is zeros and its accumulators are dropped: only lanes past the segment's end must
      // not add.
      if (in) {
        if (half) {
          row0.checksum<true>(w0, power, dw);
          row1.checksum<true>(w1, power, dw);
        } else {
          row0.checksum<false>(w0, power, dw);
          row1.checksum<false>(w1, power, dw);
        }
      }
      sketch_half(st, half, w0, w1);
      double hsq0 = 0, hsq1 = 0;  // what this lane adds to the heads' sums of squares, rows g and g + 8 (LaneRow)
      const RunSums hs = ring_sums<1>(sums_a, sums_g, slot_off + half * 1024u, lane, dw.ones);
      if (hs.sq0 <= FLT_MAX) hsq0 = row0.fast(hs.sum0, hs.sq0, w0);
      else if (in) hsq0 = row0.slow_chunk(w0);
      if (hs.sq1 <= FLT_MAX) hsq1 = row1.fast(hs.sum1, hs.sq1, w1);
      else if (in) hsq1 = row1.slow_chunk(w1);
      // Heads are whole halves, so a half is in or out on every lane alike here.
      if (kWhole || off < width) add_to_heads(hsq0, hsq1, 1);
    }
  };
  for (int s = 0, slot = 0; s < steps; ++s, power *= kA8, slot = slot == kStages - 1 ? 0 : slot + 1) {
    mma::cp_async_wait<kStages - 2>();  // step s has landed (this lane's copies)
    // Every lane's: ldmatrix reads the other lanes' chunks. The same barrier orders the previous step's reads of
    // the slot refilled below before its copies.
    __syncwarp();
    // The slot consumed by the previous step is free (this step's slot is read below, its turn comes again
    // kStages steps on).
    if (s + kStages - 1 < steps) issue(s + kStages - 1, slot == 0 ? kStages - 1 : slot - 1);
    mma::cp_async_commit();
    if (64 * (s + 1) <= width) step(s, slot, std::true_type{});
    else step(s, slot, std::false_type{});
  }
  mma::cp_async_wait<0>();
  row0.fold_lanes(checksum_row_hash(static_cast<uint64_t>(r0)));
  row1.fold_lanes(checksum_row_hash(static_cast<uint64_t>(r1)));
  // The partials of rows gr and gr + 8 of the tile: [16 rows][segs] stats, [16 rows][segs][32] sketch lanes.
  if constexpr (kBlockFold) {
    __syncthreads();  // every warp is done with its ring: the partials go there
    part = reinterpret_cast<RowPartial*>(ring);
    sketch_part = reinterpret_cast<float*>(part + kTileRows * g.segs);
  } else {
    part += tile * kTileRows * g.segs;
    sketch_part += tile * kTileRows * g.segs * kSketchLanes;
  }
  if (t == 0) {
    const auto put = [&](const LaneRow& q, int rr) {
      part[rr * g.segs + seg] = RowPartial{q.sum, q.sumsq, q.amax(), q.nan(), q.inf(), 0u, q.check};
    };
    if (v0) put(row0, gr);
    if (v1) put(row1, gr + 8);
  }
  if (sketch) {
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int rr = 8 * n + 2 * t + e % 2, k = 16 * m + gr + 8 * (e / 2);
          if (tile * kTileRows + rr < a.rows) sketch_part[(rr * g.segs + seg) * kSketchLanes + k] = c[m][n][e];
        }
  }
  if constexpr (kBlockFold) {
    __syncthreads();
    if (warp == 0) fold_tile<true>(a, g, tile, part, sketch_part, lane);
    return;
  }
  if (!g.fold_inline) return;
  // The last of the tile's segments to finish folds the tile (threadFenceReduction's pattern).
  __threadfence();
  __syncwarp();
  if (g.segs > 1) {
    unsigned prev = 0;
    if (lane == 0) prev = atomicAdd(tile_done + tile, 1u);
    prev = __shfl_sync(0xffffffffu, prev, 0);
    if (prev != static_cast<unsigned>(g.segs - 1)) return;
    if (lane == 0) tile_done[tile] = 0;  // left at zero for the next launch
    __threadfence();
  }
  fold_tile<false>(a, g, tile, part, sketch_part, lane);
}

template <bool kBlockFold>
__global__ void __launch_bounds__(kBlockFold ? kMaxBlockWarps * 32 : kTileWarps * 32,
                                  kBlockFold ? kTileMinBlocks : kTaskMinBlocks)
    probe_tiles_kernel(const ProbeStatsArgs a, TileGeometry g, RowPartial* part, float* sketch_part,
                       unsigned* tile_done) {
  extern __shared__ TileStage ring[];  // [warps][kStages]
#if __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent (launch_probe_tiles): the blocks may start before the stream's previous
  // kernel (the one that wrote the tensor) has finished; this waits for it and its writes before any memory access.
  // Without the launch attribute, a no-op.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  tiles_block<kBlockFold>(a, g, part, sketch_part, tile_done, blockIdx.x, ring);
}

// The task a batch launch's block works for: the last one whose first block is at most the block's index.
template <int N>
__device__ const TileBatchTask& batch_task(const TileBatchOf<N>& b) {
  int i = 0;
  while (i + 1 < b.n && blockIdx.x >= b.task[i + 1].first_block) ++i;
  return b.task[i];
}

// A batch's row task (TileBatchTask::row_parts): block `block` of it, each warp the row kernel's warp of the same
// index (rows_warp), so the same records. Not inlined: its registers (a row's sketch sums in double, its loads in
// flight) would otherwise be the tile path's too, which then spilled.
__device__ __noinline__ void rows_block(const TileBatchTask& t, int64_t block) {
  const int64_t task = block * kTileWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const bool bf = t.a.dtype == DType::DType_bf16;
  if (!t.a.sketch_bits) {
    if (bf) rows_warp<bf16, 1, false>(t.a, task, lane);
    else rows_warp<float, 1, false>(t.a, task, lane);
  } else if (t.row_parts == 8) {
    if (bf) rows_warp<bf16, 8, true>(t.a, task, lane);
    else rows_warp<float, 8, true>(t.a, task, lane);
  } else {
    if (bf) rows_warp<bf16, 4, true>(t.a, task, lane);
    else rows_warp<float, 4, true>(t.a, task, lane);
  }
}

// Several tensors' (tile, segment) tasks and narrow tensors' rows in one launch: block b works for batch_task(b), as
// block b − first_block of that tensor's own launch (a tile task) or of its row tasks.
template <int N>
__global__ void __launch_bounds__(kTileWarps * 32, kTaskMinBlocks)
    probe_tiles_batch_kernel(const __grid_constant__ TileBatchOf<N> b) {
  extern __shared__ TileStage ring[];  // [kTileWarps][kStages]
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");  // as probe_tiles_kernel's
#endif
  const TileBatchTask& t = batch_task(b);
  if (t.row_parts > 0) rows_block(t, blockIdx.x - t.first_block);
  else tiles_block<false>(t.a, t.g, t.part, t.sketch_part, t.tile_done, blockIdx.x - t.first_block, ring);
}

// Many segments per row (few rows: narrow segments keep the GPU busy): one warp per row.
__global__ void fold_rows_kernel(const ProbeStatsArgs a, TileGeometry g, const RowPartial* part,
                                 const float* sketch_part) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (r < a.rows) fold_row(a, g, part, sketch_part, r, threadIdx.x & 31);
}

// fold_rows_kernel for several tensors: block b for batch_task(b).
template <int N>
__global__ void fold_rows_batch_kernel(const __grid_constant__ TileBatchOf<N> b) {
  const TileBatchTask& t = batch_task(b);
  const int64_t r = (blockIdx.x - t.first_block) * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (r < t.a.rows) fold_row(t.a, t.g, t.part, t.sketch_part, r, threadIdx.x & 31);
}


}  // namespace

TileOccupancy probe_tiles_occupancy(bool block_fold, int warps) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  TileOccupancy o;
  CUDA_CHECK(cudaDeviceGetAttribute(&o.sms, cudaDevAttrMultiProcessorCount, dev));
  const void* kernel = block_fold ? reinterpret_cast<const void*>(probe_tiles_kernel<true>)
                                  : reinterpret_cast<const void*>(probe_tiles_kernel<false>);
  // Past 48 KB a block's dynamic shared memory needs the opt-in, a maximum per kernel: the largest block the
  // kernel is ever launched with, whatever size is asked about now (setting each size asked would leave the
  // last one asked, and a larger block chosen earlier would then fail to launch).
  const size_t most = tile_smem(block_fold ? kMaxBlockWarps : kTileWarps);
  if (most > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(most)));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o.blocks, kernel, warps * 32, tile_smem(warps)));
  return o;
}

namespace {
// A tile kernel's launch of `blocks` blocks of `warps` warps, as a programmatic dependent of the stream's previous
// kernel when asked (`attr` holds the attribute the configuration points to).
// The first kTileBatchSmall tasks of `b` (b.n of them), for the kernels whose parameters hold that many.
TileBatchOf<kTileBatchSmall> small_batch(const TileBatch& b) {
  TileBatchOf<kTileBatchSmall> s;
  s.n = b.n;
  for (int i = 0; i < b.n && i < kTileBatchSmall; ++i) s.task[i] = b.task[i];
  return s;
}

cudaLaunchConfig_t tiles_launch_config(unsigned blocks, int warps, bool programmatic, cudaStream_t stream,
                                       cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(static_cast<unsigned>(warps * 32));
  cfg.dynamicSmemBytes = tile_smem(warps);
  cfg.stream = stream;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = programmatic ? 1 : 0;
  return cfg;
}
}  // namespace

void launch_probe_tiles(bool block_fold, unsigned blocks, int warps, const ProbeStatsArgs& a, const TileGeometry& g,
                        RowPartial* part, float* sketch_part, unsigned* tile_done, bool programmatic,
                        cudaStream_t stream) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = tiles_launch_config(blocks, warps, programmatic, stream, attr);
  if (block_fold)
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, probe_tiles_kernel<true>, a, g, part, sketch_part, tile_done));
  else
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, probe_tiles_kernel<false>, a, g, part, sketch_part, tile_done));
}

void launch_probe_tiles_batch(const TileBatch& b, unsigned blocks, bool programmatic, cudaStream_t stream) {
  if (b.n <= 0 || blocks == 0) return;
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = tiles_launch_config(blocks, kTileWarps, programmatic, stream, attr);
  if (b.n <= kTileBatchSmall)
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, probe_tiles_batch_kernel<kTileBatchSmall>, small_batch(b)));
  else
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, probe_tiles_batch_kernel<kTileBatchMax>, b));
}

void launch_probe_fold_rows_batch(const TileBatch& b, unsigned blocks, cudaStream_t stream) {
  if (b.n <= 0 || blocks == 0) return;
  if (b.n <= kTileBatchSmall)
    fold_rows_batch_kernel<kTileBatchSmall><<<blocks, kFoldRowWarps * 32, 0, stream>>>(small_batch(b));
  else
    fold_rows_batch_kernel<kTileBatchMax><<<blocks, kFoldRowWarps * 32, 0, stream>>>(b);
  CUDA_CHECK_LAUNCH();
}

void launch_probe_fold_rows(const ProbeStatsArgs& a, const TileGeometry& g, const RowPartial* part,
                            const float* sketch_part, cudaStream_t stream) {
  fold_rows_kernel<<<static_cast<unsigned>(fold_row_blocks(a.rows)), kFoldRowWarps * 32, 0, stream>>>(a, g, part,
                                                                                                   sketch_part);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
