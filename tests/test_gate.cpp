// The comparison as a gate (label cpu): no verdict passes silently. Nothing matched is a refusal (exit 2); every
// probe of the reference's stage graph is matched or listed as missing, and a missing one fails (exit 1) unless
// --allow-missing or --probes names it; replicas are compared on the data they carry, not on checksums alone; a
// probe whose records are not where a dump keeps them is an unreadable dump; a stopped run never reads as a pass;
// dumps of different shapes are refused with the differences named; a divergence comes with its diagnosis. Dumps
// are made with the Runner and edited through the C++ API (or the HDF5 C API, for a file's layout), then checked
// in process and through `mla-bisect compare` / `golden check`.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/bisect/bisect_html.h"
#include "harness/compare/compare.h"
#include "core/engine/engine.h"
#include "harness/explore/explore.h"
#include "core/model/config.h"
#include "core/model/errors.h"
#include "core/model/inputs.h"
#include "core/model/weights.h"
#include "harness/report/compare_report.h"
#include "harness/run/runner.h"
#include "harness/run/synthetic_inputs.h"
#include "probes/collect.h"
#include "probes/dump.h"
#include "tests/cli_util.h"

namespace {

using namespace mla;
using test::slurp;

test::CliResult sh(const std::string& args) { return test::run_cli(args, {.merge_stderr = true, .timeout_s = 120}); }

std::string dir(const std::string& name) {
  static const test::ScratchDir root("gate");
  const auto d = root.dir() / name;
  std::filesystem::create_directories(d);
  return d.string();
}

RunSpec prefill(int tokens, int tp = 1) {
  RunSpec s;
  s.tokens = tokens;
  s.tp = tp;
  return s;
}

// A run of the FP32 reference (or `engine`) with the provenance `run --out` records: model, run options, inputs.
Dump make_run(const RunSpec& spec, ProbeLevel level = ProbeLevel::ProbeLevel_full, MlaConfig cfg = *find_preset("tiny"),
              const std::string& engine = "reference", const std::string& inject = "") {
  const auto weights = synthetic_weights(cfg, spec.layers, spec.graph_shape().input_norm, 3);
  const Inputs inputs = synthetic_inputs(cfg, spec, weights);
  auto e = make_engine(EngineSpec::parse(engine));
  e->set_injections(parse_injections(inject));
  DumpMeta meta;
  meta.engine = e->name();
  meta.engine_dtype = e->dtype();
  meta.model = cfg.to_json();
  meta.run_options = run_spec_to_json(spec);
  meta.run_options["weights"] = "synthetic";
  meta.run_options["weight_seed"] = 3;
  meta.tp = spec.tp;
  meta.mode = mode_name(spec.mode);
  meta.probe_level = probe_level_name(level);
  CollectSink sink(meta, spec.tp);
  ProbePlan plan;
  plan.level = level;
  Runner runner(cfg, spec);
  runner.run(*e, weights, inputs, plan, sink);
  Dump d = sink.take();
  d.has_inputs = true;
  d.inputs = inputs;
  d.path = engine + (inject.empty() ? "" : " " + inject) + " tp" + std::to_string(spec.tp);
  return d;
}

size_t graph_size(const RunSpec& spec) { return build_graph(*find_preset("tiny"), spec.graph_shape()).probes.size(); }

DumpProbe& probe(Dump& d, const std::string& name, int layer = 0) {
  for (auto& p : d.probes)
    if (p.layer == layer && p.name == name) return p;
  throw std::runtime_error("no probe " + name);
}

const ProbeResult& result(const CompareReport& rep, const std::string& name, int layer = 0) {
  for (const auto& r : rep.results)
    if (r.layer == layer && r.name == name) return r;
  throw std::runtime_error("no result " + name);
}

// Keeps the first `n` probes of the graph (the rest dropped, as an engine that never recorded them).
void keep_first(Dump& d, size_t n) { d.probes.resize(std::min(n, d.probes.size())); }

std::string text_of(const CompareReport& rep, bool all_rows = true) {
  std::ostringstream os;
  print_compare(os, rep, all_rows);
  return os.str();
}

std::string save(const Dump& d, const std::string& path) {
  write_dump_h5(d, path);
  return path;
}

// Renames an HDF5 link inside a written dump (the file's layout, as another producer might have spelled it).
void move_link(const std::string& file, const std::string& from, const std::string& to) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0) << file;
  EXPECT_GE(H5Lmove(f, from.c_str(), f, to.c_str(), H5P_DEFAULT, H5P_DEFAULT), 0) << from << " -> " << to;
  H5Fclose(f);
}

