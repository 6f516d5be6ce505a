// The reference's v_up (the latent output through each head's W_UV) against the double-precision naive loops of
// tests/naive_stages.h.
#include "tests/naive_stages.h"

namespace {

using namespace mla;
using namespace mla::test;

TEST(RefStages, VUpAppliesWuv) {
  const auto cfg = preset("tiny");
  const int64_t N = cfg.heads, P = cfg.qk_nope, V = cfg.v_head, L = cfg.kv_lora_rank;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor w = weight(N * (P + V), L, rng);
    for (auto [tp, rank] : {std::pair{1, 0}, std::pair{8, 5}}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(rank));
      const int64_t Nl = N / tp, T = 5;
      const Tensor wl = slice_rows(w, rank * Nl * (P + V), (rank + 1) * Nl * (P + V));
      const Tensor lat = randn({T, Nl, L}, rng);
      Ref want({T, Nl, V});
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < Nl; ++h)
          for (int64_t j = 0; j < V; ++j) {
            double s = 0;  // W_UV_h = rows h(P+V)+P .. h(P+V)+P+V−1
            for (int64_t l = 0; l < L; ++l) s += at(wl, (h * (P + V) + P + j) * L + l) * at(lat, (t * Nl + h) * L + l);
            want.data[(t * Nl + h) * V + j] = s;
          }
      expect_close(ref::v_up(lat, wl, cfg), want, "attn_out");
    }
  }
}

}  // namespace
