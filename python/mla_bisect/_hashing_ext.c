/* The loops of hashing.compute_record in C, in the order of core/probe/probe.cpp compute_probe_record: the same bits as
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

/* core/model/tensor.cpp to_bf16_bits / to_fp16_bits. */
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

/* Rows r0..r1 of the [T, C] view: their checksum terms summed mod 2^64 (returned), token_l2[r], head_l2[r * heads + h]
 * (heads > 0, C a multiple of heads) and sketch[r * 32 + k] (coeff non-null). dtype: 0 fp32, 1 bf16, 2 fp16, 3 the
 * 8-bit patterns given in bits8 (same layout as data).
 * One pass over each element does all of it: the columns go in blocks whose sketch coefficients (BLOCK x 32 doubles)
 * stay in cache while every row of the range takes its part of the block, its running sums kept from block to block.
 * Every double sum still runs over the columns in order (the row's squares, its head's squares, each sketch lane),
 * so the bits are those of one loop per row and quantity; the checksum is a sum mod 2^64, in any order. */
#define BLOCK 128

typedef struct {
  double s, sh;           /* the row's sum of squares; the current head's */
  uint64_t h, power;      /* checksum terms so far; A^(c >> 3) of the next column */
  double acc[LANES];      /* sketch lanes */
} RowState;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__)
__attribute__((target_clones("avx2", "default")))  /* 4 lanes a vector where the CPU has AVX2 */
#endif
static void row_part(const float* row, const uint8_t* b8, int dtype, int64_t c0, int64_t c1, uint64_t row_hash,
                     int64_t X, float* head_out, const double* coeff, RowState* st) {
  double s = st->s, sh = st->sh;
  uint64_t h = st->h, power = st->power;
  double acc[LANES];
  memcpy(acc, st->acc, sizeof acc);
  int64_t c = c0;
  while (c < c1) {
    /* up to the end of the block or of the current head, whichever comes first */
    const int64_t end = X > 0 && (c / X + 1) * X < c1 ? (c / X + 1) * X : c1;
    for (; c < end; ++c) {
      const float f = row[c];
      const uint64_t bits = dtype == 3 ? b8[c] : dtype == 1 ? bf16_bits(f) : dtype == 2 ? fp16_bits(f) : f2u(f);
      h += (row_hash * power + STEP * ((uint64_t)c & 7ull)) * (2ull * bits + 1ull);
      if ((c & 7) == 7) power *= BASE;
      const double d = f;
      s += d * d;
      sh += d * d;
      if (coeff) {
        const double* cf = coeff + c * LANES;
        for (int k = 0; k < LANES; ++k) acc[k] += d * cf[k];
      }
    }
    if (X > 0 && c % X == 0) {
      head_out[c / X - 1] = (float)sqrt(sh);
      sh = 0;
    }
  }
  st->s = s;
  st->sh = sh;
  st->h = h;
  st->power = power;
  memcpy(st->acc, acc, sizeof acc);
}

uint64_t mla_rows(const float* data, int64_t C, int64_t r0, int64_t r1, int dtype, const uint8_t* bits8,
                  int64_t heads, const double* coeff, float* token_l2, float* head_l2, float* sketch) {
  uint64_t total = 0;
  const int64_t X = heads > 0 ? C / heads : 0;
  RowState one;
  RowState* states = r1 > r0 ? (RowState*)malloc((size_t)(r1 - r0) * sizeof(RowState)) : NULL;
  const int64_t step = states ? r1 - r0 : 1; /* rows that go through the blocks together */
  if (!states) states = &one;
  for (int64_t a = r0; a < r1; a += step) {
    const int64_t b = a + step;
    for (int64_t r = a; r < b; ++r) {
      RowState* st = states + (r - a);
      memset(st, 0, sizeof *st);
      st->power = 1;
    }
    for (int64_t c0 = 0; c0 < C; c0 += BLOCK) {
      const int64_t c1 = C - c0 < BLOCK ? C : c0 + BLOCK;
      for (int64_t r = a; r < b; ++r)
        row_part(data + r * C, dtype == 3 ? bits8 + r * C : NULL, dtype, c0, c1, splitmix64((uint64_t)r) | 1ull,
                 X, heads > 0 ? head_l2 + r * heads : NULL, coeff, states + (r - a));
    }
    for (int64_t r = a; r < b; ++r) {
      const RowState* st = states + (r - a);
      total += st->h;
      token_l2[r] = (float)sqrt(st->s);
      if (coeff)
        for (int k = 0; k < LANES; ++k) sketch[r * LANES + k] = (float)st->acc[k];
    }
  }
  if (states != &one) free(states);
  return total;
}
