// The counter hashes behind probe records, callable on the host and on a device (the CUDA engine computes
// records on the GPU; tests/gpu checks bit-equality with the host). Two uses:
//   sketch_coeff_at   the sketch matrix entry ±1/sqrt(32) for (probe, global column, lane): never stored;
//   checksum_term     one element's term of the checksum. The checksum is the sum, modulo 2^64, of
//                     checksum_term(i, bits_i) over the rank's elements (i: row-major index, bits: the raw
//                     16-bit pattern for bf16/fp16, 32-bit for fp32). A sum of mixed terms rather than a
//                     sequential hash (FNV) so that a GPU computes it in parallel, in any order, bit-exactly:
//                     equal checksums mean equal bytes (up to ~2^-63 chance); a changed element always
//                     changes it, two swapped elements all but always.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define MLA_HD __host__ __device__
#else
#define MLA_HD
#endif

namespace mla {

constexpr int kSketchLanes = 32;  // k of the per-token projection (== kSketchDim of probes/probe.h)

MLA_HD inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// True when the sketch entry for (key, column, lane) is +1/sqrt(32), false for -1/sqrt(32).
MLA_HD inline bool sketch_sign(uint64_t key, int64_t column, int lane) {
  return (splitmix64(key ^ splitmix64(static_cast<uint64_t>(column) * kSketchLanes + lane)) >> 63) != 0;
}

constexpr float kSketchScale = 0.17677669529663687f;  // 1/sqrt(32)

MLA_HD inline float sketch_coeff_at(uint64_t key, int64_t column, int lane) {
  return sketch_sign(key, column, lane) ? kSketchScale : -kSketchScale;
}

// The checksum's multiplier of element `index`: odd, one splitmix64 per aligned group of 8 elements, stepped by
// an even constant inside the group (a kernel hashes once per 16-byte load of bf16).
constexpr uint64_t kChecksumStep = 0x9e3779b97f4a7c16ull;  // even
MLA_HD inline uint64_t checksum_multiplier(uint64_t index) {
  return (splitmix64(index >> 3) | 1ull) + kChecksumStep * (index & 7ull);
}

// term = multiplier(index) · (2·bits + 1) mod 2^64. Changing one element's bits changes the sum, always (the
// multiplier is odd, so it is invertible mod 2^64, and 2·Δbits is not 0 mod 2^64); swapping two different
// elements changes it unless their multipliers agree to ~31 low bits (within a group of 8: never).
MLA_HD inline uint64_t checksum_term(uint64_t index, uint32_t bits) {
  return checksum_multiplier(index) * (2ull * bits + 1ull);
}

}  // namespace mla
