// The reference's kv_a_proj (the split into kv_c and k_pe) against the double-precision naive loops of
// tests/naive_stages.h.
#include "tests/naive_stages.h"

namespace {

using namespace mla;
using namespace mla::test;

TEST(RefStages, KvAProjSplitsLatentThenRope) {
  const auto cfg = preset("tiny");
  const int64_t L = cfg.kv_lora_rank, R = cfg.qk_rope;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor x = hidden(6, cfg.hidden, rng);
    const Tensor w = weight(L + R, cfg.hidden, rng);
    const auto kv = ref::kv_a_proj(x, w, cfg);
    auto [c, pe] = naive_split(naive_linear(x, w), 1, L, R);
    c.shape = {6, L};
    pe.shape = {6, R};
    expect_close(kv.kv_c, c, "kv_c");
    expect_close(kv.k_pe, pe, "k_pe");
  }
}

}  // namespace
