// From checkpoints to LayerWeights: HF and GGUF naming, configs from config.json and from GGUF metadata,
// contradictions, layer ranges, --weight-format on synthetic weights, the weight injections, and the CLI
// end to end (run, bisect, zoo, inspect) on checkpoints written by gguf / safetensors.
#include <gtest/gtest.h>

#include "core/model/config.h"
#include "core/model/errors.h"
#include "core/weights/checkpoint_config.h"
#include "core/weights/loader.h"
#include "tests/cli_util.h"
#include "tests/test_weights_util.h"

namespace {

using namespace mla;
using namespace mla::test;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

// The mini config every fixture checkpoint has (tests/py/make_weight_fixtures.py MINI).
void expect_mini_config(const MlaConfig& c, bool q_lora = true) {
  EXPECT_EQ(c.hidden, 256);
  EXPECT_EQ(c.heads, 4);
  EXPECT_EQ(c.q_lora_rank, q_lora ? 256 : 0);
  EXPECT_EQ(c.kv_lora_rank, 256);
  EXPECT_EQ(c.qk_nope, 32);
  EXPECT_EQ(c.qk_rope, 16);
  EXPECT_EQ(c.v_head, 64);
  EXPECT_EQ(c.rope_scaling, RopeScaling::RopeScaling_yarn);
  EXPECT_EQ(c.yarn.factor, 4.0);
  EXPECT_EQ(c.yarn.original_max_position, 64);
  EXPECT_DOUBLE_EQ(c.rope_mscale, 1.0);
}

// ---------------------------------------------------------------- every fixture checkpoint, bit for bit

class FixtureModels : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureModels, LoadsExactlyWhatTheProducingLibraryDequantizesTo) {
  MLA_REQUIRE_WEIGHT_FIXTURES();
  const auto& m = fx.manifest.at("models").at(GetParam());
  const std::string path = fx.at(m.at("path").get<std::string>()).string();
  const MlaConfig cfg = checkpoint_config(path);
  expect_mini_config(cfg, GetParam() != "hf_bf16_noqlora");
  const int layers = m.at("layers").get<int>();
  WeightSpec ws;
  ws.source = path;
  const LoadedWeights w = load_weights(ws, cfg, spec_of(layers), 0, {}, /*keep_packed=*/true);
  ASSERT_EQ(static_cast<int>(w.layers.size()), layers);
  EXPECT_EQ(w.packed.size(), static_cast<size_t>(layers));
  int compared = 0;
  for (int l = 0; l < layers; ++l)
    for (const auto& [f, entry] : m.at("expected").at(l).items()) {
      const Tensor& t = field(w.layers[l], f);
      EXPECT_EQ(t.shape, entry.at("shape").get<std::vector<int64_t>>()) << f;
      EXPECT_TRUE(bit_equal(t.data, fx.expected(entry), GetParam() + " layer " + std::to_string(l) + " " + f));
      ++compared;
    }
  EXPECT_GE(compared, 7 * layers - 1);
  EXPECT_NE(w.description.find(path), std::string::npos) << w.description;
}

INSTANTIATE_TEST_SUITE_P(Weights, FixtureModels,
                         ::testing::Values("hf_fp8", "modelopt_nvfp4", "ct_nvfp4", "mxfp4", "hf_bf16_noqlora",
                                           "hf_glm_dsa", "gguf_kmix", "gguf_split"));

TEST(WeightsLoader, FormatsDetectedPerFamily) {
  MLA_REQUIRE_WEIGHT_FIXTURES();
  const std::map<std::string, std::string> want = {
      {"hf_fp8", "fp8 x10"}, {"modelopt_nvfp4", "nvfp4 x10"}, {"ct_nvfp4", "nvfp4-ct x10"}, {"mxfp4", "mxfp4 x10"},
      {"gguf_kmix", "q4_k x4, q5_k x2, q6_k x4"}, {"gguf_split", "f16 x2, q4_0 x2, q4_1 x2, q5_1 x2, q8_0 x4"}};
  for (const auto& [name, formats] : want) {
    const std::string path = fx.at(fx.manifest.at("models").at(name).at("path").get<std::string>()).string();
    WeightSpec ws;
    ws.source = path;
    const auto w = load_weights(ws, checkpoint_config(path), spec_of(2), 0);
    EXPECT_NE(w.description.find(formats), std::string::npos) << name << ": " << w.description;
  }
}

