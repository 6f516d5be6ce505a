// The probe kernel alone (launch_probe_stats of kernels/probe_stats.cuh: the tile kernel, kernels/probe_tiles.cu,
// for the bf16 shapes; the row kernel, kernels/probe_rows.cu, for the fp32 ones): time per launch on the DeepSeek-V3
// probe shapes at T = 4096, T = 512 and decode, and GLM-5's DSA scores, against a device copy of the same bytes in the
// same run, and a digest of every output so that builds against another tile or row kernel
// (scripts/probe_kernel_bench.sh) can be checked against each other.
//
//   probe_kernel_bench [repeats] [patterns]     (--help)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "kernels/cuda_check.cuh"
#include "kernels/mma_util.cuh"
#include "kernels/probe_launch_plan.cuh"
#include "kernels/probe_stats.cuh"
#include "core/probe/probe_hash.h"

namespace {
using namespace mla::cuda;
using mla::kSketchLanes;

__global__ void fill_kernel(uint16_t* x, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const float u = static_cast<float>(mla::splitmix64(seed + i) >> 40) * (1.f / 16777216.f) - 0.5f;  // [-0.5, 0.5)
    x[i] = static_cast<uint16_t>(__float_as_uint(u * 3.f) >> 16);
  }
}
// The same for fp32 tensors (full 24-bit values).
__global__ void fill_kernel_f32(float* x, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    x[i] = (static_cast<float>(mla::splitmix64(seed + i) >> 40) * (1.f / 16777216.f) - 0.5f) * 3.f;
}

// Read-pattern experiments (argument "patterns"): how fast a [rows, cols] bf16 tensor can be read in the probe
// kernel's order (one warp per 16-row tile, 64 columns per step: 16 rows x 128 bytes) against a linear read, and
// with a block's warps interleaved step by step so that the block reads `warps` x 128 bytes of a row together.
__global__ void read_linear(const uint4* x, size_t n16, unsigned* out) {
  unsigned acc = 0;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    const uint4 a = x[i], b = x[i + stride], c = x[i + 2 * stride], d = x[i + 3 * stride];
    acc += a.x ^ b.y ^ c.z ^ d.w;
  }
  for (; i < n16; i += stride) acc += x[i].x;
  if (acc == 0x12345678u) out[0] = acc;
}

// Block of `warps` warps: block task = (tile, block segment of warps x seg_steps x 64 columns); warp w takes steps
// w, w + warps, ... (interleaved) or its own contiguous seg_steps (interleave = false).
__global__ void read_tiles(const uint16_t* x, int64_t rows, int64_t cols, int seg_steps, bool interleave,
                           unsigned* out) {
  const int warps = blockDim.x >> 5, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t block_cols = int64_t{warps} * seg_steps * 64;
  const int64_t segs = (cols + block_cols - 1) / block_cols;
  const int64_t tile = blockIdx.x / segs, seg = blockIdx.x % segs;
  const int gr = lane >> 2, t = lane & 3;
  const int64_t r0 = tile * 16 + gr, r1 = r0 + 8;
  unsigned acc = 0;
  for (int k = 0; k < seg_steps; k += 2) {
    uint4 v[2][4];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int step = k + u;
      const int64_t c0 = seg * block_cols + (interleave ? (int64_t{step} * warps + warp) * 64
                                                        : (int64_t{warp} * seg_steps + step) * 64);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t col = c0 + 32 * half + 8 * t;
        const bool ok = col < cols;
        const uint4 zero = make_uint4(0, 0, 0, 0);
        v[u][2 * half] = ok && r0 < rows ? *reinterpret_cast<const uint4*>(x + r0 * cols + col) : zero;
        v[u][2 * half + 1] = ok && r1 < rows ? *reinterpret_cast<const uint4*>(x + r1 * cols + col) : zero;
      }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc += v[u][q].x ^ v[u][q].w;
  }
  if (acc == 0x12345678u) out[0] = acc;
}

