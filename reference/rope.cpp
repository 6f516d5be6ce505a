// RoPE: interleaved pairs (2i, 2i+1) as checkpoints store them, or neox pairs (i, i+R/2).
// Angles in double: the reference should be the most accurate thing in the room.
#include <cmath>

#include "reference/stages.h"

namespace mla::ref {

Tensor rope(const Tensor& x, const std::vector<int>& positions, const std::vector<double>& inv_freq,
            double cs_scale, RopeStyle style) {
  const int64_t T = x.dim(0), R = x.dim(-1), rows_per_token = x.numel() / (T * R);
  const int64_t half = R / 2;
  Tensor y(x.shape);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(positions[t]) * inv_freq[i];
      const float c = static_cast<float>(std::cos(angle) * cs_scale), s = static_cast<float>(std::sin(angle) * cs_scale);
      const int64_t a = style == RopeStyle::RopeStyle_interleaved ? 2 * i : i;
      const int64_t b = style == RopeStyle::RopeStyle_interleaved ? 2 * i + 1 : i + half;
      for (int64_t r = 0; r < rows_per_token; ++r) {
        const float* in = x.ptr() + (t * rows_per_token + r) * R;
        float* out = y.ptr() + (t * rows_per_token + r) * R;
        out[a] = in[a] * c - in[b] * s;
        out[b] = in[a] * s + in[b] * c;
      }
    }
  }
  return y;
}

}  // namespace mla::ref
