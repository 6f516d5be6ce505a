// kv_a_proj: x·W_kvaᵀ split into the latent kv_c and the shared rope key k_pe.
#include "reference/stages.h"

namespace mla::ref {

KvA kv_a_proj(const Tensor& x, const Tensor& w_kva, const MlaConfig& cfg) {
  KvA out;
  split_per_head(linear(x, w_kva), 1, cfg.kv_lora_rank, cfg.qk_rope, out.kv_c, out.k_pe);
  const int64_t T = x.dim(0);
  out.kv_c = out.kv_c.reshaped({T, cfg.kv_lora_rank});
  out.k_pe = out.k_pe.reshaped({T, cfg.qk_rope});
  return out;
}

}  // namespace mla::ref