const ToleranceModel kFloor{};

// ---------------------------------------------------------------------------------------------------
// Nothing matched: a refusal, never a pass
// ---------------------------------------------------------------------------------------------------

TEST(GateZeroMatched, NoProbeInCommonIsAUsageErrorNamingBothSides) {
  const Dump ref = make_run(prefill(6));
  Dump cand = ref;
  for (auto& p : cand.probes) p.layer = 5;  // the same probes under a layer the reference does not have
  try {
    compare_dumps(cand, ref, kFloor);
    FAIL() << "no probe matched, yet the comparison returned";
  } catch (const UsageError& e) {
    EXPECT_CONTAINS(e.what(), "no probe of");
    EXPECT_CONTAINS(e.what(), "layer5");
    EXPECT_CONTAINS(e.what(), "layer0");
  }
}

TEST(GateZeroMatched, LayerGroupSpelledDifferentlyIsExitTwo) {
  const std::string d = dir("zero");
  const std::string ref = save(make_run(prefill(6)), d + "/ref.h5");
  // A layer group spelled another way is not a dump's group: refused on reading.
  const std::string spelled = save(make_run(prefill(6)), d + "/spelled.h5");
  move_link(spelled, "layer0", "layer_0");
  auto r = sh("compare " + spelled + " " + ref);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "layer_0");
  EXPECT_EQ(r.out.find("no divergence"), std::string::npos) << r.out;
  // A complete dump that holds no probe.
  Dump empty = make_run(prefill(6));
  empty.probes.clear();
  r = sh("compare " + save(empty, d + "/empty.h5") + " " + ref);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "no probe of");
  EXPECT_EQ(r.out.find("no divergence"), std::string::npos) << r.out;
  // Probes under another layer number (a producer that records no run options): read, but none is the reference's.
  Dump other = make_run(prefill(6));
  for (auto& p : other.probes) p.layer = 3;
  other.meta.run_options = nullptr;
  const std::string cand = save(other, d + "/cand.h5");
  r = sh("compare " + cand + " " + ref);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "no probe of");
  EXPECT_CONTAINS(r.out, "layer3");  // the candidate's groups, as the file spells them
  EXPECT_EQ(r.out.find("no divergence"), std::string::npos) << r.out;
}

// ---------------------------------------------------------------------------------------------------
// Missing probes fail unless named
// ---------------------------------------------------------------------------------------------------

TEST(GateMissing, FiveOfTheGraphsProbesFailWithTheMissingListed) {
  const RunSpec spec = prefill(6);
  const Dump ref = make_run(spec);
  Dump cand = ref;
  keep_first(cand, 5);
  const CompareReport rep = compare_dumps(cand, ref, kFloor);
  EXPECT_EQ(rep.first_divergence, -1) << "the five present agree";
  EXPECT_EQ(rep.expected, static_cast<int>(graph_size(spec)));
  EXPECT_EQ(rep.matched, 5);
  EXPECT_EQ(rep.missing(false).size(), graph_size(spec) - 5);
  EXPECT_EQ(rep.exit_code(), ExitCode_divergence);
  const std::string line = rep.verdict_line();
  EXPECT_CONTAINS(line, "5 of " + std::to_string(graph_size(spec)) + " probes matched");
  EXPECT_CONTAINS(line, std::to_string(graph_size(spec) - 5) + " missing (" + ref.probes[5].name + ", ");
  EXPECT_CONTAINS(line, "FAIL");
  const ProbeResult& o = result(rep, "o");
  EXPECT_EQ(o.verdict, Verdict::Verdict_missing);
  EXPECT_CONTAINS(o.why, "not in the candidate");
}

TEST(GateMissing, ProbesTheReferenceLacksAreMissingToo) {
  const Dump full = make_run(prefill(6));
  Dump ref = full;
  keep_first(ref, 5);  // a reference (a golden, say) holding fewer probes than its graph: not a pass on 5
  const CompareReport rep = compare_dumps(full, ref, kFloor);
  EXPECT_EQ(rep.exit_code(), ExitCode_divergence) << rep.verdict_line();
  EXPECT_CONTAINS(result(rep, "o").why, "not in the reference");
}

