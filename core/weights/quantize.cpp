// Quantizers. The legacy ggml ones follow gguf-py's quantize_blocks step for step (float32 arithmetic in
// the same order: tested bit for bit against gguf.quants.quantize); the rest are plain absmax / min-max.
#include "core/weights/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/model/errors.h"
#include "core/model/progress_hook.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace mla {

namespace {

inline void put_f16(uint8_t* p, float v) {
  const uint16_t h = to_fp16_bits(v);
  std::memcpy(p, &h, 2);
}
inline float fp16_round(float v) { return from_fp16_bits(to_fp16_bits(v)); }
inline float inv_or_zero(float d) { return d == 0.0f ? 0.0f : 1.0f / d; }
inline int clampi(int v, int lo, int hi) { return std::min(hi, std::max(lo, v)); }
// Float to an integer code, round to nearest (half away from zero), clamped.
inline int qround(float v, int lo, int hi) { return std::isfinite(v) ? clampi(static_cast<int>(std::lround(v)), lo, hi) : 0; }

// ---- legacy ggml blocks: gguf-py quantize_blocks, operation for operation ----

void q8_0(const float* x, uint8_t* b) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f, id = inv_or_zero(d);
  put_f16(b, d);
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));  // np_roundf
}

// The value of largest magnitude, the first one on ties (numpy argmax).
float signed_absmax(const float* x, int n) {
  float m = x[0];
  for (int j = 1; j < n; ++j)
    if (std::fabs(x[j]) > std::fabs(m)) m = x[j];
  return m;
}

void q4_0(const float* x, uint8_t* b) {
  const float d = signed_absmax(x, 32) / -8.0f, id = inv_or_zero(d);
  put_f16(b, d);
  uint8_t q[32];
  for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(std::min(15, static_cast<int>(std::trunc(x[j] * id + 8.5f))));
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
}

void q4_1(const float* x, uint8_t* b) {
  float mx = x[0], mn = x[0];
  for (int j = 1; j < 32; ++j) mx = std::max(mx, x[j]), mn = std::min(mn, x[j]);
  const float d = (mx - mn) / 15.0f, id = inv_or_zero(d);
  put_f16(b, d);
  put_f16(b + 2, mn);
  uint8_t q[32];
  for (int j = 0; j < 32; ++j)
    q[j] = static_cast<uint8_t>(std::min(15, static_cast<int>(std::trunc((x[j] - mn) * id + 0.5f))));
  for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
}

void pack_q5(const uint8_t* q, uint8_t* qh_out, uint8_t* qs) {
  uint32_t qh = 0;
  for (int j = 0; j < 32; ++j) qh |= static_cast<uint32_t>(q[j] >> 4) << j;
  std::memcpy(qh_out, &qh, 4);
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
}

void q5_0(const float* x, uint8_t* b) {
  const float d = signed_absmax(x, 32) / -16.0f, id = inv_or_zero(d);
  put_f16(b, d);
  uint8_t q[32];
  for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(std::min(31, static_cast<int>(std::trunc(x[j] * id + 16.5f))));
  pack_q5(q, b + 2, b + 6);
}

void q5_1(const float* x, uint8_t* b) {
  float mx = x[0], mn = x[0];
  for (int j = 1; j < 32; ++j) mx = std::max(mx, x[j]), mn = std::min(mn, x[j]);
  const float d = (mx - mn) / 31.0f, id = inv_or_zero(d);
  put_f16(b, d);
  put_f16(b + 2, mn);
  uint8_t q[32];
  for (int j = 0; j < 32; ++j)
    q[j] = static_cast<uint8_t>(std::min(31, static_cast<int>(std::trunc((x[j] - mn) * id + 0.5f))));
  pack_q5(q, b + 4, b + 8);
}

// ---- K-quants: min-max sub-block scales, quantized to the format's scale bits ----

