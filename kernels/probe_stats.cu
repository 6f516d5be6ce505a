// Device probe statistics, version 2: one block per token row, one pass over the row (16-byte loads when the
// row allows) for the finite sum, sum of squares, absmax, NaN/Inf counts, the row's L2 (non-finite values
// included, as on the host: a NaN token shows as NaN) and the checksum's partial sum; a second pass (a warp
// per head, from L1/L2) for the head L2. All reductions are fixed trees, so records are bit-reproducible.
// Version 1 also computed the sketch here, 64 hashes per element: ~60 ms per DeepSeek-V3 layer at T = 4096.
// The bf16 sketch is now a tensor-core GEMM against a cached ±1 matrix (probe_stats.cuh).
#include "kernels/block_reduce.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/probe_stats.cuh"
#include "kernels/sketch_hash.cuh"

#include <climits>
#include <string>

namespace mla::cuda {

namespace {
constexpr int kThreads = 256;

struct RowAcc {
  double sum = 0, sumsq = 0, sq_all = 0, amax = 0, nan = 0, inf = 0;
  unsigned long long check = 0;

  __device__ void add(float v, uint32_t bits, uint64_t index) {
    const double d = v;
    sq_all += d * d;
    if (isnan(v)) nan += 1;
    else if (isinf(v)) inf += 1;
    else {
      sum += d;
      sumsq += d * d;
      amax = fmax(amax, fabs(d));
    }
    check += checksum_term(index, bits);
  }
};

__device__ inline float bf16_bits_to_float(uint32_t b) { return __uint_as_float(b << 16); }

template <class T>
__global__ void __launch_bounds__(kThreads) probe_stats_kernel(const ProbeStatsArgs a, bool vec) {
  __shared__ double red[32];
  __shared__ unsigned long long red_u[32];
  __shared__ double sk[kThreads / 32][kSketchLanes];
  const int64_t r = blockIdx.x;
  const T* x = static_cast<const T*>(a.data) + r * a.cols;
  const uint64_t base = static_cast<uint64_t>(r) * a.cols;
  RowAcc acc;
  double skacc[kSketchLanes];
#pragma unroll
  for (int k = 0; k < kSketchLanes; ++k) skacc[k] = 0;

  if constexpr (sizeof(T) == 2) {
    if (vec) {  // 8 bf16 per 16-byte load
      const uint4* xv = reinterpret_cast<const uint4*>(x);
      for (int64_t c8 = threadIdx.x; c8 < a.cols / 8; c8 += blockDim.x) {
        const uint4 w = xv[c8];
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t lo = words[j] & 0xffffu, hi = words[j] >> 16;
          acc.add(bf16_bits_to_float(lo), lo, base + c8 * 8 + 2 * j);
          acc.add(bf16_bits_to_float(hi), hi, base + c8 * 8 + 2 * j + 1);
        }
      }
    } else {
      const uint16_t* xs = reinterpret_cast<const uint16_t*>(x);
      for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) {
        const uint32_t b = xs[c];
        acc.add(bf16_bits_to_float(b), b, base + c);
      }
    }
  } else {
    for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) {
      const float v = x[c];
      acc.add(v, __float_as_uint(v), base + c);
      if (a.sketch) {
        const double d = v;
#pragma unroll
        for (int k = 0; k < kSketchLanes; ++k)
          skacc[k] += d * static_cast<double>(sketch_coeff_hd(a.key, a.col_offset + c, k));
      }
    }
  }
  const double sum = block_sum(acc.sum, red);
  const double sumsq = block_sum(acc.sumsq, red);
  const double sq_all = block_sum(acc.sq_all, red);
  const double nan = block_sum(acc.nan, red);
  const double inf = block_sum(acc.inf, red);
  const double amax = block_max(acc.amax, red);
  const unsigned long long check = block_sum(acc.check, red_u);
  if (threadIdx.x == 0) {
    double* st = a.row_stats + r * kRowStats;
    st[0] = sum;
    st[1] = sumsq;
    st[2] = amax;
    st[3] = nan;
    st[4] = inf;
    a.row_checksum[r] = check;
    a.token_l2[r] = static_cast<float>(sqrt(sq_all));
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (sizeof(T) == 4 && a.sketch) {
#pragma unroll
    for (int k = 0; k < kSketchLanes; ++k) {
      const double s = warp_sum(skacc[k]);
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
        float v;
        if constexpr (sizeof(T) == 2) v = bf16_bits_to_float(reinterpret_cast<const uint16_t*>(x)[h * X + c]);
        else v = x[h * X + c];
        const double d = v;
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

__global__ void sketch_signs_kernel(uint64_t key, int64_t col0, int64_t cols, bf16* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < cols * kSketchLanes;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(sketch_sign(key, col0 + i / kSketchLanes, static_cast<int>(i % kSketchLanes)) ? 1.f
                                                                                                                 : -1.f);
}

__global__ void set_flag_kernel(volatile unsigned* flag, unsigned value) {
  __threadfence_system();
  *flag = value;
  __threadfence_system();
}

int as_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw EngineError(std::string("probe sketch: ") + what + " = " + std::to_string(v) + " does not fit cuBLAS's int");
  return static_cast<int>(v);
}
}  // namespace

void launch_probe_stats(const ProbeStatsArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (a.rows > INT_MAX) throw EngineError("probe stats: " + std::to_string(a.rows) + " rows");
  if (a.dtype == DType::DType_bf16) {
    const bool vec = a.cols % 8 == 0 && (reinterpret_cast<uintptr_t>(a.data) & 15u) == 0;
    probe_stats_kernel<bf16><<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(a, vec);
  } else {
    probe_stats_kernel<float><<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(a, false);
  }
  CUDA_CHECK_LAUNCH();
}

void launch_sketch_signs(uint64_t key, int64_t col0, int64_t cols, bf16* signs, cudaStream_t stream) {
  if (cols == 0) return;
  sketch_signs_kernel<<<256, 256, 0, stream>>>(key, col0, cols, signs);
  CUDA_CHECK_LAUNCH();
}

void sketch_gemm(cublasHandle_t h, const bf16* data, int64_t rows, int64_t cols, const bf16* signs, float* out) {
  if (rows == 0) return;
  const float alpha = kSketchScale, beta = 0.0f;
  // Column-major: outᵀ [32, rows] = signsᵀ [32, cols] · dataᵀ [cols, rows]; signs row-major [cols, 32] is
  // column-major [32, cols] (ld 32), data row-major [rows, cols] is column-major [cols, rows] (ld cols).
  CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, kSketchLanes, as_int(rows, "rows"), as_int(cols, "cols"),
                            &alpha, signs, CUDA_R_16BF, kSketchLanes, data, CUDA_R_16BF, as_int(cols, "cols"), &beta,
                            out, CUDA_R_32F, kSketchLanes, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void launch_set_flag(unsigned* flag, unsigned value, cudaStream_t stream) {
  set_flag_kernel<<<1, 1, 0, stream>>>(flag, value);
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
