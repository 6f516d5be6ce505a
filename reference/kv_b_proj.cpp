// kv_b_proj: the latent up-projected per head into k_nope and v (the MHA form).
#include "reference/stages.h"

namespace mla::ref {

KvB kv_b_proj(const Tensor& kv_c_norm, const Tensor& w_kvb_local, const MlaConfig& cfg) {
  const int64_t PV = cfg.qk_nope + cfg.v_head, Nl = w_kvb_local.dim(0) / PV;
  KvB out;
  linear_per_head(kv_c_norm, w_kvb_local, Nl, cfg.qk_nope, cfg.v_head, out.k_nope, out.v);
  return out;
}

}  // namespace mla::ref