TEST(GateMissing, AllowMissingAndProbeSelectionNameWhatMayBeAbsent) {
  const RunSpec spec = prefill(6);
  const Dump ref = make_run(spec);
  Dump cand = ref;
  std::vector<std::string> kept, dropped;
  for (size_t i = 0; i < cand.probes.size(); ++i) (i < 5 ? kept : dropped).push_back(cand.probes[i].name);
  keep_first(cand, 5);

  CompareOptions allow;
  allow.allow_missing = dropped;
  allow.allow_missing.back() = "layer0/" + allow.allow_missing.back();  // the layer form too
  CompareReport rep = compare_dumps(cand, ref, kFloor, allow);
  EXPECT_EQ(rep.exit_code(), ExitCode_ok) << rep.verdict_line();
  EXPECT_EQ(rep.missing(true).size(), dropped.size()) << "still reported";
  EXPECT_CONTAINS(rep.verdict_line(), "missing but allowed");

  CompareOptions only;
  only.only = kept;
  rep = compare_dumps(cand, ref, kFloor, only);
  EXPECT_EQ(rep.exit_code(), ExitCode_ok) << rep.verdict_line();
  EXPECT_EQ(rep.expected, 5);
  EXPECT_EQ(rep.results.size(), 5u);

  CompareOptions typo;
  typo.allow_missing = {"q_cc"};
  EXPECT_THROW(compare_dumps(cand, ref, kFloor, typo), UsageError);
}

