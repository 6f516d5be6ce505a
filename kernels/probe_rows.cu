// The probe's row kernel, for the tensors the tile kernel (probe_tiles.cu) does not take: fp32 tensors such as lse,
// odd widths, heads narrower than 32 columns; a warp's work is rows_warp (probe_rows_device.cuh).
#include "kernels/cuda_check.cuh"
#include "kernels/probe_kernels.cuh"
#include "kernels/probe_rows_device.cuh"

namespace mla::cuda {

namespace {
using namespace probe_device;

constexpr int kThreads = 256;  // at most: fewer when the rows are too few for a block on every SM (launch_probe_rows)

template <class T, int kParts, bool kSketch>
__global__ void __launch_bounds__(kThreads) probe_stats_kernel(const ProbeStatsArgs a) {
  const int64_t task = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
  rows_warp<T, kParts, kSketch>(a, task, threadIdx.x & 31);
}

template <int kParts, bool kSketch>
void launch_rows(const ProbeStatsArgs& a, int sms, cudaStream_t stream) {
  // kParts warps a row, as many a block as leave a block for every SM (decode's 64 rows of DSA's idx_scores at the
  // sketch level: 512 warps, two a block); a warp's work is the same either way.
  const int64_t tasks = a.rows * kParts;
  int warps = kThreads / 32;
  while (warps > 1 && (tasks + warps - 1) / warps < sms) warps /= 2;
  const auto blocks = static_cast<unsigned>((tasks + warps - 1) / warps);
  if (a.dtype == DType::DType_bf16)
    probe_stats_kernel<bf16, kParts, kSketch><<<blocks, warps * 32, 0, stream>>>(a);
  else
    probe_stats_kernel<float, kParts, kSketch><<<blocks, warps * 32, 0, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void launch_probe_rows(const ProbeStatsArgs& a, int sms, cudaStream_t stream) {
  if (!a.sketch_bits) return launch_rows<1, false>(a, sms, stream);
  switch (probe_rows_parts(a, sms)) {
    case 8: return launch_rows<8, true>(a, sms, stream);
    case 4: return launch_rows<4, true>(a, sms, stream);
    case 2: return launch_rows<2, true>(a, sms, stream);
    default: return launch_rows<1, true>(a, sms, stream);
  }
}

}  // namespace mla::cuda
