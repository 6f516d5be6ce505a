// The head-splitting projections: q_b_proj / q_proj, kv_a_proj and kv_b_proj, and the absorbed-form pair
// q_absorb and v_up.
#include <cstring>

#include "reference/stages.h"

namespace mla::ref {

namespace {
// Splits y [T, Nl*(A+B)] (per head A lanes then B lanes) into [T, Nl, A] and [T, Nl, B].
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
}  // namespace

QHeads q_b_proj(const Tensor& q_c, const Tensor& w_qb_local, const MlaConfig& cfg) {
  const int64_t D = cfg.qk_head(), Nl = w_qb_local.dim(0) / D;
  QHeads q;
  split_per_head(linear(q_c, w_qb_local), Nl, cfg.qk_nope, cfg.qk_rope, q.q_nope, q.q_pe);
  return q;
}

KvA kv_a_proj(const Tensor& x, const Tensor& w_kva, const MlaConfig& cfg) {
  KvA out;
  split_per_head(linear(x, w_kva), 1, cfg.kv_lora_rank, cfg.qk_rope, out.kv_c, out.k_pe);
  const int64_t T = x.dim(0);
  out.kv_c = out.kv_c.reshaped({T, cfg.kv_lora_rank});
  out.k_pe = out.k_pe.reshaped({T, cfg.qk_rope});
  return out;
}

KvB kv_b_proj(const Tensor& kv_c_norm, const Tensor& w_kvb_local, const MlaConfig& cfg) {
  const int64_t PV = cfg.qk_nope + cfg.v_head, Nl = w_kvb_local.dim(0) / PV;
  KvB out;
  split_per_head(linear(kv_c_norm, w_kvb_local), Nl, cfg.qk_nope, cfg.v_head, out.k_nope, out.v);
  return out;
}

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