// The probe kernel's data path alone: one warp per (16-row tile, segment of seg_steps steps of 64 columns), each
// step's 16 rows x 128 B copied by cp.async into a STAGES-deep ring in shared memory (the probe kernel's slot
// layout: [4][32] 16-byte pieces, each lane its own), then read back; blocks of 4 warps, their number per SM set
// by the dynamic shared memory each asks for. Throughput against bytes in flight per SM says whether the probe
// kernel's loop is bound by them.
template <int STAGES>
__global__ void read_ring(const uint16_t* x, int64_t rows, int64_t cols, int seg_steps, unsigned* out) {
  extern __shared__ uint4 ring_smem[];  // [4 warps][STAGES][4][32]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t segs = cols / (int64_t{seg_steps} * 64);
  const int64_t task = int64_t{blockIdx.x} * 4 + warp;
  if (task >= rows / 16 * segs) return;
  const int64_t tile = task / segs, seg = task % segs;
  const int gr = lane >> 2, t = lane & 3;
  const uint16_t* p0 = x + (tile * 16 + gr) * cols + seg * seg_steps * 64 + 8 * t;
  const uint16_t* p1 = p0 + 8 * cols;
  uint4* my = ring_smem + warp * STAGES * 128;
  const auto issue = [&](int s) {
    uint4* slot = my + (s % STAGES) * 128;
    for (int half = 0; half < 2; ++half) {
      mla::cuda::mma::cp_async_16(mla::cuda::mma::smem_u32(slot + 64 * half + lane), p0 + 64 * s + 32 * half, true);
      mla::cuda::mma::cp_async_16(mla::cuda::mma::smem_u32(slot + 64 * half + 32 + lane), p1 + 64 * s + 32 * half,
                                  true);
    }
  };
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < seg_steps) issue(s);
    mla::cuda::mma::cp_async_commit();
  }
  unsigned acc = 0;
  for (int s = 0; s < seg_steps; ++s) {
    mla::cuda::mma::cp_async_wait<STAGES - 2>();
    const uint4* slot = my + (s % STAGES) * 128;
    if (s + STAGES - 1 < seg_steps) issue(s + STAGES - 1);  // the previous step's slot (each lane its own)
    mla::cuda::mma::cp_async_commit();
    for (int q = 0; q < 4; ++q) {
      const uint4 v = slot[q * 32 + lane];
      acc += v.x ^ v.w;
    }
  }
  mla::cuda::mma::cp_async_wait<0>();
  if (acc == 0x12345678u) out[0] = acc;
}

struct Shape {
  const char* name;
  int64_t rows, cols;
  int heads;
  bool sketch = true;
  int in_layer = 0;  // how many of the DeepSeek-V3 T = 4096 layer's bf16 probes have this shape (sketch level)
  bool fp32 = false;  // an fp32 tensor (the row kernel), else bf16
};

// Not mla::Timing::of (harness/run/bench.h): its object file brings the bench's engine code, which the nvcc
// build of scripts/probe_kernel_bench.sh does not link.
float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.f : v[v.size() / 2];
}

// A digest of a launch's records (`out` bytes from `dev`: [rows, kRowStats] stats and [rows] checksums, of which
// the first units are written, then the per-row maps): the per-row maps' bytes, and of the stats what does not
// depend on how rows are grouped into units (the checksum's sum, the NaN and Inf counts, the absmax), so that
// kernels writing per-row and per-tile units agree (the sums' rounding depends on the grouping: left out).
struct Digests {
  uint64_t maps = 0, all = 0;
};
Digests digest(const void* dev, size_t out, int64_t rows) {
  std::vector<unsigned char> h(out);
  CUDA_CHECK(cudaMemcpy(h.data(), dev, out, cudaMemcpyDeviceToHost));
  const auto* st = reinterpret_cast<const double*>(h.data());
  const auto* check = reinterpret_cast<const unsigned long long*>(st + rows * kRowStats);
  unsigned long long checksum = 0;
  double amax = 0, nan = 0, inf = 0;
  for (int64_t u = 0; u < rows; ++u) {  // units past the launch's are zero (the buffer is zeroed once)
    amax = std::max(amax, st[u * kRowStats + 2]);
    nan += st[u * kRowStats + 3];
    inf += st[u * kRowStats + 4];
    checksum += check[u];
  }
  uint64_t d = 0;
  const auto add = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) d = (d ^ static_cast<const unsigned char*>(p)[i]) * 0x100000001b3ull;
  };
  const size_t maps = rows * (kRowStats * 8 + 8);
  add(h.data() + maps, out - maps);
  for (const double v : {amax, nan, inf}) add(&v, sizeof v);
  add(&checksum, sizeof checksum);
  Digests r;
  r.maps = d;
  d = 0;
  add(h.data(), out);
  r.all = d;
  return r;
}
}  // namespace

