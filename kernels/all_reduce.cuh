// all_reduce: o = Σ_ranks o_partial. The device-side sum the local communicator uses when
// ranks share a device (or reach each other's partials through peer copies).
#pragma once
#include <cuda_runtime.h>

#include "kernels/device_tensor.cuh"

namespace mla::cuda {

constexpr int kMaxRanks = 64;

struct PartialList {
  const bf16* p[kMaxRanks];  // each [n], all on the launching device; summed in this order
  int count = 0;
};

// out[i] = bf16(Σ_r float(p_r[i])), accumulated in fp32 in rank order (the reference's order).
void launch_sum_partials(const PartialList& parts, bf16* out, int64_t n, cudaStream_t stream);

}  // namespace mla::cuda
