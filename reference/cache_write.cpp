// cache_write: the paged latent cache, rows [kv_c_norm (L) | k_pe_rope (R)], 64 rows a page; and reading a
// sequence's rows back (the attention's keys).
#include <cstring>

#include "reference/stages.h"

namespace mla::ref {

Tensor cache_write(Tensor& cache, const Batch& batch, const Tensor& kv_c_norm, const Tensor& k_pe_rope) {
  const int64_t T = kv_c_norm.dim(0), L = kv_c_norm.dim(1), R = k_pe_rope.dim(1), W = L + R;
  Tensor rows({T, W});
  for (int b = 0, t = batch.first_token(0); b < batch.num_seqs(); ++b) {
    for (int i = 0; i < batch.new_lens[b]; ++i, ++t) {
      float* row = rows.ptr() + t * W;
      std::memcpy(row, kv_c_norm.ptr() + t * L, sizeof(float) * L);
      std::memcpy(row + L, k_pe_rope.ptr() + t * R, sizeof(float) * R);
      const int slot = batch.context_lens[b] + i;
      std::memcpy(cache.ptr() + (static_cast<int64_t>(batch.page(b, slot)) * kPageSize + slot % kPageSize) * W, row,
                  sizeof(float) * W);
    }
  }
  return rows;
}

Tensor gather_cache_rows(const Tensor& cache, const Batch& batch, int b, int rows) {
  const int64_t W = cache.dim(-1);
  Tensor out({rows, W});
  for (int s = 0; s < rows; ++s)
    std::memcpy(out.ptr() + s * W, cache.ptr() + (static_cast<int64_t>(batch.page(b, s)) * kPageSize + s % kPageSize) * W,
                sizeof(float) * W);
  return out;
}

}  // namespace mla::ref
