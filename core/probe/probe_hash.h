// The counter hashes behind probe records, callable on the host and on a device (the CUDA engine computes
// records on the GPU; tests/gpu checks bit-equality with the host). Two uses:
//   sketch_coeff_at   the sketch matrix entry ±1/sqrt(32) for (probe, global column, lane): never stored;
//   checksum_term     one element's term of the checksum. The checksum is the sum, modulo 2^64, of
//                     checksum_term(row, col, bits) over the rank's elements viewed as [tokens, cols] (bits: the raw
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

constexpr int kSketchLanes = 32;  // k of the per-token projection (== kSketchDim of core/probe/probe.h)

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

// The checksum's multiplier of the element at (row, col) of the rank's tensor viewed as [tokens, cols]: the row's
// odd hash times a power of an odd base, one power per aligned group of 8 columns, stepped by an even constant
// inside the group:  H(row) · A^(col >> 3) + kChecksumStep · (col & 7)  (mod 2^64), H(row) = splitmix64(row) | 1.
// A kernel walking a row keeps A^q and multiplies it by A^8 per 64 columns, and takes H(row) out of the row's sum
// (one multiply per row), instead of a hash per 16-byte load.
constexpr uint64_t kChecksumStep = 0x9e3779b97f4a7c16ull;  // even
constexpr uint64_t kChecksumBase = 0xd1b54a32d192ed03ull;  // A: odd
MLA_HD inline uint64_t checksum_row_hash(uint64_t row) { return splitmix64(row) | 1ull; }
// base^e mod 2^64.
MLA_HD constexpr uint64_t pow_mod64(uint64_t base, uint64_t e) {
  uint64_t r = 1;
  for (; e; e >>= 1, base *= base)
    if (e & 1) r *= base;
  return r;
}
// The multiplier from the row's hash and A^(col >> 3), which a walk along the row keeps as it goes.
MLA_HD inline uint64_t checksum_multiplier_at(uint64_t row_hash, uint64_t power, uint64_t col) {
  return row_hash * power + kChecksumStep * (col & 7ull);
}
MLA_HD inline uint64_t checksum_multiplier(uint64_t row, uint64_t col) {
  return checksum_multiplier_at(checksum_row_hash(row), pow_mod64(kChecksumBase, col >> 3), col);
}

// term = multiplier · (2·bits + 1) mod 2^64. Changing one element's bits changes the sum, always (the multiplier is
// odd, so it is invertible mod 2^64, and 2·Δbits is not 0 mod 2^64). Swapping two different elements changes it
// unless their multipliers agree in their ~33 low bits: never inside a group of 8, never at the same place of two
// groups of one row fewer than 2^30 groups apart (H·A^q·(A^d − 1) has its lowest set bit at v2(d) + 2 at most), a
// ~2^-32 chance otherwise.
MLA_HD inline uint64_t checksum_term(uint64_t row, uint64_t col, uint32_t bits) {
  return checksum_multiplier(row, col) * (2ull * bits + 1ull);
}

// The checksum of n values viewed as rows of C (a count C does not divide ends in a short row), walked in order on
// the host: bits(value, flat index) gives each element's pattern (and may throw).
template <class Bits>
uint64_t checksum_walk(const float* data, int64_t n, int64_t C, Bits bits) {
  uint64_t h = 0, row_hash = 0, power = 1;
  for (int64_t i = 0, r = 0, c = 0; i < n; ++i, ++c) {
    if (c == C) {
      ++r;
      c = 0;
    }
    if (c == 0) {
      row_hash = checksum_row_hash(static_cast<uint64_t>(r));
      power = 1;
    }
    h += checksum_multiplier_at(row_hash, power, static_cast<uint64_t>(c)) * (2ull * bits(data[i], i) + 1ull);
    if ((c & 7) == 7) power *= kChecksumBase;
  }
  return h;
}

}  // namespace mla
