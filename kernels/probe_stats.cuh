// Probe statistics on the device (probes/probe.h): per token row, the finite sum / sum of squares / absmax,
// NaN and Inf counts, L2 per token and per head, and the sketch (row · the ±1/√32 counter-hash matrix).
// The host folds the per-row partials into the record (fixed order, deterministic).
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
  int heads = 0;               // cols = heads · X; 0: no head map
  int64_t col_offset = 0;      // this shard's first global column (sketch matrix rows)
  uint64_t key = 0;            // probe_key(name)
  bool sketch = false;
  double* row_stats = nullptr;  // [rows, kRowStats]
  float* token_l2 = nullptr;    // [rows]
  float* head_l2 = nullptr;     // [rows, heads] (when heads > 0)
  float* sketch_out = nullptr;  // [rows, 32] (when sketch)
};

void launch_probe_stats(const ProbeStatsArgs& a, cudaStream_t stream);

// Test hook: the sketch coefficients of columns [col0, col0 + cols) × 32 lanes, computed by a kernel on the
// current device; row-major [cols, 32].
std::vector<float> device_sketch_coeffs(uint64_t key, int64_t col0, int64_t cols);

}  // namespace mla::cuda
