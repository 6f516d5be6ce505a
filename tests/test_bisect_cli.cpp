// End-to-end tests of bisect, zoo and compare through the CLI (label cpu): every docs/bugs.md entry the reference can
// plant is localized on the tiny preset, clean runs are not flagged, a hang and a crash give exit 3 naming the
// stage, and the JSON / JUnit / HTML outputs carry what they promise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <cstring>

#include <nlohmann/json.hpp>

#include "harness/bisect/bisect_html.h"
#include "harness/report/compare_report.h"
#include "probes/dump.h"
#include "tests/cli_util.h"

namespace {

// These tests check the harness's logic, so the candidate is always the bf16 reference (on a GPU machine the
// default candidate would be the CUDA engine, which the GPU tests cover).
const char* kCandidate = " --candidate reference:precision=bf16";

// mla-bisect ARGS, stderr into stdout; no time limit of its own (bisect has its --timeout).
mla::test::CliResult sh(const std::string& args) {
  return mla::test::run_cli(args, {.merge_stderr = true, .timeout_s = 0});
}

// A subdirectory `name` of this test process's scratch directory (removed when the process exits).
std::string tmpdir(const std::string& name) {
  static const mla::test::ScratchDir root("bisect");
  const auto d = root.dir() / name;
  std::filesystem::create_directories(d);
  return d.string();
}

TEST(BisectCli, ZooOnTinyLocalizesEveryEntryAndFlagsNoCleanRun) {
  for (const char* tp : {"1", "2"}) {
    SCOPED_TRACE(std::string("tp ") + tp);
    const auto r = sh(std::string("zoo --model tiny --tokens 16") + kCandidate + " --tp " + tp + " --workdir " + tmpdir("zoo") +
                      " --json " + tmpdir("zoo") + "/zoo.json");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("0 injected bugs missed or mislocated, 0 clean or benign runs flagged"), std::string::npos)
        << r.out;
    std::ifstream f(tmpdir("zoo") + "/zoo.json");
    const auto j = nlohmann::json::parse(f);
    EXPECT_EQ(j.value("schema_version", 0), 1);
    EXPECT_EQ(j.value("command", ""), "zoo");
    EXPECT_TRUE(j["ok"].get<bool>());
    EXPECT_GE(j["cases"].size(), 15u);
    for (auto& row : j["cases"]) EXPECT_TRUE(row["ok"].get<bool>()) << row.dump();
  }
}

