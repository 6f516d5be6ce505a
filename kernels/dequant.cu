// Dequantization kernels, one thread per output element. Each element function is the per-element form of
// its block function in core/weights/dequant.cpp (read side by side): the same integer unpacking, the
// same float products in the same order. Every float operation is an explicit __fmul_rn / __fadd_rn /
// __fsub_rn / __fdiv_rn, so nvcc can never contract a product and a sum into an FMA (the CPU file is compiled
// with contraction off), and denormals are kept (no fast math in this build; the E8M0 and UE4M3 scales reach
// them). Element codes decode through integer bit construction, exact like the CPU's ldexp. The IQ types' grids
// and sign tables are device copies of core/weights/iq_tables.h (generated from gguf-py's tables).
//
// Version 1 (the only one): element-wise, re-deriving a block's scale per element. Dequantization runs once
// per weight at load time; the redundant scale arithmetic is deterministic and cheap next to the GEMMs.
#include "kernels/dequant.cuh"

#include <algorithm>

#include "core/weights/iq_tables.h"

namespace mla::cuda {

namespace {

// The IQ tables in device memory: the same numbers as the host's mla::iq arrays (one macro per table).
__device__ const uint64_t d_iq2xxs_grid[256] = {MLA_IQ2XXS_GRID_VALUES};
__device__ const uint64_t d_iq2xs_grid[512] = {MLA_IQ2XS_GRID_VALUES};
__device__ const uint64_t d_iq2s_grid[1024] = {MLA_IQ2S_GRID_VALUES};
__device__ const uint32_t d_iq3xxs_grid[256] = {MLA_IQ3XXS_GRID_VALUES};
__device__ const uint32_t d_iq3s_grid[512] = {MLA_IQ3S_GRID_VALUES};
__device__ const uint64_t d_iq1s_grid[2048] = {MLA_IQ1S_GRID_VALUES};
__device__ const uint8_t d_ksigns_iq2xs[128] = {MLA_KSIGNS_IQ2XS_VALUES};
__device__ const int8_t d_kvalues_iq4nl[16] = {MLA_KVALUES_IQ4NL_VALUES};

__device__ __forceinline__ float bits_f(uint32_t u) { return __uint_as_float(u); }
// -v as x86 computes it (an xor of the sign bit, NaN payload kept); PTX neg.f32 leaves NaN unspecified.
__device__ __forceinline__ float negate(float v) { return bits_f(__float_as_uint(v) ^ 0x80000000u); }

// 2^e for e in [-126, 127] (normal range), exact.
__device__ __forceinline__ float pow2(int e) { return bits_f(static_cast<uint32_t>(e + 127) << 23); }

// from_fp16_bits (core/model/tensor.cpp): NaN payloads kept, subnormals via m * 2^-24.
__device__ __forceinline__ float f16_bits(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = __fmul_rn(static_cast<float>(mant), pow2(-24));
    return sign ? negate(v) : v;
  }
  return bits_f(exp == 31 ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((exp - 15 + 127) << 23) | (mant << 13)));
}
__device__ __forceinline__ float f16_at(const uint8_t* p) {
  return f16_bits(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8));
}

// e4m3_to_float: bias 7, S.1111.111 NaN (std::quiet_NaN, negated for a set sign bit, as the CPU's -v does).
__device__ __forceinline__ float e4m3(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  float v;
  if (e == 15 && m == 7) v = bits_f(0x7fc00000u);
  else if (e == 0) v = __fmul_rn(static_cast<float>(m), pow2(-9));
  else v = __fmul_rn(static_cast<float>(8 + m), pow2(e - 10));
  return (b & 0x80) ? negate(v) : v;
}

// e8m0_to_float: 2^(b-127); 2^-127 is a subnormal; 0xFF NaN.
__device__ __forceinline__ float e8m0(uint8_t b) {
  if (b == 0xFF) return bits_f(0x7fc00000u);
  return b == 0 ? bits_f(0x00400000u) : bits_f(static_cast<uint32_t>(b) << 23);
}

// ggml_e8m0_to_fp32_half: 2^(e-128), as bits.
__device__ __forceinline__ float e8m0_half(uint8_t e) {
  return bits_f(e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e - 1) << 23));
}

