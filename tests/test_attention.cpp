// The attention core both forms share (attend: causal alignment, shared keys, empty key sets; the LSE merge)
// against the double-precision naive loops of tests/naive_stages.h.
#include "tests/naive_stages.h"

namespace {

using namespace mla;
using namespace mla::test;

TEST(RefStages, AttendCausalAlignsBottomRight) {
  const auto cfg = preset("tiny");
  const double scale = independent_softmax_scale(cfg);
  const int64_t Nl = 3, Dk = cfg.qk_head(), Dv = cfg.v_head;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    // Tq < Tk (chunk after context), Tq == Tk (prefill), Tq > Tk (leading queries see nothing: 0, −inf).
    for (auto [Tq, Tk] : {std::pair{5, 9}, std::pair{6, 6}, std::pair{7, 4}, std::pair{1, 70}}) {
      SCOPED_TRACE("Tq " + std::to_string(Tq) + " Tk " + std::to_string(Tk));
      const Tensor q = randn({Tq, Nl, Dk}, rng, 2.0);
      const Tensor k = randn({Tk, Nl, Dk}, rng), v = randn({Tk, Nl, Dv}, rng);
      const auto a = ref::attend(q, k, v, scale, true);
      const auto [out, lse] = naive_attend(q, k, v, scale, true);
      expect_close(a.out, out, "out");
      expect_close(a.lse, lse, "lse");
    }
  }
}

TEST(RefStages, AttendNonCausalAndSharedKeys) {
  const auto cfg = preset("tiny");
  const double scale = independent_softmax_scale(cfg);
  const int64_t Nl = 4, Dk = cfg.cache_row(), Dv = cfg.kv_lora_rank;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const int64_t Tq = 5, Tk = 11;
    const Tensor q = randn({Tq, Nl, Dk}, rng, 1.5);
    {
      SCOPED_TRACE("per-head keys, non-causal");
      const Tensor k = randn({Tk, Nl, Dk}, rng), v = randn({Tk, Nl, Dv}, rng);
      const auto a = ref::attend(q, k, v, scale, false);
      const auto [out, lse] = naive_attend(q, k, v, scale, false);
      expect_close(a.out, out, "out");
      expect_close(a.lse, lse, "lse");
    }
    // MQA: one key/value row per token shared by all heads, as [Tk, D] and as [Tk, 1, D].
    const Tensor k = randn({Tk, Dk}, rng), v = randn({Tk, Dv}, rng);
    for (bool causal : {false, true}) {
      SCOPED_TRACE(causal ? "shared keys, causal" : "shared keys, non-causal");
      const auto [out, lse] = naive_attend(q, k, v, scale, causal);
      const auto a2 = ref::attend(q, k, v, scale, causal);
      expect_close(a2.out, out, "out [Tk,D]");
      expect_close(a2.lse, lse, "lse [Tk,D]");
      const auto a3 = ref::attend(q, k.reshaped({Tk, 1, Dk}), v.reshaped({Tk, 1, Dv}), scale, causal);
      expect_close(a3.out, out, "out [Tk,1,D]");
      expect_close(a3.lse, lse, "lse [Tk,1,D]");
    }
  }
}

TEST(RefStages, AttendEmptyKeySetGivesZeroAndMinusInf) {
  const auto cfg = preset("tiny");
  std::mt19937_64 rng(7);
  SCOPED_TRACE(seed_trace(7));
  const int64_t Tq = 3, Nl = 2, Dk = cfg.qk_head(), Dv = cfg.v_head;
  const Tensor q = randn({Tq, Nl, Dk}, rng);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    const auto a = ref::attend(q, Tensor({0, Nl, Dk}), Tensor({0, Nl, Dv}), cfg.softmax_scale, causal);
    ASSERT_EQ(a.out.shape, (std::vector<int64_t>{Tq, Nl, Dv}));
    ASSERT_EQ(a.lse.shape, (std::vector<int64_t>{Tq, Nl}));
    for (float v : a.out.data) EXPECT_EQ(v, 0.0f);
    for (float v : a.lse.data) EXPECT_TRUE(std::isinf(v) && v < 0) << "lse " << v;
  }
}

TEST(RefStages, MergeLseMatchesFormulaAndUnionOfKeySets) {
  const auto cfg = preset("tiny");
  const double scale = independent_softmax_scale(cfg);
  const int64_t Tq = 6, Nl = 3, Dv = cfg.v_head, Dk = cfg.qk_head();
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    // The LSE merge's formula on random partials, with empty chunks (lse −inf) on one side or both.
    ref::Attn x{randn({Tq, Nl, Dv}, rng), randn({Tq, Nl}, rng, 4.0)};
    ref::Attn y{randn({Tq, Nl, Dv}, rng), randn({Tq, Nl}, rng, 4.0)};
    const float ninf = -std::numeric_limits<float>::infinity();
    x.lse.data[1] = ninf;
    std::fill_n(x.out.ptr() + 1 * Dv, Dv, 0.0f);
    y.lse.data[4] = ninf;
    std::fill_n(y.out.ptr() + 4 * Dv, Dv, 0.0f);
    x.lse.data[7] = y.lse.data[7] = ninf;
    std::fill_n(x.out.ptr() + 7 * Dv, Dv, 0.0f);
    std::fill_n(y.out.ptr() + 7 * Dv, Dv, 0.0f);
    Ref out({Tq, Nl, Dv}), lse({Tq, Nl});
    for (int64_t r = 0; r < Tq * Nl; ++r) {
      const double lx = at(x.lse, r), ly = at(y.lse, r);
      if (std::isinf(lx) && std::isinf(ly)) {
        lse.data[r] = -kInf;
        continue;
      }
      const double m = std::max(lx, ly), ex = std::exp(lx - m), ey = std::exp(ly - m), w = ex / (ex + ey);
      for (int64_t d = 0; d < Dv; ++d)
        out.data[r * Dv + d] = w * at(x.out, r * Dv + d) + (1 - w) * at(y.out, r * Dv + d);
      lse.data[r] = m + std::log(ex + ey);
    }
    const auto m = ref::merge_lse(x, y);
    expect_close(m.out, out, "merged out");
    expect_close(m.lse, lse, "merged lse");

    // Attending to A ∪ B equals merging attend(A) and attend(B).
    const Tensor q = randn({Tq, Nl, Dk}, rng, 2.0);
    const Tensor k = randn({12, Nl, Dk}, rng), v = randn({12, Nl, Dv}, rng);
    auto part = [&](const Tensor& t, int64_t r0, int64_t r1) {
      auto s = t.shape;
      s[0] = r1 - r0;
      Tensor o(s);
      const int64_t per = t.numel() / t.dim(0);
      std::memcpy(o.ptr(), t.ptr() + r0 * per, sizeof(float) * (r1 - r0) * per);
      return o;
    };
    const auto merged = ref::merge_lse(ref::attend(q, part(k, 0, 5), part(v, 0, 5), scale, false),
                                       ref::attend(q, part(k, 5, 12), part(v, 5, 12), scale, false));
    const auto [u_out, u_lse] = naive_attend(q, k, v, scale, false);
    expect_close(merged.out, u_out, "merge of halves vs union: out");
    expect_close(merged.lse, u_lse, "merge of halves vs union: lse");
  }
}

}  // namespace
