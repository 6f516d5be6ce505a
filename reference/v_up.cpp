// v_up: the attention's latent output up-projected through each head's W_UV (the absorbed form).
#include "reference/stages.h"

namespace mla::ref {

Tensor v_up(const Tensor& attn_latent, const Tensor& w_kvb_local, const MlaConfig& cfg) {
  const int64_t T = attn_latent.dim(0), Nl = attn_latent.dim(1), P = cfg.qk_nope, V = cfg.v_head;
  const int64_t L = cfg.kv_lora_rank;
  Tensor out({T, Nl, V});
  for (int64_t h = 0; h < Nl; ++h) {
    ConstMatrixMap w_uv(w_kvb_local.ptr() + (h * (P + V) + P) * L, V, L);  // W_UV_h [V, L]
    Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>> a(attn_latent.ptr() + h * L, T, L, Eigen::OuterStride<>(Nl * L));
    Eigen::Map<RowMatrix, 0, Eigen::OuterStride<>> o(out.ptr() + h * V, T, V, Eigen::OuterStride<>(Nl * V));
    o.noalias() = a * w_uv.transpose();
  }
  return out;
}

}  // namespace mla::ref
