// The row kernel's work, one warp's (device code, nvcc only): shared by the row kernel (probe_rows.cu) and the tile
// kernel's batch launch (probe_tiles.cu), which takes narrow tensors' rows as tasks of its own beside the tiles.
//
// One warp per token row, warp-level reductions only: one pass over the row for the finite sum, sum of squares,
// absmax, NaN/Inf counts, the checksum's partial sum and the sketch (in double); a second pass (from L1/L2) for the
// head L2. The token L2 is NaN when the row has a NaN, else Inf when it has an Inf, as on the host. The unit of stats
// is the row.
//
// The sketch costs 32 signed additions per value, four times the rest of a value's work. With few rows (decode's
// 64 rows of DSA's idx_scores, 16385 columns: a warp on each of 64 SMs) a row's sketch lanes are split over up to
// 8 warps, each of which reads the whole row and sums its own lanes; the first also takes the stats. Each sketch
// lane's additions are the same, in the same order, however the lanes are split, and so are its bits.
#pragma once
#include "kernels/probe_kernels.cuh"
#include "kernels/probe_stats_device.cuh"

namespace mla::cuda::probe_device {

// One step of warp_sum_transposed: lanes `o` apart exchange halves of their first 2·o values.
template <int O>
__device__ __forceinline__ void transposed_step(double (&v)[kSketchLanes], int lane) {
  const bool upper = lane & O;
#pragma unroll
  for (int i = 0; i < O; ++i) {
    const double lo = v[i], hi = v[i + O];
    const double recv = __shfl_xor_sync(0xffffffffu, upper ? lo : hi, O);
    v[i] = (upper ? hi : lo) + recv;
  }
}

// Lane k gets the warp's sum of v[k] (32 values a lane), bit for bit the sum warp_sum(v[k]) gives (the same two
// values added at each of its five steps, own + partner's), in 31 shuffles instead of 160: at each step a lane
// keeps half of its values, whose partner's halves it takes, and sends the other half. (Each step's count is a
// constant, so that v stays in registers.)
__device__ __forceinline__ double warp_sum_transposed(double (&v)[kSketchLanes], int lane) {
  static_assert(kSketchLanes == 32, "a value per lane");
  transposed_step<16>(v, lane);
  transposed_step<8>(v, lane);
  transposed_step<4>(v, lane);
  transposed_step<2>(v, lane);
  transposed_step<1>(v, lane);
  return v[0];
}

// Warp `task` of a launch over `a`: row task / kParts, whose sketch lanes [part·kLanes, (part + 1)·kLanes) it sums
// (part = task % kParts), part 0 the stats and head L2 as well (kParts 1: every lane and the stats by one warp).
// kSketch: a.sketch_bits is set (without it the sketch's accumulators are left out, and with them their registers).
//
// A lane's stats are chains of dependent operations, one link a value, so each link is kept short (the warps are few
// where it matters: decode's 64 rows of DSA's idx_scores, a warp on each of 64 SMs), with the bits of adding value by
// value in double: the finite sum and sum of squares in the columns' order (a non-finite value adds +0.0, which leaves
// a sum that is never −0.0 unchanged; the square by a fused multiply-add); the absmax of exact values in float, the
// NaN and Inf counts in integers; the checksum as two sums mod 2^64 that give Σ (H·A^(c >> 3) + step·(c & 7))·(2b + 1)
// once multiplied out: c & 7 is the lane's own for every column it takes, and a chunk's powers of A are the chunk's
// first times constants.
template <class T, int kParts, bool kSketch>
__device__ __forceinline__ void rows_warp(const ProbeStatsArgs& a, int64_t task, int lane) {
  static_assert(kSketchLanes % kParts == 0, "whole sketch lanes per warp");
  static_assert(kSketch || kParts == 1, "without the sketch a row is one warp's");
  constexpr int kLanes = kSketch ? kSketchLanes / kParts : 1;
  const int64_t r = task / kParts;
  const int part = static_cast<int>(task % kParts);
  const bool stats = part == 0;  // warp-uniform
  if (r >= a.rows) return;
  const T* x = static_cast<const T*>(a.data) + r * a.cols;
  const auto value = [&](int64_t c) {
    if constexpr (sizeof(T) == 2) return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(x)[c]);
    else return x[c];
  };
  const auto bits_of = [](float v) -> uint32_t {
    if constexpr (sizeof(T) == 2) return __float_as_uint(v) >> 16;  // exact: v is the bf16 value
    else return __float_as_uint(v);
  };
  double sum = 0, sumsq = 0;
  float amax = 0.f;
  unsigned nan = 0, inf = 0;
  // The checksum: Σ A^(c >> 3)·(2b + 1) and Σ (2b + 1) over the lane's columns. A lane's columns step by 32, its power
  // of A by A^4; `power` is A^(c >> 3) for the lane's next column.
  unsigned long long check_pow = 0, check_one = 0;
  uint64_t power = pow_mod64(kChecksumBase, static_cast<uint64_t>(lane >> 3));
  constexpr uint64_t kA4 = pow_mod64(kChecksumBase, 4);
  const auto stat = [&](float v) {
    const bool finite = isfinite(v);
    nan += isnan(v);
    inf += isinf(v);
    const double e = finite ? static_cast<double>(v) : 0.0;
    sum += e;
    sumsq = fma(e, e, sumsq);
    amax = fmaxf(amax, finite ? fabsf(v) : 0.f);
  };
  double skacc[kLanes];
#pragma unroll
  for (int j = 0; j < kLanes; ++j) skacc[j] = 0;
  // Column c's value into the lane's sketch sums, in the order of the columns (the additions, and so the bits, are
  // the same however far ahead the values were loaded).
  const auto sketch = [&](int64_t c, float v) {
    if constexpr (kSketch) {
      const double d = v;
      const uint32_t* words = a.sketch_bits + (c / 8) * 8;  // lane k: word k % 8, bit sign_bit(k / 8, c % 8)
      const int i = static_cast<int>(c & 7);
#pragma unroll
      for (int j = 0; j < kLanes; ++j) {
        const int k = part * kLanes + j;
        skacc[j] += ((words[k & 7] >> sign_bit(k >> 3, i)) & 1u) ? -d : d;
      }
    }
  };
  // A warp a row leaves few warps per SM (decode's 64 rows of DSA's idx_scores: one), so each lane loads kAhead
  // columns at once, and the next kAhead while it adds them: a chunk's loads in flight all the time instead of one
  // round trip to memory per column.
  constexpr int kAhead = 32;
  constexpr int64_t kChunk = 32 * kAhead;  // a chunk's columns over the warp
  constexpr uint64_t kChunkPower = pow_mod64(kChecksumBase, 4 * kAhead);  // a lane's power of A from chunk to chunk
  const auto whole = [&](int64_t from) { return from + 32 * (kAhead - 1) < a.cols; };
  int64_t c = lane;
  if (whole(c)) {
    float v[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) v[u] = value(c + 32 * u);
    for (;;) {
      const bool more = whole(c + kChunk);
      float next[kAhead];
      if (more) {
#pragma unroll
        for (int u = 0; u < kAhead; ++u) next[u] = value(c + kChunk + 32 * u);
      }
      unsigned long long weighted = 0;
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {
        if (stats) {
          stat(v[u]);
          const uint64_t t = 2ull * bits_of(v[u]) + 1ull;
          weighted += pow_mod64(kChecksumBase, 4 * u) * t;  // a constant once unrolled
          check_one += t;
        }
        sketch(c + 32 * u, v[u]);
      }
      if (stats) {
        check_pow += power * weighted;
        power *= kChunkPower;
      }
      c += kChunk;
      if (!more) break;
#pragma unroll
      for (int u = 0; u < kAhead; ++u) v[u] = next[u];
    }
  }
  for (; c < a.cols; c += 32) {
    const float v = value(c);
    if (stats) {
      stat(v);
      const uint64_t t = 2ull * bits_of(v) + 1ull;
      check_pow += power * t;
      check_one += t;
      power *= kA4;
    }
    sketch(c, v);
  }
  if constexpr (kSketch) {
    if constexpr (kParts == 1) {
      const double s = warp_sum_transposed(skacc, lane);
      a.sketch_out[r * kSketchLanes + lane] = static_cast<float>(s * kSketchScale);
    } else {
      // Each lane's sum over the warp, by warp_sum's steps: the bits warp_sum_transposed gives it.
      double mine = 0;
#pragma unroll
      for (int j = 0; j < kLanes; ++j) {
        const double s = warp_sum(skacc[j]);
        if (lane == j) mine = s;
      }
      if (lane < kLanes)
        a.sketch_out[r * kSketchLanes + part * kLanes + lane] = static_cast<float>(mine * kSketchScale);
    }
  }
  if (!stats) return;
  const uint64_t check = checksum_row_hash(static_cast<uint64_t>(r)) * check_pow +
                         kChecksumStep * static_cast<uint64_t>(lane & 7) * check_one;
  RowAcc acc{sum, sumsq, amax, static_cast<double>(nan), static_cast<double>(inf), check};
  warp_fold(acc);
  if (lane == 0) store_row(a, r, acc);
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

}  // namespace mla::cuda::probe_device
