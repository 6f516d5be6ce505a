// Dequantization to FP32. Each GGUF block kernel follows gguf-py's dequantize_blocks operation for
// operation (the products and sums in the same order, each rounded to float32), so the result is
// bit-identical; that is tested against gguf-py itself. Contraction into FMA would change roundings:
// it is switched off for this file.
#include "core/weights/dequant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/model/errors.h"
#include "core/model/progress_hook.h"
#include "core/weights/iq_tables.h"

// After the includes: only this file's functions are affected (x86-64-v2 has no FMA anyway; this keeps the
// results exact under -march=native too).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace mla {

namespace {

constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
// gguf-py's kvalues for MXFP4/NVFP4: E2M1 doubled (the block scales carry the 0.5).
constexpr int8_t kKvalues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
// TQ1_0's digit multipliers (uint8 products wrap, as gguf-py's uint8 arrays do).
constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};

inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return from_fp16_bits(h);
}

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ggml_e8m0_to_fp32_half: 2^(e-128), as bits (subnormal for e < 2).
inline float e8m0_half(uint8_t e) { return bits_to_float(e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23)); }

// Nearest entry of an ascending table of non-negative values; ties go to the even code (even mantissa).
int nearest_even(const float* table, int n, float x) {
  int lo = 0, hi = n - 1;
  if (x >= table[hi]) return hi;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (table[mid] <= x ? lo : hi) = mid;
  }
  const double dl = static_cast<double>(x) - table[lo], dh = static_cast<double>(table[hi]) - x;
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return lo % 2 == 0 ? lo : hi;
}

struct E4m3Table {
  float v[127];  // codes 0x00..0x7E (0x7F is NaN)
  E4m3Table() {
    for (int c = 0; c < 127; ++c) v[c] = e4m3_to_float(static_cast<uint8_t>(c));
  }
};

