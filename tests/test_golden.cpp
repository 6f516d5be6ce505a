// Golden dumps (golden/, harness/golden/golden.h), label cpu: every golden listed in golden/MANIFEST.json has its
// sha256 and passes `golden check` for the reference (a failure prints the command that regenerates it); a bf16
// engine passes at the calibrated tolerance; a planted bug fails with exit 1; make -> manifest -> check round trip;
// stale, unreadable and stopped goldens give exit 2, 2 and 3; JSON and JUnit outputs parse.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/golden/golden.h"
#include "tests/cli_util.h"

namespace {

using namespace mla;
namespace fs = std::filesystem;
using test::slurp;

// mla-bisect ARGS, stderr into stdout; no time limit of its own (the runs that could hang carry --timeout).
test::CliResult sh(const std::string& args) { return test::run_cli(args, {.merge_stderr = true, .timeout_s = 0}); }

// A fresh directory per test (temp/mla_test_golden_NAME_PID), removed at the end.
struct Scratch : test::ScratchDir {
  explicit Scratch(const std::string& name) : test::ScratchDir("golden_" + name) {}
};

const std::string kGoldenDir = std::string(MLA_SOURCE_DIR) + "/golden";
const std::string kManifest = kGoldenDir + "/MANIFEST.json";

std::string regenerate(const ManifestEntry& e) {
  return "\nRegenerate it from the repository root (" + std::string(MLA_SOURCE_DIR) + ") with:\n  " + e.command +
         "\n(golden make rewrites golden/MANIFEST.json; commit both)";
}

TEST(GoldenManifest, ListsTheCommittedGoldensWithTheirProvenance) {
  const auto entries = read_manifest(kManifest);
  ASSERT_GE(entries.size(), 6u) << kManifest << " lists too few goldens";
  std::set<std::string> listed;
  uintmax_t total = 0;
  for (const auto& e : entries) {
    SCOPED_TRACE(e.file);
    listed.insert(e.file);
    EXPECT_EQ(e.sha256.size(), 64u);
    EXPECT_EQ(e.command.rfind("mla-bisect golden make golden/" + e.file + " ", 0), 0u) << e.command;
    EXPECT_FALSE(e.tool_version.empty());
    EXPECT_FALSE(e.created.empty());
    ASSERT_TRUE(fs::exists(kGoldenDir + "/" + e.file)) << "listed but missing" << regenerate(e);
    const auto size = fs::file_size(kGoldenDir + "/" + e.file);
    EXPECT_LE(size, 400u * 1024) << "goldens are committed: keep them small";
    total += size;
  }
  EXPECT_LE(total, 2u * 1024 * 1024);
  for (const auto& f : fs::directory_iterator(kGoldenDir))
    if (f.path().extension() == ".h5")
      EXPECT_TRUE(listed.count(f.path().filename().string()))
          << f.path() << " is not in MANIFEST.json: run `mla-bisect golden update-manifest golden`";
}

TEST(GoldenManifest, EveryGoldenHasItsSha256AndPassesGoldenCheckForTheReference) {
  const auto entries = read_manifest(kManifest);
  ASSERT_FALSE(entries.empty());
  Scratch s("every");
  for (const auto& e : entries) {
    SCOPED_TRACE(e.file);
    const std::string path = kGoldenDir + "/" + e.file;
    EXPECT_EQ(sha256_file(path), e.sha256) << "golden/" << e.file << " does not match its sha256 in MANIFEST.json"
                                           << regenerate(e);
    const auto r = sh("golden check " + path + " --brief --junit " + s.path("j.xml"));
    EXPECT_EQ(r.exit_code, 0) << "golden check failed for golden/" << e.file << ":\n" << r.out << regenerate(e);
    EXPECT_NE(r.out.find("sha256 matches"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("golden check PASSED"), std::string::npos) << r.out;
    const std::string xml = slurp(s.path("j.xml"));
    EXPECT_NE(xml.find("<testcase"), std::string::npos);
    EXPECT_EQ(xml.find("<failure"), std::string::npos) << xml;
  }
}

std::string first_golden(const std::string& stem) {
  for (const auto& e : read_manifest(kManifest))
    if (e.file.find(stem) != std::string::npos) return kGoldenDir + "/" + e.file;
  return kGoldenDir + "/" + stem + ".h5";
}

TEST(GoldenCheck, Bf16EnginePassesAtTheCalibratedTolerance) {
  Scratch s("bf16");
  for (const char* stem : {"tiny_prefill_t8_tp1", "tiny_decode", "tiny_chunked"}) {
    SCOPED_TRACE(stem);
    const auto r = sh("golden check " + first_golden(stem) + " --engine reference:precision=bf16 --json " +
                      s.path("c.json"));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    std::ifstream f(s.path("c.json"));
    const auto j = nlohmann::json::parse(f);
    EXPECT_TRUE(j["first_divergence"].is_null());
    EXPECT_EQ(j["engine"], "reference:precision=bf16");
    EXPECT_FALSE(j["golden"]["command"].get<std::string>().empty());
    int above_floor = 0;
    for (const auto& p : j["probes"]) {
      EXPECT_NE(p["tolerance"]["origin"].get<std::string>().find("calibrated"), std::string::npos) << p.dump();
      above_floor += p["metrics"]["rel_l2"].is_number() && p["metrics"]["rel_l2"].get<double>() > 1e-5;
    }
    EXPECT_GT(above_floor, 5) << "the bf16 engine must actually differ from the FP32 golden";
  }
}

TEST(GoldenCheck, InjectedBugFailsWithExitOne) {
  Scratch s("inject");
  struct Case {
    const char* golden;
    const char* inject;
    const char* probe;
  };
  for (const Case& c : {Case{"tiny_prefill_t8_tp1", "rope-neox", "q_pe_rope"},
                        Case{"tiny_prefill_t8_tp2", "tp-head-offset", "q_nope"},
                        Case{"tiny_decode", "page-off-by-one", "attn_latent"}}) {
    SCOPED_TRACE(c.inject);
    const auto r = sh("golden check " + first_golden(c.golden) + " --engine reference --inject " + c.inject + " --json " +
                      s.path("c.json") + " --junit " + s.path("c.xml"));
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("golden check FAILED"), std::string::npos) << r.out;
    std::ifstream f(s.path("c.json"));
    const auto j = nlohmann::json::parse(f);
    EXPECT_EQ(j["first_divergence"]["probe"], c.probe) << j["first_divergence"].dump();
    const std::string xml = slurp(s.path("c.xml"));
    EXPECT_NE(xml.find("<failure"), std::string::npos);
  }
}

TEST(GoldenCheck, OtherTensorParallelismMatchesTheGolden) {
  EXPECT_EQ(sh("golden check " + first_golden("tiny_prefill_t8_tp1") + " --tp 2 --brief").exit_code, 0);
  EXPECT_EQ(sh("golden check " + first_golden("tiny_prefill_t8_tp2") + " --tp 4 --brief").exit_code, 0);
}

TEST(GoldenCheck, MakeWritesTheManifestAndAStaleGoldenSaysHowToRegenerate) {
  Scratch s("make");
  const std::string g = s.path("g.h5");
  auto r = sh("golden make " + g + " --model tiny --mode chunked --batch 2 --context 5,20 --tokens 4 --weight-seed 9");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_FALSE(fs::exists(g + ".journal"));
  const auto entries = read_manifest(s.path("MANIFEST.json"));
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].file, "g.h5");
  EXPECT_EQ(entries[0].sha256, sha256_file(g));
  EXPECT_EQ(entries[0].command, "mla-bisect golden make " + g +
                                    " --model tiny --mode chunked --tokens 4 --batch 2 --context 5,20 --weight-seed 9");
  EXPECT_EQ(entries[0].tool_version, MLA_VERSION);
  DumpReadOptions ro;
  ro.data = false;
  const Dump d = read_dump(g, ro);
  EXPECT_EQ(d.meta.command, entries[0].command);
  EXPECT_EQ(d.meta.probe_level, "full");
  EXPECT_EQ(d.meta.engine_dtype, "fp32");
  EXPECT_EQ(d.meta.run_options.value("weight_seed", 0), 9);
  EXPECT_TRUE(d.complete());

  r = sh("golden check " + g);
  EXPECT_EQ(r.exit_code, 0) << r.out;

  // Goldens hold full tensors only.
  EXPECT_EQ(sh("golden make " + s.path("x.h5") + " --model tiny --probe-level sketch").exit_code, 2);

  // A changed file no longer matches its manifest: exit 2 naming the command that regenerates it.
  std::string bytes = slurp(g);
  bytes[bytes.size() / 2] ^= 0x01;
  std::ofstream(g, std::ios::binary | std::ios::trunc) << bytes;
  r = sh("golden check " + g);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("differs from"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(entries[0].command), std::string::npos) << r.out;

  // update-manifest rehashes what is there (and drops what is gone).
  r = sh("golden update-manifest " + s.path(""));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(read_manifest(s.path("MANIFEST.json"))[0].sha256, sha256_file(g));
  fs::remove(g);
  EXPECT_EQ(sh("golden update-manifest " + s.path("")).exit_code, 0);
  EXPECT_TRUE(read_manifest(s.path("MANIFEST.json")).empty());
}

