// Progress lines of the long commands on stderr when it is a file (not a terminal), none with --quiet, and no long
// silence between them; and the reference run-to-run bit for bit (whatever -march it was compiled for, see
// MLA_PORTABLE).
#include <gtest/gtest.h>

#include <regex>
#include <utility>
#include <sstream>
#include <string>
#include <vector>

#include "probes/dump.h"
#include "tests/cli_util.h"

namespace {

using mla::test::describe;
using mla::test::run_cli;

// The lines "[12.3 s] what" of a command's stderr; a carriage return anywhere fails (a redrawn bar in a log).
std::vector<std::string> progress_lines(const std::string& err) {
  EXPECT_EQ(err.find('\r'), std::string::npos) << "a carriage return in stderr:\n" << err;
  static const std::regex line_re(R"(^\[[0-9]+\.[0-9] s\] .+$)");
  std::vector<std::string> out;
  std::istringstream in(err);
  std::string line;
  while (std::getline(in, line))
    if (std::regex_match(line, line_re)) out.push_back(line);
  return out;
}

bool any_contains(const std::vector<std::string>& lines, const std::string& what) {
  for (const auto& l : lines)
    if (l.find(what) != std::string::npos) return true;
  return false;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

TEST(Progress, RunPrintsPhaseLinesToAFile) {
  const std::string args = "run --model tiny --tokens 8 --layers 2 --tp 2";
  const auto r = run_cli(args);  // stderr to a file: not a terminal
  ASSERT_EQ(r.exit_code, 0) << describe(args, r);
  const auto lines = progress_lines(r.err);
  EXPECT_TRUE(any_contains(lines, "setup: weights")) << r.err;
  EXPECT_TRUE(any_contains(lines, "setup: inputs")) << r.err;
  EXPECT_TRUE(any_contains(lines, "layer 1/2 weights: recording")) << r.err;
  EXPECT_TRUE(any_contains(lines, "layer 1/2 stage ")) << r.err;
  EXPECT_TRUE(any_contains(lines, "layer 2/2 stage ")) << r.err;
  EXPECT_TRUE(any_contains(lines, " rank 1/2")) << r.err;
  EXPECT_TRUE(any_contains(lines, "(0%)")) << r.err;
  EXPECT_TRUE(any_contains(lines, "run done")) << r.err;
  // One line per tenth of the stages at most (and the first), not one per stage.
  int stage_lines = 0;
  for (const auto& l : lines) stage_lines += l.find(" stage ") != std::string::npos;
  EXPECT_GE(stage_lines, 5) << joined(lines);
  EXPECT_LE(stage_lines, 10) << joined(lines);
  // The probe table stays on stdout.
  EXPECT_EQ(r.out.find("] layer"), std::string::npos) << r.out;
}

TEST(Progress, QuietRunPrintsNone) {
  const std::string args = "run --model tiny --tokens 8 --layers 2 --quiet";
  const auto r = run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << describe(args, r);
  EXPECT_TRUE(progress_lines(r.err).empty()) << r.err;
}

TEST(Progress, BenchAndGoldenCheckPrintLinesAndQuietSilences) {
  const std::string bench = "bench --model tiny --tokens 8 --repeats 2 --warmup 1";
  const auto b = run_cli(bench);
  ASSERT_EQ(b.exit_code, 0) << describe(bench, b);
  const auto bl = progress_lines(b.err);
  EXPECT_TRUE(any_contains(bl, "round 1/3 (warm-up)")) << b.err;
  EXPECT_TRUE(any_contains(bl, "round 3/3")) << b.err;
  EXPECT_TRUE(progress_lines(run_cli(bench + " --quiet").err).empty());

  const std::string golden = "golden check '" MLA_SOURCE_DIR "/golden/tiny_prefill_t8_tp1.h5' --brief";
  const auto g = run_cli(golden);
  ASSERT_EQ(g.exit_code, 0) << describe(golden, g);
  const auto gl = progress_lines(g.err);
  EXPECT_TRUE(any_contains(gl, "reading ")) << g.err;
  EXPECT_TRUE(any_contains(gl, "compared")) << g.err;
  EXPECT_TRUE(progress_lines(run_cli(golden + " --quiet").err).empty());
}

// compare: its phases (reading, calibrating, comparing) on stderr, none with --quiet; the report on stdout is the
// same either way.
TEST(Progress, CompareQuietPrintsNothingOnStderrAndOtherwiseItsPhases) {
  const mla::test::ScratchDir dir("progress_compare");
  const std::string ref = dir.path("ref.h5"), cand = dir.path("cand.h5");
  for (const auto& [engine, out] : {std::pair{"reference", ref}, std::pair{"reference:precision=bf16", cand}}) {
    const std::string args = std::string("run --quiet --no-table --model tiny --tokens 8 --tp 2 --engine ") + engine +
                             " --out '" + out + "'";
    const auto r = run_cli(args);
    ASSERT_EQ(r.exit_code, 0) << describe(args, r);
  }
  const std::string args = "compare '" + cand + "' '" + ref + "'";
  const auto r = run_cli(args, {.env = "MLA_CALIBRATION_CACHE=off"});  // calibrated here, not read from a cache
  ASSERT_EQ(r.exit_code, 0) << describe(args, r);
  const auto lines = progress_lines(r.err);
  EXPECT_TRUE(any_contains(lines, "reading " + cand)) << r.err;
  EXPECT_TRUE(any_contains(lines, "reading " + ref)) << r.err;
  EXPECT_TRUE(any_contains(lines, "calibrating tolerances")) << r.err;
  EXPECT_TRUE(any_contains(lines, "comparing ")) << r.err;
  EXPECT_EQ(r.out.find("] reading"), std::string::npos) << r.out;  // the report stays on stdout, the lines off it
  const auto q = run_cli(args + " --quiet", {.env = "MLA_CALIBRATION_CACHE=off"});
  ASSERT_EQ(q.exit_code, 0) << describe(args + " --quiet", q);
  EXPECT_EQ(q.err, "");
  EXPECT_EQ(q.out, r.out);
}

// No silence: a bisect with phases of several seconds each (synthesizing and quantizing weights, the two runs side by
// side, calibration, the runs of isolation), timed line by line by bench/progress_gaps.py, never goes more than 5 s
// without a line on stderr. DeepSeek-V2-Lite dims, fp8 weights, a planted weight bug (so isolation runs), no
// calibration cache: about 20 s on a 2-core machine.
TEST(Progress, BisectNeverGoesFiveSecondsWithoutALine) {
  if (mla::test::run_shell("python3 -c 'import sys' 2>/dev/null").exit_code != 0) GTEST_SKIP() << "no python3";
  const mla::test::ScratchDir dir("progress_gaps");
  const std::string cmd = "MLA_CALIBRATION_CACHE=off timeout 600 python3 '" MLA_SOURCE_DIR
                          "/bench/progress_gaps.py' --max 5 --quiet -- '" MLA_BINARY "' bisect --model "
                          "deepseek-v2-lite --tokens 64 --weight-format fp8 --inject fp8-scale-transpose "
                          "--candidate reference:precision=bf16 --workdir '" + dir.path("work") + "' 2>&1";
  const auto r = mla::test::run_shell(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.out;
  EXPECT_NE(r.out.find("exit 1,"), std::string::npos) << r.out;  // the bisect found the planted bug
}

// The reference on DeepSeek-V2-Lite dims (GEMMs large enough for Eigen's vectorized, multi-threaded kernels), FP32
// and bf16, twice each: every probe's checksum must be equal, rank by rank.
TEST(ReferenceDeterminism, TwoRunsGiveEqualChecksums) {
  const mla::test::ScratchDir dir("determinism");
  for (const std::string precision : {"fp32", "bf16"}) {
    std::vector<mla::Dump> dumps;
    for (int i = 0; i < 2; ++i) {
      const std::string out = dir.path(precision + std::to_string(i) + ".h5");
      const std::string args = "run --quiet --model deepseek-v2-lite --tokens 40 --tp 2 --probe-level stats --engine "
                               "reference:precision=" + precision + " --out '" + out + "'";
      const auto r = run_cli(args, {.env = "OMP_NUM_THREADS=2"});
      ASSERT_EQ(r.exit_code, 0) << describe(args, r);
      dumps.push_back(mla::read_dump(out));
    }
    const auto& a = dumps[0].probes;
    const auto& b = dumps[1].probes;
    ASSERT_EQ(a.size(), b.size());
    ASSERT_GT(a.size(), 10u);
    for (size_t p = 0; p < a.size(); ++p) {
      ASSERT_EQ(a[p].ranks.size(), b[p].ranks.size()) << a[p].name;
      for (size_t k = 0; k < a[p].ranks.size(); ++k)
        EXPECT_EQ(a[p].ranks[k].checksum, b[p].ranks[k].checksum)
            << precision << " layer " << a[p].layer << " probe " << a[p].name << " rank " << k;
    }
  }
}

}  // namespace
