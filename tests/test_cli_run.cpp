// `mla-bisect run` end to end: the real binary (MLA_BINARY) in a child process, its exit code, its probe table
// and its error messages. Exit codes: 0 ok, 2 bad usage or input.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/stage_graph.h"
#include "probes/dump.h"
#include "tests/cli_util.h"

namespace {

using namespace mla;
using test::describe;
using test::run_cli;

// Table rows "layer probe contract shape dtype L2 absmax nan/inf" of the run output.
struct Row {
  int layer;
  std::string name, contract, shape, nan_inf;
};
std::vector<Row> table_rows(const std::string& out) {
  std::vector<Row> rows;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream f(line);
    std::string layer, name, contract, shape, dtype, l2, absmax, nan_inf;
    if (!(f >> layer >> name >> contract >> shape >> dtype >> l2 >> absmax >> nan_inf)) continue;
    if (layer.empty() || layer.find_first_not_of("0123456789") != std::string::npos) continue;
    rows.push_back({std::stoi(layer), name, contract, shape, nan_inf});
  }
  return rows;
}

// The run succeeded and printed one row per probe of the graph, per layer, in graph order, with the graph's
// global shapes and contracts and no NaN or Inf.
void expect_full_table(const std::string& args, const MlaConfig& cfg, const RunSpec& spec) {
  const auto r = run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << describe(args, r);
  const auto graph = build_graph(cfg, spec.graph_shape());
  const auto rows = table_rows(r.out);
  ASSERT_EQ(rows.size(), graph.probes.size() * spec.layers) << describe(args, r);
  size_t i = 0;
  for (int l = 0; l < spec.layers; ++l)
    for (const auto& p : graph.probes) {
      const auto& row = rows[i++];
      SCOPED_TRACE("layer " + std::to_string(l) + " probe " + p.name);
      EXPECT_EQ(row.layer, l);
      EXPECT_EQ(row.name, p.name);
      EXPECT_EQ(row.contract, contract_name(p.contract));
      EXPECT_EQ(row.shape, shape_string(p.shape));
      EXPECT_EQ(row.nan_inf, "0/0");
    }
  EXPECT_CONTAINS(r.out, "model " + cfg.name);
  EXPECT_CONTAINS(r.out, std::string("mode ") + mode_name(spec.mode));
  EXPECT_CONTAINS(r.out, std::string("attention ") + form_name(spec.form));
}

// Every preset, prefill at 2 tokens, one test per preset (ctest can spread them over cores). The
// DeepSeek-V3-sized presets spend most of their 2-5 s generating ~190M synthetic weights; 2 tokens keeps the
// run itself short.
class CliRunPreset : public ::testing::TestWithParam<std::string> {};

TEST_P(CliRunPreset, PrefillPrintsEveryProbe) {
  RunSpec spec;
  spec.tokens = 2;
  expect_full_table("run --model " + GetParam() + " --tokens 2", *find_preset(GetParam()), spec);
}

