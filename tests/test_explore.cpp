// `mla-bisect explore` end to end (label cpu): two dumps made through the CLI (an FP32 reference and a bf16
// candidate with rope-neox planted), then scripted sessions through stdin (a here-document) and one through a
// real terminal (tmux send-keys / capture-pane).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness/report/heatmap.h"
#include "tests/cli_util.h"

namespace {

using Result = mla::test::CliResult;
using mla::test::run_shell;

std::string bin() { return MLA_BINARY; }

class Explore : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (std::filesystem::temp_directory_path() / ("mla_explore_test_" + std::to_string(getpid()))).string();
    std::filesystem::create_directories(dir_);
    const std::string common = " run --quiet --model tiny --tokens 8 --probe-level full";
    const auto ref = run_shell(bin() + common + " --out " + dir_ + "/ref.h5 2>&1");
    ASSERT_EQ(ref.exit_code, 0) << ref.out;
    const auto cand = run_shell(bin() + common + " --engine reference:precision=bf16 --inject rope-neox --out " + dir_ +
                            "/cand.h5 2>&1");
    ASSERT_EQ(cand.exit_code, 0) << cand.out;
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  // Runs explore with `script` as a here-document on stdin.
  static Result session(const std::string& script, const std::string& extra = "") {
    return run_shell(bin() + " explore " + dir_ + "/cand.h5 " + dir_ + "/ref.h5" + extra + " 2>&1 <<'EOF'\n" + script +
                 "\nEOF\n");
  }

  static std::string dir_;
};
std::string Explore::dir_;