TEST(WeightsLoader, GgufMetadataGivesTheSameConfigAsConfigJson) {
  MLA_REQUIRE_WEIGHT_FIXTURES();
  const MlaConfig a = checkpoint_config(fx.at("models/gguf_kmix.gguf").string());   // key_length = P+R
  const MlaConfig b = checkpoint_config(fx.at("models/gguf_split.gguf").string());  // key_length_mla = P+R
  const MlaConfig c = checkpoint_config(fx.at("models/hf_fp8").string());
  for (const MlaConfig* x : {&a, &b}) {
    EXPECT_EQ(x->model_type, "deepseek_v2");
    EXPECT_EQ(x->num_layers, 2);
    EXPECT_DOUBLE_EQ(x->softmax_scale, c.softmax_scale);
    EXPECT_EQ(x->inv_freq, c.inv_freq);
    EXPECT_DOUBLE_EQ(x->rms_eps, static_cast<double>(1e-6f));  // stored as f32 in GGUF
  }
  // --model FILE.gguf reads the metadata too.
  EXPECT_EQ(load_model_config(fx.at("models/gguf_kmix.gguf").string()).hidden, 256);
  EXPECT_EQ(load_model_config(fx.at("models/hf_bf16_noqlora/model.safetensors").string()).q_lora_rank, 0);
}

TEST(WeightsLoader, ContradictionsNameTheTensorAndTheConfig) {
  MLA_REQUIRE_WEIGHT_FIXTURES();
  WeightSpec ws;
  ws.source = fx.at("models/gguf_kmix.gguf").string();
  MlaConfig wrong = checkpoint_config(ws.source);
  wrong.heads = 8;
  wrong.name = "my-config";
  std::string e = error_of([&] { load_weights(ws, wrong, spec_of(1), 0); });
  EXPECT_NE(e.find("tensor 'blk.0.attn_q_b.weight' (Q6_K, ne [256, 192])"), std::string::npos) << e;
  EXPECT_NE(e.find("is [192,256] but the model config 'my-config' expects [384,256]"), std::string::npos) << e;
  EXPECT_NE(e.find("num_attention_heads*(qk_nope_head_dim+qk_rope_head_dim), q_lora_rank] = [8*(32+16), 256]"),
            std::string::npos) << e;
  // A preset that does not match the checkpoint at all.
  e = error_of([&] { load_weights(ws, *find_preset("tiny"), spec_of(1), 0); });
  EXPECT_NE(e.find("but the model config 'tiny' expects"), std::string::npos) << e;
  // q LoRA in the config, q_proj in the checkpoint.
  ws.source = fx.at("models/hf_bf16_noqlora").string();
  MlaConfig lora = checkpoint_config(ws.source);
  lora.q_lora_rank = 256;
  e = error_of([&] { load_weights(ws, lora, spec_of(1), 0); });
  EXPECT_NE(e.find("has q_lora_rank 256 but layer 0 has no model.layers.0.self_attn.q_a_proj.weight (it has q_proj"),
            std::string::npos) << e;
  // safetensors shapes
  ws.source = fx.at("models/hf_fp8").string();
  MlaConfig v = checkpoint_config(ws.source);
  v.v_head = 32;
  e = error_of([&] { load_weights(ws, v, spec_of(1), 0); });
  EXPECT_NE(e.find("model.layers.0.self_attn.kv_b_proj.weight' (F8_E4M3 [384,256]) is [384,256] but the model config"),
            std::string::npos) << e;
}