int patterns(int repeats) {
  const int64_t rows = 4096, cols = 16384;
  const size_t n = rows * cols, bytes = n * 2;
  void* x = nullptr;
  unsigned* out = nullptr;
  CUDA_CHECK(cudaMalloc(&x, bytes));
  CUDA_CHECK(cudaMalloc(&out, 64));
  fill_kernel<<<1024, 256>>>(static_cast<uint16_t*>(x), n, 1);
  CUDA_CHECK_LAUNCH();
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  const auto time = [&](const char* what, auto&& launch) {
    std::vector<float> ts;
    for (int i = 0; i < repeats + 3; ++i) {
      CUDA_CHECK(cudaEventRecord(e0));
      launch();
      CUDA_CHECK_LAUNCH();
      CUDA_CHECK(cudaEventRecord(e1));
      CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (i >= 3) ts.push_back(ms);
    }
    const float us = median(ts) * 1e3f;
    std::printf("pattern %-52s %8.1f us %6.0f GB/s\n", what, us, bytes / (us * 1e3f));
  };
  time("linear, 4 loads in flight per lane",
       [&] { read_linear<<<132 * 16, 256>>>(static_cast<const uint4*>(x), n / 8, out); });
  for (int warps : {4, 8, 16})
    for (int seg_steps : {4, 8, 32})
      for (bool il : {false, true}) {
        const int64_t block_cols = int64_t{warps} * seg_steps * 64;
        const int64_t blocks = (rows / 16) * ((cols + block_cols - 1) / block_cols);
        char what[96];
        std::snprintf(what, sizeof what, "tiles: %2d warps, %2d steps each, %s", warps, seg_steps,
                      il ? "interleaved" : "contiguous");
        time(what, [&] {
          read_tiles<<<static_cast<unsigned>(blocks), warps * 32>>>(static_cast<const uint16_t*>(x), rows, cols,
                                                                    seg_steps, il, out);
        });
      }
  // The ring: blocks per SM B (segments of 128 / B steps, so that the launch is about one wave), ring depth S.
  int dev = 0, smem_max = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  const auto ring = [&](auto kernel, int stages) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    for (int want : {2, 4, 8, 16}) {
      const int ring_bytes = 4 * stages * 2048;
      const int smem = std::max(ring_bytes, smem_max / want - 1024 - 1024);  // 1 KB per block the runtime keeps
      if (smem > 200 * 1024) continue;
      int per_sm = 0;
      CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 128, smem));
      if (per_sm < want) continue;  // the ring does not fit this many blocks
      const int seg_steps = 128 / want;
      const int64_t blocks = (rows / 16) * (cols / (seg_steps * 64)) / 4;
      char what[96];
      std::snprintf(what, sizeof what, "ring: %d deep, %2d blocks/SM, %3d KB in flight/SM", stages, per_sm,
                    per_sm * 4 * (stages - 1) * 2);
      time(what, [&] {
        kernel<<<static_cast<unsigned>(blocks), 128, smem>>>(static_cast<const uint16_t*>(x), rows, cols, seg_steps,
                                                             out);
      });
    }
  };
  ring(read_ring<2>, 2);
  ring(read_ring<3>, 3);
  ring(read_ring<4>, 4);
  ring(read_ring<6>, 6);
  ring(read_ring<8>, 8);
  return 0;
}