TEST(GateMissing, CliExitCodesReportsAndJunit) {
  const std::string d = dir("missing");
  const RunSpec spec = prefill(6);
  const Dump ref = make_run(spec);
  Dump cand = ref;
  keep_first(cand, 5);
  save(ref, d + "/ref.h5");
  save(cand, d + "/cand.h5");
  const std::string args = "compare " + d + "/cand.h5 " + d + "/ref.h5";

  auto r = sh(args + " --json " + d + "/c.json --junit " + d + "/c.xml");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_CONTAINS(r.out, "5 of " + std::to_string(graph_size(spec)) + " probes matched");
  EXPECT_CONTAINS(r.out, "MISSING");
  EXPECT_EQ(r.out.find("no divergence"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(slurp(d + "/c.json"));
  EXPECT_EQ(j["schema_version"], 1);
  EXPECT_EQ(j["verdict"], "fail");
  EXPECT_EQ(j["matched"], 5);
  ASSERT_EQ(j["missing"].size(), graph_size(spec) - 5);
  EXPECT_EQ(j["missing"].back()["probe"], "o");
  EXPECT_CONTAINS(j["missing"].back()["reason"].get<std::string>(), "not in the candidate");
  for (const auto& p : j["probes"]) {
    if (p["verdict"] == "missing") EXPECT_TRUE(p["metrics"].is_null()) << p.dump();
  }
  const std::string xml = slurp(d + "/c.xml");
  size_t failures = 0;
  for (size_t at = xml.find("<failure type=\"missing\""); at != std::string::npos;
       at = xml.find("<failure type=\"missing\"", at + 1))
    ++failures;
  EXPECT_EQ(failures, graph_size(spec) - 5) << xml;

  r = sh(args + " --brief");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_CONTAINS(r.out, "o_partial: not in the candidate");

  std::string names;
  for (size_t i = 5; i < ref.probes.size(); ++i) names += (names.empty() ? "" : ",") + ref.probes[i].name;
  r = sh(args + " --allow-missing " + names);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_CONTAINS(r.out, "missing but allowed");
  r = sh(args + " --probes x,q_a");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_CONTAINS(r.out, "2 of 2 probes matched");
  EXPECT_EQ(sh(args + " --probes no_such_probe").exit_code, 2);
}

TEST(GateMissing, GoldenHoldingFewerProbesThanItsGraphFailsTheCheck) {
  const std::string d = dir("golden");
  const auto made = sh("golden make " + d + "/g.h5 --model tiny --tokens 4 --no-manifest");
  ASSERT_EQ(made.exit_code, 0) << made.out;
  Dump g = read_dump(d + "/g.h5");
  keep_first(g, 5);
  save(g, d + "/g.h5");
  const auto r = sh("golden check " + d + "/g.h5 --no-manifest --brief");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_CONTAINS(r.out, "not in the reference");
  EXPECT_CONTAINS(r.out, "golden check FAILED");
}

// ---------------------------------------------------------------------------------------------------
// Replicas: compared on what they carry
// ---------------------------------------------------------------------------------------------------

TEST(GateReplicas, WithoutChecksumsADifferingCopyIsNamedFromItsData) {
  const Dump ref = make_run(prefill(6, 1));
  for (ProbeLevel level : {ProbeLevel::ProbeLevel_full, ProbeLevel::ProbeLevel_sketch, ProbeLevel::ProbeLevel_stats}) {
    SCOPED_TRACE(probe_level_name(level));
    Dump cand = make_run(prefill(6, 2), level);
    for (auto& p : cand.probes)
      for (auto& rec : p.ranks) rec.checksum = 0;  // a producer that writes no checksum attribute
    ProbeRecord& r1 = probe(cand, "kv_c_norm").ranks[1];
    if (level == ProbeLevel::ProbeLevel_full) r1.data.data[9] += 0.5f;  // rank 1's copy is off in one element
    else if (level == ProbeLevel::ProbeLevel_sketch) r1.sketch[3] += 0.5f;
    else r1.l2 *= 1.01;
    const Dump reference = level == ProbeLevel::ProbeLevel_full ? ref : make_run(prefill(6, 1), level);
    const CompareReport rep = compare_dumps(cand, reference, kFloor);
    const ProbeResult& r = result(rep, "kv_c_norm");
    EXPECT_EQ(r.verdict, Verdict::Verdict_diverge) << r.why;
    ASSERT_EQ(r.problems.size(), 1u);
    EXPECT_CONTAINS(r.problems[0], "replicated probe differs on rank 1");
    if (level == ProbeLevel::ProbeLevel_full) {
      EXPECT_CONTAINS(r.problems[0], "full data");
      EXPECT_CONTAINS(r.problems[0], "1 of ");
      EXPECT_CONTAINS(r.problems[0], "max |difference| 0.5");
      EXPECT_CONTAINS(r.problems[0], "token 0 column 9");
    } else {
      EXPECT_CONTAINS(r.problems[0], level == ProbeLevel::ProbeLevel_sketch ? "sketch" : "l2");
    }
    EXPECT_EQ(rep.exit_code(), ExitCode_divergence);
  }
}

TEST(GateReplicas, AgreeingCopiesWithoutChecksumsStillPass) {
  Dump cand = make_run(prefill(6, 2));
  for (auto& p : cand.probes)
    for (auto& rec : p.ranks) rec.checksum = 0;
  const CompareReport rep = compare_dumps(cand, make_run(prefill(6, 1)), kFloor);
  EXPECT_EQ(rep.exit_code(), ExitCode_ok) << rep.verdict_line();
}

TEST(GateReplicas, CliNamesTheRankAndItsDifference) {
  const std::string d = dir("replica");
  Dump cand = make_run(prefill(6, 2));
  for (auto& p : cand.probes)
    for (auto& rec : p.ranks) rec.checksum = 0;
  probe(cand, "kv_c_norm").ranks[1].data.data[9] += 0.5f;
  save(cand, d + "/cand.h5");
  save(make_run(prefill(6, 2)), d + "/ref.h5");
  const auto r = sh("compare " + d + "/cand.h5 " + d + "/ref.h5");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_CONTAINS(r.out, "replicated probe differs on rank 1");
  EXPECT_CONTAINS(r.out, "diagnosis");
}

// ---------------------------------------------------------------------------------------------------
// Records that are not where a dump keeps them: an unreadable dump
// ---------------------------------------------------------------------------------------------------

TEST(GateUnreadable, AProbeWithoutRankRecordsIsAUsageError) {
  const Dump ref = make_run(prefill(6));
  Dump cand = ref;
  probe(cand, "q_c").ranks.clear();
  try {
    compare_dumps(cand, ref, kFloor);
    FAIL() << "a probe without records was compared";
  } catch (const UsageError& e) {
    EXPECT_CONTAINS(e.what(), "layer0/q_c");
    EXPECT_CONTAINS(e.what(), "no rank records");
  }
  cand = ref;
  probe(cand, "q_c").ranks[0].data = Tensor();  // says full, holds no data
  EXPECT_THROW(compare_dumps(cand, ref, kFloor), UsageError);
}

TEST(GateUnreadable, CliRefusesDataOutsideTheRankGroups) {
  const std::string d = dir("unreadable");
  const std::string ref = save(make_run(prefill(6)), d + "/ref.h5");
  const std::string a = save(make_run(prefill(6)), d + "/a.h5");
  move_link(a, "layer0/q_c/rank0", "layer0/q_c/r0");
  auto r = sh("compare " + a + " " + ref);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "layer0/q_c");
  EXPECT_EQ(r.out.find("DIVERGENCE"), std::string::npos) << r.out;
  const std::string b = save(make_run(prefill(6)), d + "/b.h5");
  move_link(b, "layer0/q_c/rank0/data", "layer0/q_c/data");
  r = sh("compare " + b + " " + ref);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "layer0/q_c");
}