TEST(BisectCli, PatternsAreNamed) {
  struct Case {
    const char* args;
    const char* probe;
    const char* words;  // in the pattern rules' words
    const char* cause;  // the class the hypothesis search confirms first ("" : a weight measured to differ)
  };
  const Case cases[] = {
      {"--inject rope-neox", "q_pe_rope", "position 0 exact", "rope.layout"},
      {"--inject rope-mscale", "q_pe_rope", "pure scale", "rope.mscale"},
      {"--inject causal-off", "attn_out", "last token exact", "attn.causal_off"},
      {"--inject kv-b-split", "k_nope", "layout", "proj.head_major_split"},
      // The shard is the weight: ranks 1-3 hold the q_b_proj rows of the rank before them.
      {"--inject tp-head-offset --tp 4", "q_nope", "rank 1 holds rank 0's block", ""},
      {"--inject allreduce-skip --tp 2", "o", "all-reduce", "reduce.rank_missing"},
      {"--inject page-off-by-one --mode decode --batch 2 --context 40,200", "attn_latent", "one page", "attn.page_shift"},
      {"--inject lse-base2 --mode chunked --batch 2 --context 0,30", "attn_out", "cached context", "attn.merge_base2"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const std::string dir = tmpdir("pattern");
    const auto r = sh(std::string("bisect --model tiny --tokens 16") + kCandidate + " --workdir " + dir + " --json " + dir + "/b.json " + c.args);
    ASSERT_EQ(r.exit_code, 1) << r.out;
    std::ifstream f(dir + "/b.json");
    const auto j = nlohmann::json::parse(f);
    EXPECT_EQ(j["first_divergence"]["probe"], c.probe);
    const auto& dg = j["diagnosis"];
    const std::string rules = dg["confidence"] == "confirmed" ? dg["rule_pattern"] : dg["pattern"];
    EXPECT_NE(rules.find(c.words), std::string::npos) << dg.dump();
    if (*c.cause) {
      EXPECT_EQ(dg["confidence"], "confirmed") << j["hypotheses"].dump();
      ASSERT_FALSE(j["hypotheses"]["confirmed"].empty()) << j["hypotheses"].dump();
      EXPECT_EQ(j["hypotheses"]["confirmed"][0]["class"], c.cause) << j["hypotheses"].dump();
      EXPECT_EQ(j["hypotheses"]["stage"], j["first_divergence"]["stage"]);
    } else {
      EXPECT_EQ(dg["confidence"], "measured") << dg.dump();
    }
    EXPECT_NE(j["isolation"].get<std::string>().find("introduced by"), std::string::npos) << j["isolation"];
  }
}

// fp8-scale-transpose at dims where FP8's 128x128 blocks matter (tiny's projections hold two or three blocks: too
// few to tell blocks from noise, so the rule stays silent there): DeepSeek-V2-Lite's q_proj, 3072 rows = 24
// blocks, split per head into q_nope and q_pe, which the diagnosis interleaves back into q_proj's rows.
TEST(BisectCli, Fp8BlockScalesGiveBlockShapedErrorOnDeepSeekV2LiteDims) {
  const std::string dir = tmpdir("fp8");
  const auto r = sh(std::string("bisect --model deepseek-v2-lite --tokens 4 --weight-format fp8 --inject "
                                "fp8-scale-transpose") + kCandidate + " --workdir " + dir + " --json " + dir + "/b.json");
  ASSERT_EQ(r.exit_code, 1) << r.out;
  std::ifstream f(dir + "/b.json");
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["first_divergence"]["probe"], "q_nope");
  // The cause is the weight: q_proj as dequantized differs, block by block; the probe's own rule still sees the
  // blocks in q_proj's output channels (its evidence).
  EXPECT_EQ(j["weight_cause"]["weight"], "q_proj");
  const std::string pattern = j["diagnosis"]["pattern"].get<std::string>();
  EXPECT_NE(pattern.find("weight q_proj differs: block-shaped"), std::string::npos) << j["diagnosis"].dump();
  EXPECT_NE(pattern.find("128x128 blocks off"), std::string::npos) << pattern;
  EXPECT_NE(j["diagnosis"].dump().find("blocks of 128 output channels of the q_proj output (q_nope | q_pe"),
            std::string::npos)
      << j["diagnosis"].dump();
}

TEST(BisectCli, HtmlReportHasThePictures) {
  const std::string dir = tmpdir("html");
  const auto r = sh(std::string("bisect --brief --model tiny --tokens 16") + kCandidate + " --inject rope-neox --workdir " +
                    dir + " --html " + dir + "/r.html");
  ASSERT_EQ(r.exit_code, 1) << r.out;
  std::ifstream f(dir + "/r.html");
  const std::string html((std::istreambuf_iterator<char>(f)), {});
  EXPECT_NE(html.find("Token &times; head heat map of q_pe_rope"), std::string::npos);
  EXPECT_NE(html.find("Error across the graph"), std::string::npos);
  // The causes tested beside the pattern: the confirmed class in the table and in the sentence.
  EXPECT_NE(html.find("Causes tested: bug classes re-run on stage rope"), std::string::npos);
  EXPECT_NE(html.find("Confirmed: the candidate&apos;s q_pe_rope equals"), std::string::npos) << html.substr(0, 4000);
  EXPECT_NE(html.find("<code>rope.layout</code>"), std::string::npos);
  EXPECT_GE(std::count(html.begin(), html.end(), '<') , 200);  // the SVG cells are there
  EXPECT_NE(html.find("</html>"), std::string::npos);
}

