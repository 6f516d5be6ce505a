// The probe kernel alone (kernels/probe_stats.cu, built into this program with the -D tuning macros of
// scripts/probe_kernel_bench.sh): time per launch on the DeepSeek-V3 probe shapes against a device copy of the
// same bytes in the same run, and a digest of every output so that variants can be checked against each other.
//
//   probe_kernel_bench [repeats]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cuda_check.cuh"
#include "kernels/probe_stats.cuh"
#include "probes/probe_hash.h"

namespace {
using namespace mla::cuda;
using mla::kSketchLanes;

__global__ void fill_kernel(uint16_t* x, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const float u = static_cast<float>(mla::splitmix64(seed + i) >> 40) * (1.f / 16777216.f) - 0.5f;  // [-0.5, 0.5)
    x[i] = static_cast<uint16_t>(__float_as_uint(u * 3.f) >> 16);
  }
}

struct Shape {
  const char* name;
  int64_t rows, cols;
  int heads;
  bool sketch = true;
};

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

uint64_t digest(const void* dev, size_t bytes) {
  std::vector<unsigned char> h(bytes);
  CUDA_CHECK(cudaMemcpy(h.data(), dev, bytes, cudaMemcpyDeviceToHost));
  uint64_t d = 0;
  for (size_t i = 0; i < bytes; ++i) d = (d ^ h[i]) * 0x100000001b3ull;
  return d;
}
}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 30;
  const Shape shapes[] = {
      {"q_nope T=4096 [4096,16384] h128", 4096, 16384, 128}, {"(stats) [4096,16384] h128", 4096, 16384, 128, false},
      {"q_b T=4096 [4096,24576] h128", 4096, 24576, 128},
      {"kv_b T=4096 [4096,32768] h128", 4096, 32768, 128},   {"hidden T=4096 [4096,7168]", 4096, 7168, 0},
      {"q_a T=4096 [4096,1536]", 4096, 1536, 0},             {"q_nope T=512 [512,16384] h128", 512, 16384, 128},
      {"hidden T=512 [512,7168]", 512, 7168, 0},             {"q_nope B=64 [64,16384] h128", 64, 16384, 128},
  };
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  std::printf("%-34s %10s %9s %10s %9s %7s  %s\n", "shape", "probe us", "GB/s", "copy us", "copy GB/s", "ratio",
              "digest");
  for (const Shape& s : shapes) {
    const size_t n = static_cast<size_t>(s.rows * s.cols), bytes = n * 2;
    // Two inputs, used in turn, so that a tensor smaller than L2 is not read from it.
    void *x[2], *y = nullptr;
    for (auto& p : x) CUDA_CHECK(cudaMalloc(&p, bytes));
    CUDA_CHECK(cudaMalloc(&y, bytes));
    fill_kernel<<<1024, 256>>>(static_cast<uint16_t*>(x[0]), n, 1);
    fill_kernel<<<1024, 256>>>(static_cast<uint16_t*>(x[1]), n, 1);
    uint32_t* bits = nullptr;
    CUDA_CHECK(cudaMalloc(&bits, sketch_sign_bits_words(s.cols) * 4));
    launch_sketch_sign_bits(0x1234, 0, s.cols, bits, nullptr);
    ProbeStatsArgs a;
    a.dtype = DType::DType_bf16;
    a.rows = s.rows;
    a.cols = s.cols;
    a.heads = s.heads;
    a.sketch_bits = s.sketch ? bits : nullptr;
    a.data = x[0];
    const size_t out = s.rows * (kRowStats * 8 + 8 + 4 + 4 * s.heads + 4 * kSketchLanes);
    const size_t work = probe_stats_workspace(a);
    unsigned char* dev = nullptr;
    CUDA_CHECK(cudaMalloc(&dev, out + work + 64));
    CUDA_CHECK(cudaMemset(dev, 0, out + work + 64));
    unsigned char* p = dev;
    a.row_stats = reinterpret_cast<double*>(p);
    p += s.rows * kRowStats * 8;
    a.row_checksum = reinterpret_cast<unsigned long long*>(p);
    p += s.rows * 8;
    a.token_l2 = reinterpret_cast<float*>(p);
    p += s.rows * 4;
    a.head_l2 = s.heads ? reinterpret_cast<float*>(p) : nullptr;
    p += s.rows * 4 * s.heads;
    a.sketch_out = s.sketch ? reinterpret_cast<float*>(p) : nullptr;
    p += s.rows * 4 * kSketchLanes;
    a.workspace = work ? dev + ((out + 15) / 16 * 16) : nullptr;
    std::vector<float> tp, tc;
    for (int i = 0; i < repeats + 3; ++i) {
      a.data = x[i & 1];
      CUDA_CHECK(cudaEventRecord(e0));
      launch_probe_stats(a, nullptr);
      CUDA_CHECK(cudaEventRecord(e1));
      CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (i >= 3) tp.push_back(ms);
      CUDA_CHECK(cudaEventRecord(e0));
      CUDA_CHECK(cudaMemcpyAsync(y, x[i & 1], bytes, cudaMemcpyDeviceToDevice));
      CUDA_CHECK(cudaEventRecord(e1));
      CUDA_CHECK(cudaEventSynchronize(e1));
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (i >= 3) tc.push_back(ms);
    }
    const float mp = median(tp) * 1e3f, mc = median(tc) * 1e3f;
    // The copy reads and writes the bytes; the probe reads them once: rates are bytes read (and written) per second.
    std::printf("%-34s %10.1f %9.0f %10.1f %9.0f %6.2fx  %016llx\n", s.name, mp, bytes / (mp * 1e3f), mc,
                2.0 * bytes / (mc * 1e3f), mp / mc, static_cast<unsigned long long>(digest(dev, out)));
    for (auto q : x) CUDA_CHECK(cudaFree(q));
    CUDA_CHECK(cudaFree(y));
    CUDA_CHECK(cudaFree(bits));
    CUDA_CHECK(cudaFree(dev));
  }
  return 0;
}
