// Device probe statistics, version 1: one block per token row. Pass 1 (threads strided over columns):
// finite sum, sum of squares, absmax, NaN/Inf counts, the row's L2 (non-finite values included, as on
// the host: a NaN token shows as NaN) and the 32 sketch lanes in double. Pass 2 (a warp per head): head L2.
// All reductions are fixed trees, so records are bit-reproducible run to run.
#include "kernels/block_reduce.cuh"
#include "kernels/probe_stats.cuh"
#include "kernels/sketch_hash.cuh"

namespace mla::cuda {

namespace {
constexpr int kThreads = 256;

template <class T>
__device__ inline float load_f(const T* p, int64_t i);
template <>
__device__ inline float load_f<bf16>(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
template <>
__device__ inline float load_f<float>(const float* p, int64_t i) { return p[i]; }

template <class T>
__global__ void __launch_bounds__(kThreads) probe_stats_kernel(const ProbeStatsArgs a) {
  __shared__ double red[32];
  __shared__ double sk[kThreads / 32][kSketchLanes];
  const T* x = static_cast<const T*>(a.data) + blockIdx.x * a.cols;
  const int64_t r = blockIdx.x;
  double sum = 0, sumsq = 0, sq_all = 0, amax = 0, nan = 0, inf = 0;
  double acc[kSketchLanes];
#pragma unroll
  for (int k = 0; k < kSketchLanes; ++k) acc[k] = 0;
  for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) {
    const float v = load_f<T>(x, c);
    const double d = v;
    sq_all += d * d;
    if (isnan(v)) nan += 1;
    else if (isinf(v)) inf += 1;
    else {
      sum += d;
      sumsq += d * d;
      amax = fmax(amax, fabs(d));
    }
    if (a.sketch) {
#pragma unroll
      for (int k = 0; k < kSketchLanes; ++k) acc[k] += d * static_cast<double>(sketch_coeff_hd(a.key, a.col_offset + c, k));
    }
  }
  sum = block_sum(sum, red);
  sumsq = block_sum(sumsq, red);
  sq_all = block_sum(sq_all, red);
  nan = block_sum(nan, red);
  inf = block_sum(inf, red);
  amax = block_max(amax, red);
  if (threadIdx.x == 0) {
    double* st = a.row_stats + r * kRowStats;
    st[0] = sum;
    st[1] = sumsq;
    st[2] = amax;
    st[3] = nan;
    st[4] = inf;
    a.token_l2[r] = static_cast<float>(sqrt(sq_all));
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (a.sketch) {
#pragma unroll
    for (int k = 0; k < kSketchLanes; ++k) {
      const double s = warp_sum(acc[k]);
      if (lane == 0) sk[warp][k] = s;
    }
    __syncthreads();
    if (threadIdx.x < kSketchLanes) {
      double s = 0;
      for (int w = 0; w < warps; ++w) s += sk[w][threadIdx.x];
      a.sketch_out[r * kSketchLanes + threadIdx.x] = static_cast<float>(s);
    }
  }
  if (a.heads > 0) {
    const int64_t X = a.cols / a.heads;
    for (int h = warp; h < a.heads; h += warps) {
      double s = 0;
      for (int64_t c = lane; c < X; c += 32) {
        const double d = load_f<T>(x, h * X + c);
        s += d * d;
      }
      s = warp_sum(s);
      if (lane == 0) a.head_l2[r * a.heads + h] = static_cast<float>(sqrt(s));
    }
  }
}

__global__ void sketch_coeffs_kernel(uint64_t key, int64_t col0, int64_t cols, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < cols * kSketchLanes;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = sketch_coeff_hd(key, col0 + i / kSketchLanes, static_cast<int>(i % kSketchLanes));
}
}  // namespace

void launch_probe_stats(const ProbeStatsArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (a.dtype == DType::DType_bf16)
    probe_stats_kernel<bf16><<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(a);
  else
    probe_stats_kernel<float><<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

std::vector<float> device_sketch_coeffs(uint64_t key, int64_t col0, int64_t cols) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::vector<float> host(static_cast<size_t>(cols) * kSketchLanes);
  DeviceBuffer buf(dev, host.size() * sizeof(float));
  sketch_coeffs_kernel<<<256, 256>>>(key, col0, cols, static_cast<float*>(buf.get()));
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaMemcpy(host.data(), buf.get(), host.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return host;
}

}  // namespace mla::cuda
