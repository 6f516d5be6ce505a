// Device probe statistics. Every bf16 probe of the real models takes version 3 (probe_slices_kernel below:
// one block per row slice, one 16-byte load per thread, then a fold per row); the rest (fp32 tensors such as
// lse, odd widths) version 2: one block per token row, one pass over the row for the finite sum, sum of
// squares, absmax, NaN/Inf counts, the row's L2 (non-finite values included, as on the host: a NaN token shows
// as NaN) and the checksum's partial sum; a second pass (a warp per head, from L1/L2) for the head L2. All
// reductions are fixed trees, so records are bit-reproducible. Version 1 also computed the bf16 sketch here,
// 64 hashes per element (~60 ms per DeepSeek-V3 layer at T = 4096); it is now a tensor-core GEMM against a
// cached ±1 matrix (probe_stats.cuh).
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
    add_value(v);
    check += checksum_term(index, bits);
  }
  __device__ void add_value(float v) {
    const double d = v;
    sq_all += d * d;
    if (isnan(v)) nan += 1;
    else if (isinf(v)) inf += 1;
    else {
      sum += d;
      sumsq += d * d;
      amax = fmax(amax, fabs(d));
    }
  }
};

__device__ inline float bf16_bits_to_float(uint32_t b) { return __uint_as_float(b << 16); }

template <class T>
__global__ void __launch_bounds__(kThreads) probe_stats_kernel(const ProbeStatsArgs a) {
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
    const uint16_t* xs = reinterpret_cast<const uint16_t*>(x);
    for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) {
      const uint32_t b = xs[c];
      acc.add(bf16_bits_to_float(b), b, base + c);
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

// Version 3, for bf16 rows whose width and head width are multiples of 8 (every bf16 probe of the real
// models): a 2-D grid, one block per (row, slice of whole heads of at most kSliceCols columns), one 16-byte
// load per thread, so a row's loads are all in flight at once (version 2 walked a row with 256 threads, one
// dependent load after another: latency-bound, ~25 us per probe). Each block writes its slice's partial sums
// and the L2 of the heads it holds; a fold kernel sums the slices of each row in order.
constexpr int kSliceCols = 2048;  // 256 threads × 8

struct SliceStats {
  double sum, sumsq, sq_all, amax, nan, inf;
  unsigned long long check;
};

struct SliceGeometry {
  int64_t width = 0;  // columns per slice (whole heads)
  int64_t slices = 0;
  int64_t head_cols = 0;  // X (0: no heads axis)
};

SliceGeometry slice_geometry(const ProbeStatsArgs& a) {
  SliceGeometry g;
  if (a.dtype != DType::DType_bf16 || a.cols <= 0 || a.cols % 8 != 0 ||
      (reinterpret_cast<uintptr_t>(a.data) & 15u) != 0)
    return g;
  if (a.heads > 0) {
    const int64_t X = a.cols / a.heads;
    if (X % 8 != 0 || X > kSliceCols) return g;
    g.head_cols = X;
    g.width = X * (kSliceCols / X);
  } else {
    g.width = kSliceCols;
  }
  g.slices = (a.cols + g.width - 1) / g.width;
  return g;
}

__global__ void __launch_bounds__(kThreads) probe_slices_kernel(const ProbeStatsArgs a, SliceGeometry g,
                                                               SliceStats* part) {
  __shared__ double red[32];
  __shared__ unsigned long long red_u[32];
  __shared__ double chunk_sq[kSliceCols / 8];
  const int64_t r = blockIdx.y, slice = blockIdx.x;
  const int64_t c0 = slice * g.width;
  const int64_t width = min(g.width, a.cols - c0);
  const uint4* xv = reinterpret_cast<const uint4*>(static_cast<const bf16*>(a.data) + r * a.cols + c0);
  const uint64_t i0 = static_cast<uint64_t>(r) * a.cols + c0;
  RowAcc acc;
  for (int64_t ch = threadIdx.x; ch < width / 8; ch += blockDim.x) {
    const uint4 w = xv[ch];
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
    float s = 0.f, sq = 0.f, sq_all = 0.f, amax = 0.f;
    int bad = 0;
    unsigned long long check = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t b = (j & 1) ? words[j >> 1] >> 16 : words[j >> 1] & 0xffffu;
      const float v = bf16_bits_to_float(b);
      const float v2 = __fmul_rn(v, v);
      sq_all = __fadd_rn(sq_all, v2);
      if (!isfinite(v)) ++bad;
      s = __fadd_rn(s, v);
      sq = __fadd_rn(sq, v2);
      amax = fmaxf(amax, fabsf(v));
      check += checksum_term(i0 + ch * 8 + j, b);
    }
    acc.check += check;
    if (amax < 1e18f && bad == 0) {  // no square overflows fp32, and every value is finite
      acc.sum += s;
      acc.sumsq += sq;
      acc.sq_all += sq_all;
      acc.amax = fmax(acc.amax, static_cast<double>(amax));
      chunk_sq[ch] = sq_all;
    } else {  // huge or non-finite values: element by element in double, as the host does
      double all = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t b = (j & 1) ? words[j >> 1] >> 16 : words[j >> 1] & 0xffffu;
        const float v = bf16_bits_to_float(b);
        acc.add_value(v);
        all += static_cast<double>(v) * v;
      }
      chunk_sq[ch] = all;
    }
  }
  SliceStats out;
  out.sum = block_sum(acc.sum, red);
  out.sumsq = block_sum(acc.sumsq, red);
  out.sq_all = block_sum(acc.sq_all, red);
  out.nan = block_sum(acc.nan, red);
  out.inf = block_sum(acc.inf, red);
  out.amax = block_max(acc.amax, red);
  out.check = block_sum(acc.check, red_u);
  if (threadIdx.x == 0) part[r * g.slices + slice] = out;
  if (g.head_cols > 0) {  // block_sum's barriers made chunk_sq visible
    const int64_t per = g.head_cols / 8, heads_here = width / g.head_cols;
    for (int64_t h = threadIdx.x; h < heads_here; h += blockDim.x) {
      double t = 0;
      for (int64_t k = 0; k < per; ++k) t += chunk_sq[h * per + k];
      a.head_l2[r * a.heads + c0 / g.head_cols + h] = static_cast<float>(sqrt(t));
    }
  }
}

