// Dequantization: bit for bit against gguf.quants.dequantize and ml_dtypes (files from
// tests/py/make_weight_fixtures.py); our Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 quantizers against gguf.quants.quantize;
// the element encoders; every --weight-format's round trip; and the wrong variants the weight injections use.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/model/errors.h"
#include "core/model/weights.h"
#include "core/weights/dequant.h"
#include "core/weights/gguf.h"
#include "core/weights/quantize.h"
#include "tests/test_weights_util.h"

namespace {

using namespace mla;
using namespace mla::test;

// ---------------------------------------------------------------- element types

TEST(Dequant, Fp4CodesAgreeWithMlDtypes) {
  MLA_REQUIRE_WEIGHT_FIXTURES();
  const auto want = fx.expected(fx.manifest.at("fp4_codes"));
  std::vector<float> got;
  for (int c = 0; c < 16; ++c) got.push_back(e2m1_to_float(static_cast<uint8_t>(c)));
  EXPECT_TRUE(bit_equal(got, want, "e2m1"));
  // Packed low nibble first (element 2i low, 2i+1 high), as st_to_float reads F4.
  const uint8_t packed[2] = {0x71, 0xF8};  // 0.5, 6, -0, -6
  EXPECT_EQ(st_to_float(StDtype::StDtype_F4, packed, 4), (std::vector<float>{0.5f, 6.0f, -0.0f, -6.0f}));
}

TEST(Dequant, ElementDecodersKnownValues) {
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_float(0xB8), -1.0f);
  EXPECT_EQ(e5m2_to_float(0x7C), INFINITY);
  EXPECT_EQ(e5m2_to_float(0x7B), 57344.0f);
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(e8m0_to_float(255)));
}

TEST(Dequant, EncodersRoundToNearestEvenAndSaturate) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_float(static_cast<uint8_t>(c));
    if (std::isnan(v)) continue;
    EXPECT_EQ(float_to_e4m3(v), c == 0x80 ? 0x80 : c) << "code " << c;  // every value round-trips (-0 too)
  }
  // Midpoints go to the even mantissa: between 1.0 (0x38) and 1.125 (0x39) -> 0x38; 1.125..1.25 -> 0x3A.
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3A);
  EXPECT_EQ(float_to_e4m3(1.0626f), 0x39);
  EXPECT_EQ(float_to_e4m3(1e6f), 0x7E);  // saturates, never NaN
  EXPECT_EQ(float_to_e4m3(-1e6f), 0xFE);
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // a tie between 0 and the smallest subnormal: even (0)
  EXPECT_EQ(float_to_e4m3(std::ldexp(3.0f, -10)), 0x02);  // a tie between codes 1 and 2: even (2)
  for (int c = 0; c < 16; ++c) EXPECT_EQ(float_to_e2m1(e2m1_to_float(static_cast<uint8_t>(c))), c == 8 ? 8 : c);
  EXPECT_EQ(float_to_e2m1(2.5f), 4);   // 2 (code 4) and 3 (code 5): even
  EXPECT_EQ(float_to_e2m1(5.0f), 6);   // 4 (code 6) and 6 (code 7): even
  EXPECT_EQ(float_to_e2m1(100.0f), 7);
  EXPECT_EQ(float_to_e2m1(-0.25f), 8);  // -0 (tie between 0 and 0.5 goes to 0)
  // Against the definition (the nearest of the eight values; a tie to the even code) on every float from 0 to 8 in
  // steps of 2^-12, each midpoint and its two neighbouring floats, both signs, and Inf.
  const float values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const auto definition = [&](float v) {
    const double a = std::fabs(static_cast<double>(v));
    int best = 0;
    if (a >= 6.0) return static_cast<uint8_t>((std::signbit(v) ? 8 : 0) | 7);  // saturates
    for (int c = 1; c < 8; ++c) {
      const double d = std::fabs(a - values[c]), e = std::fabs(a - values[best]);
      if (d < e || (d == e && c % 2 == 0)) best = c;
    }
    return static_cast<uint8_t>((std::signbit(v) ? 8 : 0) | best);
  };
  std::vector<float> xs;
  for (int i = 0; i <= 8 * 4096; ++i) xs.push_back(static_cast<float>(i) / 4096.0f);
  for (int c = 0; c + 1 < 8; ++c) {
    const float mid = (values[c] + values[c + 1]) / 2;
    xs.insert(xs.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 10.0f)});
  }
  xs.push_back(std::numeric_limits<float>::infinity());
  for (float x : xs)
    for (float v : {x, -x}) EXPECT_EQ(float_to_e2m1(v), definition(v)) << v;
  EXPECT_EQ(float_to_e8m0_floor(1.0f), 127);
  EXPECT_EQ(float_to_e8m0_floor(7.99f), 129);
  EXPECT_EQ(float_to_e8m0_floor(0.5f), 126);
}

// ---------------------------------------------------------------- GGUF blocks vs gguf-py

