// q_b_proj (and q_proj without q LoRA): q_c·W_qbᵀ split per head into q_nope and q_pe.
#include "reference/stages.h"

namespace mla::ref {

QHeads q_b_proj(const Tensor& q_c, const Tensor& w_qb_local, const MlaConfig& cfg) {
  const int64_t D = cfg.qk_head(), Nl = w_qb_local.dim(0) / D;
  QHeads q;
  linear_per_head(q_c, w_qb_local, Nl, cfg.qk_nope, cfg.qk_rope, q.q_nope, q.q_pe);
  return q;
}

}  // namespace mla::ref
