// RMSNorm: input_norm, q_a_norm and kv_a_norm. fp32 throughout, mean over the last axis.
#include <cmath>

#include "reference/stages.h"

namespace mla::ref {

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) {
  const int64_t C = w.numel(), T = x.numel() / C;
  Tensor y(x.shape);
  for (int64_t t = 0; t < T; ++t) {
    const float* in = x.ptr() + t * C;
    float* out = y.ptr() + t * C;
    float ss = 0.f;
    for (int64_t c = 0; c < C; ++c) ss += in[c] * in[c];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(C) + static_cast<float>(eps));
    for (int64_t c = 0; c < C; ++c) out[c] = in[c] * inv * w.data[c];
  }
  return y;
}

}  // namespace mla::ref
