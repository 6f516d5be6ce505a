// The reference's residual (h_out = h + o), against the double-precision naive loops of tests/naive_stages.h.
#include "tests/naive_stages.h"

namespace {

using namespace mla;
using namespace mla::test;

TEST(RefStages, ResidualAddsTheAttentionOutputToTheStream) {
  const auto cfg = preset("tiny");
  const int64_t H = cfg.hidden, T = 5;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor h = hidden(T, H, rng), o = randn({T, H}, rng);
    Ref h_out({T, H});
    for (int64_t i = 0; i < h.numel(); ++i) h_out.data[i] = at(h, i) + at(o, i);
    expect_close(ref::residual(h, o), h_out, "residual");
  }
}

}  // namespace