// ue4m3_gguf_to_float: sign ignored, 0 and 0x7F are 0, the value halved.
__device__ __forceinline__ float ue4m3_gguf(uint8_t x) {
  if (x == 0 || x == 0x7F) return 0.0f;
  const int e = (x >> 3) & 15, m = x & 7;
  return e == 0 ? __fmul_rn(static_cast<float>(m), pow2(-10)) : __fmul_rn(static_cast<float>(8 + m), pow2(e - 11));
}

__device__ __forceinline__ float e2m1(uint8_t nibble) {
  // kE2m1, as a switch (no constant-memory table to keep the file self-contained).
  float v;
  switch (nibble & 7) {
    case 0: v = 0.0f; break;
    case 1: v = 0.5f; break;
    case 2: v = 1.0f; break;
    case 3: v = 1.5f; break;
    case 4: v = 2.0f; break;
    case 5: v = 3.0f; break;
    case 6: v = 4.0f; break;
    default: v = 6.0f; break;
  }
  return (nibble & 8) ? negate(v) : v;
}

// gguf-py's kvalues (E2M1 doubled) as integers, converted like the CPU's static_cast<float>(int8): code 8 is
// +0, not -0.
__device__ __forceinline__ float kvalue(int q) {
  int mag;
  switch (q & 7) {
    case 0: mag = 0; break;
    case 1: mag = 1; break;
    case 2: mag = 2; break;
    case 3: mag = 3; break;
    case 4: mag = 4; break;
    case 5: mag = 6; break;
    case 6: mag = 8; break;
    default: mag = 12; break;
  }
  return static_cast<float>((q & 8) ? -mag : mag);
}

__device__ __forceinline__ float fl(int x) { return static_cast<float>(x); }

__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* s, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

__device__ __forceinline__ uint32_t u32_at(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

__device__ __forceinline__ uint32_t u16_at(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8);
}

// IQ helpers, as dequant.cpp's: byte j of a grid row; a float +-1 from sign bit j (multiplied, as gguf-py does).
__device__ __forceinline__ float grid_byte(uint64_t row, int j) { return fl(static_cast<int>((row >> (8 * j)) & 0xFF)); }
__device__ __forceinline__ float grid_sbyte(uint64_t row, int j) {
  return fl(static_cast<int8_t>(static_cast<uint8_t>((row >> (8 * j)) & 0xFF)));
}
__device__ __forceinline__ float sign_of(unsigned bits, int j) { return (bits >> j) & 1 ? -1.0f : 1.0f; }
// d * (0.5 + s) * f: the IQ2/IQ3_XXS sub-block scale.
__device__ __forceinline__ float half_step_scale(float d, unsigned s, float f) {
  return __fmul_rn(__fmul_rn(d, __fadd_rn(0.5f, fl(static_cast<int>(s)))), f);
}
__device__ __forceinline__ float signed_grid(float db, float g, float sign) { return __fmul_rn(__fmul_rn(db, g), sign); }
__device__ __forceinline__ int tq1_digit(const uint8_t* b, int e) {
  const int pow3[5] = {1, 3, 9, 27, 81};
  int x;
  if (e < 160) x = b[e % 32] * pow3[e / 32];
  else if (e < 240) x = b[32 + (e - 160) % 16] * pow3[(e - 160) / 16];
  else x = b[48 + (e - 240) % 4] * pow3[(e - 240) / 4];
  return (((x & 0xFF) * 3) >> 8) - 1;
}