void check_bytes(const PackedWeight& w, size_t got, size_t want, const char* what) {
  if (got != want)
    throw UsageError(w.origin + ": " + weight_format_name(w.format) + " [" + std::to_string(w.rows) + ", " +
                     std::to_string(w.cols) + "] needs " + std::to_string(want) + " bytes of " + what + ", has " +
                     std::to_string(got));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

float e4m3_to_float(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  float v;
  if (e == 15 && m == 7) v = std::numeric_limits<float>::quiet_NaN();
  else if (e == 0) v = std::ldexp(static_cast<float>(m), -9);
  else v = std::ldexp(static_cast<float>(8 + m), e - 10);
  return (b & 0x80) ? -v : v;
}

float e5m2_to_float(uint8_t b) {
  const int e = (b >> 2) & 31, m = b & 3;
  float v;
  if (e == 31) v = m == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  else if (e == 0) v = std::ldexp(static_cast<float>(m), -16);
  else v = std::ldexp(static_cast<float>(4 + m), e - 17);
  return (b & 0x80) ? -v : v;
}

float e8m0_to_float(uint8_t b) {
  if (b == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(b) - 127);
}

float e2m1_to_float(uint8_t nibble) {
  const float v = kE2m1[nibble & 7];
  return (nibble & 8) ? -v : v;
}

float ue4m3_gguf_to_float(uint8_t x) {
  // gguf-py NVFP4.ue4m3_to_fp32: the sign bit is ignored, 0 and 0x7F decode to 0, and the result is halved.
  if (x == 0 || x == 0x7F) return 0.0f;
  const int e = (x >> 3) & 15, m = x & 7;
  return e == 0 ? std::ldexp(static_cast<float>(m), -10) : std::ldexp(static_cast<float>(8 + m), e - 11);
}

uint8_t float_to_e4m3(float v) {
  static const E4m3Table t;
  if (std::isnan(v)) return 0x7F;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  return static_cast<uint8_t>(sign | nearest_even(t.v, 127, std::fabs(v)));
}

uint8_t float_to_e2m1(float v) {
  if (std::isnan(v)) return 0;
  const uint8_t sign = std::signbit(v) ? 8 : 0;
  // nearest_even over kE2m1 as thresholds at the midpoints of neighbouring values: a midpoint goes up where the
  // upper code is even (>=), down where the lower one is (>). Branch-free: one compare per code.
  const float a = std::fabs(v);
  const int code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return static_cast<uint8_t>(sign | code);
}

uint8_t float_to_e8m0_floor(float v) {
  if (!(v > 0) || !std::isfinite(v)) return 127;
  int e = 0;
  std::frexp(v, &e);  // v = f * 2^e, f in [0.5, 1): floor(log2 v) = e - 1
  return static_cast<uint8_t>(std::clamp(e - 1 + 127, 0, 254));
}

bool DequantBugs::touches(WeightFormat f) const {
  return (fp8_scale_transpose && f == WeightFormat::WeightFormat_fp8) ||
         (nvfp4_nibble_swap && (f == WeightFormat::WeightFormat_nvfp4 || f == WeightFormat::WeightFormat_nvfp4_ct ||
                                f == WeightFormat::WeightFormat_gguf_nvfp4)) ||
         (nvfp4_global_recip && f == WeightFormat::WeightFormat_nvfp4_ct);
}

bool ggml_type_supported(uint32_t t) {
  switch (t) {
    case ggml::F32: case ggml::F16: case ggml::BF16: case ggml::Q8_0: case ggml::Q4_0: case ggml::Q4_1:
    case ggml::Q5_0: case ggml::Q5_1: case ggml::Q2_K: case ggml::Q3_K: case ggml::Q4_K: case ggml::Q5_K:
    case ggml::Q6_K: case ggml::MXFP4: case ggml::NVFP4: case ggml::IQ1_S: case ggml::IQ1_M: case ggml::IQ2_XXS:
    case ggml::IQ2_XS: case ggml::IQ2_S: case ggml::IQ3_XXS: case ggml::IQ3_S: case ggml::IQ4_NL: case ggml::IQ4_XS:
    case ggml::TQ1_0: case ggml::TQ2_0:
      return true;
    default: return false;
  }
}

namespace {

// Q4_K / Q5_K 6-bit scale and min of sub-block j (get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* s, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

void block_q8_0(const uint8_t* b, float* y) {
  const float d = f16(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}
void block_q4_0(const uint8_t* b, float* y) {
  const float d = f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 15) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}
void block_q4_1(const uint8_t* b, float* y) {
  const float d = f16(b), m = f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 15) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}
void block_q5_0(const uint8_t* b, float* y) {
  const float d = f16(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int x0 = (qs[j] & 15) | (((qh >> j) & 1) << 4);
    const int x1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(x0 - 16);
    y[j + 16] = d * static_cast<float>(x1 - 16);
  }
}
void block_q5_1(const uint8_t* b, float* y) {
  const float d = f16(b), m = f16(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int x0 = (qs[j] & 15) | (((qh >> j) & 1) << 4);
    const int x1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(x0) + m;
    y[j + 16] = d * static_cast<float>(x1) + m;
  }
}
void block_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = f16(b + 80), dmin = f16(b + 82);
  for (int e = 0; e < 256; ++e) {
    const int c = e / 128, s = (e % 128) / 32, l = e % 32, sub = e / 16;
    const float dl = d * static_cast<float>(scales[sub] & 15);
    const float ml = dmin * static_cast<float>(scales[sub] >> 4);
    const int q = (qs[32 * c + l] >> (2 * s)) & 3;
    y[e] = dl * static_cast<float>(q) - ml;
  }
}
void block_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* s = b + 96;
  const float d = f16(b + 108);
  float dl[16];
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? (s[j] & 15) : (s[j - 8] >> 4);
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    dl[j] = d * static_cast<float>((lo | (hi << 4)) - 32);
  }
  for (int e = 0; e < 256; ++e) {
    const int c = e / 128, sh = (e % 128) / 32, l = e % 32;
    const int ql = (qs[32 * c + l] >> (2 * sh)) & 3;
    const int h = (hmask[l] >> (e / 32)) & 1;
    y[e] = dl[e / 16] * static_cast<float>(ql - ((h ^ 1) << 2));
  }
}
void block_q4_k(const uint8_t* b, float* y) {
  const float d = f16(b), dmin = f16(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    scale_min_k4(j, s, sc, m);
    const float dd = d * static_cast<float>(sc), dm = dmin * static_cast<float>(m);
    const int c = j / 2, shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) y[32 * j + l] = dd * static_cast<float>((qs[32 * c + l] >> shift) & 15) - dm;
  }
}
void block_q5_k(const uint8_t* b, float* y) {
  const float d = f16(b), dmin = f16(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    scale_min_k4(j, s, sc, m);
    const float dd = d * static_cast<float>(sc), dm = dmin * static_cast<float>(m);
    const int c = j / 2, shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      const int q = ((qs[32 * c + l] >> shift) & 15) | (((qh[l] >> j) & 1) << 4);
      y[32 * j + l] = dd * static_cast<float>(q) - dm;
    }
  }
}
void block_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16(b + 208);
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128, r = e % 128;
    const int lo = r < 64 ? (ql[64 * n + r] & 15) : (ql[64 * n + r - 64] >> 4);
    const int hi = (qh[32 * n + r % 32] >> (2 * (r / 32))) & 3;
    const float ds = d * static_cast<float>(sc[e / 16]);
    y[e] = ds * static_cast<float>((lo | (hi << 4)) - 32);
  }
}
void block_mxfp4(const uint8_t* b, float* y) {
  const float d = e8m0_half(b[0]);
  const uint8_t* qs = b + 1;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(kKvalues[qs[j] & 15]);
    y[j + 16] = d * static_cast<float>(kKvalues[qs[j] >> 4]);
  }
}
void block_nvfp4(const uint8_t* b, float* y, bool swap) {
  const uint8_t* qs = b + 4;
  for (int s = 0; s < 4; ++s) {
    const float d = ue4m3_gguf_to_float(b[s]);
    for (int j = 0; j < 8; ++j) {
      const uint8_t q = qs[8 * s + j];
      const int lo = swap ? q >> 4 : q & 15, hi = swap ? q & 15 : q >> 4;
      y[16 * s + j] = d * static_cast<float>(kKvalues[lo]);
      y[16 * s + 8 + j] = d * static_cast<float>(kKvalues[hi]);
    }
  }
}

