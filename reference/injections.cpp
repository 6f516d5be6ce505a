// The wrong variants planted by the bug zoo.
#include "reference/injections.h"

#include <cstring>

namespace mla::ref::bug {

KvB kv_b_proj_split_by_block(const Tensor& kv_c_norm, const Tensor& w_kvb_local, const MlaConfig& cfg) {
  const int64_t T = kv_c_norm.dim(0), P = cfg.qk_nope, V = cfg.v_head, Nl = w_kvb_local.dim(0) / (P + V);
  const Tensor y = linear(kv_c_norm, w_kvb_local);  // [T, Nl*(P+V)]
  KvB out{Tensor({T, Nl, P}), Tensor({T, Nl, V})};
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(out.k_nope.ptr() + t * Nl * P, y.ptr() + t * Nl * (P + V), sizeof(float) * Nl * P);
    std::memcpy(out.v.ptr() + t * Nl * V, y.ptr() + t * Nl * (P + V) + Nl * P, sizeof(float) * Nl * V);
  }
  return out;
}

Tensor q_absorb_wuk_transposed(const Tensor& q_nope, const Tensor& w_kvb_local, const MlaConfig& cfg) {
  const int64_t T = q_nope.dim(0), Nl = q_nope.dim(1), P = cfg.qk_nope, V = cfg.v_head, L = cfg.kv_lora_rank;
  Tensor q_latent({T, Nl, L});
  for (int64_t h = 0; h < Nl; ++h) {
    const float* w = w_kvb_local.ptr() + h * (P + V) * L;  // P*L floats, read as [L, P]
    for (int64_t t = 0; t < T; ++t)
      for (int64_t l = 0; l < L; ++l) {
        float acc = 0.f;
        for (int64_t p = 0; p < P; ++p) acc += w[l * P + p] * q_nope.data[(t * Nl + h) * P + p];
        q_latent.data[(t * Nl + h) * L + l] = acc;
      }
  }
  return q_latent;
}

Batch shift_block_table(const Batch& batch) {
  Batch b = batch;
  for (int s = 0; s < b.num_seqs(); ++s)
    for (int j = 1; j + 1 < b.max_blocks; ++j) b.block_table[s * b.max_blocks + j] = batch.block_table[s * b.max_blocks + j + 1];
  return b;
}

}  // namespace mla::ref::bug