TEST(BisectCli, HtmlReportHasProvenanceLegendRanksAndHistogram) {
  const std::string dir = tmpdir("html_prov");
  const auto r = sh(std::string("bisect --brief --model tiny --tokens 8 --tp 2 --seed 3") + kCandidate +
                    " --inject rope-neox --workdir " + dir + " --html " + dir + "/r.html --json " + dir + "/r.json");
  ASSERT_EQ(r.exit_code, 1) << r.out;
  std::ifstream f(dir + "/r.html");
  const std::string html((std::istreambuf_iterator<char>(f)), {});
  // Provenance from the dumps' meta: model, mode, tokens, tp, seeds, tool version, the commands.
  for (const char* s : {"<h2>Provenance</h2>", "<th>model</th><td>tiny</td>", "<th>mode</th><td>prefill</td>",
                        "<th>tokens</th><td>8</td>", "<th>tp</th><td>2</td>", "<th>input seed</th><td>3</td>",
                        "<th>weight seed</th>", "<th>tool version</th>", "<th>inject</th><td>rope-neox</td>",
                        "candidate: mla-bisect run --model tiny"})
    EXPECT_NE(html.find(s), std::string::npos) << s;
  // The colour scale's legend, rank boundaries and head ticks on the heat map.
  EXPECT_NE(html.find("class='legend'"), std::string::npos);
  EXPECT_NE(html.find("1x tolerance"), std::string::npos);
  EXPECT_NE(html.find("class='rank-boundary'"), std::string::npos);
  EXPECT_NE(html.find(">rank 1</text>"), std::string::npos);
  EXPECT_NE(html.find(">head</text>"), std::string::npos);
  // The histogram of the first divergence's values, from full tensors, with both sides counted.
  EXPECT_NE(html.find("Values of q_pe_rope: candidate vs reference"), std::string::npos);
  EXPECT_NE(html.find("class='hist'"), std::string::npos);
  EXPECT_EQ(html.find("no histogram"), std::string::npos);
  // The dumps' sketch numbers are labelled as estimates; self-contained (no scripts, no external files).
  EXPECT_NE(html.find("[estimate (from sketches/norms)]"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);
  std::ifstream jf(dir + "/r.json");
  const auto j = nlohmann::json::parse(jf);
  EXPECT_EQ(j.value("schema_version", 0), 1);
  EXPECT_EQ(j["first_divergence"].value("basis", ""), "sketch");
}

std::string slurp_file(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

// A weight injection: the HTML lists every weight the dumps compared (the ones off with their diagnosis), the
// per-token chart is on a log axis, every compared probe has its sparkline; the JSON carries schema_version and the
// JUnit file names the first divergence as a suite property and as its first failing testcase.
TEST(BisectCli, ReportsHaveWeightTableLogAxisSparklinesAndFirstDivergence) {
  const std::string dir = tmpdir("html_weights");
  const auto r = sh(std::string("bisect --brief --model tiny --tokens 16 --weight-format nvfp4-ct") + kCandidate +
                    " --inject nvfp4-global-recip --workdir " + dir + " --html " + dir + "/r.html --json " + dir +
                    "/r.json --junit " + dir + "/r.xml");
  ASSERT_EQ(r.exit_code, 1) << r.out;
  const std::string html = slurp_file(dir + "/r.html");
  std::ifstream jf(dir + "/r.json");
  const auto j = nlohmann::json::parse(jf);
  EXPECT_EQ(j.value("schema_version", 0), 1);
  EXPECT_EQ(j["compare"].value("schema_version", 0), 1);
  const auto& weights = j["compare"]["weights"];
  ASSERT_GE(weights.size(), 5u);
  const int off = j["compare"]["divergent_weights"].get<int>();
  EXPECT_GT(off, 0);
  const std::string heading = "<h2>Weights (" + std::to_string(weights.size()) + " compared, " + std::to_string(off) +
                              " beyond tolerance)</h2>";
  ASSERT_NE(html.find(heading), std::string::npos) << heading;
  const size_t table = html.find("<table class='weights'>"), table_end = html.find("</table>", table);
  ASSERT_NE(table, std::string::npos);
  const std::string wt = html.substr(table, table_end - table);
  for (const auto& w : weights) {
    const bool bad = w["verdict"] != "pass";
    const std::string row = std::string("<tr") + (bad ? " class='bad'" : "") + "><td>" +
                            std::to_string(w["layer"].get<int>()) + "</td><td>" + w["weight"].get<std::string>() +
                            "</td><td>" + w["contract"].get<std::string>() + "</td>";
    EXPECT_NE(wt.find(row), std::string::npos) << row << "\n" << wt;
  }
  EXPECT_NE(wt.find("<td>q_a_proj</td>"), std::string::npos);
  EXPECT_NE(wt.find("<b>pure scale"), std::string::npos) << wt;  // the weight's diagnosis in its row
  EXPECT_NE(wt.find("DIVERGE"), std::string::npos);
  // The per-token chart: log y axis with decade labels, the tolerance line above the floor.
  EXPECT_NE(html.find("<svg class='token-chart' data-y-scale='log'"), std::string::npos);
  EXPECT_NE(html.find("rel error per token, log scale"), std::string::npos);
  const size_t tl = html.find("<line class='tolerance'");
  ASSERT_NE(tl, std::string::npos);
  const size_t y1 = html.find("y1='", tl) + 4;
  const double ty = std::stod(html.substr(y1, html.find('\'', y1) - y1));
  EXPECT_GT(ty, 10.0);
  EXPECT_LT(ty, 159.0);  // the floor is at 160
  // One sparkline per compared probe, in the probe table.
  size_t matched = 0;
  for (const auto& p : j["compare"]["probes"])
    matched += p["metrics"].is_object() && !p["metrics"]["token_rel"].empty();
  EXPECT_GT(matched, 10u);
  const size_t probes_at = html.find("<table class='probes'>");
  ASSERT_NE(probes_at, std::string::npos);
  size_t sparks = 0;
  for (size_t at = html.find("<svg class='spark'", probes_at); at != std::string::npos;
       at = html.find("<svg class='spark'", at + 1))
    ++sparks;
  EXPECT_EQ(sparks, matched);
  // JUnit: the first divergence as a property; the first failure is its testcase.
  const std::string xml = slurp_file(dir + "/r.xml");
  const std::string first = "layer " + std::to_string(j["first_divergence"]["layer"].get<int>()) + " " +
                            j["first_divergence"]["probe"].get<std::string>();
  EXPECT_NE(xml.find("<property name=\"first_divergence\" value=\"" + first + "\"/>"), std::string::npos) << xml;
  EXPECT_NE(xml.find("<property name=\"first_weight\" value=\"layer 0 q_a_proj\"/>"), std::string::npos) << xml;
  const size_t fail = xml.find("<failure");
  ASSERT_NE(fail, std::string::npos);
  const size_t tc = xml.rfind("<testcase", fail);
  EXPECT_NE(xml.substr(tc, fail - tc).find("name=\"" + j["first_divergence"]["probe"].get<std::string>() + "\""),
            std::string::npos)
      << xml.substr(tc, fail - tc);
  EXPECT_NE(xml.find("first divergence: rel_l2"), std::string::npos);
}

TEST(BisectCli, CleanCandidateOverTwentySeedsIsNeverFlagged) {
  for (int seed = 0; seed < 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const auto r = sh(std::string("bisect --brief --model tiny --tokens 12") + kCandidate + " --seed " + std::to_string(seed) + " --workdir " +
                      tmpdir("clean"));
    EXPECT_EQ(r.exit_code, 0) << r.out;
  }
}

// DSA (tiny-dsa: 12 keys a token) against its bf16 reference, prefill past index_topk and decode over a longer
// context: no divergence, and topk is compared as sets of keys (near-ties between the two runs' scores counted, not
// flagged).
TEST(BisectCli, DsaCleanCandidateIsNotFlaggedAndTopkIsComparedAsSets) {
  for (const char* run : {"--tokens 32", "--mode decode --batch 3 --context 5,100,300"}) {
    for (int seed = 0; seed < 5; ++seed) {
      SCOPED_TRACE(std::string(run) + " seed " + std::to_string(seed));
      const std::string dir = tmpdir("dsa_clean");
      const auto r = sh(std::string("bisect --model tiny-dsa ") + run + kCandidate + " --seed " + std::to_string(seed) +
                        " --workdir " + dir + " --json " + dir + "/b.json");
      EXPECT_EQ(r.exit_code, 0) << r.out;
      std::ifstream f(dir + "/b.json");
      const auto j = nlohmann::json::parse(f);
      bool seen = false;
      for (const auto& p : j["compare"]["probes"])
        if (p["probe"] == "topk") {
          seen = true;
          EXPECT_EQ(p["metrics"]["basis"], "sets") << p.dump();
          EXPECT_TRUE(p.contains("selection")) << p.dump();
          EXPECT_EQ(p["verdict"], "pass") << p.dump();
        }
      EXPECT_TRUE(seen) << j.dump().substr(0, 2000);
    }
  }
}

// DSA's sparse gather from the wrong page (page-off-by-one in the absorbed attention over the selected rows): found
// at attn_latent.
TEST(BisectCli, DsaSparseGatherFromTheWrongPageIsFound) {
  const std::string dir = tmpdir("dsa_page");
  const auto r = sh(std::string("bisect --model tiny-dsa --mode decode --batch 4 --context 100,200,300,400") +
                    kCandidate + " --inject page-off-by-one --workdir " + dir + " --json " + dir + "/b.json");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  std::ifstream f(dir + "/b.json");
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["first_divergence"]["probe"], "attn_latent") << r.out;
}

TEST(BisectCli, HangAndCrashGiveExitThreeNamingTheStage) {
  const std::string dir = tmpdir("hang");
  auto r = sh(std::string("bisect --model tiny --tokens 8 --tp 2 --timeout 1 --inject hang-at:rope@1") + kCandidate + " --workdir " + dir + " --junit " +
              dir + "/j.xml");
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_NE(r.out.find("rank 1 at layer 0 stage rope"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("HUNG"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("last committed probe: layer 0 probe kv_c_norm"), std::string::npos) << r.out;
  std::ifstream j(dir + "/j.xml");
  std::string xml((std::istreambuf_iterator<char>(j)), {});
  EXPECT_NE(xml.find("<error"), std::string::npos);

  r = sh(std::string("bisect --model tiny --tokens 8 --inject crash-at:o_proj") + kCandidate + " --workdir " + tmpdir("crash"));
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_NE(r.out.find("CRASHED"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("stage o_proj"), std::string::npos) << r.out;
}

// A NaN on one rank's copy of a replicated tensor: the gathered copy is the clean majority's, so only the ranks'
// own records show it. The diagnosis must name the rank and say NaN, at tp 2 (no majority) and tp 4.
TEST(BisectCli, NanOnOneRanksReplicaIsNamedWithItsRank) {
  for (const char* c : {"--tp 2 --inject nan-at:kv_c_norm:5", "--tp 4 --inject nan-at:kv_c_norm:5@2"}) {
    SCOPED_TRACE(c);
    const auto r = sh(std::string("bisect --brief --model tiny --tokens 8 ") + c + kCandidate + " --workdir " + tmpdir("nanrank"));
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("first divergence: layer 0 kv_c_norm"), std::string::npos) << r.out;
    const std::string want = std::string("NaN/Inf originates here, on one rank's copy of a replicated tensor (rank ") +
                             (std::string(c).find("@2") != std::string::npos ? "2)" : "0)");
    EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
  }
}

// Two records bit for bit: every statistic, map, sketch and full tensor.
void expect_same_record(const mla::ProbeRecord& a, const mla::ProbeRecord& b, const std::string& at) {
  const auto bits = [](double v) {
    uint64_t u;
    std::memcpy(&u, &v, 8);
    return u;
  };
  EXPECT_EQ(a.shape, b.shape) << at;
  EXPECT_EQ(a.dtype, b.dtype) << at;
  EXPECT_EQ(a.level, b.level) << at;
  for (auto [x, y, what] : {std::tuple{a.l2, b.l2, "l2"}, {a.absmax, b.absmax, "absmax"}, {a.mean, b.mean, "mean"},
                            {a.std, b.std, "std"}})
    EXPECT_EQ(bits(x), bits(y)) << at << " " << what;
  EXPECT_EQ(a.nan, b.nan) << at;
  EXPECT_EQ(a.inf, b.inf) << at;
  EXPECT_EQ(a.checksum, b.checksum) << at;
  for (auto [x, y, what] : {std::tuple{&a.token_l2, &b.token_l2, "token_l2"}, {&a.head_l2, &b.head_l2, "head_l2"},
                            {&a.sketch, &b.sketch, "sketch"}, {&a.data.data, &b.data.data, "data"}}) {
    ASSERT_EQ(x->size(), y->size()) << at << " " << what;
    EXPECT_EQ(std::memcmp(x->data(), y->data(), 4 * x->size()), 0) << at << " " << what;
  }
}

// The bisect makes its FP32 reference run in its own process (it keeps every probe in full for calibration and the
// drill-down): the dump it writes is the one `run --engine reference` writes with the same options, record for
// record, at the probe levels asked for (full probes, stats level, DSA's always-full selection), weights included.
TEST(BisectCli, ReferenceDumpIsTheRunCommandsRecordForRecord) {
  for (const std::string opts : {"--model tiny --tokens 8 --tp 2 --full-probes kv_c_norm,q_a_proj",
                                 "--model tiny-dsa --tokens 8 --probe-level stats --weight-format nvfp4"}) {
    SCOPED_TRACE(opts);
    const std::string dir = tmpdir("refdump");
    const auto b = sh("bisect " + opts + " --inject rope-neox" + kCandidate + " --workdir " + dir);
    EXPECT_EQ(b.exit_code, 1) << b.out;
    EXPECT_NE(b.out.find("reference run (reference, in this process)"), std::string::npos) << b.out;
    const auto r = sh("run " + opts + " --engine reference --quiet --no-table --out " + dir + "/run.h5");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const mla::Dump bd = mla::read_dump(dir + "/reference.h5"), rd = mla::read_dump(dir + "/run.h5");
    EXPECT_TRUE(bd.complete()) << bd.status;
    EXPECT_EQ(bd.meta.engine, rd.meta.engine);
    EXPECT_EQ(bd.meta.engine_options, rd.meta.engine_options);
    EXPECT_EQ(bd.meta.engine_dtype, rd.meta.engine_dtype);
    EXPECT_EQ(bd.meta.model, rd.meta.model);
    EXPECT_EQ(bd.meta.run_options, rd.meta.run_options);
    EXPECT_EQ(bd.meta.probe_level, rd.meta.probe_level);
    EXPECT_EQ(bd.meta.inject, "");
    EXPECT_EQ(bd.meta.command.rfind("mla-bisect run ", 0), 0u) << bd.meta.command;
    ASSERT_EQ(bd.has_inputs, rd.has_inputs);
    EXPECT_EQ(bd.inputs.x.data, rd.inputs.x.data);
    for (auto [pa, pb, what] : {std::tuple{&bd.probes, &rd.probes, "probe"}, {&bd.weights, &rd.weights, "weight"}}) {
      ASSERT_EQ(pa->size(), pb->size()) << what;
      ASSERT_FALSE(pa->empty()) << what;
      for (size_t i = 0; i < pa->size(); ++i) {
        const auto &x = (*pa)[i], &y = (*pb)[i];
        const std::string at = std::string(what) + " layer " + std::to_string(x.layer) + " " + x.name;
        ASSERT_EQ(x.name, y.name) << at;
        ASSERT_EQ(x.ranks.size(), y.ranks.size()) << at;
        for (size_t k = 0; k < x.ranks.size(); ++k) expect_same_record(x.ranks[k], y.ranks[k], at + " rank " + std::to_string(k));
      }
    }
  }
}

TEST(BisectCli, BadInputIsExitTwo) {
  EXPECT_EQ(sh("bisect --model tiny --inject no-such-bug").exit_code, 2);
  EXPECT_EQ(sh("bisect --model glm-4.7-flash --tp 8").exit_code, 2);
  EXPECT_EQ(sh("compare /nonexistent/a.h5 /nonexistent/b.h5").exit_code, 2);
}

TEST(CompareCli, DumpsOfTwoRunsCompareWithJsonAndJunit) {
  const std::string dir = tmpdir("compare");
  ASSERT_EQ(sh("run --quiet --model tiny --tokens 8 --tp 2 --out " + dir + "/ref.h5").exit_code, 0);
  ASSERT_EQ(sh("run --quiet --model tiny --tokens 8 --engine reference:precision=bf16 --out " + dir + "/bf16.h5").exit_code, 0);
  ASSERT_EQ(sh("run --quiet --model tiny --tokens 8 --seed 7 --engine reference:precision=bf16 --out " + dir + "/other.h5").exit_code, 0);
  // A tp 1 bf16 run against a tp 2 FP32 run: gathered, calibrated, within tolerance.
  auto r = sh("compare " + dir + "/bf16.h5 " + dir + "/ref.h5 --json " + dir + "/c.json --junit " + dir + "/c.xml");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  std::ifstream jf(dir + "/c.json");
  const auto j = nlohmann::json::parse(jf);
  EXPECT_EQ(j.value("schema_version", 0), 1);
  EXPECT_TRUE(j["first_divergence"].is_null());
  EXPECT_GT(j["probes"].size(), 10u);
  std::ifstream xf(dir + "/c.xml");
  std::string xml((std::istreambuf_iterator<char>(xf)), {});
  EXPECT_NE(xml.find("<testcase"), std::string::npos);
  EXPECT_EQ(xml.find("<failure"), std::string::npos);
  // Another input seed must fail at the very first probe.
  r = sh("compare " + dir + "/other.h5 " + dir + "/ref.h5");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("FIRST DIVERGENCE: layer 0 probe x"), std::string::npos) << r.out;
}

}  // namespace

// Two bugs at once: the first stage's is named and confirmed; the later one does not leak into the cause.
TEST(BisectCli, TwoBugsNameTheFirstStagesCause) {
  const std::string dir = tmpdir("two_bugs");
  const auto r = sh(std::string("bisect --model tiny --tokens 16") + kCandidate + " --inject kv-norm-no-weight,causal-off --workdir " +
                    dir + " --json " + dir + "/b.json");
  ASSERT_EQ(r.exit_code, 1) << r.out;
  std::ifstream f(dir + "/b.json");
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["first_divergence"]["stage"], "kv_a_norm");
  ASSERT_FALSE(j["hypotheses"]["confirmed"].empty()) << j["hypotheses"].dump();
  EXPECT_EQ(j["hypotheses"]["confirmed"][0]["class"], "norm.no_weight");
  for (const auto& c : j["hypotheses"]["confirmed"]) EXPECT_NE(c["class"], "attn.causal_off");
}