// The lines of `out` from the first line containing `from` up to (not including) the first later line
// containing `to`.
std::vector<std::string> section(const std::string& out, const std::string& from, const std::string& to) {
  std::istringstream is(out);
  std::vector<std::string> lines;
  bool in = false;
  for (std::string l; std::getline(is, l);) {
    if (!in && l.find(from) != std::string::npos) in = true;
    else if (in && l.find(to) != std::string::npos) break;
    if (in) lines.push_back(l);
  }
  return lines;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST_F(Explore, ScriptedSessionFindsRopeAndDrillsDown) {
  const auto r = session(
      "help\nlist\nfirst\nnext\nprev\nshow q_pe_rope\nheads\ntokens\nranks\nchannels\nheatmap q_pe_rope\n"
      "slice q_pe_rope t=3 h=2 c=0:16\nworst q_pe_rope 5\nslice q_pe_rope\nisolate q_pe_rope\nfrobnicate\nquit\nlist\n");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string& o = r.out;
  EXPECT_NE(o.find("calibrating tolerances"), std::string::npos) << o;
  EXPECT_EQ(o.find("explore>"), std::string::npos) << "no prompt when stdin is not a terminal\n" << o;
  EXPECT_NE(o.find("first divergence: layer 0 q_pe_rope (stage rope)"), std::string::npos) << o;

  // help lists every command.
  for (const char* c : {"list", "first", "next", "prev", "show", "heads", "tokens", "ranks", "channels", "heatmap",
                        "slice", "worst", "isolate", "help", "quit"})
    EXPECT_NE(o.find(std::string("  ") + c), std::string::npos) << "help lacks " << c;

  // list: q_pe_rope is marked divergent and first; quit stops the script (one list only).
  EXPECT_TRUE(std::regex_search(o, std::regex(R"(\*\s+\d+\s+0\s+q_pe_rope .*DIVERGE\s+<- first divergence)"))) << o;
  EXPECT_EQ(count(o, "beyond tolerance (*)"), 1u) << o;

  // first / next / prev step through divergences; the card names the pattern.
  EXPECT_NE(o.find("[divergence 1 of"), std::string::npos) << o;
  EXPECT_NE(o.find("[divergence 2 of"), std::string::npos) << o;
  EXPECT_NE(o.find("position 0 exact"), std::string::npos) << o;

  // show: metrics, tolerance origin, drill-down, diagnosis.
  EXPECT_NE(o.find("calibrated: 4 x bf16 noise floor"), std::string::npos) << o;
  EXPECT_NE(o.find("drill-down"), std::string::npos) << o;
  EXPECT_TRUE(std::regex_search(o, std::regex(R"(\ndiagnosis \(unconfirmed pattern, fits its evidence: (high|medium)\): position 0 exact)"))) << o;

  // Bar charts for the current probe (q_pe_rope after show).
  EXPECT_NE(o.find("rel_l2 per head, layer 0 q_pe_rope"), std::string::npos) << o;
  EXPECT_NE(o.find("head 3"), std::string::npos) << o;
  EXPECT_NE(o.find("rel_l2 per token, layer 0 q_pe_rope"), std::string::npos) << o;
  EXPECT_NE(o.find("t 7"), std::string::npos) << o;
  EXPECT_NE(o.find("rel_l2 per rank, layer 0 q_pe_rope"), std::string::npos) << o;
  EXPECT_NE(o.find("rel_l2 per channel"), std::string::npos) << o;

  // heatmap: a header, 8 token rows of ramp characters, a legend.
  const auto hm = section(o, "heatmap of layer 0 q_pe_rope", "scale:");
  ASSERT_GE(hm.size(), 11u) << o;
  EXPECT_NE(hm[1].find("head ->"), std::string::npos) << hm[1];
  EXPECT_EQ(hm[2].rfind("token", 0), 0u) << hm[2];
  int rows = 0;
  for (size_t k = 3; k < hm.size(); ++k)
    if (std::regex_match(hm[k], std::regex(R"(\s*\d+ [ .:\-=+*#%@!]+)"))) ++rows;
  EXPECT_EQ(rows, 8) << o;
  EXPECT_TRUE(std::regex_search(o, std::regex(R"(\n\s+7 [ .:\-=]*[+*#%@])"))) << "the last token must be off\n" << o;

  // slice t=3 h=2: eight channels (the rope dim of tiny), difference = candidate - reference.
  const auto sl = section(o, "slice of layer 0 q_pe_rope at token 3", "(* outside allclose");
  ASSERT_EQ(sl.size(), 10u) << o;
  EXPECT_NE(sl[0].find("head 2"), std::string::npos) << sl[0];
  for (size_t k = 2; k < sl.size(); ++k) {
    std::istringstream is(sl[k]);
    int c = -1;
    double a = 0, b = 0, d = 0;
    is >> c >> a >> b >> d;
    EXPECT_EQ(c, static_cast<int>(k) - 2) << sl[k];
    EXPECT_NEAR(d, a - b, 1e-5 + 1e-5 * std::abs(a - b)) << sl[k];
  }

  // worst: coordinates, the largest first, the same element show names as max |a-b|, and the default slice
  // (the worst element's token and head) holds its values.
  const auto wl = section(o, "worst 5 elements of layer 0 q_pe_rope", "slice of layer 0 q_pe_rope at token");
  ASSERT_GE(wl.size(), 7u) << o;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(wl[2], m, std::regex(R"(^\s+1\s+(\S+)\s+(\S+)\s+(\S+)\s+(layer 0 rank 0 token (\d+) head (\d+) channel (\d+))$)")))
      << wl[2];
  const std::string cand_v = m[1], ref_v = m[2], where = m[4], token = m[5], head = m[6], channel = m[7];
  EXPECT_NE(o.find("at " + where + " (candidate"), std::string::npos) << "show's worst element is " << where << "\n" << o;
  const auto ds = section(o, "slice of layer 0 q_pe_rope at token " + token + " (position " + token + "), head " + head,
                          "(* outside allclose");
  ASSERT_FALSE(ds.empty()) << o;
  bool found = false;
  for (auto& l : ds) {
    std::istringstream is(l);
    std::string c, a, b;
    is >> c >> a >> b;
    found = found || (c == channel && a == cand_v && b == ref_v);
  }
  EXPECT_TRUE(found) << "worst element " << cand_v << " vs " << ref_v << " at channel " << channel << " not in\n" << o;

  // isolate: rope is wrong on the reference's exact inputs.
  EXPECT_NE(o.find("isolation: introduced by stage rope"), std::string::npos) << o;
  // ... and re-run under the bug classes of the rope stage, the planted layout is confirmed.
  EXPECT_NE(o.find("confirmed rope.layout"), std::string::npos) << o;
  EXPECT_NE(o.find("cause (confirmed by re-running the stage)"), std::string::npos) << o;
  // Unknown command: a one-line hint, and the session goes on.
  EXPECT_NE(o.find("unknown command 'frobnicate': type help"), std::string::npos) << o;
}