int run(int argc, char** argv);

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf(
          "Usage: probe_kernel_bench [repeats] [patterns]\n\n"
          "Times the probe kernel (stats, checksum, head L2 and sketch in one pass: kernels/probe_tiles.cu for bf16,\n"
          "kernels/probe_rows.cu for fp32) on the DeepSeek-V3 probe shapes (T 4096, T 512, decode B 64) and GLM-5's\n"
          "DSA scores against a device-to-device copy of the same bytes, median of `repeats` launches (default 30)\n"
          "after 3 warm-up, inputs rotated past L2; prints time, GB/s read, the copy's GB/s (read + written), the\n"
          "ratio, and two digests of the records: `maps` (equal between builds that keep the segment geometry: the\n"
          "per-row maps and the stats' checksum, counts and absmax, which do not depend on how rows form units) and\n"
          "`all` (every byte written, the sums included).\n"
          "`patterns`: times read orders alone (linear; the kernel's 16-row tiles, warps contiguous or interleaved;\n"
          "the kernel's cp.async ring alone at several depths and blocks per SM, with the bytes it keeps in flight).\n"
          "scripts/probe_kernel_bench.sh builds it with nvcc, also against other versions of kernels/probe_tiles.cu,\n"
          "and runs each.\n");
      return 0;
    }
    if (arg != "patterns" && std::atoi(arg.c_str()) <= 0) {
      std::fprintf(stderr, "probe_kernel_bench: unknown argument '%s' (see --help)\n", arg.c_str());
      return 2;
    }
  }
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "probe_kernel_bench: %s\n", e.what());
    return 2;
  }
}

