// The sketch matrix's counter hash, callable on host and device. It must stay bit-identical to
// probes/probe.cpp's sketch_coeff (tests/gpu/test_cuda_probe.cpp checks that on the device).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define MLA_HD __host__ __device__
#else
#define MLA_HD
#endif

namespace mla::cuda {

constexpr int kSketchLanes = 32;  // == kSketchDim of probes/probe.h

MLA_HD inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// ±1/sqrt(32) for global column `column`, sketch lane `lane` of the probe keyed `key`.
MLA_HD inline float sketch_coeff_hd(uint64_t key, int64_t column, int lane) {
  const uint64_t h = splitmix64(key ^ splitmix64(static_cast<uint64_t>(column) * kSketchLanes + lane));
  constexpr float kScale = 0.17677669529663687f;  // 1/sqrt(32)
  return (h >> 63) ? kScale : -kScale;
}

}  // namespace mla::cuda
