// The GGUF IQ and TQ types (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0):
// dequantization bit for bit against gguf.quants.dequantize on files gguf.GGUFWriter wrote
// (tests/py/make_iq_fixtures.py), the generated tables against gguf-py's, a checkpoint using every type through
// the loader and the CLI, and the formats' place among --weight-format's (read from GGUF only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "core/model/config.h"
#include "core/model/errors.h"
#include "core/weights/checkpoint_config.h"
#include "core/weights/dequant.h"
#include "core/weights/gguf.h"
#include "core/weights/iq_tables.h"
#include "core/weights/loader.h"
#include "tests/cli_util.h"
#include "tests/test_weights_util.h"

namespace {

using namespace mla;
using namespace mla::test;
using Cli = CliResult;

// The fixtures of make_iq_fixtures.py, made once per process (as weight_fixtures() makes the other script's).
const Fixtures& iq_fixtures() {
  static const Fixtures fx = make_fixtures("make_iq_fixtures.py", "iq_fixtures", "gguf-py");
  return fx;
}

#define MLA_REQUIRE_IQ_FIXTURES()                                        \
  const auto& fx = iq_fixtures();                                        \
  if (fx.skip.rfind("FIXTURE SCRIPT FAILED", 0) == 0) FAIL() << fx.skip; \
  if (!fx.skip.empty()) GTEST_SKIP() << fx.skip

const uint32_t kIqTypes[] = {ggml::IQ1_S,  ggml::IQ1_M, ggml::IQ2_XXS, ggml::IQ2_XS, ggml::IQ2_S, ggml::IQ3_XXS,
                             ggml::IQ3_S, ggml::IQ4_NL, ggml::IQ4_XS, ggml::TQ1_0, ggml::TQ2_0};

// ---------------------------------------------------------------- blocks vs gguf-py

TEST(DequantIq, EveryTypeBitExactWithGgufPy) {
  MLA_REQUIRE_IQ_FIXTURES();
  const GgufFile g(fx.at("iq_quants.gguf").string());
  int checked = 0;
  for (const auto& [name, entry] : fx.manifest.at("iq_quants").items()) {
    SCOPED_TRACE(name);
    const GgufTensorInfo* t = g.find(name);
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->type, entry.at("type").get<uint32_t>());
    const Bytes d = g.data(*t);
    const int64_t cols = t->ne[0], rows = t->numel / cols;
    EXPECT_EQ(cols, 3 * ggml_type_info(t->type)->block);  // several blocks per row
    const int64_t row_bytes = static_cast<int64_t>(t->nbytes) / rows;
    std::vector<float> got(static_cast<size_t>(t->numel));
    for (int64_t r = 0; r < rows; ++r) dequantize_ggml_row(t->type, d.data() + r * row_bytes, got.data() + r * cols, cols);
    const std::vector<float> want = fx.expected(entry.at("expected"));
    EXPECT_TRUE(bit_equal(got, want, name + " (" + ggml_type_name(t->type) + ")"));
    // The same through PackedWeight, as the loader hands a GGUF weight to dequantize().
    PackedWeight p;
    p.format = *weight_format_of_ggml(t->type);
    p.rows = rows;
    p.cols = cols;
    p.data.assign(d.data(), d.data() + d.size());
    EXPECT_TRUE(bit_equal(dequantize(p).data, want, name + " via PackedWeight"));
    // The zero scales of row 0's second and third blocks: signed zeros, so a dropped sign would show.
    const int64_t blk = ggml_type_info(t->type)->block;
    int zeros = 0;
    for (int64_t k = blk; k < 3 * blk; ++k) zeros += want[static_cast<size_t>(k)] == 0.0f;
    EXPECT_EQ(zeros, 2 * blk);
    ++checked;
  }
  EXPECT_EQ(checked, 11);
}