// ---- IQ and TQ types (gguf-py's IQ*/TQ* dequantize_blocks). A grid row's element j is byte j of its table entry;
// a sign bit set means minus. Where gguf-py multiplies by a float +-1 sign, so do these (it makes -0 of a zero).

inline uint16_t u16_at(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float grid_byte(uint64_t row, int j) { return static_cast<float>((row >> (8 * j)) & 0xFF); }
inline float sign_of(unsigned bits, int j) { return (bits >> j) & 1 ? -1.0f : 1.0f; }

// 8 sub-blocks of 32: u32 pairs (4 grid bytes; 4 x 7 sign bits and a 4-bit scale).
void block_iq2_xxs(const uint8_t* b, float* y) {
  const float d = f16(b);
  for (int ib = 0; ib < 8; ++ib) {
    const uint32_t aux0 = u32_at(b + 2 + 8 * ib), aux1 = u32_at(b + 6 + 8 * ib);
    const float db = d * (0.5f + static_cast<float>(aux1 >> 28)) * 0.25f;
    for (int l = 0; l < 4; ++l) {
      const uint64_t g = iq::kIq2xxsGrid[(aux0 >> (8 * l)) & 0xFF];
      const unsigned signs = iq::kKsignsIq2xs[(aux1 >> (7 * l)) & 127];
      for (int j = 0; j < 8; ++j) y[32 * ib + 8 * l + j] = db * grid_byte(g, j) * sign_of(signs, j);
    }
  }
}
// 32 u16 (9-bit grid index, 7 sign bits), a 4-bit scale per 16.
void block_iq2_xs(const uint8_t* b, float* y) {
  const float d = f16(b);
  const uint8_t* sc = b + 66;
  for (int q = 0; q < 32; ++q) {
    const uint16_t v = u16_at(b + 2 + 2 * q);
    const int s = q / 2;  // scale of elements 16s..16s+15
    const float db = d * (0.5f + static_cast<float>((sc[s / 2] >> (4 * (s % 2))) & 15)) * 0.25f;
    const uint64_t g = iq::kIq2xsGrid[v & 511];
    const unsigned signs = iq::kKsignsIq2xs[v >> 9];
    for (int j = 0; j < 8; ++j) y[8 * q + j] = db * grid_byte(g, j) * sign_of(signs, j);
  }
}
// 32 grid bytes + 2 high bits each, 32 sign bytes, a 4-bit scale per 16.
void block_iq2_s(const uint8_t* b, float* y) {
  const float d = f16(b);
  const uint8_t *qs = b + 2, *signs = b + 34, *qh = b + 66, *sc = b + 74;
  for (int q = 0; q < 32; ++q) {
    const int s = q / 2;
    const float db = d * (0.5f + static_cast<float>((sc[s / 2] >> (4 * (s % 2))) & 15)) * 0.25f;
    const uint64_t g = iq::kIq2sGrid[qs[q] | (((qh[q / 4] >> (2 * (q % 4))) & 3) << 8)];
    for (int j = 0; j < 8; ++j) y[8 * q + j] = db * grid_byte(g, j) * sign_of(signs[q], j);
  }
}
// 64 grid bytes (4 values each), then 8 u32 (4 x 7 sign bits and a 4-bit scale per 32).
void block_iq3_xxs(const uint8_t* b, float* y) {
  const float d = f16(b);
  const uint8_t* qs = b + 2;
  for (int ib = 0; ib < 8; ++ib) {
    const uint32_t aux = u32_at(b + 66 + 4 * ib);
    const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
    for (int l = 0; l < 4; ++l) {
      const unsigned signs = iq::kKsignsIq2xs[(aux >> (7 * l)) & 127];
      for (int j = 0; j < 8; ++j) {
        const int e = 8 * l + j;  // within the sub-block
        const uint32_t g = iq::kIq3xxsGrid[qs[8 * ib + e / 4]];
        y[32 * ib + e] = db * grid_byte(g, e % 4) * sign_of(signs, j);
      }
    }
  }
}
// 64 grid bytes + 1 high bit each, 32 sign bytes, a 4-bit odd scale per 32.
void block_iq3_s(const uint8_t* b, float* y) {
  const float d = f16(b);
  const uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74, *sc = b + 106;
  for (int e = 0; e < 256; ++e) {
    const int s = e / 32, q = e / 4;
    const float db = d * static_cast<float>(1 + 2 * ((sc[s / 2] >> (4 * (s % 2))) & 15));
    const uint32_t g = iq::kIq3sGrid[qs[q] | (((qh[q / 8] >> (q % 8)) & 1) << 8)];
    y[e] = db * grid_byte(g, e % 4) * sign_of(signs[e / 8], e % 8);
  }
}
// 32 grid bytes + 3 high bits each (in u16 qh per 32, with a 3-bit scale and the delta's sign); values -1, 0, 1.
void block_iq1_s(const uint8_t* b, float* y) {
  const float d = f16(b);
  const uint8_t* qs = b + 2;
  for (int ib = 0; ib < 8; ++ib) {
    const uint16_t qh = u16_at(b + 34 + 2 * ib);
    const float dl = d * static_cast<float>(2 * ((qh >> 12) & 7) + 1);
    const float delta = (qh & 0x8000) ? -iq::kIq1sDelta : iq::kIq1sDelta;
    for (int l = 0; l < 4; ++l) {
      const uint64_t g = iq::kIq1sGrid[qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)];
      for (int j = 0; j < 8; ++j)
        y[32 * ib + 8 * l + j] = dl * (static_cast<float>(static_cast<int8_t>((g >> (8 * j)) & 0xFF)) + delta);
    }
  }
}
// IQ1_S's grid with a 3-bit scale per 16 and the delta's sign per 8; the fp16 scale is the top nibbles of the
// four u16 scale words.
void block_iq1_m(const uint8_t* b, float* y) {
  const uint8_t *qs = b, *qh = b + 32, *sc = b + 48;
  uint16_t w[4];
  for (int k = 0; k < 4; ++k) w[k] = u16_at(sc + 2 * k);
  const uint16_t dbits = static_cast<uint16_t>(((w[0] & 0xF000) >> 12) | ((w[1] & 0xF000) >> 8) |
                                               ((w[2] & 0xF000) >> 4) | (w[3] & 0xF000));
  const float d = from_fp16_bits(dbits);
  for (int q = 0; q < 32; ++q) {
    const int s = q / 2;  // scale of elements 16s..16s+15
    const float dl = d * static_cast<float>(2 * ((w[s / 4] >> (3 * (s % 4))) & 7) + 1);
    const int h = (qh[q / 2] >> (4 * (q % 2))) & 15;
    const float delta = (h & 8) ? -iq::kIq1sDelta : iq::kIq1sDelta;
    const uint64_t g = iq::kIq1sGrid[qs[q] | ((h & 7) << 8)];
    for (int j = 0; j < 8; ++j)
      y[8 * q + j] = dl * (static_cast<float>(static_cast<int8_t>((g >> (8 * j)) & 0xFF)) + delta);
  }
}
void block_iq4_nl(const uint8_t* b, float* y) {
  const float d = f16(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(iq::kKvaluesIq4nl[b[2 + j] & 15]);
    y[j + 16] = d * static_cast<float>(iq::kKvaluesIq4nl[b[2 + j] >> 4]);
  }
}
// 8 sub-blocks of 32 with 6-bit scales (low 4 bits in scales_l, high 2 in the u16 scales_h), minus 32.
void block_iq4_xs(const uint8_t* b, float* y) {
  const float d = f16(b);
  const uint16_t sh = u16_at(b + 2);
  const uint8_t *sl = b + 4, *qs = b + 8;
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = ((sl[ib / 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4);
    const float dl = d * static_cast<float>(ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[32 * ib + j] = dl * static_cast<float>(iq::kKvaluesIq4nl[qs[16 * ib + j] & 15]);
      y[32 * ib + 16 + j] = dl * static_cast<float>(iq::kKvaluesIq4nl[qs[16 * ib + j] >> 4]);
    }
  }
}
// Ternary digit e of a TQ1_0 block (base-3 digits packed as fixed-point bytes: q * 3^n mod 256, then * 3 >> 8).
inline int tq1_digit(const uint8_t* b, int e) {
  uint8_t x;
  if (e < 160) x = static_cast<uint8_t>(b[e % 32] * kPow3[e / 32]);
  else if (e < 240) x = static_cast<uint8_t>(b[32 + (e - 160) % 16] * kPow3[(e - 160) / 16]);
  else x = static_cast<uint8_t>(b[48 + (e - 240) % 4] * kPow3[(e - 240) / 4]);
  return ((x * 3) >> 8) - 1;
}
void block_tq1_0(const uint8_t* b, float* y) {
  const float d = f16(b + 52);
  for (int e = 0; e < 256; ++e) y[e] = d * static_cast<float>(tq1_digit(b, e));
}
void block_tq2_0(const uint8_t* b, float* y) {
  const float d = f16(b + 64);
  for (int e = 0; e < 256; ++e) {
    const int c = e / 128, s = (e % 128) / 32, l = e % 32;
    y[e] = d * static_cast<float>(((b[32 * c + l] >> (2 * s)) & 3) - 1);
  }
}

}  // namespace

