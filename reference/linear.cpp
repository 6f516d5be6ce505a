// linear: y = x·Wᵀ, the GEMM of every projection; the same product split per head as it is written; and the split of
// a product already made.
#include "reference/stages.h"

#include <cstring>
#include <stdexcept>

#include "reference/parallel_for.h"

namespace mla::ref {

Tensor linear(const Tensor& x, const Tensor& w) {
  const int64_t T = x.dim(0), K = x.numel() / std::max<int64_t>(T, 1), O = w.dim(0);
  if (w.dim(1) != K)
    throw std::logic_error("linear: x " + shape_string(x.shape) + " vs W " + shape_string(w.shape));
  Tensor y({T, O});
  y.matrix(T).noalias() = x.matrix(T) * w.matrix(O).transpose();
  return y;
}

void linear_per_head(const Tensor& x, const Tensor& w, int64_t Nl, int64_t A, int64_t B, Tensor& a, Tensor& b) {
  const int64_t T = x.dim(0), K = x.numel() / std::max<int64_t>(T, 1);
  if (w.dim(1) != K || w.dim(0) != Nl * (A + B))
    throw std::logic_error("linear_per_head: x " + shape_string(x.shape) + " vs W " + shape_string(w.shape) +
                           " for " + std::to_string(Nl) + " heads of " + std::to_string(A) + " + " +
                           std::to_string(B));
  a = Tensor({T, Nl, A});
  b = Tensor({T, Nl, B});
  using Out = Eigen::Map<RowMatrix, 0, Eigen::OuterStride<>>;
  const auto X = x.matrix(T);
  const auto W = w.matrix(Nl * (A + B));
  // Head h: its A rows of W, then its B rows; each part's product lands in columns h·A.. of a (h·B.. of b).
  parallel_for(Nl, [&](int64_t h) {
    Out(a.ptr() + h * A, T, A, Eigen::OuterStride<>(Nl * A)).noalias() =
        X * W.middleRows(h * (A + B), A).transpose();
    Out(b.ptr() + h * B, T, B, Eigen::OuterStride<>(Nl * B)).noalias() =
        X * W.middleRows(h * (A + B) + A, B).transpose();
  });
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
