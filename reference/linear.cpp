// linear: y = x·Wᵀ, the GEMM of every projection; and the per-head split the projections share.
#include "reference/stages.h"

#include <cstring>
#include <stdexcept>

namespace mla::ref {

Tensor linear(const Tensor& x, const Tensor& w) {
  const int64_t T = x.dim(0), K = x.numel() / std::max<int64_t>(T, 1), O = w.dim(0);
  if (w.dim(1) != K)
    throw std::logic_error("linear: x " + shape_string(x.shape) + " vs W " + shape_string(w.shape));
  Tensor y({T, O});
  y.matrix(T).noalias() = x.matrix(T) * w.matrix(O).transpose();
  return y;
}

void split_per_head(const Tensor& y, int64_t Nl, int64_t A, int64_t B, Tensor& a, Tensor& b) {
  const int64_t T = y.dim(0);
  a = Tensor({T, Nl, A});
  b = Tensor({T, Nl, B});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Nl; ++h) {
      const float* src = y.ptr() + (t * Nl + h) * (A + B);
      std::memcpy(a.ptr() + (t * Nl + h) * A, src, sizeof(float) * A);
      std::memcpy(b.ptr() + (t * Nl + h) * B, src + A, sizeof(float) * B);
    }
}

}  // namespace mla::ref