INSTANTIATE_TEST_SUITE_P(AllPresets, CliRunPreset, ::testing::ValuesIn(preset_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           for (auto& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

TEST(CliRun, EveryModeAndFormOnTiny) {
  const auto tiny = *find_preset("tiny");
  struct Case {
    const char* args;
    Mode mode;
    AttentionForm form;
    int tokens;
  };
  const Case cases[] = {
      {"--mode prefill --tokens 4", Mode::Mode_prefill, AttentionForm::AttentionForm_mha, 4},
      {"--mode prefill --tokens 4 --attention absorbed", Mode::Mode_prefill, AttentionForm::AttentionForm_absorbed, 4},
      {"--mode decode --tokens 1", Mode::Mode_decode, AttentionForm::AttentionForm_absorbed, 1},
      {"--mode decode --tokens 1 --attention mha", Mode::Mode_decode, AttentionForm::AttentionForm_mha, 1},
      {"--mode decode --tokens 2 --batch 3 --context 70,1,0", Mode::Mode_decode, AttentionForm::AttentionForm_absorbed, 2},
      {"--mode chunked --tokens 4 --context 65", Mode::Mode_chunked, AttentionForm::AttentionForm_mha, 4},
      {"--mode chunked --tokens 4 --attention absorbed", Mode::Mode_chunked, AttentionForm::AttentionForm_absorbed, 4},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    RunSpec spec;
    spec.mode = c.mode;
    spec.form = c.form;
    spec.tokens = c.tokens;
    if (std::string(c.args).find("--batch 3") != std::string::npos) spec.batch = 3;
    expect_full_table(std::string("run --model tiny ") + c.args, tiny, spec);
  }
}

TEST(CliRun, LayersAndTensorParallelOnTiny) {
  const auto tiny = *find_preset("tiny");
  RunSpec spec;
  spec.tokens = 3;
  spec.layers = 3;
  expect_full_table("run --model tiny --tokens 3 --layers 3", tiny, spec);
  spec.layers = 1;
  spec.tp = 8;
  expect_full_table("run --model tiny --tokens 3 --tp 8", tiny, spec);
}

// The table's L2 of a heads probe is the gathered tensor's at any tp: a stage with two outputs (q_nope, q_pe) records
// them rank by rank, and each rank's shard adds to its own probe's row.
TEST(CliRun, TableGathersEveryHeadsProbeAtAnyTp) {
  const auto l2_by_probe = [](const std::string& args) {
    const auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 0) << describe(args, r);
    std::map<std::string, double> l2;
    std::istringstream lines(r.out);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream f(line);
      std::string layer, name, contract, shape, dtype, value;
      if (f >> layer >> name >> contract >> shape >> dtype >> value && contract == "heads") l2[name] = std::stod(value);
    }
    return l2;
  };
  const auto tp1 = l2_by_probe("run --model tiny --tokens 6");
  const auto tp2 = l2_by_probe("run --model tiny --tokens 6 --tp 2");
  ASSERT_EQ(tp1.size(), tp2.size());
  ASSERT_GE(tp1.size(), 6u);
  // 1e-4: FP32 GEMMs of a different shape per shard round differently; the table prints 6 digits.
  for (const auto& [name, v] : tp1) EXPECT_NEAR(tp2.at(name), v, 1e-4 * v) << name;
}

// A config.json path as --model: a small GLM-5-style (glm_moe_dsa) config, so the run has DSA's indexer stages and
// the scale is 1/sqrt(192 + 64) = 1/16, without GLM-5's 6 s of weight generation.
TEST(CliRun, ConfigJsonAsModel) {
  const test::ScratchDir dir("cli_glm_dsa");
  const auto path = dir.dir() / "small_glm_dsa_config.json";
  std::ofstream(path) << R"({"model_type": "glm_moe_dsa", "hidden_size": 96, "num_attention_heads": 4,
    "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 16,
    "rope_theta": 1000000, "rms_norm_eps": 1e-05, "rope_scaling": null, "index_topk": 2048,
    "num_hidden_layers": 78, "vocab_size": 154880})";
  const std::string args = "run --model '" + path.string() + "' --tokens 3 --tp 2";
  const auto r = run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << describe(args, r);
  EXPECT_CONTAINS(r.out, "softmax scale 0.0625");
  EXPECT_CONTAINS(r.out, "tp 2");
  // x, q_a, q_c, q_nope, q_pe, kv_c, k_pe, kv_c_norm, ropes, cache, the indexer's idx_q, idx_k, idx_weights,
  // idx_scores, topk, then k_nope, v, attn_out, lse, o_partial, o
  EXPECT_EQ(table_rows(r.out).size(), 22u);
  EXPECT_CONTAINS(r.out, "topk");
}

TEST(CliRun, HelpOfRunMentionsModel) {
  const auto r = run_cli("run --help");
  EXPECT_EQ(r.exit_code, 0) << describe("run --help", r);
  for (const char* opt : {"--model", "--mode", "--attention", "--tokens", "--tp", "--layers", "--engine"})
    EXPECT_CONTAINS(r.out, opt);
  EXPECT_CONTAINS(r.out, "omitted: 64 prefill, 1 decode, 32 chunked");  // what leaving --tokens out means
  EXPECT_CONTAINS(run_cli("bench --help").out, "omitted: 512 prefill");
  EXPECT_CONTAINS(run_cli("bench --help").out, "--run-layers");
  const auto top = run_cli("--help");
  EXPECT_EQ(top.exit_code, 0) << describe("--help", top);
  EXPECT_CONTAINS(top.out, "run");
}

TEST(CliRun, TpThatDoesNotDivideHeadsExits2) {
  const auto r = run_cli("run --model glm-4.7-flash --tp 8 --tokens 2");
  EXPECT_EQ(r.exit_code, 2) << describe("--model glm-4.7-flash --tp 8", r);
  EXPECT_CONTAINS(r.err, "20");
  EXPECT_CONTAINS(r.err, "heads");
  EXPECT_CONTAINS(r.err, "tp 8");
  EXPECT_EQ(r.out.find("probe"), std::string::npos) << "no table for a refused run";
}