// Element e of one IQ/TQ block b (dequant.cpp's block_iq* / block_tq*, element by element).
__device__ float iq_element(uint32_t type, const uint8_t* b, int e) {
  switch (type) {
    case ggml::IQ2_XXS: {
      const int ib = e / 32, l = (e % 32) / 8, j = e % 8;
      const uint32_t aux0 = u32_at(b + 2 + 8 * ib), aux1 = u32_at(b + 6 + 8 * ib);
      const float db = half_step_scale(f16_at(b), aux1 >> 28, 0.25f);
      const uint64_t g = d_iq2xxs_grid[(aux0 >> (8 * l)) & 0xFF];
      return signed_grid(db, grid_byte(g, j), sign_of(d_ksigns_iq2xs[(aux1 >> (7 * l)) & 127], j));
    }
    case ggml::IQ2_XS: {
      const int q = e / 8, s = q / 2, j = e % 8;
      const uint32_t v = u16_at(b + 2 + 2 * q);
      const float db = half_step_scale(f16_at(b), (b[66 + s / 2] >> (4 * (s % 2))) & 15, 0.25f);
      return signed_grid(db, grid_byte(d_iq2xs_grid[v & 511], j), sign_of(d_ksigns_iq2xs[v >> 9], j));
    }
    case ggml::IQ2_S: {
      const int q = e / 8, s = q / 2, j = e % 8;
      const float db = half_step_scale(f16_at(b), (b[74 + s / 2] >> (4 * (s % 2))) & 15, 0.25f);
      const uint64_t g = d_iq2s_grid[b[2 + q] | (((b[66 + q / 4] >> (2 * (q % 4))) & 3) << 8)];
      return signed_grid(db, grid_byte(g, j), sign_of(b[34 + q], j));
    }
    case ggml::IQ3_XXS: {
      const int ib = e / 32, w = e % 32;
      const uint32_t aux = u32_at(b + 66 + 4 * ib);
      const float db = half_step_scale(f16_at(b), aux >> 28, 0.5f);
      const uint32_t g = d_iq3xxs_grid[b[2 + 8 * ib + w / 4]];
      return signed_grid(db, grid_byte(g, w % 4), sign_of(d_ksigns_iq2xs[(aux >> (7 * (w / 8))) & 127], w % 8));
    }
    case ggml::IQ3_S: {
      const int s = e / 32, q = e / 4;
      const float db = __fmul_rn(f16_at(b), fl(1 + 2 * ((b[106 + s / 2] >> (4 * (s % 2))) & 15)));
      const uint32_t g = d_iq3s_grid[b[2 + q] | (((b[66 + q / 8] >> (q % 8)) & 1) << 8)];
      return signed_grid(db, grid_byte(g, e % 4), sign_of(b[74 + e / 8], e % 8));
    }
    case ggml::IQ1_S: {
      const int ib = e / 32, l = (e % 32) / 8, j = e % 8;
      const uint32_t qh = u16_at(b + 34 + 2 * ib);
      const float dl = __fmul_rn(f16_at(b), fl(static_cast<int>(2 * ((qh >> 12) & 7) + 1)));
      const float delta = (qh & 0x8000) ? -MLA_IQ1S_DELTA : MLA_IQ1S_DELTA;
      const uint64_t g = d_iq1s_grid[b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)];
      return __fmul_rn(dl, __fadd_rn(grid_sbyte(g, j), delta));
    }
    case ggml::IQ1_M: {
      const int q = e / 8, s = q / 2, j = e % 8;
      const uint8_t* sc = b + 48;
      const uint32_t dbits = ((u16_at(sc) & 0xF000) >> 12) | ((u16_at(sc + 2) & 0xF000) >> 8) |
                             ((u16_at(sc + 4) & 0xF000) >> 4) | (u16_at(sc + 6) & 0xF000);
      const float dl = __fmul_rn(f16_bits(dbits), fl(static_cast<int>(2 * ((u16_at(sc + 2 * (s / 4)) >> (3 * (s % 4))) & 7) + 1)));
      const int h = (b[32 + q / 2] >> (4 * (q % 2))) & 15;
      const float delta = (h & 8) ? -MLA_IQ1S_DELTA : MLA_IQ1S_DELTA;
      const uint64_t g = d_iq1s_grid[b[q] | ((h & 7) << 8)];
      return __fmul_rn(dl, __fadd_rn(grid_sbyte(g, j), delta));
    }
    case ggml::IQ4_NL: {
      const int j = e % 16, code = e < 16 ? (b[2 + j] & 15) : (b[2 + j] >> 4);
      return __fmul_rn(f16_at(b), fl(d_kvalues_iq4nl[code]));
    }
    case ggml::IQ4_XS: {
      const int ib = e / 32, w = e % 32;
      const uint32_t sh = u16_at(b + 2);
      const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4);
      const float dl = __fmul_rn(f16_at(b), fl(ls - 32));
      const uint8_t q = b[8 + 16 * ib + w % 16];
      return __fmul_rn(dl, fl(d_kvalues_iq4nl[w < 16 ? (q & 15) : (q >> 4)]));
    }
    case ggml::TQ1_0: return __fmul_rn(f16_at(b + 52), fl(tq1_digit(b, e)));
    case ggml::TQ2_0: {
      const int c = e / 128, s = (e % 128) / 32, l = e % 32;
      return __fmul_rn(f16_at(b + 64), fl(((b[32 * c + l] >> (2 * s)) & 3) - 1));
    }
    default: return bits_f(0x7fc00000u);  // unreachable: ggml_element passes only the types above
  }
}

