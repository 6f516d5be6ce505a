// The reference's rms_norm (input_norm, q_a_norm, kv_a_norm) against the double-precision naive loops of
// tests/naive_stages.h.
#include "tests/naive_stages.h"

namespace {

using namespace mla;
using namespace mla::test;

TEST(RefStages, RmsNormUsesMeanSquareEpsAndWeight) {
  const auto cfg = preset("tiny");
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    Tensor x = hidden(6, cfg.hidden, rng);
    // A tiny row (mean square 1e-8 << eps): the output depends on eps, so a wrong or missing eps shows.
    for (int64_t c = 0; c < cfg.hidden; ++c) x.data[5 * cfg.hidden + c] *= 1e-4f;
    const Tensor w = norm_weight(cfg.hidden, rng);
    for (double eps : {1e-6, 1e-5}) {
      SCOPED_TRACE("eps " + std::to_string(eps));
      expect_close(ref::rms_norm(x, w, eps), naive_rms_norm(x, w, eps), "rms_norm");
    }
    // kv_a_norm's width L, over a [T, L] input.
    const Tensor kv = randn({4, cfg.kv_lora_rank}, rng, 3.0);
    const Tensor wk = norm_weight(cfg.kv_lora_rank, rng);
    expect_close(ref::rms_norm(kv, wk, cfg.rms_eps), naive_rms_norm(kv, wk, cfg.rms_eps), "rms_norm L");
  }
}

}  // namespace