TEST(CliRun, BadUsageExits2) {
  struct Case {
    std::string args;
    std::vector<std::string> says;
  };
  const test::ScratchDir dir("cli_bad_usage");
  const auto malformed = dir.dir() / "malformed_config.json";
  std::ofstream(malformed) << "{\"model_type\": \"deepseek_v3\", \"hidden_size\": 7168,";
  const auto not_object = dir.dir() / "list_config.json";
  std::ofstream(not_object) << "[1, 2, 3]";
  const std::vector<Case> cases = {
      {"run --model tiny --mode sideways", {"sideways", "mode"}},
      {"run --model tiny --attention sparse", {"sparse"}},
      {"run --model '" + malformed.string() + "'", {"malformed JSON", malformed.string()}},
      {"run --model '" + not_object.string() + "'", {"JSON object"}},
      {"run --model no-such-model", {"no-such-model", "neither a preset"}},
      {"run --model tiny --tokens -3", {"--tokens"}},
      {"run --model tiny --tokens 0", {"--tokens", "positive", "leave --tokens out"}},  // not "the default"
      {"run --model tiny --tokens 2x", {"--tokens"}},
      {"bench --model tiny --tokens 0", {"--tokens", "positive"}},
      {"bench --model tiny --run-layers 0", {"--run-layers"}},
      {"bisect --model tiny --tokens 0", {"--tokens", "positive"}},
      {"zoo --model tiny --tokens 0", {"--tokens", "positive"}},
      {"run --model tiny --tp 0", {"--tp"}},
      {"run --model tiny --mode decode --context 5,x", {"--context"}},
      {"run --model tiny --mode prefill --context 5", {"--context"}},
      {"run --model tiny --probe-level everything", {"everything"}},
      {"run --model tiny --engine warp-drive", {"warp-drive"}},
      {"run --model tiny --no-such-flag", {"no-such-flag"}},
      // Injections that would plant nothing: named so, never a silent clean run.
      {"run --model tiny --inject nan-at:bogus:0", {"'bogus' is not a probe", "q_pe_rope"}},
      {"run --model tiny --inject hang-at:nostage", {"hang-at:nostage", "unknown stage 'nostage'"}},
      {"run --model tiny --inject crash-at:rope@-1", {"rank after '@' must be >= 0"}},
      {"run --model tiny --inject fault-at:nostage", {"fault-at:nostage", "unknown stage 'nostage'"}},
      {"run --model tiny --inject fault-at:rope:x", {"LAYER must be a layer number"}},
      {"run --model tiny --inject fault-at:rope:-1", {"LAYER must be >= 0"}},
      {"run --model tiny --layers 2 --inject fault-at:rope:2", {"layer 2 does not exist at --layers 2"}},
      {"run --model tiny --inject fault-at:o_proj", {"reference engine cannot plant 'fault-at'", "cuda engine"}},
      {"run --model tiny --inject slow-at:rope", {"expected slow-at:STAGE:MS[@rank]"}},
      {"run --model tiny --inject slow-at:rope:xx", {"MS must be an integer"}},
      {"run --model tiny --inject slow-at:rope:-5", {"MS must be 0 .. 3600000"}},
      {"run --model tiny --inject slow-at:nostage:5", {"slow-at:nostage:5", "unknown stage 'nostage'"}},
      {"run --model tiny --inject nan-at:q_a:0@9", {"rank 9 does not exist at --tp 1"}},
      {"run --model tiny --inject ,,,", {"no injection named"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const auto r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << describe(c.args, r);
    for (const auto& s : c.says) EXPECT_CONTAINS(r.err, s);
  }
}

// slow-at plants nothing in the numbers: a slowed run's dump equals the plain run's record for record, and a
// watchdog shorter than the sleep ends the slowed stage as hung (exit 3, naming it).
TEST(CliRun, SlowAtSlowsAStageAndNothingElse) {
  const test::ScratchDir dir("cli_slow_at");
  const std::string plain = dir.path("plain.h5"), slow = dir.path("slow.h5");
  const auto a = run_cli("run --model tiny --tokens 4 --probe-level full --out " + plain);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const auto b = run_cli("run --model tiny --tokens 4 --probe-level full --inject slow-at:rope:20 --out " + slow);
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const Dump da = read_dump(plain), db = read_dump(slow);
  ASSERT_EQ(da.probes.size(), db.probes.size());
  for (size_t i = 0; i < da.probes.size(); ++i) {
    SCOPED_TRACE(da.probes[i].name);
    ASSERT_EQ(da.probes[i].ranks.size(), db.probes[i].ranks.size());
    for (size_t r = 0; r < da.probes[i].ranks.size(); ++r)
      EXPECT_EQ(da.probes[i].ranks[r].checksum, db.probes[i].ranks[r].checksum);
  }
  const auto hung = run_cli("run --model tiny --tokens 4 --inject slow-at:rope:3000 --watchdog 0.5");
  EXPECT_EQ(hung.exit_code, 3) << hung.err;
  EXPECT_CONTAINS(hung.err, "rope");
}

}  // namespace
