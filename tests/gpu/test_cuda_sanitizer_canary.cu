// Canaries for scripts/gpu_check.sh's sanitizer runs: a kernel that writes one element past its buffer and one
// with a shared-memory race. Run under compute-sanitizer (memcheck, racecheck) they must make the check fail —
// the proof that a clean report on the engine's kernels means the tool saw them. They do nothing (skip) unless
// MLA_SANITIZER_CANARY=1, so a plain `ctest -L gpu` never runs them.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdlib>

#include "kernels/cuda_check.cuh"
#include "tests/gpu/gpu_test_util.h"

namespace mla::gputest {
namespace {

bool canary_on() {
  const char* v = std::getenv("MLA_SANITIZER_CANARY");
  return v && std::string(v) == "1";
}

__global__ void write_one_past_the_end(float* p, int n) { p[n] = 1.0f; }

// Each thread writes its shared slot and, with no barrier, reads the slot a warp further on: a read-after-write
// hazard between warps. Volatile, so that the compiler keeps both accesses (a plain shared word written and read
// back by the same thread was folded into a register, and racecheck saw no race).
__global__ void racing_shared_writes(int* out) {
  __shared__ int slots[256];
  volatile int* s = slots;
  s[threadIdx.x] = static_cast<int>(threadIdx.x);
  out[threadIdx.x] = s[(threadIdx.x + 32) % 256];
}

TEST(CudaSanitizerCanary, OutOfBoundsWrite) {
  MLA_REQUIRE_GPU();
  if (!canary_on()) GTEST_SKIP() << "a planted bug for compute-sanitizer; runs with MLA_SANITIZER_CANARY=1";
  constexpr int n = 256;  // 1 KiB: the write lands in the allocation's padding, so only a sanitizer notices
  float* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
  write_one_past_the_end<<<1, 1>>>(p, n);
  cudaDeviceSynchronize();
  cudaFree(p);
}

TEST(CudaSanitizerCanary, SharedMemoryRace) {
  MLA_REQUIRE_GPU();
  if (!canary_on()) GTEST_SKIP() << "a planted bug for compute-sanitizer; runs with MLA_SANITIZER_CANARY=1";
  int* out = nullptr;
  CUDA_CHECK(cudaMalloc(&out, 256 * sizeof(int)));
  racing_shared_writes<<<1, 256>>>(out);
  CUDA_CHECK(cudaDeviceSynchronize());
  cudaFree(out);
}

}  // namespace
}  // namespace mla::gputest