// Asymmetric sub-blocks (y = d*sc*q - dmin*m): sub-block scales and mins for n_sub sub-blocks of len,
// q in [0, nmax], scale codes in [0, smax].
struct AsymScales {
  float d = 0, dmin = 0;
  int sc[16] = {}, m[16] = {};
};
AsymScales asym_scales(const float* x, int n_sub, int len, int nmax, int smax) {
  float scale[16], mins[16], max_scale = 0, max_min = 0;
  for (int s = 0; s < n_sub; ++s) {
    float mn = 0, mx = 0;  // min <= 0 (ggml's K-quants keep the zero point non-negative)
    for (int l = 0; l < len; ++l) mn = std::min(mn, x[s * len + l]), mx = std::max(mx, x[s * len + l]);
    scale[s] = (mx - mn) / nmax;
    mins[s] = -mn;
    max_scale = std::max(max_scale, scale[s]);
    max_min = std::max(max_min, mins[s]);
  }
  AsymScales a;
  a.d = fp16_round(max_scale / smax);
  a.dmin = fp16_round(max_min / smax);
  for (int s = 0; s < n_sub; ++s) {
    // Round the scale up so the sub-block's maximum still fits in nmax steps.
    a.sc[s] = a.d > 0 ? clampi(static_cast<int>(std::ceil(scale[s] / a.d)), 0, smax) : 0;
    a.m[s] = a.dmin > 0 ? qround(mins[s] / a.dmin, 0, smax) : 0;
  }
  return a;
}
int asym_q(float x, const AsymScales& a, int s, int nmax) {
  const float step = a.d * static_cast<float>(a.sc[s]);
  return step > 0 ? qround((x + a.dmin * static_cast<float>(a.m[s])) / step, 0, nmax) : 0;
}

void q2_k(const float* x, uint8_t* b) {
  std::memset(b, 0, 84);
  const AsymScales a = asym_scales(x, 16, 16, 3, 15);
  for (int s = 0; s < 16; ++s) b[s] = static_cast<uint8_t>(a.sc[s] | (a.m[s] << 4));
  for (int e = 0; e < 256; ++e) {
    const int q = asym_q(x[e], a, e / 16, 3);
    b[16 + 32 * (e / 128) + e % 32] |= static_cast<uint8_t>(q << (2 * ((e % 128) / 32)));
  }
  put_f16(b + 80, a.d);
  put_f16(b + 82, a.dmin);
}

