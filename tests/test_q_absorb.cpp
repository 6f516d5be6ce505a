// The reference's q_absorb (q_nope through each head's W_UK) against the double-precision naive loops of
// tests/naive_stages.h.
#include "tests/naive_stages.h"

namespace {

using namespace mla;
using namespace mla::test;

TEST(RefStages, QAbsorbAppliesWukTransposed) {
  const auto cfg = preset("tiny");
  const int64_t N = cfg.heads, P = cfg.qk_nope, V = cfg.v_head, L = cfg.kv_lora_rank;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor w = weight(N * (P + V), L, rng);
    for (auto [tp, rank] : {std::pair{1, 0}, std::pair{4, 2}}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(rank));
      const int64_t Nl = N / tp, T = 6;
      const Tensor wl = slice_rows(w, rank * Nl * (P + V), (rank + 1) * Nl * (P + V));
      const Tensor q_nope = randn({T, Nl, P}, rng, 2.0);
      Ref want({T, Nl, L});
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < Nl; ++h)
          for (int64_t l = 0; l < L; ++l) {
            double s = 0;  // (W_UK_hᵀ q)_l = Σ_p W_kvb[h(P+V) + p, l] q_p
            for (int64_t p = 0; p < P; ++p) s += at(wl, (h * (P + V) + p) * L + l) * at(q_nope, (t * Nl + h) * P + p);
            want.data[(t * Nl + h) * L + l] = s;
          }
      expect_close(ref::q_absorb(q_nope, wl, cfg), want, "q_latent");
    }
  }
}

}  // namespace
