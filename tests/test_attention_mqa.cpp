// The reference's attention_mqa (the absorbed form over the paged latent cache) against the double-precision
// naive loops of tests/naive_stages.h.
#include "tests/naive_stages.h"

namespace {

using namespace mla;
using namespace mla::test;

TEST(RefStages, AttentionMqaOverPagedLatentCache) {
  const auto cfg = preset("tiny");
  const double scale = independent_softmax_scale(cfg);
  const int64_t N = cfg.heads, R = cfg.qk_rope, L = cfg.kv_lora_rank, W = L + R;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    // Decode (s_q 1, contexts across pages), multi-token steps with and without context.
    for (auto [news, ctx] : {std::pair{std::vector<int>{1, 1, 1}, std::vector<int>{200, 63, 0}},
                             std::pair{std::vector<int>{4, 4}, std::vector<int>{61, 0}}}) {
      const Batch b = shuffled_batch(news, ctx, seed + 7);
      SCOPED_TRACE("sequences " + std::to_string(b.num_seqs()) + ", new " + std::to_string(news[0]));
      const int64_t T = b.tokens(), Nl = N / 2;
      const Tensor cache = filled_cache(b, W, rng);
      const Tensor q_latent = randn({T, Nl, L}, rng, 1.5), q_pe = randn({T, Nl, R}, rng, 1.5);
      Ref out({T, Nl, L}), lse({T, Nl});
      for (int s = 0, t0 = 0; s < b.num_seqs(); t0 += b.new_lens[s], ++s)
        for (int i = 0; i < b.new_lens[s]; ++i)
          for (int64_t h = 0; h < Nl; ++h) {
            const int64_t t = t0 + i;
            const auto q = cat(lanes(q_latent, t * Nl + h, L, 0, L), lanes(q_pe, t * Nl + h, R, 0, R));
            std::vector<double> scores;
            std::vector<std::vector<double>> values;
            for (int slot = 0; slot <= b.context_lens[s] + i; ++slot) {  // bottom-right causal
              const int64_t off = cache_offset(b, s, slot, W);
              std::vector<double> row(W);
              for (int64_t c = 0; c < W; ++c) row[c] = at(cache, off + c);
              scores.push_back(scale * dot(q, row));             // key: the whole row
              values.emplace_back(row.begin(), row.begin() + L);  // value: its first L lanes
            }
            naive_softmax(scores, values, L, &out.data[(t * Nl + h) * L], &lse.data[t * Nl + h]);
          }
      const auto a = ref::attention_mqa(q_latent, q_pe, cache, b, cfg);
      expect_close(a.out, out, "attn_latent");
      expect_close(a.lse, lse, "lse");
    }
  }
}

}  // namespace