TEST(WeightsLoader, LayerRangeReadsOnlyThoseLayers) {
  MLA_REQUIRE_WEIGHT_FIXTURES();
  const auto& m = fx.manifest.at("models").at("hf_fp8");
  WeightSpec ws;
  ws.source = fx.at("models/hf_fp8").string();
  ws.layer_range = "1:2";
  const MlaConfig cfg = checkpoint_config(ws.source);
  const auto w = load_weights(ws, cfg, spec_of(1), 0);
  ASSERT_EQ(w.layers.size(), 1u);
  EXPECT_EQ(w.first_layer, 1);
  EXPECT_TRUE(bit_equal(w.layers[0].o_proj.data, fx.expected(m.at("expected").at(1).at("o_proj")), "layer 1 o_proj"));
  EXPECT_NE(w.description.find("layer 1"), std::string::npos) << w.description;
  ws.layer_range = "2:3";
  EXPECT_NE(error_of([&] { load_weights(ws, cfg, spec_of(1), 0); }).find("no layer 2 (model.layers.2.self_attn.*); the checkpoint has 2 MLA layers, 0..1"),
            std::string::npos);
  ws.layer_range = "0:2";
  EXPECT_NE(error_of([&] { load_weights(ws, cfg, spec_of(1), 0); }).find("--layer-range 0:2 holds 2 layers but the run has --layers 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_layer_range("3:1"); }).find("B must be greater than A"), std::string::npos);
  EXPECT_NE(error_of([] { parse_layer_range("x"); }).find("'x' is not a non-negative integer"), std::string::npos);
  ws.source = fx.at("models/gguf_split.gguf").string();
  ws.layer_range = "5";
  EXPECT_NE(error_of([&] { load_weights(ws, cfg, spec_of(1), 0); }).find("no tensor 'blk.5.attn_kv_a_mqa.weight' (the file has MLA layers 0..1)"),
            std::string::npos);
}

// ---------------------------------------------------------------- synthetic weights through a format

TEST(WeightsLoader, SyntheticWeightFormatQuantizesThenDequantizes) {
  const MlaConfig cfg = *find_preset("tiny");
  const RunSpec spec = spec_of(2);
  WeightSpec plain;
  const auto ref = load_weights(plain, cfg, spec, 5);
  const auto syn = synthetic_weights(cfg, 2, true, 5);
  EXPECT_EQ(ref.layers[1].kv_b_proj.data, syn[1].kv_b_proj.data);  // no format: the synthetic weights as they are
  for (const char* f : {"bf16", "fp8", "fp8:16", "nvfp4", "nvfp4-ct", "f16"}) {
    SCOPED_TRACE(f);
    WeightSpec ws;
    ws.format = f;
    const auto q = load_weights(ws, cfg, spec, 5, {}, true);
    EXPECT_EQ(q.packed.at(0).at("q_a_proj").format, parse_format_choice(f).format);
    EXPECT_EQ(q.layers[0].kv_a_norm.data, syn[0].kv_a_norm.data);  // norms stay FP32
    if (std::string(f) == "bf16") EXPECT_EQ(q.layers[0].o_proj.data, syn[0].o_proj.data);  // synthetic is bf16-exact
    else if (std::string(f) != "f16") EXPECT_NE(q.layers[0].o_proj.data, syn[0].o_proj.data);
  }
  WeightSpec k;
  k.format = "q4_k";  // tiny's 64-wide hidden size is not a multiple of 256
  EXPECT_NE(error_of([&] { load_weights(k, cfg, spec, 5); })
                .find("synthetic layer 0 q_a_proj [48,64]: --weight-format q4_k quantizes the input dimension in "
                      "blocks of 256, and 64 is not a multiple of it"),
            std::string::npos);
  k.format = "q4_0:3";
  EXPECT_NE(error_of([&] { load_weights(k, cfg, spec, 5); }).find("only fp8 takes a block size"), std::string::npos);
  WeightSpec r;
  r.layer_range = "2:4";
  EXPECT_EQ(load_weights(r, cfg, spec, 5).layers[0].o_proj.data, synthetic_weights(cfg, 4, true, 5)[2].o_proj.data);
}

TEST(WeightsLoader, CheckpointRequantizedThroughAnotherFormat) {
  MLA_REQUIRE_WEIGHT_FIXTURES();
  WeightSpec ws;
  ws.source = fx.at("models/gguf_split.gguf").string();
  const MlaConfig cfg = checkpoint_config(ws.source);
  const auto stored = load_weights(ws, cfg, spec_of(2), 0);
  ws.format = "q8_0";
  const auto q = load_weights(ws, cfg, spec_of(2), 0, {}, true);
  for (const char* f : {"q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj", "o_proj"})
    EXPECT_EQ(q.packed.at(1).at(f).format, WeightFormat::WeightFormat_q8_0) << f;
  EXPECT_TRUE(q.packed.at(1).count("attn_k_b"));  // the split form as stored, for engines that want it
  double num = 0, den = 0;
  const auto& a = q.layers[1].kv_b_proj.data;
  const auto& b = stored.layers[1].kv_b_proj.data;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * double(a[i] - b[i]), den += double(b[i]) * b[i];
  EXPECT_LT(std::sqrt(num / den), 0.01);  // Q8_0's noise (see Quantize.EveryFormatRoundTripsWithinItsPrecision)
  EXPECT_GT(num, 0.0);
}

TEST(WeightsLoader, WeightInjectionsCorruptOnlyTheirFormat) {
  const MlaConfig cfg = *find_preset("tiny");
  const RunSpec spec = spec_of(1);
  WeightSpec ws;
  ws.format = "nvfp4-ct";
  const auto clean = load_weights(ws, cfg, spec, 1);
  const auto recip = load_weights(ws, cfg, spec, 1, parse_injections("nvfp4-global-recip"));
  const auto swap = load_weights(ws, cfg, spec, 1, parse_injections("nvfp4-nibble-swap"));
  EXPECT_NE(recip.layers[0].q_a_proj.data, clean.layers[0].q_a_proj.data);
  EXPECT_NE(swap.layers[0].o_proj.data, clean.layers[0].o_proj.data);
  EXPECT_EQ(swap.layers[0].q_a_norm.data, clean.layers[0].q_a_norm.data);
  std::string e = error_of([&] { load_weights(ws, cfg, spec, 1, parse_injections("fp8-scale-transpose")); });
  EXPECT_NE(e.find("this run's weights are nvfp4-ct x5"), std::string::npos) << e;
  EXPECT_NE(e.find("fp8-scale-transpose needs --weight-format fp8"), std::string::npos) << e;
  ws.format.clear();
  e = error_of([&] { load_weights(ws, cfg, spec, 1, parse_injections("nvfp4-global-recip")); });
  EXPECT_NE(e.find("unquantized FP32"), std::string::npos) << e;
  EXPECT_NE(e.find("needs --weight-format nvfp4-ct"), std::string::npos) << e;
  ws.format = "fp8:16";
  EXPECT_NE(load_weights(ws, cfg, spec, 1, parse_injections("fp8-scale-transpose")).layers[0].q_a_proj.data,
            load_weights(ws, cfg, spec, 1).layers[0].q_a_proj.data);
  // Engines never see the weight injections.
  const auto list = parse_injections("rope-neox,nvfp4-nibble-swap,nan-at:q_c:3");
  const auto eng = engine_injections(list);
  ASSERT_EQ(eng.size(), 2u);
  EXPECT_EQ(eng[0].name, "rope-neox");
  EXPECT_EQ(eng[1].name, "nan-at");
}

// ---------------------------------------------------------------- the CLI end to end

using Cli = test::CliResult;
// mla-bisect ARGS, stderr into stdout, at most 10 minutes (a zoo over quantized weights is the longest).
Cli mla_bisect(const std::string& args) { return run_cli(args, {.merge_stderr = true, .timeout_s = 600}); }

TEST(WeightsCli, RunOnEveryCheckpointFamily) {
  MLA_REQUIRE_WEIGHT_FIXTURES();
  for (const char* m : {"models/hf_fp8", "models/modelopt_nvfp4", "models/ct_nvfp4", "models/mxfp4/model.safetensors",
                        "models/gguf_kmix.gguf", "models/gguf_split.gguf"}) {
    SCOPED_TRACE(m);
    const Cli r = mla_bisect("run --weights '" + fx.at(m).string() + "' --layers 2 --tokens 6");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("weights " + fx.at(m).string()), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("h_out"), std::string::npos) << r.out;  // layers start at h (input_layernorm)
  }
  const Cli one = mla_bisect("run --weights '" + fx.at("models/hf_bf16_noqlora").string() + "' --layer-range 0:1 --tokens 3");
  EXPECT_EQ(one.exit_code, 0) << one.out;
  EXPECT_NE(one.out.find("q_nope"), std::string::npos) << one.out;
  const Cli bad = mla_bisect("run --weights '" + fx.at("models/gguf_kmix.gguf").string() + "' --model tiny --tokens 3");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.out.find("error: "), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("but the model config 'tiny' expects"), std::string::npos) << bad.out;
  const Cli range = mla_bisect("run --weights '" + fx.at("models/gguf_kmix.gguf").string() + "' --layer-range 0:2 --layers 3");
  EXPECT_EQ(range.exit_code, 2) << range.out;
  EXPECT_NE(range.out.find("--layer-range 0:2 holds 2 layers but --layers is 3"), std::string::npos) << range.out;
}

