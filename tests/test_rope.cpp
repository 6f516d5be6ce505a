// The reference's rope (YaRN frequencies, both pair layouts, DeepSeek-V3 at large positions) against the
// double-precision naive loops of tests/naive_stages.h.
#include "tests/naive_stages.h"

namespace {

using namespace mla;
using namespace mla::test;

TEST(RefStages, RopeTinyYarnBothStyles) {
  const auto cfg = preset("tiny");
  const auto inv_freq = independent_inv_freq(cfg);
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    std::vector<int> pos = {0, 1, 2, 63, 64};
    std::uniform_int_distribution<int> pick(0, 4095);
    for (int i = 0; i < 5; ++i) pos.push_back(pick(rng));
    const int64_t T = static_cast<int64_t>(pos.size());
    const Tensor q_pe = randn({T, cfg.heads, cfg.qk_rope}, rng);
    const Tensor k_pe = randn({T, cfg.qk_rope}, rng);
    for (auto style : {RopeStyle::RopeStyle_interleaved, RopeStyle::RopeStyle_neox}) {
      SCOPED_TRACE(style == RopeStyle::RopeStyle_neox ? "neox" : "interleaved");
      for (double cs : {cfg.rope_mscale, 1.37}) {
        SCOPED_TRACE("cos/sin scale " + std::to_string(cs));
        expect_close(ref::rope(q_pe, pos, cfg.inv_freq, cs, style), naive_rope(q_pe, pos, inv_freq, cs, style),
                     "q_pe_rope");
        expect_close(ref::rope(k_pe, pos, cfg.inv_freq, cs, style), naive_rope(k_pe, pos, inv_freq, cs, style),
                     "k_pe_rope");
      }
    }
  }
}

TEST(RefStages, RopeDeepSeekV3YarnAtLargePositions) {
  const auto cfg = preset("deepseek-v3");
  const auto inv_freq = independent_inv_freq(cfg);
  const std::vector<int> pos = {0, 1, 2, 4095, 4096, 32767, 65536, 100003, 131071, 163839};
  const int64_t T = static_cast<int64_t>(pos.size());
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE(seed_trace(seed));
    std::mt19937_64 rng(seed);
    const Tensor q_pe = randn({T, 4, cfg.qk_rope}, rng);
    const Tensor k_pe = randn({T, cfg.qk_rope}, rng);
    for (auto style : {RopeStyle::RopeStyle_interleaved, RopeStyle::RopeStyle_neox}) {
      SCOPED_TRACE(style == RopeStyle::RopeStyle_neox ? "neox" : "interleaved");
      expect_close(ref::rope(q_pe, pos, cfg.inv_freq, cfg.rope_mscale, style),
                   naive_rope(q_pe, pos, inv_freq, 1.0, style), "q_pe_rope");
      expect_close(ref::rope(k_pe, pos, cfg.inv_freq, cfg.rope_mscale, style),
                   naive_rope(k_pe, pos, inv_freq, 1.0, style), "k_pe_rope");
    }
  }
}

// RoPE: position 0 rotates by zero in both styles; every other position pairs different lanes, so the
// styles disagree. (The rope-neox bug leaves token 0 exact and nothing else.)
TEST(RefStages, RopeNeoxAndInterleavedDifferExceptAtPositionZero) {
  for (const char* name : {"tiny", "deepseek-v3", "kimi-k2", "glm-5"}) {
    SCOPED_TRACE(name);
    const auto cfg = preset(name);
    for (uint64_t seed : kSeeds) {
      SCOPED_TRACE(seed_trace(seed));
      std::mt19937_64 rng(seed);
      std::vector<int> pos(40);
      std::iota(pos.begin(), pos.end(), 0);
      pos.push_back(4096);
      pos.push_back(163839);
      const int64_t T = static_cast<int64_t>(pos.size()), R = cfg.qk_rope;
      const Tensor x = randn({T, 2, R}, rng);
      const Tensor a = ref::rope(x, pos, cfg.inv_freq, cfg.rope_mscale, RopeStyle::RopeStyle_interleaved);
      const Tensor b = ref::rope(x, pos, cfg.inv_freq, cfg.rope_mscale, RopeStyle::RopeStyle_neox);
      for (int64_t t = 0; t < T; ++t) {
        double diff = 0, norm = 0;
        for (int64_t i = 0; i < 2 * R; ++i) {
          diff += std::pow(at(a, t * 2 * R + i) - at(b, t * 2 * R + i), 2);
          norm += std::pow(at(x, t * 2 * R + i), 2);
        }
        if (pos[t] == 0) {
          EXPECT_EQ(diff, 0.0) << "position 0 must be exact in both styles";
          for (int64_t i = 0; i < 2 * R; ++i) ASSERT_EQ(a.data[t * 2 * R + i], x.data[t * 2 * R + i]);
        } else {
          EXPECT_GT(std::sqrt(diff / norm), 1e-3) << "styles agree at position " << pos[t];
        }
      }
    }
  }
}

}  // namespace
