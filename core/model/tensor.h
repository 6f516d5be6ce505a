// Host tensors: row-major float32 with a shape. Every engine converts to and from this at its boundary.
#pragma once
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include <Eigen/Core>

namespace mla {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;

  Tensor() = default;
  explicit Tensor(std::vector<int64_t> s, float fill = 0.0f);

  int64_t numel() const { return static_cast<int64_t>(data.size()); }
  int rank() const { return static_cast<int>(shape.size()); }
  int64_t dim(int i) const { return shape.at(i < 0 ? shape.size() + i : i); }
  bool empty() const { return data.empty() && shape.empty(); }
  float* ptr() { return data.data(); }
  const float* ptr() const { return data.data(); }

  // View as [rows, numel/rows] (row-major).
  MatrixMap matrix(int64_t rows);
  ConstMatrixMap matrix(int64_t rows) const;
  Tensor reshaped(std::vector<int64_t> s) const;
};

std::string shape_string(const std::vector<int64_t>& shape);
int64_t shape_numel(const std::vector<int64_t>& shape);

// Rows [r0, r1) of a 2-D weight [out, in]; columns [c0, c1) of one.
Tensor slice_rows(const Tensor& w, int64_t r0, int64_t r1);
Tensor slice_cols(const Tensor& w, int64_t c0, int64_t c1);

// Precision emulation: round-to-nearest-even to bf16 / fp16 and back to float.
enum class Precision { Precision_fp32, Precision_bf16, Precision_fp16 };
inline float round_bf16(float v);
float round_fp16(float v);
void round_in_place(Tensor& t, Precision p);
const char* precision_name(Precision p);
Precision parse_precision(const std::string& s);  // throws UsageError

// bf16 conversions inline: they run once per element of a tensor (rounding, checksums, synthetic weights).
inline uint16_t to_bf16_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
inline float from_bf16_bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}
inline float round_bf16(float v) { return from_bf16_bits(to_bf16_bits(v)); }
uint16_t to_fp16_bits(float v);
float from_fp16_bits(uint16_t h);

}  // namespace mla
