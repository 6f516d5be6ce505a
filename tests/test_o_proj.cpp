// The reference's o_proj (each rank's heads through its column shard of W_o: a partial sum), against the
// double-precision naive loops of tests/naive_stages.h.
#include "tests/naive_stages.h"

namespace {

using namespace mla;
using namespace mla::test;

TEST(RefStages, OProjIsEachRanksShardOfTheOutputProjection) {
  const auto cfg = preset("tiny");
  const int64_t N = cfg.heads, V = cfg.v_head, H = cfg.hidden, T = 5;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor w_o = weight(H, N * V, rng);
    const int tp = 4;
    const int64_t Nl = N / tp;
    for (int r = 0; r < tp; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      const Tensor a = randn({T, Nl, V}, rng);
      const Tensor wl = slice_cols(w_o, r * Nl * V, (r + 1) * Nl * V);
      Ref want({T, H});
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < H; ++j) {
          double s = 0;  // attn_out reshaped [T, Nl·V] times W_o,localᵀ
          for (int64_t h = 0; h < Nl; ++h)
            for (int64_t c = 0; c < V; ++c) s += at(a, (t * Nl + h) * V + c) * at(wl, j * Nl * V + h * V + c);
          want.data[t * H + j] = s;
        }
      expect_close(ref::o_proj(a, wl), want, "o_partial");
    }
  }
}

}  // namespace