// ---------------------------------------------------------------------------------------------------
// A stopped run: never a pass line, missing probes without numbers
// ---------------------------------------------------------------------------------------------------

TEST(GateStopped, AStoppedCandidateSaysSoAndShowsNoNumbersForWhatItLacks) {
  const RunSpec spec = prefill(6);
  const Dump ref = make_run(spec);
  Dump cand = ref;
  keep_first(cand, 8);
  cand.status = "stopped: hung in layer 0 stage rope (watchdog 1 s)";
  const CompareReport rep = compare_dumps(cand, ref, kFloor);
  EXPECT_EQ(rep.exit_code(), ExitCode_engine);
  const std::string text = text_of(rep);
  EXPECT_EQ(text.find("no divergence"), std::string::npos) << text;
  EXPECT_EQ(text.find("PASS"), std::string::npos) << text;
  EXPECT_CONTAINS(text, "STOPPED EARLY");
  EXPECT_CONTAINS(text, "8 of " + std::to_string(graph_size(spec)) + " probes matched");
  EXPECT_CONTAINS(text, "not in the candidate, which stopped before recording it");
  EXPECT_CONTAINS(text, "the candidate stopped: hung in layer 0 stage rope");
  // The row of a probe never recorded carries no rel_l2 and no cosine.
  std::istringstream lines(text);
  bool seen = false;
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("0   o ", 0) == 0) {
      seen = true;
      EXPECT_CONTAINS(line, "—");
      EXPECT_CONTAINS(line, "MISSING");
      EXPECT_EQ(line.find(" 1 "), std::string::npos) << line;
    }
  EXPECT_TRUE(seen) << text;
  const auto j = compare_to_json(rep);
  EXPECT_EQ(j["verdict"], "stopped");
  EXPECT_EQ(j["exit_code"], 3);
  EXPECT_TRUE(j["probes"].back()["metrics"].is_null());
}

TEST(GateStopped, HtmlAndExplorerShowTheMissingProbesAndNoPass) {
  const Dump ref = make_run(prefill(6));
  Dump cand = ref;
  keep_first(cand, 8);
  cand.status = "stopped: hung in layer 0 stage rope (watchdog 1 s)";
  BisectReport b;
  b.headline = "candidate HUNG";
  b.compare = compare_dumps(cand, ref, kFloor);
  const std::string html = bisect_to_html(b);
  EXPECT_CONTAINS(html, "MISSING");
  EXPECT_CONTAINS(html, "INCOMPLETE");
  EXPECT_CONTAINS(html, "<td>o</td><td>&mdash;</td>");

  std::ostringstream os;
  Explorer ex(cand, ref, kFloor, os);
  ex.print_intro();
  EXPECT_EQ(os.str().find("no divergence"), std::string::npos) << os.str();
  EXPECT_CONTAINS(os.str(), "8 of ");
}

TEST(GateStopped, CliHungCandidateIsExitThreeWithoutAPassLine) {
  const std::string d = dir("hung");
  ASSERT_EQ(sh("run --quiet --model tiny --tokens 6 --probe-level full --out " + d + "/ref.h5").exit_code, 0);
  const auto h = sh("run --quiet --model tiny --tokens 6 --probe-level full --inject hang-at:rope --watchdog 1 --out " +
                    d + "/hung.h5");
  ASSERT_EQ(h.exit_code, 3) << h.out;
  const auto r = sh("compare " + d + "/hung.h5 " + d + "/ref.h5 --junit " + d + "/h.xml");
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_EQ(r.out.find("no divergence"), std::string::npos) << r.out;
  EXPECT_CONTAINS(r.out, "STOPPED EARLY");
  EXPECT_CONTAINS(r.out, "INCOMPLETE");
  EXPECT_CONTAINS(slurp(d + "/h.xml"), "<error");
}

// ---------------------------------------------------------------------------------------------------
// Dumps of different shapes are refused
// ---------------------------------------------------------------------------------------------------