TEST(WeightsCli, BisectOnCheckpointsFindsNothingWhenCleanAndTheInjectionWhenPlanted) {
  MLA_REQUIRE_WEIGHT_FIXTURES();
  const auto work = scratch("bisect");
  for (const char* m : {"models/hf_fp8", "models/modelopt_nvfp4", "models/gguf_kmix.gguf", "models/gguf_split.gguf"}) {
    SCOPED_TRACE(m);
    const Cli r = mla_bisect("bisect --weights '" + fx.at(m).string() + "' --layers 2 --tokens 8 --brief --workdir '" +
                          (work / "clean").string() + "'");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("no divergence"), std::string::npos) << r.out;
  }
  // An NVFP4 nibble swap in a ModelOpt checkpoint's loader: found at the first projection, isolated there.
  const Cli r = mla_bisect("bisect --weights '" + fx.at("models/modelopt_nvfp4").string() +
                        "' --layers 2 --tokens 8 --inject nvfp4-nibble-swap --workdir '" + (work / "swap").string() + "'");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("first divergence: layer 0 weight q_a_proj (stage q_a_proj), then probe q_a"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("WEIGHT DIFFERS: layer 0 q_a_proj"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("introduced by stage q_a_proj"), std::string::npos) << r.out;
}

TEST(WeightsCli, ZooLocalizesTheWeightInjections) {
  const auto work = scratch("zoo");
  const Cli r = mla_bisect("zoo --only fp8-scale-transpose,nvfp4-nibble-swap,nvfp4-global-recip --workdir '" +
                        (work / "z").string() + "'");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("3 of 3 as expected"), std::string::npos) << r.out;
}

