// The reference's attention_mha (the new tokens causal, the context up-projected from the cache) against the
// double-precision naive loops of tests/naive_stages.h.
#include "tests/naive_stages.h"

namespace {

using namespace mla;
using namespace mla::test;

// Naive prefill form (no LSE merge): for each new token, keys = the sequence's cached rows up-projected through
// W_kvb (k = [W_UK c | pe], v = W_UV c) plus the new tokens up to itself; one softmax over the union.
std::pair<Ref, Ref> naive_attention_mha(const Tensor& q_nope, const Tensor& q_pe_rope, const Tensor& k_nope,
                                        const Tensor& k_pe_rope, const Tensor& v, const Tensor& cache, const Batch& b,
                                        const Tensor& w_kvb, const MlaConfig& cfg, double scale) {
  const int64_t T = q_nope.dim(0), Nl = q_nope.dim(1), P = cfg.qk_nope, R = cfg.qk_rope, V = cfg.v_head;
  const int64_t L = cfg.kv_lora_rank, W = L + R;
  Ref out({T, Nl, V}), lse({T, Nl});
  for (int s = 0, t0 = 0; s < b.num_seqs(); t0 += b.new_lens[s], ++s)
    for (int i = 0; i < b.new_lens[s]; ++i)
      for (int64_t h = 0; h < Nl; ++h) {
        const int64_t t = t0 + i;
        const auto q = cat(lanes(q_nope, t * Nl + h, P, 0, P), lanes(q_pe_rope, t * Nl + h, R, 0, R));
        std::vector<double> scores;
        std::vector<std::vector<double>> values;
        for (int c = 0; c < b.context_lens[s]; ++c) {
          const int64_t off = cache_offset(b, s, c, W);
          std::vector<double> kn(P, 0.0), vv(V, 0.0), pe(R);
          for (int64_t j = 0; j < P + V; ++j) {
            double acc = 0;
            for (int64_t l = 0; l < L; ++l) acc += at(w_kvb, (h * (P + V) + j) * L + l) * at(cache, off + l);
            (j < P ? kn[j] : vv[j - P]) = acc;
          }
          for (int64_t r = 0; r < R; ++r) pe[r] = at(cache, off + L + r);
          scores.push_back(scale * dot(q, cat(kn, pe)));
          values.push_back(vv);
        }
        for (int j = 0; j <= i; ++j) {
          const int64_t u = t0 + j;
          scores.push_back(scale * dot(q, cat(lanes(k_nope, u * Nl + h, P, 0, P), lanes(k_pe_rope, u, R, 0, R))));
          values.push_back(lanes(v, u * Nl + h, V, 0, V));
        }
        naive_softmax(scores, values, V, &out.data[(t * Nl + h) * V], &lse.data[t * Nl + h]);
      }
  return {out, lse};
}

TEST(RefStages, AttentionMhaWithAndWithoutContext) {
  const auto cfg = preset("tiny");
  const double scale = independent_softmax_scale(cfg);
  const int64_t N = cfg.heads, P = cfg.qk_nope, R = cfg.qk_rope, V = cfg.v_head, L = cfg.kv_lora_rank;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor w_kvb = weight(N * (P + V), L, rng);
    for (auto ctx : {std::vector<int>{0, 0}, std::vector<int>{70, 2}}) {
      SCOPED_TRACE("context " + std::to_string(ctx[0]) + "," + std::to_string(ctx[1]));
      const Batch b = shuffled_batch({5, 3}, ctx, seed + 100);
      const int64_t T = b.tokens();
      const Tensor cache = filled_cache(b, L + R, rng);
      for (auto [tp, rank] : {std::pair{1, 0}, std::pair{2, 1}}) {
        SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(rank));
        const int64_t Nl = N / tp;
        const Tensor wl = slice_rows(w_kvb, rank * Nl * (P + V), (rank + 1) * Nl * (P + V));
        const Tensor q_nope = randn({T, Nl, P}, rng, 2.0), q_pe = randn({T, Nl, R}, rng, 2.0);
        const Tensor k_nope = randn({T, Nl, P}, rng), k_pe = randn({T, R}, rng), v = randn({T, Nl, V}, rng);
        const auto a = ref::attention_mha(q_nope, q_pe, k_nope, k_pe, v, cache, b, wl, cfg);
        const auto [out, lse] = naive_attention_mha(q_nope, q_pe, k_nope, k_pe, v, cache, b, wl, cfg, scale);
        expect_close(a.out, out, "attn_out");
        expect_close(a.lse, lse, "lse");
      }
    }
  }
}

}  // namespace