void dequantize_ggml_row(uint32_t type, const uint8_t* src, float* dst, int64_t n, bool nibble_swap) {
  const GgmlTypeInfo* ti = ggml_type_info(type);
  if (!ti || !ggml_type_supported(type))
    throw UsageError("no dequantization for ggml type " + ggml_type_name(type) +
                     " (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4, NVFP4, "
                     "IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0)");
  if (n % ti->block != 0)
    throw UsageError(std::string("a ") + ti->name + " row of " + std::to_string(n) +
                     " elements is not a whole number of blocks of " + std::to_string(ti->block));
  const int64_t nb = n / ti->block;
  switch (type) {
    case ggml::F32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case ggml::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16(src + 2 * i);
      return;
    case ggml::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = from_bf16_bits(h);
      }
      return;
    default: break;
  }
  for (int64_t k = 0; k < nb; ++k) {
    const uint8_t* b = src + k * ti->type_size;
    float* y = dst + k * ti->block;
    switch (type) {
      case ggml::Q8_0: block_q8_0(b, y); break;
      case ggml::Q4_0: block_q4_0(b, y); break;
      case ggml::Q4_1: block_q4_1(b, y); break;
      case ggml::Q5_0: block_q5_0(b, y); break;
      case ggml::Q5_1: block_q5_1(b, y); break;
      case ggml::Q2_K: block_q2_k(b, y); break;
      case ggml::Q3_K: block_q3_k(b, y); break;
      case ggml::Q4_K: block_q4_k(b, y); break;
      case ggml::Q5_K: block_q5_k(b, y); break;
      case ggml::Q6_K: block_q6_k(b, y); break;
      case ggml::MXFP4: block_mxfp4(b, y); break;
      case ggml::NVFP4: block_nvfp4(b, y, nibble_swap); break;
      case ggml::IQ2_XXS: block_iq2_xxs(b, y); break;
      case ggml::IQ2_XS: block_iq2_xs(b, y); break;
      case ggml::IQ2_S: block_iq2_s(b, y); break;
      case ggml::IQ3_XXS: block_iq3_xxs(b, y); break;
      case ggml::IQ3_S: block_iq3_s(b, y); break;
      case ggml::IQ1_S: block_iq1_s(b, y); break;
      case ggml::IQ1_M: block_iq1_m(b, y); break;
      case ggml::IQ4_NL: block_iq4_nl(b, y); break;
      case ggml::IQ4_XS: block_iq4_xs(b, y); break;
      case ggml::TQ1_0: block_tq1_0(b, y); break;
      case ggml::TQ2_0: block_tq2_0(b, y); break;
      default: break;
    }
  }
}

