// q_absorb: q_nope taken into the latent space through each head's W_UK (the absorbed form).
#include "reference/stages.h"

namespace mla::ref {

Tensor q_absorb(const Tensor& q_nope, const Tensor& w_kvb_local, const MlaConfig& cfg) {
  const int64_t T = q_nope.dim(0), Nl = q_nope.dim(1), P = cfg.qk_nope, V = cfg.v_head, L = cfg.kv_lora_rank;
  Tensor q_latent({T, Nl, L});
  for (int64_t h = 0; h < Nl; ++h) {
    ConstMatrixMap w_uk(w_kvb_local.ptr() + h * (P + V) * L, P, L);  // W_UK_h [P, L]
    Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>> qn(q_nope.ptr() + h * P, T, P, Eigen::OuterStride<>(Nl * P));
    Eigen::Map<RowMatrix, 0, Eigen::OuterStride<>> ql(q_latent.ptr() + h * L, T, L, Eigen::OuterStride<>(Nl * L));
    ql.noalias() = qn * w_uk;  // (W_UK_hᵀ q_nope_h) for every token
  }
  return q_latent;
}

}  // namespace mla::ref
