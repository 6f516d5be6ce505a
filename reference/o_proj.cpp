// o_proj: the rank's heads' outputs through its shard of W_o (a partial sum, before all_reduce).
#include "reference/stages.h"

namespace mla::ref {

Tensor o_proj(const Tensor& attn_out, const Tensor& w_o_local) {
  const int64_t T = attn_out.dim(0);
  return linear(attn_out.reshaped({T, attn_out.numel() / T}), w_o_local);
}

}  // namespace mla::ref