// Element e of one GGUF block b (the block functions of dequant.cpp, element by element).
__device__ float ggml_element(uint32_t type, const uint8_t* b, int e, bool swap) {
  switch (type) {
    case ggml::F32: return bits_f(u32_at(b));
    case ggml::F16: return f16_at(b);
    case ggml::BF16: return bits_f(static_cast<uint32_t>(b[0] | (b[1] << 8)) << 16);
    case ggml::Q8_0: {
      const float d = f16_at(b);
      return __fmul_rn(fl(static_cast<int8_t>(b[2 + e])), d);
    }
    case ggml::Q4_0: {
      const float d = f16_at(b);
      const int j = e % 16, x = e < 16 ? (b[2 + j] & 15) : (b[2 + j] >> 4);
      return __fmul_rn(d, fl(x - 8));
    }
    case ggml::Q4_1: {
      const float d = f16_at(b), m = f16_at(b + 2);
      const int j = e % 16, x = e < 16 ? (b[4 + j] & 15) : (b[4 + j] >> 4);
      return __fadd_rn(__fmul_rn(d, fl(x)), m);
    }
    case ggml::Q5_0: {
      const float d = f16_at(b);
      const uint32_t qh = u32_at(b + 2);
      const uint8_t* qs = b + 6;
      const int j = e % 16;
      const int x = e < 16 ? ((qs[j] & 15) | (((qh >> j) & 1) << 4)) : ((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
      return __fmul_rn(d, fl(x - 16));
    }
    case ggml::Q5_1: {
      const float d = f16_at(b), m = f16_at(b + 2);
      const uint32_t qh = u32_at(b + 4);
      const uint8_t* qs = b + 8;
      const int j = e % 16;
      const int x = e < 16 ? ((qs[j] & 15) | (((qh >> j) & 1) << 4)) : ((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
      return __fadd_rn(__fmul_rn(d, fl(x)), m);
    }
    case ggml::Q2_K: {
      const uint8_t* scales = b;
      const uint8_t* qs = b + 16;
      const float d = f16_at(b + 80), dmin = f16_at(b + 82);
      const int c = e / 128, s = (e % 128) / 32, l = e % 32, sub = e / 16;
      const float dl = __fmul_rn(d, fl(scales[sub] & 15));
      const float ml = __fmul_rn(dmin, fl(scales[sub] >> 4));
      const int q = (qs[32 * c + l] >> (2 * s)) & 3;
      return __fsub_rn(__fmul_rn(dl, fl(q)), ml);
    }
    case ggml::Q3_K: {
      const uint8_t* hmask = b;
      const uint8_t* qs = b + 32;
      const uint8_t* s = b + 96;
      const float d = f16_at(b + 108);
      const int j = e / 16;
      const int lo = j < 8 ? (s[j] & 15) : (s[j - 8] >> 4);
      const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
      const float dl = __fmul_rn(d, fl((lo | (hi << 4)) - 32));
      const int c = e / 128, sh = (e % 128) / 32, l = e % 32;
      const int ql = (qs[32 * c + l] >> (2 * sh)) & 3;
      const int h = (hmask[l] >> (e / 32)) & 1;
      return __fmul_rn(dl, fl(ql - ((h ^ 1) << 2)));
    }
    case ggml::Q4_K:
    case ggml::Q5_K: {
      const float d = f16_at(b), dmin = f16_at(b + 2);
      const uint8_t* s = b + 4;
      const int j = e / 32, l = e % 32;
      int sc, m;
      scale_min_k4(j, s, sc, m);
      const float dd = __fmul_rn(d, fl(sc)), dm = __fmul_rn(dmin, fl(m));
      const int c = j / 2, shift = 4 * (j % 2);
      int q;
      if (type == ggml::Q4_K) {
        q = (b[16 + 32 * c + l] >> shift) & 15;
      } else {
        const uint8_t* qh = b + 16;
        q = ((b[48 + 32 * c + l] >> shift) & 15) | (((qh[l] >> j) & 1) << 4);
      }
      return __fsub_rn(__fmul_rn(dd, fl(q)), dm);
    }
    case ggml::Q6_K: {
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = f16_at(b + 208);
      const int n = e / 128, r = e % 128;
      const int lo = r < 64 ? (ql[64 * n + r] & 15) : (ql[64 * n + r - 64] >> 4);
      const int hi = (qh[32 * n + r % 32] >> (2 * (r / 32))) & 3;
      const float ds = __fmul_rn(d, fl(sc[e / 16]));
      return __fmul_rn(ds, fl((lo | (hi << 4)) - 32));
    }
    case ggml::MXFP4: {
      const float d = e8m0_half(b[0]);
      const int j = e % 16;
      const uint8_t q = b[1 + j];
      return __fmul_rn(d, kvalue(e < 16 ? (q & 15) : (q >> 4)));
    }
    case ggml::NVFP4: {  // 4 sub-blocks of 16, each the low nibbles of 8 bytes then their high nibbles
      const int s = e / 16, w = e % 16, j = w % 8;
      const float d = ue4m3_gguf(b[s]);
      const uint8_t q = b[4 + 8 * s + j];
      const int lo = swap ? q >> 4 : q & 15, hi = swap ? q & 15 : q >> 4;
      return __fmul_rn(d, kvalue(w < 8 ? lo : hi));
    }
    case ggml::IQ1_S: case ggml::IQ1_M: case ggml::IQ2_XXS: case ggml::IQ2_XS: case ggml::IQ2_S:
    case ggml::IQ3_XXS: case ggml::IQ3_S: case ggml::IQ4_NL: case ggml::IQ4_XS: case ggml::TQ1_0: case ggml::TQ2_0:
      return iq_element(type, b, e);
    default: return bits_f(0x7fc00000u);  // unreachable: the host API accepts only the types above
  }
}

// Element (i, k) of the weight.
__device__ float element(const DequantParams& p, int64_t i, int64_t k) {
  const int64_t C = p.cols;
  switch (p.format) {
    case WeightFormat::WeightFormat_fp8: {
      const int64_t sr = (p.rows + p.block_rows - 1) / p.block_rows, sc = (C + p.block_cols - 1) / p.block_cols;
      const int64_t bi = i / p.block_rows, bj = k / p.block_cols;
      const float* s = reinterpret_cast<const float*>(p.scales);
      const float scale = p.fp8_scale_transpose ? s[bj * sr + bi] : s[bi * sc + bj];
      return __fmul_rn(e4m3(p.data[i * C + k]), scale);
    }
    case WeightFormat::WeightFormat_nvfp4:
    case WeightFormat::WeightFormat_nvfp4_ct: {
      const float s8 = e4m3(p.scales[i * (C / 16) + k / 16]);
      const float scale = p.global_divide ? __fdiv_rn(s8, p.global_scale) : __fmul_rn(s8, p.global_scale);
      const uint8_t byte = p.data[(i * C + k) / 2];
      const bool high = (k % 2 == 1) != p.nibble_swap;
      return __fmul_rn(e2m1(high ? byte >> 4 : byte & 15), scale);
    }
    case WeightFormat::WeightFormat_mxfp4: {
      const uint8_t byte = p.data[(i * C + k) / 2];
      return __fmul_rn(e2m1(k % 2 ? byte >> 4 : byte & 15), e8m0(p.scales[i * (C / 32) + k / 32]));
    }
    default: {
      const int64_t row_bytes = C / p.ggml_block * p.ggml_type_size;
      const uint8_t* b = p.data + i * row_bytes + (k / p.ggml_block) * p.ggml_type_size;
      return ggml_element(p.ggml_type, b, static_cast<int>(k % p.ggml_block), p.nibble_swap);
    }
  }
}

// to_bf16_bits (core/model/tensor.cpp): round to nearest even; NaN kept quiet with its upper bits.
__device__ __forceinline__ uint16_t bf16_bits(float v) {
  uint32_t u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// y32 [R, C] or y16 [R, C] (bf16 bits); grid-stride over the R*C elements.
__global__ void dequant_kernel(const DequantParams p, float* __restrict__ y32, uint16_t* __restrict__ y16) {
  const int64_t n = p.rows * p.cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n; idx += stride) {
    const float v = element(p, idx / p.cols, idx % p.cols);
    if (y32) y32[idx] = v;
    else y16[idx] = bf16_bits(v);
  }
}

}  // namespace

void launch_dequant(const DequantParams& p, float* y32, bf16* y16, cudaStream_t stream) {
  const int64_t n = p.rows * p.cols;
  if (n == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t{1} << 20);
  dequant_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, y32, reinterpret_cast<uint16_t*>(y16));
  CUDA_CHECK_LAUNCH();
}

}  // namespace mla::cuda