int run(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    std::fprintf(stderr, "probe_kernel_bench: no CUDA device is available; run it on a GPU machine\n");
    return 2;
  }
  const int repeats = argc > 1 && std::string(argv[1]) != "patterns" ? std::atoi(argv[1]) : 30;
  if ((argc > 1 && std::string(argv[1]) == "patterns") || (argc > 2 && std::string(argv[2]) == "patterns"))
    return patterns(repeats);
  // The layer's 16 bf16 probes at T = 4096 (lse, fp32, takes the row kernel and is left out): q_nope, k_nope, v,
  // attn_out [T,16384] h128; q_pe, q_pe_rope [T,8192] h128; x, o_partial, o [T,7168]; q_a, q_c [T,1536]; kv_c,
  // kv_c_norm [T,512]; kv_cache [T,576]; k_pe, k_pe_rope [T,64].
  const Shape shapes[] = {
      {"q_nope T=4096 [4096,16384] h128", 4096, 16384, 128, true, 4},
      {"(stats) [4096,16384] h128", 4096, 16384, 128, false},
      {"q_pe T=4096 [4096,8192] h128", 4096, 8192, 128, true, 2},
      {"q_b T=4096 [4096,24576] h128", 4096, 24576, 128},
      {"kv_b T=4096 [4096,32768] h128", 4096, 32768, 128},
      {"hidden T=4096 [4096,7168]", 4096, 7168, 0, true, 3},
      {"q_a T=4096 [4096,1536]", 4096, 1536, 0, true, 2},
      {"kv_c T=4096 [4096,512]", 4096, 512, 0, true, 2},
      {"kv_cache T=4096 [4096,576]", 4096, 576, 0, true, 1},
      {"k_pe T=4096 [4096,64]", 4096, 64, 0, true, 2},
      {"q_nope T=512 [512,16384] h128", 512, 16384, 128},
      {"q_pe T=512 [512,8192] h128", 512, 8192, 128},
      {"hidden T=512 [512,7168]", 512, 7168, 0},
      {"q_a T=512 [512,1536]", 512, 1536, 0},
      {"kv_c T=512 [512,512]", 512, 512, 0},
      {"kv_cache T=512 [512,576]", 512, 576, 0},
      {"k_pe T=512 [512,64]", 512, 64, 0},
      {"(stats) q_a T=512 [512,1536]", 512, 1536, 0, false},
      {"lse T=512 [512,128] fp32 h128", 512, 128, 128, true, 0, true},
      {"q_nope B=64 [64,16384] h128", 64, 16384, 128},
      {"hidden B=64 [64,7168]", 64, 7168, 0},
      {"q_a B=64 [64,1536]", 64, 1536, 0},
      {"lse B=64 [64,128] fp32 h128", 64, 128, 128, true, 0, true},
      // GLM-5's DSA: index scores and top-k at decode B 64 (L 16384) and chunked T 512 (L 16896), fp32.
      {"idx_scores B=64 [64,16385] fp32", 64, 16385, 0, true, 0, true},
      {"(stats) idx_scores B=64 [64,16385]", 64, 16385, 0, false, 0, true},
      {"topk B=64 [64,2048] fp32", 64, 2048, 0, true, 0, true},
      {"idx_scores T=512 [512,16896] fp32", 512, 16896, 0, true, 0, true},
      {"(stats) idx_scores T=512 [512,16896]", 512, 16896, 0, false, 0, true},
      // Fewer and more rows: the row kernel's sketch split over 4 and 2 warps a row.
      {"idx_scores B=128 [128,8193] fp32", 128, 8193, 0, true, 0, true},
      {"idx_scores B=200 [200,4097] fp32", 200, 4097, 0, true, 0, true},
  };
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  ProbeLaunchCache cache;  // the probe launches' geometry per shape, as a rank of the engine keeps it
  std::printf("%-36s %10s %9s %10s %9s %7s  %-16s  %s\n", "shape", "probe us", "GB/s", "copy us", "copy GB/s",
              "ratio", "digest maps", "digest all");
  double layer_us = 0, layer_bytes = 0, layer_copy_us = 0;
  for (const Shape& s : shapes) {
    const size_t n = static_cast<size_t>(s.rows * s.cols), bytes = n * (s.fp32 ? 4 : 2);
    // Two inputs, used in turn, so that a tensor smaller than L2 is not read from it.
    void *x[2], *y = nullptr;
    for (auto& p : x) CUDA_CHECK(cudaMalloc(&p, bytes));
    CUDA_CHECK(cudaMalloc(&y, bytes));
    for (void* xi : x) {
      if (s.fp32) fill_kernel_f32<<<1024, 256>>>(static_cast<float*>(xi), n, 1);
      else fill_kernel<<<1024, 256>>>(static_cast<uint16_t*>(xi), n, 1);
    }
    CUDA_CHECK_LAUNCH();
    uint32_t* bits = nullptr;
    CUDA_CHECK(cudaMalloc(&bits, sketch_sign_bits_words(s.cols) * 4));
    launch_sketch_sign_bits(0x1234, 0, s.cols, bits, nullptr);
    ProbeStatsArgs a;
    a.dtype = s.fp32 ? DType::DType_f32 : DType::DType_bf16;
    a.rows = s.rows;
    a.cols = s.cols;
    a.heads = s.heads;
    a.sketch_bits = s.sketch ? bits : nullptr;
    a.data = x[0];
    const size_t out = s.rows * (kRowStats * 8 + 8 + 4 + 4 * s.heads + 4 * kSketchLanes);
    const size_t work = probe_stats_workspace(cache, a);
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
      launch_probe_stats(cache, a, /*programmatic=*/true, nullptr);
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
    const Digests dg = digest(dev, out, s.rows);
    std::printf("%-36s %10.1f %9.0f %10.1f %9.0f %6.2fx  %016llx  %016llx\n", s.name, mp, bytes / (mp * 1e3f), mc,
                2.0 * bytes / (mc * 1e3f), mp / mc, static_cast<unsigned long long>(dg.maps),
                static_cast<unsigned long long>(dg.all));
    layer_us += s.in_layer * mp;
    layer_copy_us += s.in_layer * mc;
    layer_bytes += s.in_layer * static_cast<double>(bytes);
    for (auto q : x) CUDA_CHECK(cudaFree(q));
    CUDA_CHECK(cudaFree(y));
    CUDA_CHECK(cudaFree(bits));
    CUDA_CHECK(cudaFree(dev));
  }
  std::printf("%-36s %10.1f %9.0f %10.1f %9.0f %6.2fx  (sum over the 16 bf16 probes of a DeepSeek-V3 layer, "
              "T = 4096)\n",
              "layer T=4096 sketch", layer_us, layer_bytes / (layer_us * 1e3), layer_copy_us,
              2.0 * layer_bytes / (layer_copy_us * 1e3), layer_us / layer_copy_us);
  return 0;
}