TEST(DequantIq, TablesEqualGgufPys) {
  MLA_REQUIRE_IQ_FIXTURES();
  const auto& t = fx.manifest.at("tables");
  // Grid row r, element j of a table, widened as the dequantizers read it.
  const auto check_grid = [&](const char* name, const auto& table, int width, bool signed_bytes) {
    SCOPED_TRACE(name);
    const std::vector<float> want = fx.expected(t.at(name));
    const size_t rows = std::size(table);
    ASSERT_EQ(want.size(), rows * width);
    for (size_t r = 0; r < rows; ++r)
      for (int j = 0; j < width; ++j) {
        const unsigned byte = static_cast<unsigned>((static_cast<uint64_t>(table[r]) >> (8 * j)) & 0xFF);
        const float v = signed_bytes ? static_cast<float>(static_cast<int8_t>(byte)) : static_cast<float>(byte);
        ASSERT_EQ(v, want[r * width + j]) << "row " << r << " element " << j;
      }
  };
  check_grid("IQ2_XXS", iq::kIq2xxsGrid, 8, false);
  check_grid("IQ2_XS", iq::kIq2xsGrid, 8, false);
  check_grid("IQ2_S", iq::kIq2sGrid, 8, false);
  check_grid("IQ3_XXS", iq::kIq3xxsGrid, 4, false);
  check_grid("IQ3_S", iq::kIq3sGrid, 4, false);
  check_grid("IQ1_S", iq::kIq1sGrid, 8, true);
  const std::vector<float> ks = fx.expected(t.at("ksigns")), kv = fx.expected(t.at("kvalues_iq4nl"));
  ASSERT_EQ(ks.size(), std::size(iq::kKsignsIq2xs));
  for (size_t i = 0; i < ks.size(); ++i) EXPECT_EQ(static_cast<float>(iq::kKsignsIq2xs[i]), ks[i]) << "ksigns " << i;
  ASSERT_EQ(kv.size(), std::size(iq::kKvaluesIq4nl));
  for (size_t i = 0; i < kv.size(); ++i) EXPECT_EQ(static_cast<float>(iq::kKvaluesIq4nl[i]), kv[i]) << "kvalues " << i;
  EXPECT_EQ(iq::kIq1sDelta, t.at("iq1s_delta").get<float>());
}

