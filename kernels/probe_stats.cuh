// Probe records on the device (probes/probe.h): per token row the finite sum / sum of squares / absmax,
// NaN and Inf counts, the checksum's partial sum, L2 per token and per head, and the sketch. The host folds
// the per-row partials into the record (fixed order, deterministic).
//
// Sketch of a bf16 tensor: a GEMM on the tensor cores, [rows, cols] · S [cols, 32] with S = ±1 in bf16
// (exact), fp32 accumulation, times 1/sqrt(32) — S is built once per (probe, column offset, width) and kept.
// Sketch of an fp32 tensor (only small ones, e.g. lse): in the stats kernel, from the hash, in double.
#pragma once
#include <cublas_v2.h>
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
  int64_t col_offset = 0;       // this shard's first global column (sketch matrix rows)
  uint64_t key = 0;             // probe_key(name)
  bool sketch = false;          // the sketch in this kernel (fp32 tensors; bf16 ones use launch_sketch_gemm)
  double* row_stats = nullptr;  // [rows, kRowStats]
  unsigned long long* row_checksum = nullptr;  // [rows] partial sums of checksum_term (mod 2^64)
  float* token_l2 = nullptr;    // [rows]
  float* head_l2 = nullptr;     // [rows, heads] (when heads > 0)
  float* sketch_out = nullptr;  // [rows, 32] (when sketch)
  void* workspace = nullptr;    // probe_stats_workspace(a) bytes of device memory
};

// Device memory launch_probe_stats needs beside its outputs (0 for the one-block-per-row kernel).
size_t probe_stats_workspace(const ProbeStatsArgs& a);
void launch_probe_stats(const ProbeStatsArgs& a, cudaStream_t stream);

// S [cols, 32] bf16, ±1 for global columns col0 .. col0 + cols - 1 of the probe keyed `key`.
void launch_sketch_signs(uint64_t key, int64_t col0, int64_t cols, bf16* signs, cudaStream_t stream);
// out = data [rows, cols] · signs [cols, 32] / sqrt(32), fp32, stored lane-major: out[lane · rows + row].
void sketch_gemm(cublasHandle_t h, const bf16* data, int64_t rows, int64_t cols, const bf16* signs, float* out);

// Test hook: the sketch coefficients of columns [col0, col0 + cols) × 32 lanes, computed by a kernel on the
// current device; row-major [cols, 32].
std::vector<float> device_sketch_coeffs(uint64_t key, int64_t col0, int64_t cols);

}  // namespace mla::cuda

namespace mla::cuda {
// Writes `value` to a flag in mapped host memory once everything before it on `stream` is done.
void launch_set_flag(unsigned* flag, unsigned value, cudaStream_t stream);
}  // namespace mla::cuda
