// Ceilings for `mla-bisect bench --engine cuda`: cuBLAS bf16 GEMM (fp32 accumulation, as every projection
// here) at 8192³ and cudaMemcpyAsync device-to-device of 1 GiB, both on non-zero data (the tensor cores and copies
// run faster on zeros), each after 3 warm-up runs, one event pair per timed run.
#include <cublas_v2.h>

#include <string>

#include "kernels/bench_ceilings.cuh"
#include "kernels/device_tensor.cuh"

namespace mla::cuda {

namespace {
// Uniform values in [-1, 1) from a counter hash (bf16).
__global__ void fill_random_kernel(bf16* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9e3779b1u ^ seed ^ static_cast<uint32_t>(i >> 32) * 0x85ebca6bu;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    x[i] = __float2bfloat16_rn(static_cast<float>(h) * (2.0f / 4294967296.0f) - 1.0f);
  }
}

void fill_random(bf16* x, int64_t n, uint32_t seed, cudaStream_t s) {
  fill_random_kernel<<<1024, 256, 0, s>>>(x, n, seed);
  CUDA_CHECK_LAUNCH();
}

struct EventPair {
  cudaEvent_t a = nullptr, b = nullptr;
  EventPair() {
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
  }
  ~EventPair() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

template <class F>
std::vector<double> time_runs(cudaStream_t s, int repeats, F&& run) {
  for (int i = 0; i < 3; ++i) run();
  EventPair ev;
  std::vector<double> out;
  for (int i = 0; i < repeats; ++i) {
    CUDA_CHECK(cudaEventRecord(ev.a, s));
    run();
    CUDA_CHECK(cudaEventRecord(ev.b, s));
    CUDA_CHECK(cudaEventSynchronize(ev.b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ev.a, ev.b));
    out.push_back(ms * 1e-3);
  }
  return out;
}
}  // namespace

std::vector<CeilingRun> measure_device_ceilings(int device, int repeats) {
  DeviceGuard g(device);
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<CeilingRun> out;
  try {
    {
      constexpr int64_t n = 8192;
      DeviceBuffer A(device, n * n * sizeof(bf16)), B(device, n * n * sizeof(bf16)), C(device, n * n * sizeof(bf16));
      DeviceBuffer ws(device, 32ull << 20);
      fill_random(static_cast<bf16*>(A.get()), n * n, 1, s);
      fill_random(static_cast<bf16*>(B.get()), n * n, 2, s);
      cublasHandle_t h = nullptr;
      CUBLAS_CHECK(cublasCreate(&h));
      try {
        CUBLAS_CHECK(cublasSetStream(h, s));
        CUBLAS_CHECK(cublasSetWorkspace(h, ws.get(), ws.bytes()));
        const float alpha = 1.f, beta = 0.f;
        CeilingRun c;
        c.what = "cuBLAS bf16 GEMM 8192^3 (fp32 accumulation)";
        c.flops = 2.0 * n * n * n;
        c.bytes = 3.0 * n * n * sizeof(bf16);
        c.samples_s = time_runs(s, repeats, [&] {
          CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, A.get(), CUDA_R_16BF, n, B.get(),
                                    CUDA_R_16BF, n, &beta, C.get(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
        });
        out.push_back(std::move(c));
      } catch (...) {
        cublasDestroy(h);
        throw;
      }
      cublasDestroy(h);
    }
    {
      constexpr size_t bytes = 1ull << 30;
      DeviceBuffer src(device, bytes), dst(device, bytes);
      fill_random(static_cast<bf16*>(src.get()), static_cast<int64_t>(bytes / sizeof(bf16)), 3, s);
      CeilingRun c;
      c.what = "device-to-device copy of 1 GiB (bytes read + written)";
      c.bytes = 2.0 * bytes;
      c.samples_s = time_runs(s, repeats, [&] {
        CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, s));
      });
      out.push_back(std::move(c));
    }
  } catch (...) {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    throw;
  }
  CUDA_CHECK(cudaStreamSynchronize(s));
  CUDA_CHECK(cudaStreamDestroy(s));
  return out;
}

}  // namespace mla::cuda