// Clean runs of other models and modes: no divergence, so nothing is searched and nothing confirmed.
TEST(BisectCli, CleanRunsConfirmNothing) {
  for (const char* args : {" --model tiny-dsa --mode decode --batch 2", " --model deepseek-v2-lite --mode chunked --tokens 8",
                           " --model tiny --tp 2 --attention absorbed"}) {
    SCOPED_TRACE(args);
    const std::string dir = tmpdir("clean_confirm");
    const auto r = sh(std::string("bisect") + kCandidate + args + " --workdir " + dir + " --json " + dir + "/b.json");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    std::ifstream f(dir + "/b.json");
    const auto j = nlohmann::json::parse(f);
    EXPECT_TRUE(j["first_divergence"].is_null());
    EXPECT_FALSE(j.contains("hypotheses"));
  }
}

// compare and golden check re-run the divergent stage under the bug classes on the candidate's own full tensors; on
// sketch-level dumps they say what they lack instead.
TEST(BisectCli, CompareAndGoldenCheckTestCauses) {
  const std::string dir = tmpdir("compare_causes");
  ASSERT_EQ(sh("run --model tiny --tokens 16 --probe-level full --out " + dir + "/ref.h5").exit_code, 0);
  ASSERT_EQ(sh("run --model tiny --tokens 16 --probe-level full --engine reference:precision=bf16 --inject position-offset --out " +
               dir + "/cand.h5").exit_code, 0);
  auto r = sh("compare " + dir + "/cand.h5 " + dir + "/ref.h5 --json " + dir + "/c.json");
  ASSERT_EQ(r.exit_code, 1) << r.out;
  {
    std::ifstream f(dir + "/c.json");
    const auto j = nlohmann::json::parse(f);
    ASSERT_FALSE(j["hypotheses"]["confirmed"].empty()) << j["hypotheses"].dump();
    EXPECT_EQ(j["hypotheses"]["confirmed"][0]["class"], "rope.position_offset");
    EXPECT_EQ(j["hypotheses"]["confirmed"][0]["params"]["offset"], 1);
    EXPECT_EQ(j["diagnosis"]["confidence"], "confirmed");
  }
  ASSERT_EQ(sh("run --model tiny --tokens 16 --engine reference:precision=bf16 --inject position-offset --out " + dir +
               "/cand_sketch.h5").exit_code, 0);
  r = sh("compare " + dir + "/cand_sketch.h5 " + dir + "/ref.h5 --json " + dir + "/s.json");
  ASSERT_EQ(r.exit_code, 1) << r.out;
  {
    std::ifstream f(dir + "/s.json");
    const auto j = nlohmann::json::parse(f);
    EXPECT_FALSE(j["hypotheses"]["searched"].get<bool>());
    EXPECT_NE(j["hypotheses"]["reason"].get<std::string>().find("not held"), std::string::npos) << j["hypotheses"].dump();
    EXPECT_EQ(j["diagnosis"]["confidence"], "unconfirmed");
  }
  r = sh(std::string("golden check ") + MLA_SOURCE_DIR + "/golden/tiny_prefill_t8_tp1.h5 --engine reference:precision=bf16 "
         "--inject kv-norm-no-weight --json " + dir + "/g.json");
  ASSERT_EQ(r.exit_code, 1) << r.out;
  std::ifstream f(dir + "/g.json");
  const auto j = nlohmann::json::parse(f);
  ASSERT_FALSE(j["hypotheses"]["confirmed"].empty()) << j["hypotheses"].dump();
  EXPECT_EQ(j["hypotheses"]["confirmed"][0]["class"], "norm.no_weight");
  EXPECT_EQ(j.value("schema_version", 0), 1);  // golden check's JSON
}

