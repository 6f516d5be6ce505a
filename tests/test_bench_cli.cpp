// `mla-bisect bench` end to end (the real binary in a child process, tiny preset, 2 rounds): it prints a row per
// stage of the graph, the layer row, the GEMM ceiling and the probe overhead, and writes the same figures as
// JSON. Only the shape of the output is checked, never a time. Also the FLOP formulas, which the
// benchmark's GFLOP/s rest on.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/stage_graph.h"
#include "harness/report/bench_report.h"
#include "tests/cli_util.h"

namespace {

using namespace mla;
using test::CliResult;
using test::describe;

// OMP_NUM_THREADS=1: the tiny GEMMs gain nothing from threads, and on a busy machine Eigen's spinning threads
// make them hundreds of times slower; the test is about the output, not the speed.
CliResult run_cli(const std::string& args) { return test::run_cli(args, {.env = "OMP_NUM_THREADS=1"}); }

// The table row of `name`: the line starting with it and a space, split into words ("" if none).
std::vector<std::string> row_of(const std::string& out, const std::string& name) {
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind(name + " ", 0) == 0) {
      std::istringstream f(line);
      std::vector<std::string> words;
      for (std::string w; f >> w;) words.push_back(w);
      return words;
    }
  return {};
}

// bench on tiny succeeds and prints every stage of `spec`'s graph, the layer, the ceiling and each probe level.
void expect_bench_table(const std::string& args, const RunSpec& spec, const CliResult& r) {
  ASSERT_EQ(r.exit_code, 0) << describe(args, r);
  const auto graph = build_graph(*find_preset("tiny"), spec.graph_shape());
  for (const auto& st : graph.stages) {
    const auto row = row_of(r.out, stage_name(st.stage));
    ASSERT_GE(row.size(), 6u) << "no row for stage " << stage_name(st.stage) << "\n" << describe(args, r);
    EXPECT_GE(std::stod(row[1]), 0.0) << row[0];  // time ms
  }
  const auto layer = row_of(r.out, "layer");
  ASSERT_GE(layer.size(), 6u) << describe(args, r);
  EXPECT_GT(std::stod(layer[3]), 0.0) << "layer GFLOP";
  EXPECT_CONTAINS(r.out, "ceiling: Eigen GEMM");
  EXPECT_CONTAINS(r.out, "of the GEMM ceiling");
  EXPECT_CONTAINS(r.out, "probe overhead at stats");
  EXPECT_CONTAINS(r.out, "probe overhead at sketch");
  EXPECT_CONTAINS(r.out, std::string("mode ") + mode_name(spec.mode));
}