TEST_F(Explore, EndOfInputQuitsAndBadProbesAreHints) {
  const auto r = session("show no_such_probe\nslice q_pe_rope t=99\nworst kv_c 3\nheads kv_c\nheatmap kv_c_norm\nnext\nnext");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("no probe 'no_such_probe' in these dumps; probes: x,"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("error: t=99 is outside 0..7"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("worst 3 elements of layer 0 kv_c"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kv_c has no heads axis"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("token x channel"), std::string::npos) << r.out;
}

TEST_F(Explore, ColorAlwaysDrawsAnsiBlocks) {
  const auto r = session("heatmap q_pe_rope", " --color always");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\x1b[48;5;"), std::string::npos) << r.out;
}

// Big maps are merged to fit 80 columns and 40 rows, keeping the worst cell of each group visible.
TEST(Heatmap, LargeGridsAreMergedToFitAndKeepTheWorstCell) {
  mla::HeatGrid g;
  g.rows = 100;
  g.cols = 200;
  g.v.assign(g.rows * g.cols, 1e-4);
  g.v[57 * g.cols + 150] = NAN;
  g.v[3 * g.cols + 10] = 5.0;
  mla::HeatStyle s;
  s.threshold = 1e-2;
  const std::string out = mla::render_heatmap(g, s);
  std::istringstream is(out);
  int cell_rows = 0;
  for (std::string l; std::getline(is, l);) {
    if (l.rfind("scale:", 0) != 0) EXPECT_LE(l.size(), 80u) << l;
    if (std::regex_match(l, std::regex(R"(\s*\d+-\d+ [ .:\-=+*#%@!]+)"))) ++cell_rows;
  }
  EXPECT_LE(cell_rows, 40);
  EXPECT_GE(cell_rows, 30);
  EXPECT_EQ(count(out, "!"), 2u) << "the NaN cell, and the legend\n" << out;
  EXPECT_EQ(count(out, "@"), 2u) << "the one cell far above tolerance, and the legend\n" << out;
  EXPECT_NE(out.find("(merged: each row up to 3 tokens, each column up to 3 heads; the worst is shown)"),
            std::string::npos) << out;
}

// A real terminal: tmux on a private socket, keys sent as a user would type them.
TEST_F(Explore, RealTerminalThroughTmux) {
  if (run_shell("command -v tmux >/dev/null 2>&1 && echo yes").out.find("yes") == std::string::npos)
    GTEST_SKIP() << "tmux is not installed: the real-terminal test of explore did not run (apt-get install tmux)";
  const std::string sock = "mla_explore_" + std::to_string(getpid());
  const std::string tmux = "tmux -L " + sock + " -f /dev/null ";
  const std::string target = " -t explore";
  auto capture = [&](bool escapes = false) {
    return run_shell(tmux + "capture-pane -p -J -S -400" + (escapes ? " -e" : "") + target + " 2>&1").out;
  };
  auto wait_for = [&](const std::string& what, size_t times = 1) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(8);
    std::string screen;
    while (std::chrono::steady_clock::now() < until) {
      screen = capture();
      if (count(screen, what) >= times) return screen;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "timed out waiting for '" << what << "' (x" << times << "); the pane shows:\n" << screen;
    return screen;
  };
  const auto started = run_shell(tmux + "new-session -d -s explore -x 100 -y 60 '" + bin() + " explore " + dir_ +
                             "/cand.h5 " + dir_ + "/ref.h5; echo explore-exited-$?; sleep 30' 2>&1");
  ASSERT_EQ(started.exit_code, 0) << started.out;
  struct KillServer {  // our private tmux server only, even when an assertion ends the test early
    std::string cmd;
    ~KillServer() { run_shell(cmd); }
  } kill_server{tmux + "kill-server 2>&1"};
  wait_for("explore> ");
  run_shell(tmux + "send-keys" + target + " list Enter");
  std::string screen = wait_for("beyond tolerance (*)");
  EXPECT_NE(screen.find("explore> list"), std::string::npos) << screen;
  EXPECT_NE(screen.find("<- first divergence"), std::string::npos) << screen;
  // Typed with a correction (a Backspace) and Tab completion of the probe name.
  run_shell(tmux + "send-keys" + target + " 'heatmap q_pe_rx' BSpace 'o' Tab Enter");
  screen = wait_for("scale:");
  EXPECT_NE(screen.find("explore> heatmap q_pe_rope"), std::string::npos) << screen;
  EXPECT_NE(screen.find("heatmap of layer 0 q_pe_rope"), std::string::npos) << screen;
  EXPECT_NE(screen.find("head \u2192"), std::string::npos) << screen;
  EXPECT_NE(capture(true).find("48;5;"), std::string::npos) << "a terminal gets colored blocks";
  wait_for("explore> ", 3);
  run_shell(tmux + "send-keys" + target + " quit Enter");
  // explore exits 0 at once; the pane's shell then says so and sleeps.
  const std::string after = wait_for("explore-exited-0");
  EXPECT_EQ(count(after, "explore> "), 3u) << after;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Sketch-level dumps (bisect's default): explore's per-head numbers are estimates, labelled, and agree with bisect
// ---------------------------------------------------------------------------------------------------

// "K of N" after `what` in `out` (the first match), as {K, N}; {-1, -1} when absent.
std::pair<int, int> k_of_n(const std::string& out, const std::string& what) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(what + R"(\s+(\d+) of (\d+))"))) return {-1, -1};
  return {std::stoi(m[1]), std::stoi(m[2])};
}

class ExploreSketch : public ::testing::Test {
 protected:
  // A bisect on sketch-level dumps (tp 2: the rope bug is on every head of both ranks); its dumps are explored.
  static void SetUpTestSuite() {
    dir_ = (std::filesystem::temp_directory_path() / ("mla_explore_sketch_" + std::to_string(getpid()))).string();
    std::filesystem::create_directories(dir_);
    bisect_ = run_shell(bin() + " bisect --model tiny --tokens 8 --tp 2 --candidate reference:precision=bf16 "
                        "--inject rope-neox --workdir " + dir_ + " 2>&1");
    // The dumps alone, as a sketch-level run leaves them (the full tensors bisect keeps beside them are explored in
    // NoSilentPass.BisectKeepsTheDivergentStagesFullTensorsForExplore).
    for (const char* f : {"/candidate.full.h5", "/reference.full.h5"}) std::filesystem::remove(dir_ + f);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  static Result session(const std::string& script, const std::string& a = "candidate.h5",
                        const std::string& b = "reference.h5") {
    return run_shell(bin() + " explore " + dir_ + "/" + a + " " + dir_ + "/" + b + " 2>&1 <<'EOF'\n" + script + "\nEOF\n");
  }
  static std::string dir_;
  static Result bisect_;
};
std::string ExploreSketch::dir_;
Result ExploreSketch::bisect_;

TEST_F(ExploreSketch, HeadsAreEstimatedAllOffAndShowAgreesWithBisect) {
  ASSERT_EQ(bisect_.exit_code, 1) << bisect_.out;
  const auto from_bisect = k_of_n(bisect_.out, "heads:");
  ASSERT_GT(from_bisect.second, 0) << bisect_.out;
  EXPECT_EQ(from_bisect.first, from_bisect.second) << "bisect (full tensors): the rope bug is on every head\n"
                                                   << bisect_.out;

  const auto r = session("show q_pe_rope\nheads\nheatmap\n");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string& o = r.out;
  EXPECT_NE(o.find("sketch"), std::string::npos) << "the dumps are sketch-level\n" << o;
  // show's drill-down counts the same heads off as bisect, and says the count is an estimate.
  EXPECT_EQ(k_of_n(o, "heads:"), from_bisect) << o;
  EXPECT_TRUE(std::regex_search(o, std::regex(R"(heads:\s+\d+ of \d+ off.*estimate \(from sketches/norms\))"))) << o;
  EXPECT_TRUE(std::regex_search(o, std::regex(R"(\n\s+rel_l2\s+[0-9.e+-]+ .*estimate \(from sketches/norms\))"))) << o;
  EXPECT_TRUE(std::regex_search(o, std::regex(R"(diagnosis \(unconfirmed pattern[^)]*, on estimate \(from sketches/norms\)\))"))) << o;
  // heads: every head above the tolerance, labelled an estimate.
  EXPECT_NE(o.find("rel_l2 per head, layer 0 q_pe_rope (estimate (from sketches/norms)"), std::string::npos) << o;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(o, m, std::regex(R"(\n\s+(\d+) of (\d+) heads off\s+\[estimate)"))) << o;
  EXPECT_EQ(m[1], m[2]) << o;
  EXPECT_EQ(std::stoi(m[2]), from_bisect.second) << o;
  // heatmap from the same estimate: the later tokens are above the tolerance in every head.
  const auto hm = section(o, "heatmap of layer 0 q_pe_rope", "scale:");
  ASSERT_GE(hm.size(), 11u) << o;
  EXPECT_NE(hm[0].find("estimate (from sketches/norms)"), std::string::npos) << hm[0];
  EXPECT_TRUE(std::regex_search(o, std::regex(R"(\n\s+7 [+*#%@]+\n)"))) << "token 7 off in every head\n" << o;
}

TEST_F(ExploreSketch, WorstSaysHowToGetFullTensorsAndThoseCommandsWork) {
  ASSERT_EQ(bisect_.exit_code, 1) << bisect_.out;
  const auto r = session("worst q_pe_rope 3\nslice\nchannels\n");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string& o = r.out;
  EXPECT_NE(o.find("worst elements need full tensors in both dumps"), std::string::npos) << o;
  EXPECT_NE(o.find("--full-probes q_pe_rope"), std::string::npos) << o;
  EXPECT_NE(o.find("slice needs full tensors in both dumps"), std::string::npos) << o;
  EXPECT_NE(o.find("a per-channel map needs full tensors in both dumps"), std::string::npos) << o;
  EXPECT_NE(o.find("the worst tokens instead (estimate (from sketches/norms))"), std::string::npos) << o;
  // The commands it prints make the dumps that answer `worst` with elements.
  std::istringstream is(o);
  std::vector<std::string> runs;
  for (std::string l; std::getline(is, l);)
    if (l.rfind("    mla-bisect run ", 0) == 0 && runs.size() < 2) runs.push_back(l.substr(std::string("    mla-bisect").size()));
  ASSERT_EQ(runs.size(), 2u) << o;
  for (auto& c : runs) {
    const auto rr = run_shell(bin() + c + " --quiet 2>&1");
    ASSERT_EQ(rr.exit_code, 0) << c << "\n" << rr.out;
  }
  const auto full = session("worst q_pe_rope 3\n", "candidate.full.h5", "reference.full.h5");
  ASSERT_EQ(full.exit_code, 0) << full.out;
  EXPECT_NE(full.out.find("worst 3 elements of layer 0 q_pe_rope"), std::string::npos) << full.out;
}