TEST(GoldenCheck, UnreadableGoldenIsExitTwoAndStoppedRunIsExitThree) {
  Scratch s("bad");
  EXPECT_EQ(sh("golden check /nonexistent/g.h5").exit_code, 2);
  std::ofstream(s.path("junk.h5")) << "not a dump";
  EXPECT_EQ(sh("golden check " + s.path("junk.h5")).exit_code, 2);
  EXPECT_EQ(sh("golden check " + first_golden("tiny_prefill_t8_tp1") + " --engine no-such-engine").exit_code, 2);
  EXPECT_EQ(sh("golden").exit_code, 2);

  // A golden whose own run stopped (crashed at o_proj; the journal is folded on read): exit 3.
  const auto r0 = sh("run --quiet --model tiny --tokens 8 --probe-level full --inject crash-at:o_proj --out " +
                     s.path("stopped.h5"));
  ASSERT_NE(r0.exit_code, 0);
  auto r = sh("golden check " + s.path("stopped.h5") + " --brief");
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_NE(r.out.find("stopped"), std::string::npos) << r.out;

  // A candidate that hangs: the watchdog ends the check with exit 3 and leaves a JUnit error.
  r = sh("golden check " + first_golden("tiny_prefill_t8_tp1") + " --inject hang-at:rope --timeout 1 --junit " +
         s.path("h.xml"));
  EXPECT_EQ(r.exit_code, 3) << r.out;
  const std::string xml = slurp(s.path("h.xml"));
  EXPECT_NE(xml.find("<error"), std::string::npos) << xml;
  EXPECT_NE(xml.find("stage rope"), std::string::npos) << xml;
}

}  // namespace