void pack_scales_k4(const AsymScales& a, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((a.sc[j] & 63) | ((a.sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>((a.m[j] & 63) | ((a.m[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((a.sc[j + 4] & 15) | ((a.m[j + 4] & 15) << 4));
  }
}

void q4_k(const float* x, uint8_t* b) {
  std::memset(b, 0, 144);
  const AsymScales a = asym_scales(x, 8, 32, 15, 63);
  put_f16(b, a.d);
  put_f16(b + 2, a.dmin);
  pack_scales_k4(a, b + 4);
  for (int j = 0; j < 8; ++j)
    for (int l = 0; l < 32; ++l)
      b[16 + 32 * (j / 2) + l] |= static_cast<uint8_t>(asym_q(x[32 * j + l], a, j, 15) << (4 * (j % 2)));
}

void q5_k(const float* x, uint8_t* b) {
  std::memset(b, 0, 176);
  const AsymScales a = asym_scales(x, 8, 32, 31, 63);
  put_f16(b, a.d);
  put_f16(b + 2, a.dmin);
  pack_scales_k4(a, b + 4);
  for (int j = 0; j < 8; ++j)
    for (int l = 0; l < 32; ++l) {
      const int q = asym_q(x[32 * j + l], a, j, 31);
      b[48 + 32 * (j / 2) + l] |= static_cast<uint8_t>((q & 15) << (4 * (j % 2)));
      b[16 + l] |= static_cast<uint8_t>((q >> 4) << j);
    }
}

// Symmetric sub-blocks of 16 (y = d*sc*q): per-sub-block scale codes in [0, smax], q in [qmin, qmax].
void sym_scales(const float* x, int qmax_abs, int smax, float& d, int* sc) {
  float scale[16], max_scale = 0;
  for (int s = 0; s < 16; ++s) {
    float amax = 0;
    for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[16 * s + l]));
    scale[s] = amax / qmax_abs;
    max_scale = std::max(max_scale, scale[s]);
  }
  d = fp16_round(max_scale / smax);
  for (int s = 0; s < 16; ++s) sc[s] = d > 0 ? clampi(static_cast<int>(std::ceil(scale[s] / d)), 0, smax) : 0;
}

void q3_k(const float* x, uint8_t* b) {
  std::memset(b, 0, 110);
  float d;
  int sc[16];
  sym_scales(x, 4, 31, d, sc);
  for (int j = 0; j < 16; ++j) {
    const int u = sc[j] + 32;  // stored 6-bit, read back as u - 32
    if (j < 8) b[96 + j] |= static_cast<uint8_t>(u & 15);
    else b[96 + j - 8] |= static_cast<uint8_t>((u & 15) << 4);
    b[96 + 8 + j % 4] |= static_cast<uint8_t>((u >> 4) << (2 * (j / 4)));
  }
  for (int e = 0; e < 256; ++e) {
    const float step = d * static_cast<float>(sc[e / 16]);
    const int q = step > 0 ? qround(x[e] / step, -4, 3) : 0;
    const int u = q + 4;  // low 2 bits in qs, bit 2 in hmask (set means no -4 offset)
    b[32 + 32 * (e / 128) + e % 32] |= static_cast<uint8_t>((u & 3) << (2 * ((e % 128) / 32)));
    b[e % 32] |= static_cast<uint8_t>((u >> 2) << (e / 32));
  }
  put_f16(b + 108, d);
}

void q6_k(const float* x, uint8_t* b) {
  std::memset(b, 0, 210);
  float d;
  int sc[16];
  sym_scales(x, 32, 127, d, sc);
  for (int s = 0; s < 16; ++s) b[192 + s] = static_cast<uint8_t>(static_cast<int8_t>(sc[s]));
  for (int e = 0; e < 256; ++e) {
    const float step = d * static_cast<float>(sc[e / 16]);
    const int u = (step > 0 ? qround(x[e] / step, -32, 31) : 0) + 32;
    const int n = e / 128, r = e % 128;
    if (r < 64) b[64 * n + r] |= static_cast<uint8_t>(u & 15);
    else b[64 * n + r - 64] |= static_cast<uint8_t>((u & 15) << 4);
    b[128 + 32 * n + r % 32] |= static_cast<uint8_t>((u >> 4) << (2 * (r / 32)));
  }
  put_f16(b + 208, d);
}

// ---- GGUF FP4 blocks ----

constexpr int8_t kGgufKvalues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

void gguf_mxfp4(const float* x, uint8_t* b) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  // gguf-py: e = floor(log2(amax)) - 2 + 127; d = 2^(e - 128); nearest doubled E2M1 value, first on ties.
  const int e = amax > 0 ? clampi(static_cast<int>(float_to_e8m0_floor(amax)) - 2, 0, 254) : 0;
  b[0] = static_cast<uint8_t>(e);
  const float d = std::ldexp(1.0f, e - 128);
  uint8_t q[32];
  for (int j = 0; j < 32; ++j) {
    int best = 0;
    float err = std::fabs(d * kGgufKvalues[0] - x[j]);
    for (int k = 1; k < 16; ++k) {
      const float ek = std::fabs(d * static_cast<float>(kGgufKvalues[k]) - x[j]);
      if (ek < err) err = ek, best = k;
    }
    q[j] = static_cast<uint8_t>(best);
  }
  for (int j = 0; j < 16; ++j) b[1 + j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
}

void gguf_nvfp4(const float* x, uint8_t* b) {
  for (int s = 0; s < 4; ++s) {
    float amax = 0;
    for (int j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(x[16 * s + j]));
    // The decoded block scale is ue4m3(code) / 2 and the kvalues are doubled: y = ue4m3(code) * e2m1.
    const uint8_t code = float_to_e4m3(amax / 6.0f);
    b[s] = code == 0x7F ? 0x7E : code;
    const float scale = 2.0f * ue4m3_gguf_to_float(b[s]);
    for (int j = 0; j < 8; ++j) {
      const uint8_t lo = scale > 0 ? float_to_e2m1(x[16 * s + j] / scale) : 0;
      const uint8_t hi = scale > 0 ? float_to_e2m1(x[16 * s + 8 + j] / scale) : 0;
      b[4 + 8 * s + j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

// ---- safetensors formats ----

PackedWeight quantize_fp8(const Tensor& w, PackedWeight p) {
  const int64_t R = p.rows, C = p.cols, br = p.block_rows, bc = p.block_cols;
  const int64_t sr = (R + br - 1) / br, sc = (C + bc - 1) / bc;
  std::vector<float> s(static_cast<size_t>(sr * sc));
  p.data.resize(static_cast<size_t>(R * C));
  for (int64_t bi = 0; bi < sr; ++bi) {
    progress_within(static_cast<double>(bi) / static_cast<double>(sr));
    for (int64_t bj = 0; bj < sc; ++bj) {
      float amax = 0;
      for (int64_t i = bi * br; i < std::min(R, (bi + 1) * br); ++i)
        for (int64_t j = bj * bc; j < std::min(C, (bj + 1) * bc); ++j) amax = std::max(amax, std::fabs(w.data[i * C + j]));
      const float scale_inv = amax > 0 ? amax / 448.0f : 1.0f;  // DeepSeek: s = amax / 448, y = x / s
      s[bi * sc + bj] = scale_inv;
      for (int64_t i = bi * br; i < std::min(R, (bi + 1) * br); ++i)
        for (int64_t j = bj * bc; j < std::min(C, (bj + 1) * bc); ++j)
          p.data[i * C + j] = float_to_e4m3(w.data[i * C + j] / scale_inv);
    }
  }
  p.scales.resize(s.size() * 4);
  if (!s.empty()) std::memcpy(p.scales.data(), s.data(), p.scales.size());
  return p;
}

// The FP4 (E2M1) formats share one shape: per row, per block of `group` elements, a scale from the block's
// largest magnitude (`scale_of(bmax)` returns the stored scale byte and the scale dequantize will multiply by),
// then the elements packed two per byte, the even one in the low nibble.
template <class ScaleOf>
void pack_e2m1_blocks(const Tensor& w, PackedWeight& p, int group, ScaleOf scale_of) {
  const int64_t R = p.rows, C = p.cols;
  p.data.assign(static_cast<size_t>(R * C / 2), 0);
  p.scales.resize(static_cast<size_t>(R * (C / group)));
  for (int64_t i = 0; i < R; ++i) {
    if (i % 256 == 0) progress_within(static_cast<double>(i) / static_cast<double>(R));
    for (int64_t b = 0; b < C / group; ++b) {
      const float* x = w.data.data() + i * C + group * b;
      float bmax = 0;
      for (int j = 0; j < group; ++j) bmax = std::max(bmax, std::fabs(x[j]));
      const auto [code, scale] = scale_of(bmax);
      p.scales[i * (C / group) + b] = code;
      for (int j = 0; j < group; ++j) {
        const uint8_t q = scale > 0 ? float_to_e2m1(x[j] / scale) : 0;
        const int64_t k = i * C + group * b + j;
        p.data[k / 2] |= static_cast<uint8_t>(k % 2 ? q << 4 : q);
      }
    }
  }
}

PackedWeight quantize_nvfp4(const Tensor& w, PackedWeight p) {
  const bool ct = p.format == WeightFormat::WeightFormat_nvfp4_ct;
  float amax = 0;
  for (float v : w.data) amax = std::max(amax, std::fabs(v));
  // The global scale maps the largest block scale to E4M3's 448: ModelOpt stores amax / (6*448) and
  // multiplies; compressed-tensors stores the reciprocal (6*448) / amax and divides.
  const float g = amax > 0 ? (ct ? (6.0f * 448.0f) / amax : amax / (6.0f * 448.0f)) : 1.0f;
  p.global_scale = g;
  pack_e2m1_blocks(w, p, 16, [&](float bmax) {
    const uint8_t code = float_to_e4m3(ct ? bmax / 6.0f * g : bmax / 6.0f / g);
    const float s8 = e4m3_to_float(code);
    return std::pair<uint8_t, float>{code, ct ? s8 / g : s8 * g};  // exactly what dequantize computes
  });
  return p;
}

PackedWeight quantize_mxfp4(const Tensor& w, PackedWeight p) {
  pack_e2m1_blocks(w, p, 32, [](float bmax) {
    // OCP MX: shared exponent floor(log2 amax) - 2 (E2M1's largest exponent); values past 6 saturate.
    const uint8_t e = bmax > 0 ? static_cast<uint8_t>(clampi(float_to_e8m0_floor(bmax) - 2, 0, 254)) : 127;
    return std::pair<uint8_t, float>{e, e8m0_to_float(e)};
  });
  return p;
}

}  // namespace

void quantize_ggml_row(uint32_t type, const float* src, uint8_t* dst, int64_t n) {
  const GgmlTypeInfo* ti = ggml_type_info(type);
  if (!ti) throw UsageError("unknown ggml type " + std::to_string(type));
  if (n % ti->block != 0)
    throw UsageError(std::string("a row of ") + std::to_string(n) + " elements is not a whole number of " + ti->name +
                     " blocks of " + std::to_string(ti->block));
  switch (type) {
    case ggml::F32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case ggml::F16:
      for (int64_t i = 0; i < n; ++i) put_f16(dst + 2 * i, src[i]);
      return;
    case ggml::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = to_bf16_bits(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    default: break;
  }
  void (*block)(const float*, uint8_t*) = nullptr;
  switch (type) {
    case ggml::Q8_0: block = q8_0; break;
    case ggml::Q4_0: block = q4_0; break;
    case ggml::Q4_1: block = q4_1; break;
    case ggml::Q5_0: block = q5_0; break;
    case ggml::Q5_1: block = q5_1; break;
    case ggml::Q2_K: block = q2_k; break;
    case ggml::Q3_K: block = q3_k; break;
    case ggml::Q4_K: block = q4_k; break;
    case ggml::Q5_K: block = q5_k; break;
    case ggml::Q6_K: block = q6_k; break;
    case ggml::MXFP4: block = gguf_mxfp4; break;
    case ggml::NVFP4: block = gguf_nvfp4; break;
    default: throw UsageError(std::string("no quantizer for ggml type ") + ti->name);
  }
  for (int64_t k = 0; k < n / ti->block; ++k) block(src + k * ti->block, dst + k * ti->type_size);
}

PackedWeight quantize(const Tensor& w, WeightFormat f, const std::string& origin, int64_t fp8_block) {
  if (w.rank() != 2) throw UsageError(origin + ": only 2-D weights can be quantized, got " + shape_string(w.shape));
  PackedWeight p;
  p.format = f;
  p.rows = w.dim(0);
  p.cols = w.dim(1);
  p.origin = origin;
  p.block_rows = p.block_cols = fp8_block;
  if (fp8_block <= 0) throw UsageError(origin + ": fp8 block size must be positive");
  const int64_t kmul = weight_format_k_multiple(f);
  if (p.cols % kmul != 0)
    throw UsageError(origin + " " + shape_string(w.shape) + ": --weight-format " + weight_format_name(f) +
                     " quantizes the input dimension in blocks of " + std::to_string(kmul) + ", and " +
                     std::to_string(p.cols) + " is not a multiple of it (pick a format with smaller blocks or a "
                     "model whose dimensions divide)");
  switch (f) {
    case WeightFormat::WeightFormat_fp8: return quantize_fp8(w, std::move(p));
    case WeightFormat::WeightFormat_nvfp4:
    case WeightFormat::WeightFormat_nvfp4_ct: return quantize_nvfp4(w, std::move(p));
    case WeightFormat::WeightFormat_mxfp4: return quantize_mxfp4(w, std::move(p));
    default: break;
  }
  const uint32_t t = ggml_type_of(f);
  const GgmlTypeInfo* ti = ggml_type_info(t);
  const int64_t row_bytes = p.cols / ti->block * ti->type_size;
  p.data.resize(static_cast<size_t>(p.rows * row_bytes));
  for (int64_t i = 0; i < p.rows; ++i) {
    if (i % 256 == 0) progress_within(static_cast<double>(i) / static_cast<double>(p.rows));
    quantize_ggml_row(t, w.data.data() + i * p.cols, p.data.data() + i * row_bytes, p.cols);
  }
  return p;
}

}  // namespace mla
