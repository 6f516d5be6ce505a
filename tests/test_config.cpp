// MlaConfig: the YaRN and softmax constants of every preset, HF config.json parsing (hand-written files
// in tests/testdata with the real field names), and the error messages of bad configs.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numbers>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/errors.h"
#include "core/weights/checkpoint_config.h"

namespace {

using namespace mla;
using nlohmann::json;

const std::string kTestData = std::string(MLA_SOURCE_DIR) + "/tests/testdata/";

MlaConfig preset(const char* name) {
  auto c = find_preset(name);
  if (!c) throw std::runtime_error(std::string("no preset ") + name);
  return *c;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json testdata(const std::string& file) { return json::parse(read_file(kTestData + file)); }

// The UsageError message thrown by f; a test failure if f throws nothing or something else.
std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected UsageError, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected UsageError, nothing was thrown";
  return "";
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "message: \"" << (text) << "\" lacks \"" << (part) << "\""

std::string parse_error(const json& j) {
  return usage_error([&] { parse_hf_config(j.dump(), "test.json"); });
}

// Every dimension, constant and derived value of two configs (the name and the path differ by design).
void expect_same_config(const MlaConfig& got, const MlaConfig& want) {
  EXPECT_EQ(got.model_type, want.model_type);
  EXPECT_EQ(got.hidden, want.hidden);
  EXPECT_EQ(got.heads, want.heads);
  EXPECT_EQ(got.q_lora_rank, want.q_lora_rank);
  EXPECT_EQ(got.has_q_lora(), want.has_q_lora());
  EXPECT_EQ(got.kv_lora_rank, want.kv_lora_rank);
  EXPECT_EQ(got.qk_nope, want.qk_nope);
  EXPECT_EQ(got.qk_rope, want.qk_rope);
  EXPECT_EQ(got.v_head, want.v_head);
  EXPECT_EQ(got.num_layers, want.num_layers);
  EXPECT_EQ(got.rope_theta, want.rope_theta);
  EXPECT_EQ(got.rms_eps, want.rms_eps);
  EXPECT_EQ(got.rope_scaling, want.rope_scaling);
  EXPECT_EQ(got.rope_style, want.rope_style);
  EXPECT_EQ(got.index_topk, want.index_topk);
  EXPECT_EQ(got.index_n_heads, want.index_n_heads);
  EXPECT_EQ(got.index_head_dim, want.index_head_dim);
  EXPECT_EQ(got.index_rope_style, want.index_rope_style);
  if (want.rope_scaling == RopeScaling::RopeScaling_yarn) {
    EXPECT_EQ(got.yarn.factor, want.yarn.factor);
    EXPECT_EQ(got.yarn.original_max_position, want.yarn.original_max_position);
    EXPECT_EQ(got.yarn.beta_fast, want.yarn.beta_fast);
    EXPECT_EQ(got.yarn.beta_slow, want.yarn.beta_slow);
    EXPECT_EQ(got.yarn.mscale, want.yarn.mscale);
    EXPECT_EQ(got.yarn.mscale_all_dim, want.yarn.mscale_all_dim);
  }
  EXPECT_EQ(got.inv_freq, want.inv_freq);
  EXPECT_EQ(got.rope_mscale, want.rope_mscale);
  EXPECT_EQ(got.softmax_scale, want.softmax_scale);
  EXPECT_EQ(got.yarn_low, want.yarn_low);
  EXPECT_EQ(got.yarn_high, want.yarn_high);
}

// ---------- constants (YaRN frequencies and mscale, softmax scale) ----------

TEST(ConfigConstants, PresetsHaveTheDimensionsOfMlaMd) {
  struct Row {
    const char* name;
    int H, N, Lq, P, V;
    double theta, eps;
    bool yarn;
    double s, beta_fast, beta_slow, mscale, mscale_all;
  };
  const Row rows[] = {
      {"deepseek-v2-lite", 2048, 16, 0, 128, 128, 1e4, 1e-6, true, 40, 32, 1, 0.707, 0.707},
      {"deepseek-v2", 5120, 128, 1536, 128, 128, 1e4, 1e-6, true, 40, 32, 1, 0.707, 0.707},
      {"deepseek-v3", 7168, 128, 1536, 128, 128, 1e4, 1e-6, true, 40, 32, 1, 1.0, 1.0},
      {"kimi-k2", 7168, 64, 1536, 128, 128, 5e4, 1e-6, true, 32, 1, 1, 1.0, 1.0},
      {"glm-4.7-flash", 2048, 20, 768, 192, 256, 1e6, 1e-5, false, 0, 0, 0, 0, 0},
      {"glm-5", 6144, 64, 2048, 192, 256, 1e6, 1e-5, false, 0, 0, 0, 0, 0},
  };
  for (const auto& r : rows) {
    SCOPED_TRACE(r.name);
    const auto c = preset(r.name);
    EXPECT_EQ(c.hidden, r.H);
    EXPECT_EQ(c.heads, r.N);
    EXPECT_EQ(c.q_lora_rank, r.Lq);
    EXPECT_EQ(c.kv_lora_rank, 512);
    EXPECT_EQ(c.qk_nope, r.P);
    EXPECT_EQ(c.qk_rope, 64);
    EXPECT_EQ(c.v_head, r.V);
    EXPECT_EQ(c.cache_row(), 576);
    EXPECT_EQ(c.rope_theta, r.theta);
    EXPECT_EQ(c.rms_eps, r.eps);
    EXPECT_EQ(c.rope_style, RopeStyle::RopeStyle_interleaved);
    EXPECT_EQ(c.rope_scaling == RopeScaling::RopeScaling_yarn, r.yarn);
    if (r.yarn) {
      EXPECT_EQ(c.yarn.factor, r.s);
      EXPECT_EQ(c.yarn.original_max_position, 4096);
      EXPECT_EQ(c.yarn.beta_fast, r.beta_fast);
      EXPECT_EQ(c.yarn.beta_slow, r.beta_slow);
      EXPECT_EQ(c.yarn.mscale, r.mscale);
      EXPECT_EQ(c.yarn.mscale_all_dim, r.mscale_all);
    }
    EXPECT_NO_THROW(c.validate());
  }
  EXPECT_EQ(preset("glm-5").index_topk, 2048);
  // The names the CLI advertises are exactly the presets.
  const std::vector<std::string> names = {"deepseek-v2-lite", "deepseek-v2", "deepseek-v3", "kimi-k2",
                                          "glm-4.7-flash",    "glm-5",       "tiny",        "tiny-dsa"};
  EXPECT_EQ(preset_names(), names);
  EXPECT_FALSE(find_preset("deepseek-v4").has_value());
}

TEST(ConfigConstants, SoftmaxScaleTable) {
  // mscale(s, mscale_all_dim)² / sqrt(P + R), worked out by hand to 6 decimals.
  const std::pair<const char*, double> table[] = {
      {"deepseek-v2-lite", 0.114721}, {"deepseek-v2", 0.114721}, {"deepseek-v3", 0.135234},
      {"kimi-k2", 0.130861},          {"glm-4.7-flash", 0.0625}, {"glm-5", 0.0625},
  };
  for (auto [name, want] : table) {
    SCOPED_TRACE(name);
    const auto c = preset(name);
    EXPECT_LT(std::fabs(c.softmax_scale - want), 5e-7) << "softmax_scale " << c.softmax_scale;
    // Never 1/sqrt(576) (the absorbed row width) and, with YaRN, never the bare 1/sqrt(P+R).
    EXPECT_GT(std::fabs(c.softmax_scale - 1.0 / std::sqrt(576.0)), 1e-3);
    if (c.rope_scaling == RopeScaling::RopeScaling_yarn)
      EXPECT_GT(std::fabs(c.softmax_scale - 1.0 / std::sqrt(double(c.qk_head()))), 1e-3);
  }
  EXPECT_EQ(preset("glm-5").softmax_scale, 1.0 / 16.0);
}

TEST(ConfigConstants, GetMscale) {
  EXPECT_LT(std::fabs(yarn_get_mscale(40, 0.707) - 1.260804), 5e-7);
  EXPECT_LT(std::fabs(yarn_get_mscale(40, 1.0) - 1.368888), 5e-7);
  EXPECT_LT(std::fabs(yarn_get_mscale(32, 1.0) - 1.346574), 5e-7);
  EXPECT_EQ(yarn_get_mscale(1.0, 1.0), 1.0);  // s <= 1: no scaling
  EXPECT_EQ(yarn_get_mscale(0.5, 0.707), 1.0);
  EXPECT_EQ(yarn_get_mscale(40, 0.0), 1.0);
}

TEST(ConfigConstants, YarnCorrectionRange) {
  const std::tuple<const char*, int, int> table[] = {
      {"deepseek-v2-lite", 10, 23}, {"deepseek-v2", 10, 23}, {"deepseek-v3", 10, 23},
      {"kimi-k2", 19, 20},          {"tiny", 0, 2},
  };
  for (auto [name, low, high] : table) {
    SCOPED_TRACE(name);
    const auto c = preset(name);
    EXPECT_EQ(c.yarn_low, low);
    EXPECT_EQ(c.yarn_high, high);
  }
  // dim(β) = R·ln(O/(β·2π)) / (2·ln θ): V3 dim(32) = 10.4722, dim(1) = 22.5134; Kimi-K2 dim(1) = 19.1646.
  EXPECT_NEAR(yarn_correction_dim(32, 64, 1e4, 4096), 10.472241, 1e-6);
  EXPECT_NEAR(yarn_correction_dim(1, 64, 1e4, 4096), 22.513441, 1e-6);
  EXPECT_NEAR(yarn_correction_dim(1, 64, 5e4, 4096), 19.164575, 1e-6);
}

TEST(ConfigConstants, RopeMscaleIsOneForEveryPreset) {
  for (const auto& name : preset_names()) {
    SCOPED_TRACE(name);
    EXPECT_EQ(find_preset(name)->rope_mscale, 1.0);
  }
  // The ratio is what makes it 1: the numerator alone is the rope-mscale bug's 1.37 on V3.
  const auto v3 = preset("deepseek-v3");
  EXPECT_GT(yarn_get_mscale(v3.yarn.factor, v3.yarn.mscale), 1.36);
}

TEST(ConfigConstants, InvFreqFollowsTheYarnRamp) {
  for (const auto& name : preset_names()) {
    SCOPED_TRACE(name);
    const auto c = *find_preset(name);
    const int R = c.qk_rope;
    ASSERT_EQ(static_cast<int>(c.inv_freq.size()), R / 2);
    const bool yarn = c.rope_scaling == RopeScaling::RopeScaling_yarn;
    for (int i = 0; i < R / 2; ++i) {
      SCOPED_TRACE("i " + std::to_string(i));
      const double f = std::pow(c.rope_theta, -2.0 * i / R);
      double want = f;
      if (yarn) {
        const double ramp = std::clamp((i - c.yarn_low) / double(c.yarn_high - c.yarn_low), 0.0, 1.0);
        want = f * (1 - ramp) + f / c.yarn.factor * ramp;
        // Below low: the plain frequency; from high on: divided by s.
        if (i <= c.yarn_low) EXPECT_NEAR(c.inv_freq[i] / f, 1.0, 1e-12);
        if (i >= c.yarn_high) EXPECT_NEAR(c.inv_freq[i] / f, 1.0 / c.yarn.factor, 1e-12);
      }
      EXPECT_NEAR(c.inv_freq[i] / want, 1.0, 1e-12);
    }
  }
}

// ---------- HF config.json ----------

TEST(ConfigParse, DeepSeekV3MatchesPreset) {
  const std::string path = kTestData + "deepseek_v3_config.json";
  const auto c = load_model_config(path);
  EXPECT_EQ(c.name, path);
  expect_same_config(c, preset("deepseek-v3"));
  EXPECT_LT(std::fabs(c.softmax_scale - 0.135234), 5e-7);
}

TEST(ConfigParse, Glm5MatchesPreset) {
  const auto c = load_model_config(kTestData + "glm5_config.json");
  expect_same_config(c, preset("glm-5"));
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_EQ(c.rope_scaling, RopeScaling::RopeScaling_none);
  EXPECT_EQ(c.softmax_scale, 0.0625);
}

// DSA's indexer (docs/mla.md): GLM-5's own config.json, and DeepSeek-V3.2's fields on V3's dims (HF's defaults
// where a config leaves them out: 64 heads for V3.2, 128 lanes; half-split RoPE on V3.2's indexer, interleaved on
// GLM-5's).
TEST(ConfigParse, DsaIndexerOfGlm5AndDeepSeekV32) {
  const auto glm = load_model_config(kTestData + "glm5_config.json");
  EXPECT_TRUE(glm.has_dsa());
  EXPECT_EQ(glm.index_n_heads, 32);
  EXPECT_EQ(glm.index_head_dim, 128);
  EXPECT_EQ(glm.index_rope_style, RopeStyle::RopeStyle_interleaved);
  EXPECT_FALSE(preset("deepseek-v3").has_dsa());

  auto j = testdata("deepseek_v3_config.json");
  j["model_type"] = "deepseek_v32";
  j["index_topk"] = 2048;
  const auto v32 = parse_hf_config(j.dump(), "v32");
  EXPECT_EQ(v32.index_n_heads, 64);
  EXPECT_EQ(v32.index_head_dim, 128);
  EXPECT_EQ(v32.index_rope_style, RopeStyle::RopeStyle_neox);
  j["index_n_heads"] = 16;
  j["index_head_dim"] = 96;
  const auto small = parse_hf_config(j.dump(), "v32");
  EXPECT_EQ(small.index_n_heads, 16);
  EXPECT_EQ(small.index_head_dim, 96);
  const auto round = config_from_json(small.to_json());
  EXPECT_EQ(round.index_n_heads, 16);
  EXPECT_EQ(round.index_head_dim, 96);
  EXPECT_EQ(round.index_rope_style, RopeStyle::RopeStyle_neox);

  // Bad indexer shapes are usage errors that name the field.
  for (const auto& [field, value] : {std::pair{"index_head_dim", 32}, std::pair{"index_head_dim", 97},
                                     std::pair{"index_n_heads", 0}, std::pair{"index_topk", -1}}) {
    auto bad = j;
    bad[field] = value;
    try {
      parse_hf_config(bad.dump(), "v32");
      ADD_FAILURE() << field << " " << value << " accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
}

// GLM-5's shared indexer layers (docs/mla.md): indexer_types, index_topk_pattern, or index_topk_freq with
// index_skip_topk_offset, read as HF's GlmMoeDsaConfig derives them; kept through the model JSON; bad ones refused.
std::vector<bool> shared_of(const std::vector<std::string>& modes) {
  std::vector<bool> v;
  for (const auto& m : modes) v.push_back(m == "shared");
  return v;
}

TEST(ConfigParse, Glm5SharedIndexerLayers) {
  const auto with = [](int layers, const std::function<void(json&)>& set) {
    auto j = testdata("glm5_config.json");
    j["num_hidden_layers"] = layers;
    set(j);
    return parse_hf_config(j.dump(), "glm5");
  };
  EXPECT_TRUE(load_model_config(kTestData + "glm5_config.json").index_shared.empty());  // every layer full
  // Layer i full when max(i - offset + 1, 0) is a multiple of freq: freq 3, offset 2 over 10 layers.
  const auto freq = with(10, [](json& j) { j["index_topk_freq"] = 3, j["index_skip_topk_offset"] = 2; });
  const std::vector<bool> F_F_S_S_F_S_S_F_S_S = {false, false, true, true, false, true, true, false, true, true};
  EXPECT_EQ(freq.index_shared, F_F_S_S_F_S_S_F_S_S);
  EXPECT_EQ(with(6, [](json& j) { j["index_topk_pattern"] = "FFSSFS"; }).index_shared,
            (std::vector<bool>{false, false, true, true, false, true}));
  const auto listed = with(3, [](json& j) { j["indexer_types"] = {"full", "shared", "shared"}; });
  EXPECT_EQ(listed.index_shared, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(config_from_json(listed.to_json()).index_shared, listed.index_shared);
  EXPECT_TRUE(with(4, [](json& j) { j["index_topk_freq"] = 1; }).index_shared.empty());
  // Refused, naming the field: a layer 0 with nothing to share, a wrong length, an unknown mode or letter.
  for (const auto& [set, words] :
       std::vector<std::pair<std::function<void(json&)>, std::string>>{
           {[](json& j) { j["index_topk_freq"] = 4, j["index_skip_topk_offset"] = 0; }, "layer 0 shared"},
           {[](json& j) { j["indexer_types"] = {"full", "shared"}; }, "indexer_types has 2 entries for 4 layers"},
           {[](json& j) { j["indexer_types"] = {"full", "sparse", "full", "full"}; }, "indexer_types[1] is 'sparse'"},
           {[](json& j) { j["index_topk_pattern"] = "FFXF"; }, "index_topk_pattern has 'X'"}}) {
    try {
      with(4, set);
      ADD_FAILURE() << words << ": accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  }
  // HF's own derivation (GlmMoeDsaConfig), where the Python beside the tests has it.
  const std::string py = MLA_PYTHON_EXE;
  if (py.empty() || std::system(("'" + py + "' -c 'import transformers.models.glm_moe_dsa' 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "no Python with transformers' glm_moe_dsa: HF's derivation not compared";
  const std::string out = (std::filesystem::temp_directory_path() / ("hf_indexer_types_" +
                                                                      std::to_string(getpid()) + ".json")).string();
  const std::string script =
      "import json, sys\n"
      "from transformers.models.glm_moe_dsa.configuration_glm_moe_dsa import GlmMoeDsaConfig as C\n"
      "cases = [dict(num_hidden_layers=10, index_topk_freq=3, index_skip_topk_offset=2),\n"
      "         dict(num_hidden_layers=9, index_topk_freq=2, index_skip_topk_offset=1),\n"
      "         dict(num_hidden_layers=12, index_topk_freq=4, index_skip_topk_offset=3),\n"
      "         dict(num_hidden_layers=6, index_topk_pattern='FSFFSS')]\n"
      "json.dump([[c, C(**c).indexer_types] for c in cases], open(sys.argv[1], 'w'))\n";
  ASSERT_EQ(std::system(("'" + py + "' -c \"" + script + "\" '" + out + "'").c_str()), 0);
  const json hf = json::parse(read_file(out));
  std::filesystem::remove(out);
  ASSERT_EQ(hf.size(), 4u);
  for (const auto& c : hf) {
    SCOPED_TRACE(c[0].dump());
    auto j = testdata("glm5_config.json");
    for (const auto& [k, v] : c[0].items()) j[k] = v;
    EXPECT_EQ(parse_hf_config(j.dump(), "glm5").index_shared, shared_of(c[1].get<std::vector<std::string>>()));
  }
}

TEST(ConfigParse, KimiK2MatchesPreset) {
  expect_same_config(load_model_config(kTestData + "kimi_k2_config.json"), preset("kimi-k2"));
}

TEST(ConfigParse, DeepSeekV2LiteWithNullQLora) {
  const auto c = load_model_config(kTestData + "deepseek_v2_lite_config.json");
  EXPECT_FALSE(c.has_q_lora());
  EXPECT_EQ(c.q_lora_rank, 0);
  expect_same_config(c, preset("deepseek-v2-lite"));
  EXPECT_LT(std::fabs(c.softmax_scale - 0.114721), 5e-7);
}

// transformers >= 5 moves rope_theta and the scaling into rope_parameters (rope_type, not type).
TEST(ConfigParse, RopeParametersOfNewerTransformers) {
  {
    SCOPED_TRACE("yarn in rope_parameters");
    const auto j = testdata("deepseek_v3_rope_parameters_config.json");
    ASSERT_FALSE(j.contains("rope_scaling"));
    ASSERT_FALSE(j.contains("rope_theta"));
    expect_same_config(parse_hf_config(j.dump(), "v3"), preset("deepseek-v3"));
  }
  {
    SCOPED_TRACE("default rope in rope_parameters, theta 1e6");
    const auto c = load_model_config(kTestData + "glm47_flash_rope_parameters_config.json");
    expect_same_config(c, preset("glm-4.7-flash"));
    EXPECT_EQ(c.rope_theta, 1e6);
  }
  {
    SCOPED_TRACE("rope_scaling: null beside rope_parameters");
    auto j = testdata("deepseek_v3_rope_parameters_config.json");
    j["rope_scaling"] = nullptr;
    expect_same_config(parse_hf_config(j.dump(), "v3"), preset("deepseek-v3"));
  }
}

TEST(ConfigParse, DirectoryHoldingConfigJson) {
  const auto dir = std::filesystem::temp_directory_path() / ("mla_test_config_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kTestData + "glm5_config.json", dir / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  const auto c = load_model_config(dir.string());
  std::filesystem::remove_all(dir);
  expect_same_config(c, preset("glm-5"));
}

TEST(ConfigParse, ToJsonRoundTripsEveryPreset) {
  for (const auto& name : preset_names()) {
    SCOPED_TRACE(name);
    const auto want = *find_preset(name);
    const auto got = config_from_json(want.to_json());
    EXPECT_EQ(got.name, name);
    expect_same_config(got, want);
  }
}

TEST(ConfigParse, NeoxRopeFromRopeInterleaveFalse) {
  auto j = testdata("deepseek_v3_config.json");
  j["rope_interleave"] = false;
  EXPECT_EQ(parse_hf_config(j.dump(), "t").rope_style, RopeStyle::RopeStyle_neox);
  j["rope_interleave"] = true;
  EXPECT_EQ(parse_hf_config(j.dump(), "t").rope_style, RopeStyle::RopeStyle_interleaved);
}

// ---------- errors: UsageError with a message that says what and where ----------

TEST(ConfigErrors, NonPositiveDimensions) {
  const auto base = testdata("deepseek_v3_config.json");
  for (const char* field : {"hidden_size", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
                            "qk_rope_head_dim", "v_head_dim"}) {
    for (int v : {0, -2}) {
      SCOPED_TRACE(std::string(field) + " = " + std::to_string(v));
      auto j = base;
      j[field] = v;
      const auto msg = parse_error(j);
      EXPECT_CONTAINS(msg, field);
      EXPECT_CONTAINS(msg, "positive");
      EXPECT_CONTAINS(msg, std::to_string(v));
    }
  }
  auto j = base;
  j["q_lora_rank"] = -1536;
  EXPECT_CONTAINS(parse_error(j), "q_lora_rank");
}

TEST(ConfigErrors, OddRopeDimension) {
  auto j = testdata("deepseek_v3_config.json");
  j["qk_rope_head_dim"] = 63;
  const auto msg = parse_error(j);
  EXPECT_CONTAINS(msg, "qk_rope_head_dim");
  EXPECT_CONTAINS(msg, "even");
  EXPECT_CONTAINS(msg, "63");
}

TEST(ConfigErrors, UnknownRopeType) {
  auto j = testdata("deepseek_v3_config.json");
  j["rope_scaling"]["type"] = "longrope";
  auto msg = parse_error(j);
  EXPECT_CONTAINS(msg, "unknown rope type 'longrope'");
  auto k = testdata("deepseek_v3_rope_parameters_config.json");
  k["rope_parameters"]["rope_type"] = "dynamic";
  msg = parse_error(k);
  EXPECT_CONTAINS(msg, "unknown rope type 'dynamic'");
}

TEST(ConfigErrors, MalformedJson) {
  const std::string text = read_file(kTestData + "deepseek_v3_config.json");
  for (const std::string& bad : {text.substr(0, text.size() / 2), std::string("{\"hidden_size\": 7168,}"),
                                 std::string(""), std::string("{'model_type': 'deepseek_v3'}")}) {
    SCOPED_TRACE(bad.substr(0, 40));
    const auto msg = usage_error([&] { parse_hf_config(bad, "cfg.json"); });
    EXPECT_CONTAINS(msg, "cfg.json");
    EXPECT_CONTAINS(msg, "malformed JSON");
  }
}

TEST(ConfigErrors, TopLevelMustBeAnObject) {
  for (const char* text : {"[1, 2, 3]", "42", "\"deepseek_v3\"", "null", "true"}) {
    SCOPED_TRACE(text);
    const auto msg = usage_error([&] { parse_hf_config(text, "cfg.json"); });
    EXPECT_CONTAINS(msg, "cfg.json");
    EXPECT_CONTAINS(msg, "expected a JSON object");
  }
}

TEST(ConfigErrors, WrongFieldTypes) {
  const auto base = testdata("deepseek_v3_config.json");
  struct Case {
    const char* field;
    json value;
    const char* says;
  };
  const Case cases[] = {
      {"hidden_size", "7168", "must be an integer"},
      {"num_attention_heads", 128.5, "must be an integer"},
      {"kv_lora_rank", json::array({512}), "must be an integer"},
      {"hidden_size", 1LL << 40, "out of range"},
      {"rope_theta", "10000", "must be a number"},
      {"rms_norm_eps", true, "must be a number"},
      {"rope_interleave", "yes", "must be true or false"},
      {"model_type", 3, "must be a string"},
      {"rope_scaling", 40, "rope_scaling must be an object or null"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.field) + " = " + c.value.dump());
    auto j = base;
    j[c.field] = c.value;
    const auto msg = parse_error(j);
    EXPECT_CONTAINS(msg, c.field);
    EXPECT_CONTAINS(msg, c.says);
  }
  auto j = base;
  j["rope_scaling"]["factor"] = "40";
  const auto msg = parse_error(j);
  EXPECT_CONTAINS(msg, "factor");
  EXPECT_CONTAINS(msg, "must be a number");
}

TEST(ConfigErrors, MissingFieldsAndNonMlaModels) {
  auto j = testdata("deepseek_v3_config.json");
  j.erase("kv_lora_rank");
  EXPECT_CONTAINS(parse_error(j), "missing field 'kv_lora_rank'");
  j = testdata("deepseek_v3_config.json");
  j.erase("qk_rope_head_dim");
  EXPECT_CONTAINS(parse_error(j), "missing field 'qk_rope_head_dim'");
  j = testdata("deepseek_v3_config.json");
  j["rope_scaling"].erase("factor");
  EXPECT_CONTAINS(parse_error(j), "missing field 'factor'");
  const json llama = {{"model_type", "llama"}, {"hidden_size", 4096}, {"num_attention_heads", 32}};
  const auto msg = parse_error(llama);
  EXPECT_CONTAINS(msg, "llama");
  EXPECT_CONTAINS(msg, "not an MLA model");
}

TEST(ConfigErrors, DeepNestingIsRejectedWithoutCrashing) {
  const int depth = 100000;
  const std::string arrays = std::string(depth, '[') + std::string(depth, ']');
  const std::string in_field = "{\"model_type\": \"deepseek_v3\", \"extra\": " + std::string(depth, '[') +
                               std::string(depth, ']') + "}";
  std::string objects;
  for (int i = 0; i < depth; ++i) objects += "{\"a\":";
  objects += "1" + std::string(depth, '}');
  const std::string unclosed(depth, '{');
  for (const std::string* text : std::vector<const std::string*>{&arrays, &in_field, &objects, &unclosed}) {
    SCOPED_TRACE(text->substr(0, 30));
    const auto msg = usage_error([&] { parse_hf_config(*text, "deep.json"); });
    EXPECT_CONTAINS(msg, "deep.json");
    EXPECT_CONTAINS(msg, "nested deeper than");
  }
  // Brackets inside strings are text, not nesting; escaped quotes do not end a string.
  auto j = testdata("deepseek_v3_config.json");
  j["comment"] = "\"[" + std::string(depth, '[') + "{";
  EXPECT_NO_THROW(parse_hf_config(j.dump(), "strings.json"));
  // Modest real nesting (quantization_config, auto_map) is fine.
  j["extra"] = json::parse(std::string(30, '[') + std::string(30, ']'));
  EXPECT_NO_THROW(parse_hf_config(j.dump(), "nested.json"));
}

// A head dim or layer count no model has is refused before a table is sized by it (the config fuzzer's input: a
// qk_rope_head_dim of 64887874 asked for a 260 MB rope table).
TEST(ConfigErrors, SizesPastAnyModelAreRefused) {
  auto j = testdata("deepseek_v3_config.json");
  j["qk_rope_head_dim"] = 64887874;
  auto msg = usage_error([&] { parse_hf_config(j.dump(), "huge.json"); });
  EXPECT_CONTAINS(msg, "qk_rope_head_dim must be at most 65536, got 64887874");
  j = testdata("deepseek_v3_config.json");
  j["v_head_dim"] = 65538;
  EXPECT_CONTAINS(usage_error([&] { parse_hf_config(j.dump(), "huge.json"); }), "v_head_dim must be at most 65536");
  j = testdata("deepseek_v3_config.json");
  j["qk_nope_head_dim"] = 65536;  // the bound itself is accepted
  EXPECT_NO_THROW(parse_hf_config(j.dump(), "wide.json"));
  // A layer count past any model's, before the indexer's per-layer modes are listed by it.
  j = testdata("glm5_config.json");
  j["num_hidden_layers"] = 2000000000;
  j["index_topk_freq"] = 2;
  EXPECT_CONTAINS(usage_error([&] { parse_hf_config(j.dump(), "deep.json"); }),
                  "num_hidden_layers must be 1 .. 100000, got 2000000000");
  j["num_hidden_layers"] = 0;
  EXPECT_CONTAINS(usage_error([&] { parse_hf_config(j.dump(), "deep.json"); }), "num_hidden_layers must be 1");
}

TEST(ConfigErrors, HeadsMustDivideByTp) {
  const auto flash = preset("glm-4.7-flash");
  auto msg = usage_error([&] { flash.validate_tp(8); });
  EXPECT_CONTAINS(msg, "20");
  EXPECT_CONTAINS(msg, "heads");
  EXPECT_CONTAINS(msg, "tp 8");
  for (int tp : {1, 2, 4, 5, 10, 20}) EXPECT_NO_THROW(flash.validate_tp(tp)) << "tp " << tp;
  for (int tp : {3, 8, 16, 40}) EXPECT_THROW(flash.validate_tp(tp), UsageError) << "tp " << tp;
  const auto v3 = preset("deepseek-v3");
  msg = usage_error([&] { v3.validate_tp(3); });
  EXPECT_CONTAINS(msg, "128");
  EXPECT_CONTAINS(msg, "tp 3");
  for (int tp : {1, 2, 4, 8, 16, 128}) EXPECT_NO_THROW(v3.validate_tp(tp)) << "tp " << tp;
  EXPECT_CONTAINS(usage_error([&] { v3.validate_tp(0); }), "--tp must be positive");
  // Through a run spec, as the CLI reaches it.
  RunSpec spec;
  spec.tp = 8;
  msg = usage_error([&] { spec.validate(flash); });
  EXPECT_CONTAINS(msg, "20");
  EXPECT_CONTAINS(msg, "tp 8");
}

TEST(ConfigErrors, UnknownModelSpec) {
  const auto msg = usage_error([] { load_model_config("/nonexistent/mla/config.json"); });
  EXPECT_CONTAINS(msg, "/nonexistent/mla/config.json");
  EXPECT_CONTAINS(msg, "neither a preset");
  EXPECT_CONTAINS(msg, "deepseek-v3");  // lists the presets
}

}  // namespace
