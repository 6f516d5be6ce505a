// residual: h_out = h + o.
#include "reference/stages.h"

namespace mla::ref {

Tensor residual(const Tensor& h, const Tensor& o) {
  Tensor out = h;
  for (int64_t i = 0; i < out.numel(); ++i) out.data[i] += o.data[i];
  return out;
}

}  // namespace mla::ref
