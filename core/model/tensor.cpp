// Host tensor helpers and the rounding used to emulate bf16/fp16 engines on the CPU.
#include "core/model/tensor.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/model/errors.h"

namespace mla {

int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

Tensor::Tensor(std::vector<int64_t> s, float fill) : shape(std::move(s)), data(shape_numel(shape), fill) {}

MatrixMap Tensor::matrix(int64_t rows) { return MatrixMap(data.data(), rows, rows ? numel() / rows : 0); }
ConstMatrixMap Tensor::matrix(int64_t rows) const {
  return ConstMatrixMap(data.data(), rows, rows ? numel() / rows : 0);
}

Tensor Tensor::reshaped(std::vector<int64_t> s) const {
  if (shape_numel(s) != numel())
    throw std::logic_error("reshape " + shape_string(shape) + " -> " + shape_string(s));
  Tensor t;
  t.shape = std::move(s);
  t.data = data;
  return t;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? "," : "") << shape[i];
  os << "]";
  return os.str();
}

Tensor slice_rows(const Tensor& w, int64_t r0, int64_t r1) {
  const int64_t cols = w.dim(1);
  Tensor out({r1 - r0, cols});
  std::memcpy(out.ptr(), w.ptr() + r0 * cols, sizeof(float) * (r1 - r0) * cols);
  return out;
}

Tensor slice_cols(const Tensor& w, int64_t c0, int64_t c1) {
  const int64_t rows = w.dim(0), cols = w.dim(1);
  Tensor out({rows, c1 - c0});
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.ptr() + r * (c1 - c0), w.ptr() + r * cols + c0, sizeof(float) * (c1 - c0));
  return out;
}

uint16_t to_fp16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf (rounded)
  if (ax < 0x38800000u) {  // subnormal or zero in fp16: round at 2^-24
    const float a = std::fabs(f);
    const float q = std::nearbyint(a * 16777216.0f);  // ties to even (default rounding mode)
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(q));
  }
  uint32_t mant = ax & 0x7fffffu;
  const uint32_t exp = (ax >> 23) - 127 + 15;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float from_fp16_bits(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  uint32_t u = exp == 31 ? (sign | 0x7f800000u | (mant << 13)) : (sign | ((exp - 15 + 127) << 23) | (mant << 13));
  std::memcpy(&v, &u, 4);
  return v;
}

float round_fp16(float v) { return from_fp16_bits(to_fp16_bits(v)); }

void round_in_place(Tensor& t, Precision p) {
  float* v = t.ptr();
  const int64_t n = t.numel();
  if (p == Precision::Precision_bf16) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) v[i] = round_bf16(v[i]);
  } else if (p == Precision::Precision_fp16) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) v[i] = round_fp16(v[i]);
  }
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::Precision_fp32: return "fp32";
    case Precision::Precision_bf16: return "bf16";
    case Precision::Precision_fp16: return "fp16";
  }
  return "?";
}

Precision parse_precision(const std::string& s) {
  if (s == "fp32" || s == "f32") return Precision::Precision_fp32;
  if (s == "bf16") return Precision::Precision_bf16;
  if (s == "fp16" || s == "f16") return Precision::Precision_fp16;
  throw UsageError("unknown precision '" + s + "' (expected fp32, bf16 or fp16)");
}

}  // namespace mla