size_t PackedWeight::expected_data_bytes() const {
  const int64_t n = rows * cols;
  switch (format) {
    case WeightFormat::WeightFormat_f32: return static_cast<size_t>(n) * 4;
    case WeightFormat::WeightFormat_f16: case WeightFormat::WeightFormat_bf16: return static_cast<size_t>(n) * 2;
    case WeightFormat::WeightFormat_fp8: return static_cast<size_t>(n);
    case WeightFormat::WeightFormat_nvfp4: case WeightFormat::WeightFormat_nvfp4_ct: case WeightFormat::WeightFormat_mxfp4:
      return static_cast<size_t>(n / 2);
    default: {
      const GgmlTypeInfo* ti = ggml_type_info(ggml_type_of(format));
      return static_cast<size_t>(rows * (cols / ti->block) * ti->type_size);
    }
  }
}

size_t PackedWeight::expected_scale_bytes() const {
  switch (format) {
    case WeightFormat::WeightFormat_fp8:
      return static_cast<size_t>(ceil_div(rows, block_rows) * ceil_div(cols, block_cols) * 4);
    case WeightFormat::WeightFormat_nvfp4: case WeightFormat::WeightFormat_nvfp4_ct:
      return static_cast<size_t>(rows * (cols / 16));
    case WeightFormat::WeightFormat_mxfp4: return static_cast<size_t>(rows * (cols / 32));
    default: return 0;
  }
}

