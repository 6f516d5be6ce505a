// Device code shared by the probe kernels (nvcc only): a row's accumulator and the stores of a record's units (the
// row kernel, probe_rows.cu, and the tile kernel's folds, probe_tiles.cu), and the bit layout of the sketch's
// sign-bit table (probe_sketch_signs.cu builds it, both kernels read it). Reductions are fixed trees, so records
// are bit-reproducible.
#pragma once
#include <math_constants.h>

#include <cstdint>

#include "kernels/block_reduce.cuh"
#include "kernels/probe_kernels.cuh"
#include "kernels/probe_stats.cuh"
#include "kernels/sketch_hash.cuh"

namespace mla::cuda::probe_device {

// A partial written by another warp of this launch: in this block's shared memory (kShared: after a barrier) as
// it is; in global memory past L1, which is not coherent.
template <bool kShared, class T>
__device__ __forceinline__ T load_partial(const T* p) {
  if constexpr (kShared) return *p;
  else return __ldcg(p);
}

struct RowAcc {
  double sum = 0, sumsq = 0, amax = 0, nan = 0, inf = 0;  // sum, sumsq and absmax of the finite values
  unsigned long long check = 0;

  // Adds a segment's partial written by another warp of this launch (load_partial).
  template <bool kShared = false>
  __device__ void add_partial(const RowPartial* p) {
    sum += load_partial<kShared>(&p->sum);
    sumsq += load_partial<kShared>(&p->sumsq);
    amax = fmax(amax, static_cast<double>(load_partial<kShared>(&p->amax)));
    nan += load_partial<kShared>(&p->nan);
    inf += load_partial<kShared>(&p->inf);
    check += load_partial<kShared>(&p->check);
  }
};

// Where the sign of (column i of a group of 8, sketch lane g + 8j) sits in the group's word g of the sign-bit
// table: the odd column of a pair 16 bits above the even one (the tile kernel's sign_pair reads two at once).
__host__ __device__ constexpr int sign_bit(int j, int i) { return 16 * (i & 1) + 4 * j + (i >> 1); }

__device__ inline float bf16_bits_to_float(uint32_t b) { return __uint_as_float(b << 16); }

// Folds a lane's RowAcc over the warp (butterfly: fixed order, every lane gets the result).
__device__ inline void warp_fold(RowAcc& q) {
  q.sum = warp_sum(q.sum);
  q.sumsq = warp_sum(q.sumsq);
  q.nan = warp_sum(q.nan);
  q.inf = warp_sum(q.inf);
  q.amax = warp_max(q.amax);
  q.check = warp_sum(q.check);
}

// A unit's stats (a row's or a tile's: ProbeStatsPlan::units), which the host folds, and its checksum's partial sum.
__device__ inline void store_stats(const ProbeStatsArgs& a, int64_t unit, const RowAcc& q) {
  double* st = a.row_stats + unit * kRowStats;
  st[0] = q.sum;
  st[1] = q.sumsq;
  st[2] = q.amax;
  st[3] = q.nan;
  st[4] = q.inf;
  a.row_checksum[unit] = q.check;
}
// Row r's token L2: of every value, as the host sums it (NaN when there is a NaN, else Inf when there is an Inf).
__device__ inline void store_token_l2(const ProbeStatsArgs& a, int64_t r, const RowAcc& q) {
  a.token_l2[r] = q.nan > 0 ? CUDART_NAN_F : q.inf > 0 ? CUDART_INF_F : static_cast<float>(sqrt(q.sumsq));
}
// A row's record where the unit is the row.
__device__ inline void store_row(const ProbeStatsArgs& a, int64_t r, const RowAcc& q) {
  store_stats(a, r, q);
  store_token_l2(a, r, q);
}

}  // namespace mla::cuda::probe_device
