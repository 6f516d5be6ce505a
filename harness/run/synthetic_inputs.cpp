// Synthetic inputs (see synthetic_inputs.h).
#include "harness/run/synthetic_inputs.h"

#include <cstring>
#include <numeric>

#include "reference/stages.h"

namespace mla {

Inputs synthetic_inputs(const MlaConfig& cfg, const RunSpec& spec, const std::vector<LayerWeights>& weights) {
  Inputs in;
  in.batch = make_batch(spec);
  const auto& b = in.batch;
  const bool input_norm = spec.graph_shape().input_norm;
  in.x = synthetic_hidden(b.tokens(), cfg.hidden, spec.seed, 1000);
  const int64_t W = cfg.cache_row(), L = cfg.kv_lora_rank;
  const int ctx_total = std::accumulate(b.context_lens.begin(), b.context_lens.end(), 0);
  for (int l = 0; l < spec.layers; ++l) {
    Tensor cache({b.num_blocks, kPageSize, W});
    if (ctx_total > 0) {
      // Context tokens: fresh hidden states per layer, through this layer's own kv path.
      Tensor h = synthetic_hidden(ctx_total, cfg.hidden, spec.seed, 2000 + l);
      const auto& w = weights[l];
      Tensor x = input_norm ? ref::rms_norm(h, w.input_norm, cfg.rms_eps) : h;
      const auto kva = ref::kv_a_proj(x, w.kv_a_proj, cfg);
      const Tensor kv_c_norm = ref::rms_norm(kva.kv_c, w.kv_a_norm, cfg.rms_eps);
      std::vector<int> pos;
      for (int s = 0; s < b.num_seqs(); ++s)
        for (int p = 0; p < b.context_lens[s]; ++p) pos.push_back(p);
      const Tensor k_pe_rope = ref::rope(kva.k_pe, pos, cfg.inv_freq, cfg.rope_mscale, cfg.rope_style);
      for (int s = 0, t = 0; s < b.num_seqs(); ++s)
        for (int p = 0; p < b.context_lens[s]; ++p, ++t) {
          float* row = cache.ptr() + (static_cast<int64_t>(b.page(s, p)) * kPageSize + p % kPageSize) * W;
          std::memcpy(row, kv_c_norm.ptr() + t * L, sizeof(float) * L);
          std::memcpy(row + L, k_pe_rope.ptr() + t * cfg.qk_rope, sizeof(float) * cfg.qk_rope);
        }
      round_in_place(cache, Precision::Precision_bf16);  // caches are bf16 in every real engine
      if (cfg.has_dsa()) {  // the indexer's keys of the same context tokens
        const int64_t Di = cfg.index_head_dim;
        const Tensor k = ref::indexer_k(x, w.idx_wk, w.idx_k_norm, w.idx_k_norm_bias, MlaConfig::kIndexNormEps, pos,
                                        cfg.inv_freq, cfg.index_rope_style);
        Tensor index({b.num_blocks, kPageSize, Di});
        for (int s = 0, t = 0; s < b.num_seqs(); ++s)
          for (int p = 0; p < b.context_lens[s]; ++p, ++t)
            std::memcpy(index.ptr() + (static_cast<int64_t>(b.page(s, p)) * kPageSize + p % kPageSize) * Di,
                        k.ptr() + t * Di, sizeof(float) * Di);
        round_in_place(index, Precision::Precision_bf16);
        in.index_cache.push_back(std::move(index));
      }
    }
    in.kv_cache.push_back(std::move(cache));
  }
  complete_index_cache(in, cfg, spec.layers, "synthetic inputs");
  return in;
}

}  // namespace mla
