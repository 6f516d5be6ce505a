// The reference propagates NaN the way the math does: a NaN score makes its softmax row NaN (not an empty row of
// zeros with lse -inf), a NaN under the indexer's ReLU stays NaN, and a NaN index score reaches the selection.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "reference/stages.h"

namespace mla {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(ReferenceNaN, AQueryRowOfNaNGivesNaNAttentionAndLse) {
  const int64_t T = 4, N = 2, D = 8;
  Tensor q({T, N, D}, 0.5f), k({T, N, D}, 0.25f), v({T, N, D}, 1.0f);
  for (int64_t d = 0; d < D; ++d) q.data[(2 * N + 1) * D + d] = kNaN;  // token 2, head 1
  const auto a = ref::attend(q, k, v, 0.3, true);
  for (int64_t d = 0; d < D; ++d) EXPECT_TRUE(std::isnan(a.out.data[(2 * N + 1) * D + d]));
  EXPECT_TRUE(std::isnan(a.lse.data[2 * N + 1]));
  // The other rows are untouched: finite, and the right softmax of equal scores (the mean of v).
  EXPECT_FLOAT_EQ(a.out.data[(2 * N + 0) * D], 1.0f);
  EXPECT_TRUE(std::isfinite(a.lse.data[3 * N + 1]));
}

TEST(ReferenceNaN, ANaNUnderTheIndexerReluStaysNaN) {
  const int64_t Tq = 2, Hi = 2, Di = 4, Tk = 2;
  Tensor q({Tq, Hi, Di}, 1.0f), k({Tk, Di}, 1.0f), w({Tq, Hi}, 1.0f);
  q.data[(1 * Hi + 0) * Di + 2] = kNaN;  // token 1, head 0: its dot products are NaN
  const Tensor s = ref::indexer_scores(q, k, w);
  EXPECT_TRUE(std::isfinite(s.data[0]));
  EXPECT_TRUE(std::isnan(s.data[1 * Tk + 0]));
  EXPECT_TRUE(std::isnan(s.data[1 * Tk + 1]));
}

TEST(ReferenceNaN, ANaNIndexScoreIsSelected) {
  Tensor scores({1, 4});
  scores.data = {3.0f, kNaN, 1.0f, 2.0f};
  const auto keys = ref::topk_keys(scores, 2);
  ASSERT_EQ(keys[0].size(), 2u);
  EXPECT_EQ(keys[0][0], 1);  // NaN ranks first, as torch.topk has it
  EXPECT_EQ(keys[0][1], 0);
}

}  // namespace
}  // namespace mla

#include "core/model/config.h"
#include "core/model/weights.h"
#include "core/weights/loader.h"
#include "core/weights/quantize.h"

namespace mla {
namespace {

TEST(WeightsNaN, NonFiniteWeightsAreNamedWithWhere) {
  const MlaConfig cfg = *find_preset("tiny");
  LayerWeights w = synthetic_weights(cfg, 1, true, 1)[0];
  EXPECT_TRUE(nonfinite_weights(w, 0).empty());
  const int64_t cols = w.q_a_proj.dim(1);
  w.q_a_proj.data[5 * cols + 17] = std::numeric_limits<float>::quiet_NaN();
  w.kv_a_norm.data[2] = std::numeric_limits<float>::infinity();
  const auto lines = nonfinite_weights(w, 3);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "layer 3 q_a_proj holds 1 NaN and 0 Inf values (the first at row 5, column 17)");
  EXPECT_NE(lines[1].find("kv_a_layernorm holds 0 NaN and 1 Inf"), std::string::npos) << lines[1];
}

// Block scales that are NaN or Inf are named with their block (fp8's F32 scale_inv, nvfp4's E4M3 NaN pattern,
// mxfp4's E8M0 NaN, a non-finite global scale); finite ones say nothing.
TEST(WeightsNaN, NonFiniteBlockScalesAreNamedWithTheirBlock) {
  Tensor t({64, 96});
  for (int64_t i = 0; i < t.numel(); ++i) t.data[i] = std::sin(0.37f * static_cast<float>(i));
  PackedWeight fp8 = quantize(t, WeightFormat::WeightFormat_fp8, "t", 32);  // scale grid [2, 3]
  EXPECT_FALSE(nonfinite_scales(fp8).has_value());
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(fp8.scales.data() + 4 * 4, &inf, 4);  // block row 1, column 1
  EXPECT_EQ(nonfinite_scales(fp8).value_or(""),
            "1 of 6 block scales are NaN or Inf (the first: block row 1, block column 1)");
  PackedWeight nv = quantize(t, WeightFormat::WeightFormat_nvfp4, "t");  // scales [64, 6]
  EXPECT_FALSE(nonfinite_scales(nv).has_value());
  nv.scales[2 * 6 + 5] = 0x7F;
  nv.scales[3 * 6] = 0xFF;
  EXPECT_EQ(nonfinite_scales(nv).value_or(""),
            "2 of 384 block scales are NaN or Inf (the first: block row 2, block column 5)");
  nv.global_scale = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(nonfinite_scales(nv).value_or(""), "its global scale is NaN");
  PackedWeight mx = quantize(t, WeightFormat::WeightFormat_mxfp4, "t");  // scales [64, 3]
  EXPECT_FALSE(nonfinite_scales(mx).has_value());
  mx.scales[7] = 0xFF;
  EXPECT_EQ(nonfinite_scales(mx).value_or(""),
            "1 of 192 block scales are NaN or Inf (the first: block row 2, block column 1)");
}

}  // namespace
}  // namespace mla
