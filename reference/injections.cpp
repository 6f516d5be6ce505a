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

Tensor o_proj_half_reduction(const Tensor& attn_out, const Tensor& w_o_local) {
  const int64_t T = attn_out.dim(0), H = w_o_local.dim(0), K = w_o_local.dim(1), Kh = K / 2;
  Tensor o({T, H});
  Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>> a(attn_out.ptr(), T, Kh, Eigen::OuterStride<>(K));
  Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>> w(w_o_local.ptr(), H, Kh, Eigen::OuterStride<>(K));
  Eigen::Map<RowMatrix> y(o.ptr(), T, H);
  y.noalias() = a * w.transpose();
  return o;
}

Tensor v_up_last_head_from_previous(const Tensor& attn_latent, const Tensor& w_kvb_local, const MlaConfig& cfg) {
  const int64_t T = attn_latent.dim(0), Nl = attn_latent.dim(1), P = cfg.qk_nope, V = cfg.v_head, L = cfg.kv_lora_rank;
  Tensor out = v_up(attn_latent, w_kvb_local, cfg);
  if (Nl < 2) return out;  // no neighbour to read
  const int64_t h = Nl - 1;
  ConstMatrixMap w_uv(w_kvb_local.ptr() + ((h - 1) * (P + V) + P) * L, V, L);  // head h-1's W_UV
  Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>> a(attn_latent.ptr() + h * L, T, L, Eigen::OuterStride<>(Nl * L));
  Eigen::Map<RowMatrix, 0, Eigen::OuterStride<>> o(out.ptr() + h * V, T, V, Eigen::OuterStride<>(Nl * V));
  o.noalias() = a * w_uv.transpose();
  return out;
}

KvA kv_a_proj_whole_tiles(const Tensor& x, const Tensor& w_kva, const MlaConfig& cfg, int64_t tile) {
  const int64_t T = x.dim(0), M = T / tile * tile;
  KvA out{Tensor({T, cfg.kv_lora_rank}), Tensor({T, cfg.qk_rope})};  // zeros
  if (M == 0) return out;
  const KvA part = kv_a_proj(slice_rows(x, 0, M), w_kva, cfg);
  std::copy(part.kv_c.data.begin(), part.kv_c.data.end(), out.kv_c.data.begin());
  std::copy(part.k_pe.data.begin(), part.k_pe.data.end(), out.k_pe.data.begin());
  return out;
}

Batch shift_block_table(const Batch& batch) {
  Batch b = batch;
  for (int s = 0; s < b.num_seqs(); ++s)
    for (int j = 1; j + 1 < b.max_blocks; ++j) b.block_table[s * b.max_blocks + j] = batch.block_table[s * b.max_blocks + j + 1];
  return b;
}

}  // namespace mla::ref::bug