void validate_packed(const PackedWeight& w) {
  if (w.rows < 0 || w.cols < 0) throw UsageError(w.origin + ": negative shape");
  const int64_t kmul = weight_format_k_multiple(w.format);
  if (w.cols % kmul != 0)
    throw UsageError(w.origin + ": " + weight_format_name(w.format) + " needs the input dimension to be a multiple of " +
                     std::to_string(kmul) + ", got [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) + "]");
  if (w.format == WeightFormat::WeightFormat_fp8 && (w.block_rows <= 0 || w.block_cols <= 0))
    throw UsageError(w.origin + ": fp8 block shape must be positive");
  check_bytes(w, w.data.size(), w.expected_data_bytes(), "elements");
  check_bytes(w, w.scales.size(), w.expected_scale_bytes(), "scales");
}

Tensor dequantize(const PackedWeight& w, const DequantBugs& bugs) {
  validate_packed(w);
  Tensor out({w.rows, w.cols});
  float* y = out.ptr();
  const int64_t R = w.rows, C = w.cols;
  const uint8_t* src = w.data.data();
  const auto within = [R](int64_t i) {  // progress ticks of a large weight, every 256 rows
    if (i % 256 == 0) progress_within(static_cast<double>(i) / static_cast<double>(R));
  };
  switch (w.format) {
    case WeightFormat::WeightFormat_fp8: {
      const int64_t sr = ceil_div(R, w.block_rows), sc = ceil_div(C, w.block_cols);
      std::vector<float> s(static_cast<size_t>(sr * sc));
      if (!s.empty()) std::memcpy(s.data(), w.scales.data(), s.size() * 4);
      for (int64_t i = 0; i < R; ++i) {
        within(i);
        for (int64_t j = 0; j < C; ++j) {
          const int64_t bi = i / w.block_rows, bj = j / w.block_cols;
          const float scale = bugs.fp8_scale_transpose ? s[bj * sr + bi] : s[bi * sc + bj];
          y[i * C + j] = e4m3_to_float(src[i * C + j]) * scale;
        }
      }
      return out;
    }
    case WeightFormat::WeightFormat_nvfp4:
    case WeightFormat::WeightFormat_nvfp4_ct: {
      const bool ct = w.format == WeightFormat::WeightFormat_nvfp4_ct;
      const bool divide = ct && !bugs.nvfp4_global_recip;
      for (int64_t i = 0; i < R; ++i) {
        within(i);
        for (int64_t g = 0; g < C / 16; ++g) {
          const float s8 = e4m3_to_float(w.scales[i * (C / 16) + g]);
          // The block scale first, then the element (ModelOpt's and compressed-tensors' order).
          const float scale = divide ? s8 / w.global_scale : s8 * w.global_scale;
          for (int64_t k = 16 * g; k < 16 * g + 16; ++k) {
            const uint8_t byte = src[(i * C + k) / 2];
            const bool high = (k % 2 == 1) != bugs.nvfp4_nibble_swap;
            y[i * C + k] = e2m1_to_float(high ? byte >> 4 : byte & 15) * scale;
          }
        }
      }
      return out;
    }
    case WeightFormat::WeightFormat_mxfp4:
      for (int64_t i = 0; i < R; ++i) {
        within(i);
        for (int64_t k = 0; k < C; ++k) {
          const uint8_t byte = src[(i * C + k) / 2];
          y[i * C + k] = e2m1_to_float(k % 2 ? byte >> 4 : byte & 15) * e8m0_to_float(w.scales[i * (C / 32) + k / 32]);
        }
      }
      return out;
    default: {
      const uint32_t t = ggml_type_of(w.format);
      const GgmlTypeInfo* ti = ggml_type_info(t);
      const int64_t row_bytes = C / ti->block * ti->type_size;
      const bool swap = bugs.nvfp4_nibble_swap && w.format == WeightFormat::WeightFormat_gguf_nvfp4;
      for (int64_t i = 0; i < R; ++i) {
        within(i);
        dequantize_ggml_row(t, src + i * row_bytes, y + i * C, C, swap);
      }
      return out;
    }
  }
}