TEST(Dequant, GgufEveryTypeBitExactWithGgufPy) {
  MLA_REQUIRE_WEIGHT_FIXTURES();
  const GgufFile g(fx.at("gguf_quants.gguf").string());
  int checked = 0;
  for (const auto& [name, entry] : fx.manifest.at("gguf_quants").items()) {
    SCOPED_TRACE(name);
    const GgufTensorInfo* t = g.find(name);
    ASSERT_NE(t, nullptr);
    const Bytes d = g.data(*t);
    const int64_t cols = t->ne[0], rows = t->numel / cols;
    const int64_t row_bytes = static_cast<int64_t>(t->nbytes) / rows;
    std::vector<float> got(static_cast<size_t>(t->numel));
    for (int64_t r = 0; r < rows; ++r) dequantize_ggml_row(t->type, d.data() + r * row_bytes, got.data() + r * cols, cols);
    EXPECT_TRUE(bit_equal(got, fx.expected(entry.at("expected")), name + " (" + ggml_type_name(t->type) + ")"));
    // The same through PackedWeight, as the loader does it.
    PackedWeight p;
    p.format = *weight_format_of_ggml(t->type);
    p.rows = rows;
    p.cols = cols;
    p.data.assign(d.data(), d.data() + d.size());
    EXPECT_TRUE(bit_equal(dequantize(p).data, got, name + " via PackedWeight"));
    ++checked;
  }
  EXPECT_EQ(checked, 15);  // Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 MXFP4 BF16 Q2_K Q3_K Q4_K Q5_K Q6_K NVFP4 F16 F32
}

TEST(Quantize, LegacyGgufQuantizersBitExactWithGgufPy) {
  MLA_REQUIRE_WEIGHT_FIXTURES();
  const GgufFile g(fx.at("gguf_quants.gguf").string());
  for (const char* name : {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "bf16", "mxfp4"}) {
    SCOPED_TRACE(name);
    const auto& entry = fx.manifest.at("gguf_quants").at(name);
    const std::vector<float> src = fx.expected(entry.at("src"));
    const GgufTensorInfo* t = g.find(name);
    ASSERT_NE(t, nullptr);
    const Bytes want = g.data(*t);
    std::vector<uint8_t> got(want.size());
    const int64_t cols = t->ne[0], rows = t->numel / cols, row_bytes = static_cast<int64_t>(t->nbytes) / rows;
    for (int64_t r = 0; r < rows; ++r) quantize_ggml_row(t->type, src.data() + r * cols, got.data() + r * row_bytes, cols);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], want.data()[i]) << "byte " << i << " (block " << i / ggml_type_info(t->type)->type_size << ")";
  }
}