TEST(BenchCli, PrefillPrintsEveryStageTheCeilingAndJson) {
  const test::ScratchDir dir("bench");
  const auto json_path = dir.dir() / "bench.json";
  const std::string args = "bench --engine reference --model tiny --tokens 32 --repeats 2 --json '" +
                           json_path.string() + "'";
  const auto r = run_cli(args);
  RunSpec spec;
  spec.tokens = 32;
  expect_bench_table(args, spec, r);
  EXPECT_CONTAINS(r.out, "ceiling: Eigen GEMM of the q_b_proj size, Y[32 x 192] = X[32 x 48]");  // tiny: q_b is largest

  std::ifstream in(json_path);
  ASSERT_TRUE(in) << "no JSON written at " << json_path;
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j.value("schema_version", 0), 1);
  EXPECT_EQ(j.value("command", ""), "bench");
  const auto graph = build_graph(*find_preset("tiny"), spec.graph_shape());
  ASSERT_EQ(j.at("stages").size(), graph.stages.size());
  for (size_t i = 0; i < graph.stages.size(); ++i) {
    EXPECT_EQ(j["stages"][i]["stage"], stage_name(graph.stages[i].stage));
    EXPECT_EQ(j["stages"][i]["time"]["samples_s"].size(), 2u);
  }
  EXPECT_EQ(j["repeats"], 2);
  EXPECT_GT(j["gemm_ceiling"]["gflops_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["layer"]["fraction_of_gemm"].get<double>(), 0.0);
  EXPECT_EQ(j["probe_overhead"].size(), 2u);  // stats, sketch
}

TEST(BenchCli, DecodeWithTensorParallelRanks) {
  const std::string args = "bench --model tiny --mode decode --batch 2 --context 40 --tp 2 --repeats 2 --warmup 0";
  const auto r = run_cli(args);
  RunSpec spec;
  spec.mode = Mode::Mode_decode;
  spec.form = AttentionForm::AttentionForm_absorbed;
  spec.tokens = 1;
  spec.batch = 2;
  spec.tp = 2;
  expect_bench_table(args, spec, r);
  EXPECT_CONTAINS(r.out, "attention absorbed");
  EXPECT_CONTAINS(r.out, "tp 2");
}

TEST(BenchCli, HelpAndBadRepeats) {
  const auto help = run_cli("bench --help");
  EXPECT_EQ(help.exit_code, 0) << describe("bench --help", help);
  for (const char* opt : {"--engine", "--model", "--mode", "--tokens", "--repeats", "--warmup", "--json", "--tp"})
    EXPECT_CONTAINS(help.out, opt);
  const auto top = run_cli("--help");
  EXPECT_CONTAINS(top.out, "bench");
  const auto bad = run_cli("bench --model tiny --repeats 0");
  EXPECT_EQ(bad.exit_code, 2) << describe("bench --repeats 0", bad);
}

// Prefill, DeepSeek-V3 dims, tp 1: 3.742e8·T + 40960·T(T+1) FLOPs (2·N_w·T with N_w = 187,105,280).
TEST(BenchFlops, DeepSeekV3PrefillMatchesFormula) {
  const auto cfg = *find_preset("deepseek-v3");
  RunSpec spec;
  spec.tokens = 512;
  const Batch batch = make_batch(spec);
  double total = 0;
  for (const auto& st : build_graph(cfg, spec.graph_shape()).stages) total += stage_flops(st.stage, cfg, spec, batch);
  EXPECT_DOUBLE_EQ(total, 2.0 * 187105280 * 512 + 40960.0 * 512 * 513);
  EXPECT_DOUBLE_EQ(stage_flops(Stage::Stage_o_proj, cfg, spec, batch), 2.0 * 512 * 16384 * 7168);
}

// Decode, absorbed, B sequences, s_q new tokens seeing L keys: B·s_q·(3.742e8 + 278,528·L).
TEST(BenchFlops, DeepSeekV3DecodeMatchesFormula) {
  const auto cfg = *find_preset("deepseek-v3");
  RunSpec spec;
  spec.mode = Mode::Mode_decode;
  spec.form = AttentionForm::AttentionForm_absorbed;
  spec.tokens = 1;
  spec.batch = 4;
  spec.context = {99};  // the new token sees L = 100 keys
  const Batch batch = make_batch(spec);
  double total = 0;
  for (const auto& st : build_graph(cfg, spec.graph_shape()).stages) total += stage_flops(st.stage, cfg, spec, batch);
  EXPECT_DOUBLE_EQ(total, 4.0 * (2.0 * 187105280 + 278528.0 * 100));
  // With tp 2 the replicated projections (q_a, kv_a) run on both ranks; the sharded ones are split.
  RunSpec tp2 = spec;
  tp2.tp = 2;
  EXPECT_DOUBLE_EQ(stage_flops(Stage::Stage_kv_a_proj, cfg, tp2, batch),
                   2 * stage_flops(Stage::Stage_kv_a_proj, cfg, spec, batch));
  EXPECT_DOUBLE_EQ(stage_flops(Stage::Stage_o_proj, cfg, tp2, batch), stage_flops(Stage::Stage_o_proj, cfg, spec, batch));
}

// FlashMLA's formula: the decode attention core moves (ΣL·576 + B·s_q·h·576 + B·s_q·h·512)·2 bytes,
// plus its fp32 lse; a GEMM stage reads its input and weight and writes its output once.
TEST(BenchBytes, DecodeCoreAndProjectionsMatchFormulas) {
  const auto cfg = *find_preset("deepseek-v3");
  RunSpec spec;
  spec.mode = Mode::Mode_decode;
  spec.form = AttentionForm::AttentionForm_absorbed;
  spec.tokens = 1;
  spec.batch = 64;
  spec.context = {4096};
  const Batch batch = make_batch(spec);
  const double sum_l = 64.0 * 4097, bh = 64.0 * 128;
  EXPECT_DOUBLE_EQ(stage_bytes(Stage::Stage_attention_mqa, cfg, spec, batch),
                   (sum_l * 576 + bh * 576 + bh * 512) * 2 + 4 * bh);
  EXPECT_DOUBLE_EQ(stage_bytes(Stage::Stage_o_proj, cfg, spec, batch), 2.0 * (64 * 16384 + 7168.0 * 16384 + 64 * 7168));
  EXPECT_EQ(stage_bytes(Stage::Stage_layer_input, cfg, spec, batch), 0.0);
}

}  // namespace