// The per-token chart on numbers of its own: a log axis over the values and the tolerance, the tolerance line at its
// value, zeros as grey stubs on the floor and NaN/Inf full height, both counted in the note; the probe's sparkline.
TEST(BisectHtml, TokenChartIsLogScaleWithZerosAtTheFloor) {
  mla::ProbeResult p;
  p.name = "q_pe_rope";
  p.stage = "rope";
  p.contract = "heads";
  p.verdict = mla::Verdict::Verdict_diverge;
  p.tol = {1e-3, 2e-3, "test tolerance"};
  p.m.basis = "full";
  p.m.rel_l2 = 0.5;
  p.m.token_rel = {0.0, 1e-4, 1e-2, 0.5, NAN, 0.0};
  mla::BisectReport r;
  r.exit_code = 1;
  r.headline = "first divergence: layer 0 q_pe_rope";
  r.first = p;
  r.compare.a_status = r.compare.b_status = "complete";
  r.compare.results = {p};
  r.compare.first_divergence = 0;
  r.compare.expected = r.compare.matched = 1;
  const std::string html = mla::bisect_to_html(r);
  EXPECT_NE(html.find("data-y-scale='log'"), std::string::npos);
  // Decades 1e-5 (a decade under the smallest value) to 1e0; 150 px between y 10 and the floor at 160.
  EXPECT_NE(html.find(">1e-5</text>"), std::string::npos);
  EXPECT_NE(html.find(">1e0</text>"), std::string::npos);
  const size_t tl = html.find("<line class='tolerance'");
  ASSERT_NE(tl, std::string::npos);
  const size_t y1 = html.find("y1='", tl) + 4;
  const double ty = std::stod(html.substr(y1, html.find('\'', y1) - y1));
  EXPECT_NEAR(ty, 10 + 150 * (1 - (std::log10(2e-3) + 5) / 5), 0.01);
  EXPECT_NE(html.find("tolerance 0.002</text>"), std::string::npos);
  // 1e-4 is one decade above the floor: 30 px.
  EXPECT_NE(html.find("y='130' height='30'"), std::string::npos) << html;
  size_t stubs = 0;
  for (size_t at = html.find("height='2' fill='#999'"); at != std::string::npos;
       at = html.find("height='2' fill='#999'", at + 1))
    ++stubs;
  EXPECT_EQ(stubs, 2u);
  EXPECT_NE(html.find("2 tokens with zero error (or below 1e-5) drawn at the floor in grey"), std::string::npos);
  EXPECT_NE(html.find("1 token NaN/Inf drawn full height"), std::string::npos);
  // The probe table's sparkline: the tolerance dashed, the NaN token a purple tick, the rest one polyline.
  const size_t sp = html.find("<svg class='spark'");
  ASSERT_NE(sp, std::string::npos);
  const std::string spark = html.substr(sp, html.find("</svg>", sp) - sp);
  EXPECT_NE(spark.find("stroke-dasharray"), std::string::npos);
  EXPECT_NE(spark.find("stroke='#7b2cbf'"), std::string::npos);
  EXPECT_NE(spark.find("<polyline"), std::string::npos);
  EXPECT_NE(spark.find("log scale 1e-5 .. 1e0"), std::string::npos) << spark;
}

