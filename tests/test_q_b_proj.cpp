// The reference's q_b_proj (the per-head split into q_nope and q_pe) against the double-precision naive loops of
// tests/naive_stages.h.
#include "tests/naive_stages.h"

namespace {

using namespace mla;
using namespace mla::test;

TEST(RefStages, QBProjSplitsEachHeadIntoNopeThenRope) {
  const auto cfg = preset("tiny");
  const int64_t N = cfg.heads, D = cfg.qk_head(), P = cfg.qk_nope, R = cfg.qk_rope;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor q_c = randn({5, cfg.q_lora_rank}, rng);
    const Tensor w = weight(N * D, cfg.q_lora_rank, rng);
    // Global weights, and rank 1's head block at tp 2 and rank 3's at tp 4 (the function sees only its rows).
    for (auto [tp, rank] : {std::pair{1, 0}, std::pair{2, 1}, std::pair{4, 3}}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(rank));
      const int64_t Nl = N / tp;
      const Tensor wl = slice_rows(w, rank * Nl * D, (rank + 1) * Nl * D);
      const auto q = ref::q_b_proj(q_c, wl, cfg);
      const auto [nope, pe] = naive_split(naive_linear(q_c, wl), Nl, P, R);
      expect_close(q.q_nope, nope, "q_nope");
      expect_close(q.q_pe, pe, "q_pe");
    }
    // q_proj (no q LoRA): the same split of x·W_qᵀ.
    const Tensor x = hidden(5, cfg.hidden, rng);
    const Tensor wq = weight(N * D, cfg.hidden, rng);
    const auto q = ref::q_b_proj(x, wq, cfg);
    const auto [nope, pe] = naive_split(naive_linear(x, wq), N, P, R);
    expect_close(q.q_nope, nope, "q_proj q_nope");
    expect_close(q.q_pe, pe, "q_proj q_pe");
  }
}

}  // namespace