std::vector<float> st_to_float(StDtype t, const uint8_t* src, int64_t numel) {
  std::vector<float> out(static_cast<size_t>(numel));
  auto each = [&](int bytes, auto conv) {
    for (int64_t i = 0; i < numel; ++i) out[i] = conv(src + i * bytes);
  };
  auto load = [](const uint8_t* p, auto v) {
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (t) {
    case StDtype::StDtype_F64: each(8, [&](const uint8_t* p) { return static_cast<float>(load(p, double{})); }); break;
    case StDtype::StDtype_F32:
      if (numel > 0) std::memcpy(out.data(), src, static_cast<size_t>(numel) * 4);
      break;
    case StDtype::StDtype_F16: each(2, [&](const uint8_t* p) { return from_fp16_bits(load(p, uint16_t{})); }); break;
    case StDtype::StDtype_BF16: each(2, [&](const uint8_t* p) { return from_bf16_bits(load(p, uint16_t{})); }); break;
    case StDtype::StDtype_I64: each(8, [&](const uint8_t* p) { return static_cast<float>(load(p, int64_t{})); }); break;
    case StDtype::StDtype_I32: each(4, [&](const uint8_t* p) { return static_cast<float>(load(p, int32_t{})); }); break;
    case StDtype::StDtype_I16: each(2, [&](const uint8_t* p) { return static_cast<float>(load(p, int16_t{})); }); break;
    case StDtype::StDtype_I8: each(1, [&](const uint8_t* p) { return static_cast<float>(static_cast<int8_t>(*p)); }); break;
    case StDtype::StDtype_U8: each(1, [&](const uint8_t* p) { return static_cast<float>(*p); }); break;
    case StDtype::StDtype_U16: each(2, [&](const uint8_t* p) { return static_cast<float>(load(p, uint16_t{})); }); break;
    case StDtype::StDtype_U32: each(4, [&](const uint8_t* p) { return static_cast<float>(load(p, uint32_t{})); }); break;
    case StDtype::StDtype_U64: each(8, [&](const uint8_t* p) { return static_cast<float>(load(p, uint64_t{})); }); break;
    case StDtype::StDtype_BOOL: each(1, [&](const uint8_t* p) { return *p ? 1.0f : 0.0f; }); break;
    case StDtype::StDtype_F8_E4M3: each(1, [&](const uint8_t* p) { return e4m3_to_float(*p); }); break;
    case StDtype::StDtype_F8_E5M2: each(1, [&](const uint8_t* p) { return e5m2_to_float(*p); }); break;
    case StDtype::StDtype_F8_E8M0: each(1, [&](const uint8_t* p) { return e8m0_to_float(*p); }); break;
    case StDtype::StDtype_F4:
      for (int64_t i = 0; i < numel; ++i) out[i] = e2m1_to_float(i % 2 ? src[i / 2] >> 4 : src[i / 2] & 15);
      break;
  }
  return out;
}

}  // namespace mla
