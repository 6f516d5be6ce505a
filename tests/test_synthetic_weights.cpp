// Synthetic weights (core/model/weights.cpp): the fast bf16 generator gives fill_normal's values rounded, bit
// for bit, and the values are the normal numbers they claim to be; and a rank's head shards of a layer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/model/config.h"
#include "core/model/weights.h"
#include "core/weights/checkpoint_config.h"

namespace mla {
namespace {

// Bit patterns that differ between two float arrays, and the first such index (-1 when none).
int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b, int64_t* count) {
  int64_t first = -1;
  *count = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++*count;
    }
  return first;
}

TEST(SyntheticWeights, FastBf16GeneratorIsTheScalarOneRounded) {
  // An odd count (the last value is a pair's cos alone), several streams and scales, and enough values (2^21 per
  // case) that values near a bf16 rounding boundary (about 1 in 250 here) are certain to occur.
  // Each vector path this CPU has (AVX-512, AVX2), pinned in turn.
  for (const int width : {512, 256})
    for (const int64_t n : {int64_t{(1 << 21) + 1}, int64_t{4096}, int64_t{4097}, int64_t{7}})
      for (const uint64_t stream : {0ull, 5ull, 1234567ull})
        for (const float stddev : {1.0f, 0.0078125f, 1.0f / std::sqrt(7168.0f)}) {
          std::vector<float> scalar(n), fast(n);
          fill_normal(scalar.data(), n, 42, stream, stddev);
          for (auto& v : scalar) v = round_bf16(v);
          set_fill_normal_width(width);
          fill_normal_bf16(fast.data(), n, 42, stream, stddev);
          set_fill_normal_width(512);
          int64_t count = 0;
          const int64_t at = first_bit_difference(scalar, fast, &count);
          EXPECT_EQ(at, -1) << "width " << width << ": " << count << " of " << n << " values differ (stream " << stream
                            << ", stddev " << stddev << "), first at " << at << ": " << (at >= 0 ? scalar[at] : 0.f)
                            << " vs " << (at >= 0 ? fast[at] : 0.f);
        }
}

TEST(SyntheticWeights, ValuesAreNormalWithTheFanInScale) {
  const MlaConfig cfg = load_model_config("tiny");
  const auto w = synthetic_weights(cfg, 1, true, 7);
  const Tensor& t = w[0].kv_b_proj;  // [N*(P+V), L]: N(0, 1/L), bf16-exact
  double sum = 0, sumsq = 0;
  for (float v : t.data) {
    EXPECT_EQ(v, round_bf16(v));
    sum += v;
    sumsq += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(t.numel()), mean = sum / n, var = sumsq / n - mean * mean;
  const double expected_var = 1.0 / static_cast<double>(cfg.kv_lora_rank);
  // Bounds of ~3-5 standard errors of these estimates (seeded, so fixed values; a wrong scale or a broken generator
  // lands far outside): the mean's is sqrt(var / n); the sample variance's relative one sqrt(2 / n) = 0.017 at tiny's
  // n = 7168 values.
  EXPECT_NEAR(mean, 0.0, 5.0 * std::sqrt(expected_var / n));
  EXPECT_NEAR(var / expected_var, 1.0, 3.0 * std::sqrt(2.0 / n));
  // A norm weight: 1 + N(0, 0.1); the mean of its L = 32 values has a standard error of 0.1 / sqrt(32) = 0.018.
  double nsum = 0;
  for (float v : w[0].kv_a_norm.data) nsum += v;
  EXPECT_NEAR(nsum / static_cast<double>(w[0].kv_a_norm.numel()), 1.0, 3.0 * 0.1 / std::sqrt(32.0));
  // Another seed gives other weights; the same seed the same ones.
  EXPECT_NE(synthetic_weights(cfg, 1, true, 8)[0].kv_b_proj.data, t.data);
  EXPECT_EQ(synthetic_weights(cfg, 1, true, 7)[0].kv_b_proj.data, t.data);
}

// head_shards: rank r of tp holds rows [r·Nl·(P+R), (r+1)·Nl·(P+R)) of q_b_proj, the same head block of kv_b_proj's
// rows and of o_proj's columns, element for element; nothing else (the replicated weights stay global).
TEST(SyntheticWeights, HeadShardsAreTheRanksHeadBlocks) {
  const MlaConfig cfg = load_model_config("tiny");
  const auto w = synthetic_weights(cfg, 1, true, 7)[0];
  const int tp = 2;
  const int64_t Nl = cfg.heads / tp, D = cfg.qk_head(), PV = cfg.qk_nope + cfg.v_head, V = cfg.v_head;
  for (int r = 0; r < tp; ++r) {
    const LayerWeights s = head_shards(w, cfg, tp, r);
    ASSERT_EQ(s.q_b_proj.shape, (std::vector<int64_t>{Nl * D, w.q_b_proj.shape[1]}));
    ASSERT_EQ(s.kv_b_proj.shape, (std::vector<int64_t>{Nl * PV, w.kv_b_proj.shape[1]}));
    ASSERT_EQ(s.o_proj.shape, (std::vector<int64_t>{w.o_proj.shape[0], Nl * V}));
    const int64_t kq = w.q_b_proj.shape[1], kk = w.kv_b_proj.shape[1], H = w.o_proj.shape[0], NV = w.o_proj.shape[1];
    for (int64_t i = 0; i < Nl * D; ++i)
      for (int64_t k = 0; k < kq; ++k) ASSERT_EQ(s.q_b_proj.data[i * kq + k], w.q_b_proj.data[(r * Nl * D + i) * kq + k]);
    for (int64_t i = 0; i < Nl * PV; ++i)
      for (int64_t k = 0; k < kk; ++k)
        ASSERT_EQ(s.kv_b_proj.data[i * kk + k], w.kv_b_proj.data[(r * Nl * PV + i) * kk + k]);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < Nl * V; ++j) ASSERT_EQ(s.o_proj.data[h * Nl * V + j], w.o_proj.data[h * NV + r * Nl * V + j]);
    EXPECT_TRUE(s.q_a_proj.empty());
    EXPECT_TRUE(s.kv_a_proj.empty());
    EXPECT_TRUE(s.input_norm.empty());
  }
}

}  // namespace
}  // namespace mla
