// The reference's kv_b_proj (the per-head split into k_nope and v) against the double-precision naive loops of
// tests/naive_stages.h.
#include "tests/naive_stages.h"

namespace {

using namespace mla;
using namespace mla::test;

TEST(RefStages, KvBProjSplitsEachHeadIntoKNopeThenV) {
  const auto cfg = preset("tiny");
  const int64_t N = cfg.heads, P = cfg.qk_nope, V = cfg.v_head, L = cfg.kv_lora_rank;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor c = randn({7, L}, rng);
    const Tensor w = weight(N * (P + V), L, rng);
    for (auto [tp, rank] : {std::pair{1, 0}, std::pair{4, 1}, std::pair{8, 7}}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(rank));
      const int64_t Nl = N / tp;
      const Tensor wl = slice_rows(w, rank * Nl * (P + V), (rank + 1) * Nl * (P + V));
      const auto kv = ref::kv_b_proj(c, wl, cfg);
      const auto [k, v] = naive_split(naive_linear(c, wl), Nl, P, V);
      expect_close(kv.k_nope, k, "k_nope");
      expect_close(kv.v, v, "v");
    }
  }
}

}  // namespace
