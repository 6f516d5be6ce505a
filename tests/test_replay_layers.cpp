// End-to-end (label cpu): replay of a whole-model capture, FILE.layer<L>.h5 beside FILE.h5 (one single-layer
// capture per layer, here per rank too: `run --tp 2 --rank R --layer-range L:L+1` writes FILE.layer<L>.rank<R>.h5).
// Each layer is replayed on its own inputs; the first diverging layer is named; --layers narrows; a stopped layer
// gives no verdict on it; layers side by side report as one after another; JSON, JUnit and HTML carry the per-layer
// table.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/cli_util.h"

namespace {

using mla::test::CliResult;

CliResult sh(const std::string& args) { return mla::test::run_cli(args, {.merge_stderr = true, .timeout_s = 0}); }

std::string dir_of(const std::string& name) {
  static const mla::test::ScratchDir root("replay_layers");
  const auto d = root.dir() / name;
  std::filesystem::create_directories(d);
  return d.string();
}

// Layer L of tiny, bf16, tp 2 in one process per rank, with `inject` (may be empty).
void capture_layer(const std::string& dir, int layer, const std::string& inject) {
  const std::string bin = std::string("'") + MLA_BINARY + "'";
  std::string cmd;
  for (int r = 0; r < 2; ++r)
    cmd += bin + " run --quiet --no-table --model tiny --tokens 8 --tp 2 --rank " + std::to_string(r) +
           " --rendezvous " + dir + "/rv" + std::to_string(layer) + " --layer-range " + std::to_string(layer) + ":" +
           std::to_string(layer + 1) + " --engine reference:precision=bf16" +
           (inject.empty() ? "" : " --inject " + inject) + " --out " + dir + "/cap.layer" + std::to_string(layer) +
           ".h5 >/dev/null 2>&1 & ";
  mla::test::run_shell(cmd + "wait");
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

TEST(ReplayLayers, TheFirstDivergingLayerIsNamedAndOthersAgree) {
  const std::string d = dir_of("scan");
  for (int l = 0; l < 3; ++l) capture_layer(d, l, l == 2 ? "softmax-scale" : "");
  const auto r = sh("replay " + d + "/cap.h5 --weights synthetic --quiet --json " + d + "/s.json --junit " + d +
                    "/s.xml --html " + d + "/s.html");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_CONTAINS(r.out, "layer 2's MLA diverges on its own captured inputs: first divergent probe attn_out");
  EXPECT_CONTAINS(r.out, "layers 0-1 agree");
  const auto j = read_json(d + "/s.json");
  EXPECT_EQ(j.value("schema_version", 0), 1);
  EXPECT_EQ(j["first_layer"], 2);
  ASSERT_EQ(j["layers"].size(), 3u);
  for (int l = 0; l < 3; ++l) {
    EXPECT_EQ(j["layers"][l]["layer"], l);
    EXPECT_EQ(j["layers"][l]["verdict"], l == 2 ? "DIVERGES" : "agrees") << j["layers"][l].dump();
  }
  EXPECT_EQ(j["layers"][2]["report"]["first_divergence"]["layer"], 2);
  const std::string xml = mla::test::slurp(d + "/s.xml");
  EXPECT_CONTAINS(xml, "tests=\"3\" failures=\"1\" errors=\"0\"");
  const std::string html = mla::test::slurp(d + "/s.html");
  EXPECT_CONTAINS(html, "<svg");
  EXPECT_CONTAINS(html, "MLA diverges on its own captured inputs");

  // --layers narrows the set; the layers left agree.
  const auto n = sh("replay " + d + "/cap.h5 --weights synthetic --quiet --layers 0:2");
  EXPECT_EQ(n.exit_code, 0) << n.out;
  EXPECT_CONTAINS(n.out, "every MLA layer agrees with the reference on its own inputs (layers 0-1)");
  // --layer belongs to a single-layer capture.
  const auto bad = sh("replay " + d + "/cap.h5 --weights synthetic --layer 1");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_CONTAINS(bad.out, "narrow it with --layers A:B");
  // One layer's file read alone is an ordinary single-layer replay.
  const auto one = sh("replay " + d + "/cap.layer2.h5 --weights synthetic --quiet --brief");
  EXPECT_EQ(one.exit_code, 1) << one.out;
  EXPECT_CONTAINS(one.out, "first divergence: layer 2 attn_out");
}

// Layers replayed side by side (--jobs 3, the cores shared among them) give the report of one after another, in
// layer order, whatever order they finish in; --jobs belongs to a whole-model capture.
TEST(ReplayLayers, LayersSideBySideGiveTheSameReport) {
  const std::string d = dir_of("jobs");
  for (int l = 0; l < 4; ++l) capture_layer(d, l, l == 1 ? "softmax-scale" : l == 3 ? "rope-neox" : "");
  const auto one = sh("replay " + d + "/cap.h5 --weights synthetic --quiet --jobs 1 --json " + d + "/one.json");
  const auto par = sh("replay " + d + "/cap.h5 --weights synthetic --jobs 3 --json " + d + "/par.json");
  EXPECT_EQ(one.exit_code, 1) << one.out;
  EXPECT_EQ(par.exit_code, 1) << par.out;
  EXPECT_CONTAINS(par.out, "4 layers, 3 at once with ");
  EXPECT_CONTAINS(par.out, "(--jobs 3)");
  EXPECT_CONTAINS(par.out, "layer 1's MLA diverges on its own captured inputs: first divergent probe attn_out");
  EXPECT_CONTAINS(par.out, "layers 1, 3 diverge");
  const auto a = read_json(d + "/one.json"), b = read_json(d + "/par.json");
  EXPECT_EQ(a["first_layer"], 1);
  EXPECT_EQ(b["first_layer"], 1);
  ASSERT_EQ(a["layers"].size(), 4u);
  ASSERT_EQ(b["layers"].size(), 4u);
  for (int l = 0; l < 4; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    EXPECT_EQ(b["layers"][l]["layer"], l);
    EXPECT_EQ(a["layers"][l]["verdict"], b["layers"][l]["verdict"]);
    EXPECT_EQ(a["layers"][l]["verdict"], l == 1 || l == 3 ? "DIVERGES" : "agrees");
    if (l == 1 || l == 3) {
      const auto& fa = a["layers"][l]["report"]["first_divergence"];
      ASSERT_TRUE(fa.is_object() && fa.contains("probe")) << fa.dump();
      EXPECT_EQ(fa["probe"], b["layers"][l]["report"]["first_divergence"]["probe"]);
      EXPECT_EQ(fa["probe"], l == 1 ? "attn_out" : "q_pe_rope");
    }
  }
  const auto single = sh("replay " + d + "/cap.layer0.h5 --weights synthetic --jobs 2");
  EXPECT_EQ(single.exit_code, 2) << single.out;
  EXPECT_CONTAINS(single.out, "is a single-layer capture (--jobs");
}

TEST(ReplayLayers, AStoppedLayerGivesNoVerdictOnIt) {
  const std::string d = dir_of("stopped");
  capture_layer(d, 0, "");
  capture_layer(d, 1, "crash-at:rope");
  const auto r = sh("replay " + d + "/cap.h5 --weights synthetic --quiet");
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_CONTAINS(r.out, "1 of 2 captured layers agree with the reference on their own inputs; layers 1 stopped early");
  EXPECT_EQ(r.out.find("every MLA layer agrees"), std::string::npos) << r.out;
}

}  // namespace
