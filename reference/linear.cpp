// linear (every projection's GEMM), o_proj, all_reduce and residual.
#include "reference/stages.h"

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

Tensor o_proj(const Tensor& attn_out, const Tensor& w_o_local) {
  const int64_t T = attn_out.dim(0);
  return linear(attn_out.reshaped({T, attn_out.numel() / T}), w_o_local);
}

Tensor all_reduce(const std::vector<const Tensor*>& partials) {
  Tensor o = *partials.at(0);
  for (size_t r = 1; r < partials.size(); ++r)
    for (int64_t i = 0; i < o.numel(); ++i) o.data[i] += partials[r]->data[i];
  return o;
}

Tensor residual(const Tensor& h, const Tensor& o) {
  Tensor out = h;
  for (int64_t i = 0; i < out.numel(); ++i) out.data[i] += o.data[i];
  return out;
}

}  // namespace mla::ref
