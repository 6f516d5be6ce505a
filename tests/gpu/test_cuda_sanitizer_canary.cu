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

// Every thread writes the same shared word with no barrier between the writes and the read: a write-write and
// read-after-write hazard between warps.
__global__ void racing_shared_writes(int* out) {
  __shared__ int word;
  word = static_cast<int>(threadIdx.x);
  out[threadIdx.x] = word;
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
