// The reference's linear (y = x·Wᵀ, the GEMM of every projection) against the double-precision naive loops of
// tests/naive_stages.h.
#include "tests/naive_stages.h"

namespace {

using namespace mla;
using namespace mla::test;

TEST(RefStages, LinearIsXTimesWTransposed) {
  const auto cfg = preset("tiny");
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor x = hidden(7, cfg.hidden, rng);
    const Tensor w = weight(cfg.q_lora_rank, cfg.hidden, rng);
    expect_close(ref::linear(x, w), naive_linear(x, w), "linear");
    // A 3-D input is read as [T, rest] (o_proj feeds [T, Nl, V]).
    const Tensor a = randn({5, cfg.heads, cfg.v_head}, rng);
    const Tensor wo = weight(cfg.hidden, cfg.heads * cfg.v_head, rng);
    expect_close(ref::linear(a, wo), naive_linear(a, wo), "linear 3-D");
  }
}

}  // namespace