TEST(GateComparable, DifferentTokensOrModelAreRefusedWithTheDifferences) {
  const Dump ref = make_run(prefill(6));
  auto diff = check_comparable(make_run(prefill(8)), ref);
  ASSERT_FALSE(diff.empty());
  std::string all;
  for (auto& s : diff) all += s + "\n";
  EXPECT_CONTAINS(all, "tokens per sequence: 8 vs 6");
  EXPECT_CONTAINS(all, "probe shapes");
  EXPECT_THROW(compare_dumps(make_run(prefill(8)), ref, kFloor), UsageError);

  MlaConfig wide = *find_preset("tiny");
  wide.hidden = 96;
  wide.derive();
  diff = check_comparable(make_run(prefill(6), ProbeLevel::ProbeLevel_full, wide), ref);
  all.clear();
  for (auto& s : diff) all += s + "\n";
  EXPECT_CONTAINS(all, "hidden size: 96 vs 64");

  // A different tp is not a difference: each side is gathered first.
  EXPECT_TRUE(check_comparable(make_run(prefill(6, 2)), ref).empty());
  // Nor is another engine or input seed: that is what a comparison is for.
  EXPECT_TRUE(check_comparable(make_run(prefill(6), ProbeLevel::ProbeLevel_full, *find_preset("tiny"),
                                        "reference:precision=bf16"),
                               ref)
                  .empty());
}

TEST(GateComparable, CliUnrelatedDumpsAreExitTwo) {
  const std::string d = dir("unrelated");
  ASSERT_EQ(sh("run --quiet --model tiny --tokens 6 --out " + d + "/t6.h5").exit_code, 0);
  ASSERT_EQ(sh("run --quiet --model tiny --tokens 8 --out " + d + "/t8.h5").exit_code, 0);
  ASSERT_EQ(sh("run --quiet --model tiny --mode decode --batch 2 --context 5,9 --tokens 1 --out " + d + "/dec.h5")
                .exit_code,
            0);
  MlaConfig wide = *find_preset("tiny");
  wide.hidden = 96;
  wide.derive();
  save(make_run(prefill(6), ProbeLevel::ProbeLevel_sketch, wide), d + "/wide.h5");
  auto r = sh("compare " + d + "/t8.h5 " + d + "/t6.h5");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "tokens per sequence: 8 vs 6");
  EXPECT_EQ(r.out.find("FIRST DIVERGENCE"), std::string::npos) << r.out;
  r = sh("compare " + d + "/dec.h5 " + d + "/t6.h5");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "mode: decode vs prefill");
  r = sh("compare " + d + "/wide.h5 " + d + "/t6.h5");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "hidden size: 96 vs 64");
  r = sh("explore " + d + "/wide.h5 " + d + "/t6.h5 < /dev/null");
  EXPECT_EQ(r.exit_code, 2) << r.out;
}

// ---------------------------------------------------------------------------------------------------
// A divergence comes with its drill-down and diagnosis
// ---------------------------------------------------------------------------------------------------

TEST(GateDiagnosis, CompareAndGoldenCheckPrintAndWriteTheDiagnosis) {
  const std::string d = dir("diagnosis");
  ASSERT_EQ(sh("run --quiet --model tiny --tokens 8 --probe-level full --out " + d + "/ref.h5").exit_code, 0);
  ASSERT_EQ(sh("run --quiet --model tiny --tokens 8 --probe-level full --inject rope-neox --out " + d + "/bug.h5")
                .exit_code,
            0);
  auto r = sh("compare " + d + "/bug.h5 " + d + "/ref.h5 --json " + d + "/c.json");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_CONTAINS(r.out, "FIRST DIVERGENCE");
  EXPECT_CONTAINS(r.out, "diagnosis (");
  EXPECT_CONTAINS(r.out, "drill-down");
  auto j = nlohmann::json::parse(slurp(d + "/c.json"));
  EXPECT_EQ(j["verdict"], "fail");
  ASSERT_TRUE(j.contains("diagnosis")) << j.dump(1).substr(0, 2000);
  EXPECT_FALSE(j["diagnosis"]["pattern"].get<std::string>().empty());
  EXPECT_TRUE(j["drill_down"]["lines"].is_array());

  const auto g = sh("golden make " + d + "/g.h5 --model tiny --tokens 8 --no-manifest");
  ASSERT_EQ(g.exit_code, 0) << g.out;
  r = sh("golden check " + d + "/g.h5 --no-manifest --inject rope-neox --brief --json " + d + "/g.json");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_CONTAINS(r.out, "diagnosis (");
  j = nlohmann::json::parse(slurp(d + "/g.json"));
  EXPECT_TRUE(j.contains("diagnosis"));
  EXPECT_EQ(j["schema_version"], 1);
}

}  // namespace