// Without gguf-py: blocks whose values follow from the layout alone.
TEST(DequantIq, HandBuiltBlocks) {
  // IQ4_NL: d = 2 (fp16 0x4000); byte j holds codes j (low nibble, element j) and 15 - j (high, element j + 16).
  std::vector<uint8_t> nl(18);
  nl[0] = 0x00, nl[1] = 0x40;
  for (int j = 0; j < 16; ++j) nl[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::vector<float> y(32);
  dequantize_ggml_row(ggml::IQ4_NL, nl.data(), y.data(), 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * iq::kKvaluesIq4nl[j]) << j;
    EXPECT_EQ(y[j + 16], 2.0f * iq::kKvaluesIq4nl[15 - j]) << j;
  }
  EXPECT_EQ(y[0], -254.0f);  // kvalues[0] = -127
  // TQ2_0: d = 1 at byte 64; 2-bit codes c - 1 in {-1, 0, 1, 2}, element 32s + l of each 128 from bits 2s of byte l.
  std::vector<uint8_t> t2(66);
  for (int l = 0; l < 64; ++l) t2[l] = static_cast<uint8_t>(0b11100100);  // codes 0, 1, 2, 3 at shifts 0, 2, 4, 6
  t2[64] = 0x00, t2[65] = 0x3C;
  std::vector<float> z(256);
  dequantize_ggml_row(ggml::TQ2_0, t2.data(), z.data(), 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(z[e], static_cast<float>((e % 128) / 32 - 1)) << e;
  // TQ1_0: a byte 0 is digit 0 (value -1) for all its 5 multiples; d = -0.5 makes it +0.5.
  std::vector<uint8_t> t1(54);
  t1[52] = 0x00, t1[53] = 0xB8;  // -0.5
  dequantize_ggml_row(ggml::TQ1_0, t1.data(), z.data(), 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(z[e], 0.5f) << e;
  // IQ2_XXS: grid row 0 is all 8s; sign byte index 0 has no minus; scale nibble 15: d * 15.5 * 0.25 * 8.
  std::vector<uint8_t> xx(66);
  xx[0] = 0x00, xx[1] = 0x3C;                  // d = 1
  for (int ib = 0; ib < 8; ++ib) xx[2 + 8 * ib + 7] = 0xF0;  // aux1 >> 28 = 15
  xx[2 + 4] = 1;  // sub-block 0, l = 0: ksigns[1] = 0x81 (elements 0 and 7 negative)
  dequantize_ggml_row(ggml::IQ2_XXS, xx.data(), z.data(), 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(z[e], (e == 0 || e == 7 ? -31.0f : 31.0f)) << e;
}

TEST(DequantIq, RowsMustBeWholeBlocksAndTypesAreSupported) {
  for (uint32_t t : kIqTypes) {
    SCOPED_TRACE(ggml_type_name(t));
    EXPECT_TRUE(ggml_type_supported(t));
    const auto f = weight_format_of_ggml(t);
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(ggml_type_of(*f), t);
    EXPECT_TRUE(is_gguf_block_format(*f));
    EXPECT_EQ(weight_format_k_multiple(*f), ggml_type_info(t)->block);
    const int64_t n = ggml_type_info(t)->block + 16;
    std::vector<uint8_t> b(static_cast<size_t>(2 * ggml_type_info(t)->type_size));
    std::vector<float> y(static_cast<size_t>(n));
    try {
      dequantize_ggml_row(t, b.data(), y.data(), n);
      ADD_FAILURE() << "no error";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("a ") + ggml_type_name(t) + " row of " + std::to_string(n) +
                                           " elements is not a whole number of blocks"),
                std::string::npos)
          << e.what();
    }
  }
}

// ---------------------------------------------------------------- formats

TEST(DequantIq, FormatsAreReadFromGgufOnly) {
  const auto only = gguf_only_weight_formats();
  EXPECT_EQ(only.size(), std::size(kIqTypes));
  const auto quantizable = all_weight_formats();
  for (WeightFormat f : only) {
    const std::string name = weight_format_name(f);
    SCOPED_TRACE(name);
    EXPECT_FALSE(is_quantizable(f));
    EXPECT_EQ(std::find(quantizable.begin(), quantizable.end(), f), quantizable.end());
    try {
      parse_weight_format(name);
      ADD_FAILURE() << "parsed";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("weight format '" + name + "' is read from GGUF files only"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_TRUE(is_quantizable(WeightFormat::WeightFormat_q4_k));
  EXPECT_EQ(parse_weight_format("Q6_K"), WeightFormat::WeightFormat_q6_k);
  const Cli r = run_cli("run --weight-format iq2_xxs --model tiny --tokens 2", {.merge_stderr = true, .timeout_s = 120});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "'iq2_xxs' is read from GGUF files only");
}

// ---------------------------------------------------------------- a checkpoint of every type, loaded

TEST(DequantIq, CheckpointLoadsExactlyWhatGgufPyDequantizesTo) {
  MLA_REQUIRE_IQ_FIXTURES();
  const auto& m = fx.manifest.at("models").at("gguf_iq");
  const std::string path = fx.at(m.at("path").get<std::string>()).string();
  const MlaConfig cfg = checkpoint_config(path);
  EXPECT_EQ(cfg.hidden, 768);
  EXPECT_EQ(cfg.q_lora_rank, 512);
  EXPECT_EQ(cfg.kv_lora_rank, 512);
  WeightSpec ws;
  ws.source = path;
  const LoadedWeights w = load_weights(ws, cfg, spec_of(2), 0, {}, /*keep_packed=*/true);
  ASSERT_EQ(w.layers.size(), 2u);
  int compared = 0;
  std::set<std::string> types;
  for (int l = 0; l < 2; ++l) {
    for (const auto& [f, entry] : m.at("expected").at(l).items()) {
      const Tensor& t = field(w.layers[l], f);
      EXPECT_EQ(t.shape, entry.at("shape").get<std::vector<int64_t>>()) << f;
      EXPECT_TRUE(bit_equal(t.data, fx.expected(entry), "gguf_iq layer " + std::to_string(l) + " " + f));
      ++compared;
    }
    for (const auto& [f, type] : m.at("types").at(l).items()) types.insert(type.get<std::string>());
    // The packed projections are the file's blocks, in the format named by their ggml type.
    for (const auto& [f, p] : w.packed[l]) {
      const std::string type = m.at("types").at(l).at(f).get<std::string>();
      EXPECT_EQ(ggml_type_name(ggml_type_of(p.format)), type) << f;
      EXPECT_TRUE(bit_equal(dequantize(p).data, field(w.layers[l], f).data, "packed " + f));
    }
  }
  EXPECT_EQ(compared, 16);
  EXPECT_EQ(types.size(), std::size(kIqTypes));  // every type is somewhere in the checkpoint
  for (const char* s : {"iq1_m x1", "iq2_xxs x1", "iq4_nl x1", "tq1_0 x1"})
    EXPECT_NE(w.description.find(s), std::string::npos) << s << ": " << w.description;
}

TEST(DequantIq, InspectAndRunOnTheCheckpoint) {
  MLA_REQUIRE_IQ_FIXTURES();
  const std::string path = fx.at("models/gguf_iq.gguf").string();
  const CliRun how{.merge_stderr = true, .timeout_s = 300};
  for (int layer : {0, 1}) {
    const Cli r = run_cli("inspect '" + path + "' --layer " + std::to_string(layer), how);
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_CONTAINS(r.out, "check     layer " + std::to_string(layer) + " loads and agrees with the config");
    for (const char* t : layer == 0 ? std::vector<const char*>{"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
                                                               "IQ4_NL", "TQ2_0"}
                                    : std::vector<const char*>{"IQ1_S", "IQ1_M", "IQ4_XS", "TQ1_0", "IQ4_NL"})
      EXPECT_CONTAINS(r.out, t);
  }
  const Cli run = run_cli("run --weights '" + path + "' --layers 2 --tokens 3", how);
  EXPECT_EQ(run.exit_code, 0) << run.out;
}

}  // namespace
