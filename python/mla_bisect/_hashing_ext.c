/* The loops of hashing.compute_record in C, in the order of probes/probe.cpp compute_probe_record: the same bits as
 * the C++ records (and as the numpy path of hashing.py). Compiled on first use by hashing._ext() with the system C
 * compiler and loaded through ctypes; no Python headers needed. Plain C99, no fast-math: every double sum runs in
 * the C++ loop's order (products of two floats are exact in double, so contraction into FMA changes no bit). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 32
#define STEP 0x9e3779b97f4a7c16ull
#define BASE 0xd1b54a32d192ed03ull
#define SCALE 0.17677669529663687f

static uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* harness/model/tensor.cpp to_bf16_bits / to_fp16_bits. */
static uint32_t bf16_bits(float f) {
  const uint32_t u = f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

static uint32_t fp16_bits(float f) {
  const uint32_t x = f2u(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00u;
  if (ax >= 0x477ff000u) return sign | 0x7c00u;
  if (ax < 0x38800000u) return sign | (uint32_t)nearbyintf(fabsf(f) * 16777216.0f);
  const uint32_t mant = ax & 0x7fffffu;
  uint32_t h = (((ax >> 23) - 127 + 15) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return sign | h;
}

int mla_hash_abi(void) { return 1; }

/* coeff[c * 32 + k] = sketch_coeff(key, col_offset + c, k) as a double. */
void mla_sketch_coeffs(uint64_t key, int64_t col_offset, int64_t C, double* coeff) {
  for (int64_t c = 0; c < C; ++c)
    for (int k = 0; k < LANES; ++k) {
      const uint64_t h = splitmix64(key ^ splitmix64((uint64_t)(col_offset + c) * LANES + (uint64_t)k));
      coeff[c * LANES + k] = (h >> 63) ? (double)SCALE : -(double)SCALE;
    }
}

/* Sum and sum of squares of the finite values in element order (one chain each, as the C++ loop), the non-finite
 * counts and the finite values' largest magnitude. out: sum, sumsq, absmax; counts: nan, inf. */
void mla_seq_stats(const float* data, int64_t n, double* out, int64_t* counts) {
  double sum = 0, sumsq = 0, amax = 0;
  int64_t nan = 0, inf = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = data[i];
    const uint32_t a = f2u(v) & 0x7fffffffu;
    if (a < 0x7f800000u) {
      const double d = v;
      sum += d;
      sumsq += d * d;
      const double m = fabs(d);
      if (m > amax) amax = m;
    } else if (a == 0x7f800000u) {
      ++inf;
    } else {
      ++nan;
    }
  }
  out[0] = sum;
  out[1] = sumsq;
  out[2] = amax;
  counts[0] = nan;
  counts[1] = inf;
}

/* sketch[r * 32 + k] = sum over c in column order of data[r, c] * coeff[c, k], rows r0..r1. The columns go in blocks
 * whose coefficients (SKETCH_BLOCK x 32 doubles) stay in cache while every row adds its part to its 32 running sums
 * (each sum still in column order: the same bits as one pass per row). */
#define SKETCH_BLOCK 128
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__)
__attribute__((target_clones("avx2", "default")))  /* 4 lanes a vector where the CPU has AVX2 */
#endif
static void sketch_rows(const float* data, int64_t C, int64_t r0, int64_t r1, const double* coeff, float* sketch) {
  double one[LANES];
  double* sums = r1 > r0 ? (double*)malloc((size_t)(r1 - r0) * LANES * sizeof(double)) : NULL;
  const int64_t step = sums ? r1 - r0 : 1; /* rows that go through the blocks together */
  if (!sums) sums = one;
  for (int64_t a = r0; a < r1; a += step) {
    const int64_t b = a + step;
    for (int64_t i = 0; i < step * LANES; ++i) sums[i] = 0;
    for (int64_t c0 = 0; c0 < C; c0 += SKETCH_BLOCK) {
      const int64_t c1 = C - c0 < SKETCH_BLOCK ? C : c0 + SKETCH_BLOCK;
      for (int64_t r = a; r < b; ++r) {
        const float* row = data + r * C;
        double acc[LANES];
        memcpy(acc, sums + (r - a) * LANES, sizeof acc);
        for (int64_t c = c0; c < c1; ++c) {
          const double v = row[c];
          const double* cf = coeff + c * LANES;
          for (int k = 0; k < LANES; ++k) acc[k] += v * cf[k];
        }
        memcpy(sums + (r - a) * LANES, acc, sizeof acc);
      }
    }
    for (int64_t r = a; r < b; ++r)
      for (int k = 0; k < LANES; ++k) sketch[r * LANES + k] = (float)sums[(r - a) * LANES + k];
  }
  if (sums != one) free(sums);
}

/* Rows r0..r1 of the [T, C] view: their checksum terms summed mod 2^64 (returned), token_l2[r], head_l2[r * heads + h]
 * (heads > 0, C a multiple of heads) and sketch[r * 32 + k] (coeff non-null). dtype: 0 fp32, 1 bf16, 2 fp16, 3 the
 * 8-bit patterns given in bits8 (same layout as data). */
uint64_t mla_rows(const float* data, int64_t C, int64_t r0, int64_t r1, int dtype, const uint8_t* bits8,
                  int64_t heads, const double* coeff, float* token_l2, float* head_l2, float* sketch) {
  uint64_t total = 0;
  const int64_t X = heads > 0 ? C / heads : 0;
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = data + r * C;
    /* checksum: H(row) * A^(c >> 3) + step * (c & 7), times (2 bits + 1) */
    const uint64_t row_hash = splitmix64((uint64_t)r) | 1ull;
    uint64_t power = 1, h = 0;
    if (dtype == 3) {
      const uint8_t* b = bits8 + r * C;
      for (int64_t c = 0; c < C; ++c) {
        h += (row_hash * power + STEP * ((uint64_t)c & 7ull)) * (2ull * b[c] + 1ull);
        if ((c & 7) == 7) power *= BASE;
      }
    } else {
      for (int64_t c = 0; c < C; ++c) {
        const uint32_t bits = dtype == 1 ? bf16_bits(row[c]) : dtype == 2 ? fp16_bits(row[c]) : f2u(row[c]);
        h += (row_hash * power + STEP * ((uint64_t)c & 7ull)) * (2ull * (uint64_t)bits + 1ull);
        if ((c & 7) == 7) power *= BASE;
      }
    }
    total += h;
    /* token and head L2: squares summed in column order, one chain per row and one per head */
    double s = 0;
    if (heads > 0) {
      for (int64_t hd = 0; hd < heads; ++hd) {
        const float* p = row + hd * X;
        double sh = 0;
        for (int64_t c = 0; c < X; ++c) {
          const double d = p[c];
          sh += d * d;
          s += d * d;
        }
        head_l2[r * heads + hd] = (float)sqrt(sh);
      }
      for (int64_t c = heads * X; c < C; ++c) s += (double)row[c] * row[c];
    } else {
      for (int64_t c = 0; c < C; ++c) s += (double)row[c] * row[c];
    }
    token_l2[r] = (float)sqrt(s);
  }
  if (coeff) sketch_rows(data, C, r0, r1, coeff, sketch);
  return total;
}