TEST(WeightsCli, InspectDescribesWeightFiles) {
  MLA_REQUIRE_WEIGHT_FIXTURES();
  const Cli g = mla_bisect("inspect '" + fx.at("models/gguf_split.gguf").string() + "'");
  EXPECT_EQ(g.exit_code, 0) << g.out;
  for (const char* s : {"GGUF v3", "deepseek2.attention.kv_lora_rank (u32) = 256", "blk.1.attn_k_b.weight",
                        "F16     [4, 256, 32]", "attn_k_b [N, L, P] + attn_v_b [N, V, L]", "2 attention layers (0..1)",
                        "config    deepseek_v2: hidden 256, heads 4, q_lora_rank 256, kv_lora_rank 256, qk_nope 32, "
                        "qk_rope 16, v_head 64",
                        "check     layer 0 loads and agrees with the config"})
    EXPECT_NE(g.out.find(s), std::string::npos) << s << "\n" << g.out;
  const Cli s = mla_bisect("inspect '" + fx.at("models/hf_fp8").string() + "' --layer 1");
  EXPECT_EQ(s.exit_code, 0) << s.out;
  for (const char* t : {"safetensors, 2 files", "model.layers.1.self_attn.q_b_proj.weight_scale_inv", "F8_E4M3",
                        "check     layer 1 loads and agrees with the config", "fp8 x5"})
    EXPECT_NE(s.out.find(t), std::string::npos) << t << "\n" << s.out;
  EXPECT_EQ(s.out.find("model.layers.0."), std::string::npos) << s.out;
  // DSA (GLM-5 style): the indexer's constants and shared layers, and layer 0's indexer weights against them.
  const Cli d = mla_bisect("inspect '" + fx.at("models/hf_glm_dsa").string() + "'");
  EXPECT_EQ(d.exit_code, 0) << d.out;
  for (const char* t : {"dsa       index_topk 8; indexer 2 heads x 32 lanes, rope interleaved on its first 16 lanes; "
                        "shared layers (the previous full layer's top-k): 1 (runs refuse them",
                        "dsa       layer 0's indexer agrees with the config: wq_b [64, 256], wk [32, 256], "
                        "k_norm [32], k_norm.bias [32], weights_proj [2, 256]"})
    EXPECT_NE(d.out.find(t), std::string::npos) << t << "\n" << d.out;
  const Cli d1 = mla_bisect("inspect '" + fx.at("models/hf_glm_dsa").string() + "' --layer 1");
  EXPECT_EQ(d1.exit_code, 0) << d1.out;
  EXPECT_NE(d1.out.find("dsa       layer 1 is shared: no indexer of its own, as expected"), std::string::npos)
      << d1.out;
  const Cli di = mla_bisect("inspect '" + fx.at("models/hf_glm_dsa_bad_indexer").string() + "'");
  EXPECT_EQ(di.exit_code, 2) << di.out;
  EXPECT_NE(di.out.find("model.layers.0.self_attn.indexer.wq_b.weight is [48, 256], but index_n_heads 2, "
                        "index_head_dim 32 make it [64, 256]"),
            std::string::npos)
      << di.out;
  const Cli bad = mla_bisect("inspect '" + fx.at("gguf_quants.gguf").string() + "'");  // not an MLA model: exit 2
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.out.find("0 attention layers"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("no MLA attention layer"), std::string::npos) << bad.out;
  const auto junk = scratch("inspect") / "junk.gguf";
  write_file(junk, {'G', 'G', 'U', 'F', 9, 0, 0, 0});
  const Cli j = mla_bisect("inspect '" + junk.string() + "'");
  EXPECT_EQ(j.exit_code, 2) << j.out;
  EXPECT_NE(j.out.find("unsupported GGUF version 9"), std::string::npos) << j.out;
}