__global__ void fold_slices_kernel(const ProbeStatsArgs a, SliceGeometry g, const SliceStats* part) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= a.rows) return;
  SliceStats t = part[r * g.slices];
  for (int64_t k = 1; k < g.slices; ++k) {
    const SliceStats& p = part[r * g.slices + k];
    t.sum += p.sum;
    t.sumsq += p.sumsq;
    t.sq_all += p.sq_all;
    t.amax = fmax(t.amax, p.amax);
    t.nan += p.nan;
    t.inf += p.inf;
    t.check += p.check;
  }
  double* st = a.row_stats + r * kRowStats;
  st[0] = t.sum;
  st[1] = t.sumsq;
  st[2] = t.amax;
  st[3] = t.nan;
  st[4] = t.inf;
  a.row_checksum[r] = t.check;
  a.token_l2[r] = static_cast<float>(sqrt(t.sq_all));
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

size_t probe_stats_workspace(const ProbeStatsArgs& a) {
  const SliceGeometry g = slice_geometry(a);
  return g.slices > 0 ? static_cast<size_t>(a.rows * g.slices) * sizeof(SliceStats) : 0;
}

void launch_probe_stats(const ProbeStatsArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (a.rows > INT_MAX) throw EngineError("probe stats: " + std::to_string(a.rows) + " rows");
  const SliceGeometry g = slice_geometry(a);
  if (g.slices > 0 && a.workspace && a.rows <= 65535 && g.slices <= INT_MAX) {
    auto* part = static_cast<SliceStats*>(a.workspace);
    probe_slices_kernel<<<dim3(static_cast<unsigned>(g.slices), static_cast<unsigned>(a.rows)), kThreads, 0, stream>>>(
        a, g, part);
    CUDA_CHECK_LAUNCH();
    fold_slices_kernel<<<static_cast<unsigned>((a.rows + 127) / 128), 128, 0, stream>>>(a, g, part);
    CUDA_CHECK_LAUNCH();
    return;
  }
  if (a.dtype == DType::DType_bf16)
    probe_stats_kernel<bf16><<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(a);
  else
    probe_stats_kernel<float><<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(a);
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
  // Column-major [rows, 32] = dataᵀᵀ · signsᵀᵀ: data row-major [rows, cols] is column-major [cols, rows], taken
  // transposed; signs row-major [cols, 32] is column-major [32, cols], taken transposed. The "TN" layout
  // cuBLAS's tensor-core kernels prefer; the caller reads the result as out[lane · rows + row].
  CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_T, as_int(rows, "rows"), kSketchLanes, as_int(cols, "cols"),
                            &alpha, data, CUDA_R_16BF, as_int(cols, "cols"), signs, CUDA_R_16BF, kSketchLanes, &beta,
                            out, CUDA_R_32F, as_int(rows, "rows"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
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
