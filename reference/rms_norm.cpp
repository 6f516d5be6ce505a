// RMSNorm: input_norm, q_a_norm and kv_a_norm. fp32 throughout, mean over the last axis.
#include <algorithm>
#include <cmath>

#include "reference/stages.h"

namespace mla::ref {

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps, const NormOptions& opt) {
  const int64_t C = w.numel(), T = x.numel() / C;
  const int64_t width = opt.width > 0 ? std::min(opt.width, C) : C;
  const int64_t wrap = opt.weight_wrap > 0 ? opt.weight_wrap : C;
  Tensor y(x.shape);
  for (int64_t t = 0; t < T; ++t) {
    const float* in = x.ptr() + t * C;
    float* out = y.ptr() + t * C;
    float ss = 0.f;
    for (int64_t c = 0; c < width; ++c) ss += in[c] * in[c];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(width) + static_cast<float>(eps));
    for (int64_t c = 0; c < C; ++c) out[c] = opt.weight ? in[c] * inv * w.data[c % wrap] : in[c] * inv;
  }
  return y;
}

}  // namespace mla::ref