// A probe missing ahead of the first divergence in graph order: the divergent probe's testcase still comes first.
TEST(Junit, FirstFailingTestcaseIsTheFirstDivergence) {
  mla::CompareReport rep;
  rep.a_status = rep.b_status = "complete";
  mla::ProbeResult missing, diverged;
  missing.name = "q_c";
  missing.verdict = mla::Verdict::Verdict_missing;
  missing.why = "not in the candidate";
  diverged.layer = 1;
  diverged.name = "q_pe_rope";
  diverged.stage = "rope";
  diverged.verdict = mla::Verdict::Verdict_diverge;
  diverged.why = "rel_l2 0.5 > 0.001";
  rep.results = {missing, diverged};
  rep.first_divergence = 1;
  const std::string xml = mla::compare_to_junit(rep, "suite");
  EXPECT_NE(xml.find("<property name=\"first_divergence\" value=\"layer 1 q_pe_rope\"/>"), std::string::npos) << xml;
  EXPECT_NE(xml.find("<property name=\"first_divergence_stage\" value=\"rope\"/>"), std::string::npos) << xml;
  const size_t fail = xml.find("<failure");
  ASSERT_NE(fail, std::string::npos);
  EXPECT_LT(xml.find("name=\"q_pe_rope\""), fail) << xml;
  EXPECT_NE(xml.find("first divergence: rel_l2 0.5"), std::string::npos);
  EXPECT_NE(xml.find("type=\"missing\""), std::string::npos);  // still a failure, after it
  EXPECT_EQ(xml.find("<testcase"), xml.find("<testcase classname=\"suite.layer1\" name=\"q_pe_rope\">"));
  // No divergence: no properties.
  rep.results = {missing};
  rep.first_divergence = -1;
  EXPECT_EQ(mla::compare_to_junit(rep, "suite").find("<properties>"), std::string::npos);
}