TEST(Dequant, RowsMustBeWholeBlocks) {
  std::vector<uint8_t> b(34);
  std::vector<float> y(33);
  try {
    dequantize_ggml_row(ggml::Q8_0, b.data(), y.data(), 33);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("a Q8_0 row of 33 elements is not a whole number of blocks of 32"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(dequantize_ggml_row(15 /* Q8_K: no dequantizer */, b.data(), y.data(), 256), UsageError);
  PackedWeight p;
  p.format = WeightFormat::WeightFormat_nvfp4;
  p.rows = 2, p.cols = 32, p.origin = "f.safetensors: w";
  p.data.resize(32);
  p.scales.resize(3);
  try {
    dequantize(p);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("f.safetensors: w: nvfp4 [2, 32] needs 4 bytes of scales, has 3"), std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------- every format's round trip

Tensor random_weight(int64_t rows, int64_t cols, uint64_t seed) {
  Tensor w({rows, cols});
  fill_normal(w.ptr(), w.numel(), seed, 0, 1.0f / std::sqrt(static_cast<float>(cols)));
  return w;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * double(a[i] - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / den);
}

TEST(Quantize, EveryFormatRoundTripsWithinItsPrecision) {
  // Bounds: the quantization noise of each format on N(0, 1/sqrt(K)) weights, calibrated (measured x ~1.5),
  // ordered as the bits per weight are: a format that loses far more than its peers is a bug.
  const std::map<std::string, double> bound = {
      {"f32", 0.0}, {"f16", 4e-4}, {"bf16", 3e-3}, {"fp8", 0.04}, {"nvfp4", 0.13}, {"nvfp4-ct", 0.13},
      {"mxfp4", 0.2}, {"q8_0", 0.006}, {"q4_0", 0.12}, {"q4_1", 0.1}, {"q5_0", 0.06}, {"q5_1", 0.05},
      {"q2_k", 0.45}, {"q3_k", 0.25}, {"q4_k", 0.1}, {"q5_k", 0.05}, {"q6_k", 0.025}, {"gguf-mxfp4", 0.2},
      {"gguf-nvfp4", 0.13}};
  const Tensor w = random_weight(260, 512, 11);
  for (WeightFormat f : all_weight_formats()) {
    const std::string name = weight_format_name(f);
    SCOPED_TRACE(name);
    const PackedWeight p = quantize(w, f, "test " + name);
    EXPECT_EQ(p.data.size(), p.expected_data_bytes());
    EXPECT_EQ(p.scales.size(), p.expected_scale_bytes());
    const Tensor back = dequantize(p);
    ASSERT_EQ(back.shape, w.shape);
    const double e = rel_l2(back.data, w.data);
    EXPECT_LE(e, bound.at(name)) << "rel_l2 " << e;
    if (name != "f32") EXPECT_GT(e, 0.0);
    // Quantizing what came back is stable for the formats whose scales are exact functions of the values.
    for (float v : back.data) ASSERT_TRUE(std::isfinite(v));
  }
}

TEST(Quantize, BlockSizeMismatchIsAClearError) {
  const Tensor w = random_weight(4, 48, 1);
  try {
    quantize(w, WeightFormat::WeightFormat_q4_k, "layer 0 q_b_proj");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0 q_b_proj [4,48]: --weight-format q4_k quantizes the input dimension "
                                         "in blocks of 256, and 48 is not a multiple of it"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(quantize(w, WeightFormat::WeightFormat_fp8, "x"));  // partial 128-blocks are fine
  EXPECT_THROW(parse_weight_format("q7_k"), UsageError);
  EXPECT_EQ(parse_weight_format("Q4_K"), WeightFormat::WeightFormat_q4_k);
}

// ---------------------------------------------------------------- the injections' wrong variants

TEST(DequantBugs, Fp8ScaleTransposeReadsTheScaleGridTransposed) {
  const Tensor w = random_weight(300, 260, 3);  // scale grid [3, 3]: partial blocks at both edges
  PackedWeight p = quantize(w, WeightFormat::WeightFormat_fp8, "w");
  // Make every block's scale distinct so a transposed read shows everywhere off the diagonal.
  std::vector<float> s(9);
  for (int k = 0; k < 9; ++k) s[k] = 0.001f * static_cast<float>(k + 1);
  std::memcpy(p.scales.data(), s.data(), 36);
  DequantBugs bug;
  bug.fp8_scale_transpose = true;
  const Tensor good = dequantize(p), bad = dequantize(p, bug);
  for (int64_t i = 0; i < 300; ++i)
    for (int64_t j = 0; j < 260; ++j) {
      const float e = e4m3_to_float(p.data[i * 260 + j]);
      ASSERT_EQ(good.data[i * 260 + j], e * s[(i / 128) * 3 + j / 128]);
      ASSERT_EQ(bad.data[i * 260 + j], e * s[(j / 128) * 3 + i / 128]) << i << "," << j;
    }
  // One block in a dimension: the transposed read is the right one (the bug hides in small models).
  const PackedWeight q = quantize(random_weight(64, 300, 4), WeightFormat::WeightFormat_fp8, "q");
  EXPECT_EQ(dequantize(q).data, dequantize(q, bug).data);
  EXPECT_TRUE(bug.touches(WeightFormat::WeightFormat_fp8));
  EXPECT_FALSE(bug.touches(WeightFormat::WeightFormat_nvfp4));
}

TEST(DequantBugs, Nvfp4NibbleSwapExchangesNeighbours) {
  const Tensor w = random_weight(8, 64, 5);
  DequantBugs bug;
  bug.nvfp4_nibble_swap = true;
  for (WeightFormat f : {WeightFormat::WeightFormat_nvfp4, WeightFormat::WeightFormat_nvfp4_ct}) {
    const PackedWeight p = quantize(w, f, "w");
    const Tensor good = dequantize(p), bad = dequantize(p, bug);
    for (int64_t k = 0; k < good.numel(); k += 2) {
      ASSERT_EQ(bad.data[k], good.data[k + 1]);
      ASSERT_EQ(bad.data[k + 1], good.data[k]);
    }
    EXPECT_NE(good.data, bad.data);
  }
  // GGUF NVFP4 packs split halves (element j low, j+8 high): the swap exchanges j and j+8 of each 16.
  const PackedWeight g = quantize(w, WeightFormat::WeightFormat_gguf_nvfp4, "g");
  const Tensor good = dequantize(g), bad = dequantize(g, bug);
  for (int64_t k = 0; k < good.numel(); ++k) ASSERT_EQ(bad.data[k], good.data[(k % 16) < 8 ? k + 8 : k - 8]);
  EXPECT_FALSE(bug.touches(WeightFormat::WeightFormat_mxfp4));
}

TEST(DequantBugs, Nvfp4GlobalRecipIsAPureScale) {
  const Tensor w = random_weight(16, 64, 6);
  const PackedWeight p = quantize(w, WeightFormat::WeightFormat_nvfp4_ct, "w");
  DequantBugs bug;
  bug.nvfp4_global_recip = true;
  const Tensor good = dequantize(p), bad = dequantize(p, bug);
  const double g2 = double(p.global_scale) * p.global_scale;
  for (int64_t k = 0; k < good.numel(); ++k) {
    if (good.data[k] == 0) continue;
    ASSERT_NEAR(bad.data[k] / good.data[k] / g2, 1.0, 1e-6) << k;
  }
  // ModelOpt's convention multiplies already: the compressed-tensors bug does not apply to it.
  const PackedWeight m = quantize(w, WeightFormat::WeightFormat_nvfp4, "m");
  EXPECT_EQ(dequantize(m).data, dequantize(m, bug).data);
  EXPECT_FALSE(bug.touches(WeightFormat::WeightFormat_nvfp4));
}

}  // namespace
