// Probe records on the device (core/probe/probe.h): the finite sum / sum of squares / absmax, NaN and Inf counts and
// the checksum's partial sum per unit (a 16-row tile where the kernel folds a tile's rows together, else a token
// row: ProbeStatsPlan::units), L2 per token and per head, and the sketch. The host folds the units' partials into the
// record (fixed order, deterministic).
//
// The sketch is computed in the same pass as the stats, against a table of sign bits (1: −1/sqrt(32)) built
// once per (probe, column offset, width) and kept: bf16 tensors on the tensor cores (mma with ±1 operands,
// exact; fp32 accumulation, times 1/sqrt(32)), others (fp32 lse, odd widths) in double.
//
// The kernels: probe_tiles.cu (bf16 tensors in 16-row tiles, the real models' probes), probe_rows.cu (a warp per
// row: the rest); which one and its geometry: probe_launch_plan.cpp; the sign-bit table: probe_sketch_signs.cu.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/device_tensor.cuh"

namespace mla::cuda {

constexpr int kRowStats = 5;  // sum, sumsq (finite values), absmax, nan, inf

struct ProbeStatsArgs {
  const void* data = nullptr;  // [rows, cols] of `dtype`
  DType dtype = DType::DType_bf16;
  int64_t rows = 0, cols = 0;
  int heads = 0;                // cols = heads · X; 0: no head map
  const uint32_t* sketch_bits = nullptr;  // the table of launch_sketch_sign_bits for these columns; nullptr: no sketch
  double* row_stats = nullptr;  // [probe_stats_plan(cache, a).units, kRowStats]
  unsigned long long* row_checksum = nullptr;  // [units] partial sums of checksum_term (mod 2^64)
  float* token_l2 = nullptr;    // [rows]
  float* head_l2 = nullptr;     // [rows, heads] (when heads > 0)
  float* sketch_out = nullptr;  // [rows, 32] (when sketch_bits)
  void* workspace = nullptr;    // probe_stats_plan(cache, a).workspace bytes of device memory
};

// What a launch for `a` needs around it, from one lookup of its geometry (kept per shape):
struct ProbeStatsPlan {
  // Units of stats (row_stats, row_checksum) it writes: its 16-row tiles where a tile's rows are folded together
  // on the device (then the host reads a sixteenth of the per-row figures), else its rows.
  int64_t units = 0;
  // Device memory it needs beside its outputs (0 for the one-warp-per-row kernel, and when each 16-row tile is
  // folded in its block: T >= 16 rows per SM), of which the first counter_bytes are counters that must be zero
  // before the first launch on that memory (every launch leaves them zero).
  size_t workspace = 0, counter_bytes = 0;
};
// `cache`: the rank's (RankContext::probe_launch_cache), which keeps the geometry of each shape
// (probe_launch_plan.cuh).
class ProbeLaunchCache;
ProbeStatsPlan probe_stats_plan(ProbeLaunchCache& cache, const ProbeStatsArgs& a);
size_t probe_stats_workspace(ProbeLaunchCache& cache, const ProbeStatsArgs& a);  // probe_stats_plan(...).workspace
// programmatic: the tile kernel launched as a programmatic dependent of the stream's previous kernel where the
// device has compute capability 9 or later (its launch overlaps the end of that kernel, the stage that wrote the
// tensor); false: plain launches (the engine's option probe_pdl=0).
void launch_probe_stats(ProbeLaunchCache& cache, const ProbeStatsArgs& a, bool programmatic, cudaStream_t stream);
// Several tensors in few launches (a tile kernel and a fold kernel for up to 22 tensors at a time), each tensor's
// records as launch_probe_stats gives them; for the tensors whose launch takes the tile kernel's task kind (bf16,
// fewer 16-row tiles than the GPU has SMs), with their workspace as for one launch, and those the row kernel takes
// where a batch runs their rows as its warps would (fp32 such as lse and DSA's index scores: all at stats level; with
// the sketch those of at most 65536 values and those of few rows, at most 66 on an H200, which the row kernel splits
// over 4 or more warps a row anyway; probe_stats_batchable says which).
// programmatic: the tile kernel as for launch_probe_stats.
bool probe_stats_batchable(ProbeLaunchCache& cache, const ProbeStatsArgs& a);
void launch_probe_stats_batch(ProbeLaunchCache& cache, const std::vector<ProbeStatsArgs>& list, bool programmatic,
                              cudaStream_t stream);

// The sign-bit table of the sketch for global columns col0 .. col0 + cols - 1 of the probe keyed `key`:
// sketch_sign_bits_words(cols) words; word 8·(c / 8) + (k % 8), bit 16·(i % 2) + 4·(k / 8) + i / 2 (i = c % 8)
// is set when the entry of local column c, sketch lane k is −1/sqrt(32) (the layout lets one word give a
// tensor-core lane its fragments, two instructions per register).
size_t sketch_sign_bits_words(int64_t cols);
void launch_sketch_sign_bits(uint64_t key, int64_t col0, int64_t cols, uint32_t* bits, cudaStream_t stream);

// Test hook: the sketch coefficients of columns [col0, col0 + cols) × 32 lanes as the kernels see them (the
// sign-bit table built on the current device, decoded); row-major [cols, 32].
std::vector<float> device_sketch_coeffs(uint64_t key, int64_t col0, int64_t cols);

}  // namespace mla::cuda