// A glm-dsa GGUF (llama.cpp's names, the indexer under blk.N.indexer.*) holding hf_glm_dsa's layer 0: the same config
// (DSA constants included) and the same weights, indexer included, bit for bit.
TEST(WeightsLoader, GlmDsaGgufGivesTheSameLayerAsItsSafetensors) {
  MLA_REQUIRE_WEIGHT_FIXTURES();
  const std::string gguf = fx.at("models/gguf_glm_dsa.gguf").string(), hf = fx.at("models/hf_glm_dsa").string();
  const MlaConfig g = checkpoint_config(gguf), h = checkpoint_config(hf);
  expect_mini_config(g);
  EXPECT_EQ(g.model_type, "glm_moe_dsa");
  EXPECT_TRUE(g.has_dsa());
  EXPECT_EQ(g.index_topk, h.index_topk);
  EXPECT_EQ(g.index_n_heads, h.index_n_heads);
  EXPECT_EQ(g.index_head_dim, h.index_head_dim);
  EXPECT_EQ(g.index_rope_style, h.index_rope_style);
  WeightSpec wg, wh;
  wg.source = gguf;
  wh.source = hf;
  const auto a = load_weights(wg, h, spec_of(1), 0).layers.at(0);
  const auto b = load_weights(wh, h, spec_of(1), 0).layers.at(0);
  for (const char* f : {"input_norm", "q_a_proj", "q_a_norm", "q_b_proj", "kv_a_proj", "kv_a_norm", "kv_b_proj",
                        "o_proj"})
    EXPECT_TRUE(bit_equal(field(a, f).data, field(b, f).data, std::string("glm-dsa gguf ") + f));
  ASSERT_FALSE(a.idx_wq_b.empty());
  EXPECT_EQ(a.idx_wq_b.shape, b.idx_wq_b.shape);
  EXPECT_TRUE(bit_equal(a.idx_wq_b.data, b.idx_wq_b.data, "indexer.wq_b"));
  EXPECT_TRUE(bit_equal(a.idx_wk.data, b.idx_wk.data, "indexer.wk"));
  EXPECT_TRUE(bit_equal(a.idx_k_norm.data, b.idx_k_norm.data, "indexer.k_norm"));
  EXPECT_TRUE(bit_equal(a.idx_k_norm_bias.data, b.idx_k_norm_bias.data, "indexer.k_norm.bias"));
  EXPECT_TRUE(bit_equal(a.idx_weights_proj.data, b.idx_weights_proj.data, "indexer.weights_proj"));
  // A run on the GGUF alone (its own metadata for the config) reaches the indexer.
  const std::string out = scratch("glm_dsa_gguf") / "run.h5";
  const Cli r = mla_bisect("run --weights '" + gguf + "' --tokens 12 --out '" + out + "'");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("idx_scores"), std::string::npos) << r.out;
  // A DSA config over a GGUF layer without indexer tensors (a deepseek2 file) names the missing tensor.
  WeightSpec dense;
  dense.source = fx.at("models/gguf_split.gguf").string();
  MlaConfig dsa = checkpoint_config(dense.source);
  dsa.index_topk = h.index_topk;
  dsa.index_n_heads = h.index_n_heads;
  dsa.index_head_dim = h.index_head_dim;
  dsa.index_shared.clear();
  ASSERT_TRUE(dsa.has_dsa());
  const std::string e = error_of([&] { load_weights(dense, dsa, spec_of(1), 0); });
  EXPECT_NE(e.find("has DSA (index_topk 8) but layer 0 has no tensor 'blk.0.indexer.attn_q_b.weight'"),
            std::string::npos) << e;
}

}  // namespace
