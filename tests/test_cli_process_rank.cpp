// One process per rank end to end (`run --rank`, the real binary in child processes): the per-rank dumps of a
// tp 2 run read as the one-process dump (every checksum equal), each file holds only its rank (h5py), --rank auto
// takes the launcher's variables, and a missing, mismatched or lone rank file, a hang on one rank, and --rank
// where it does not belong are each refused with a message that says what to do.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "probes/dump.h"
#include "tests/cli_util.h"

namespace {

using namespace mla;
using test::CliRun;
using test::describe;
using test::run_cli;
using test::ScratchDir;
using test::slurp;

const std::string kRun = "run --model tiny --tp 2 --tokens 8 --layers 2 --quiet --full-probes q_c,attn_out,o_partial";
// No launcher variable of the test's own environment may leak into a child (a CI job under srun has SLURM_PROCID).
const std::string kNoLauncher =
    "env -u MLA_RANK -u MLA_WORLD_SIZE -u MLA_LOCAL_RANK -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE "
    "-u OMPI_COMM_WORLD_LOCAL_RANK -u PMI_RANK -u PMI_SIZE -u MPI_LOCALRANKID -u SLURM_PROCID -u SLURM_NTASKS "
    "-u SLURM_LOCALID";

CliRun with_env(const std::string& vars = "") {
  CliRun how;
  how.env = kNoLauncher + (vars.empty() ? "" : " " + vars);
  return how;
}

void run_ok(const std::string& args, const std::string& vars = "") {
  const auto r = run_cli(args, with_env(vars));
  ASSERT_EQ(r.exit_code, 0) << describe(args, r);
}

// single.h5 in one process; per.rank0.h5 and per.rank1.h5 from two processes, rank 1 through --rank auto.
struct PerRankRuns {
  ScratchDir dir;
  // stale: an older one-process dump at the --out name first, which the per-rank runs must retire.
  explicit PerRankRuns(const std::string& name, bool stale = false) : dir(name) {
    if (stale) run_ok(kRun + " --seed 9 --out " + path("per.h5"));
    run_ok(kRun + " --out " + path("single.h5"));
    const std::string per = kRun + " --rendezvous " + path("id") + " --out " + path("per.h5");
    run_ok(per + " --rank 0");
    run_ok(per + " --rank auto", "MLA_RANK=1 MLA_WORLD_SIZE=2");
  }
  std::string path(const std::string& f) const { return dir.path(f); }
};

TEST(CliProcessRank, PerRankDumpsReadAsTheOneProcessDump) {
  const PerRankRuns runs("rank_e2e", /*stale=*/true);
  EXPECT_TRUE(std::filesystem::exists(runs.path("per.rank0.h5")));
  EXPECT_TRUE(std::filesystem::exists(runs.path("per.rank1.h5")));
  EXPECT_FALSE(std::filesystem::exists(runs.path("per.h5")));
  EXPECT_FALSE(std::filesystem::exists(runs.path("per.rank0.h5.journal")));

  // Either side of compare; exact: bit for bit.
  for (const auto& [a, b] : {std::pair{"single.h5", "per.h5"}, std::pair{"per.h5", "single.h5"}}) {
    const std::string args = "compare " + runs.path(a) + " " + runs.path(b) + " --tolerance exact";
    const auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 0) << describe(args, r);
    EXPECT_CONTAINS(r.out, "no divergence");
  }

  // Every rank record of every probe equal, as read_dump merges the set.
  const Dump single = read_dump(runs.path("single.h5"));
  const Dump per = read_dump(runs.path("per.h5"));
  EXPECT_EQ(per.status, "complete");
  EXPECT_EQ(per.meta.tp, 2);
  EXPECT_EQ(per.meta.process_rank, -1);
  EXPECT_EQ(per.meta.processes, 2);
  ASSERT_EQ(per.parts.size(), 2u);
  EXPECT_EQ(per.parts[1], runs.path("per.rank1.h5"));
  EXPECT_EQ(per.meta.run_options, single.meta.run_options);
  ASSERT_EQ(per.probes.size(), single.probes.size());
  for (size_t i = 0; i < single.probes.size(); ++i) {
    const auto &p = per.probes[i], &s = single.probes[i];
    SCOPED_TRACE("layer " + std::to_string(s.layer) + " probe " + s.name);
    EXPECT_EQ(p.layer, s.layer);
    EXPECT_EQ(p.name, s.name);
    ASSERT_EQ(p.ranks.size(), 2u);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(p.ranks[r].checksum, s.ranks[r].checksum) << "rank " << r;
      EXPECT_EQ(p.ranks[r].l2, s.ranks[r].l2) << "rank " << r;
      EXPECT_EQ(p.ranks[r].sketch, s.ranks[r].sketch) << "rank " << r;
      EXPECT_EQ(p.ranks[r].data.data, s.ranks[r].data.data) << "rank " << r;
    }
  }
  EXPECT_EQ(per.inputs.x.data, single.inputs.x.data);
  ASSERT_EQ(per.last_stage.size(), 2u);
}

TEST(CliProcessRank, H5pyFindsOnlyItsRankInEachFile) {
  const std::string py = MLA_PYTHON_EXE;
  if (py.empty()) GTEST_SKIP() << "MLA_PYTHON is not set at configure time: h5py check skipped";
  if (std::system(("'" + py + "' -c 'import h5py, numpy' >/dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << py << " cannot import h5py and numpy: h5py check skipped (run scripts/setup.sh)";
  const PerRankRuns runs("rank_h5py");
  const std::string script = std::string(MLA_SOURCE_DIR) + "/tests/py/check_rank_dumps.py";
  const std::string out = runs.path("py.txt");
  const int rc = std::system(("'" + py + "' '" + script + "' '" + runs.path("single.h5") + "' '" +
                              runs.path("per.rank0.h5") + "' '" + runs.path("per.rank1.h5") + "' >'" + out + "' 2>&1")
                                 .c_str());
  EXPECT_EQ(rc, 0) << "check_rank_dumps.py failed:\n" << slurp(out);
}

TEST(CliProcessRank, AMissingRankFileIsNamed) {
  const PerRankRuns runs("rank_missing");
  std::filesystem::rename(runs.path("per.rank1.h5"), runs.path("elsewhere.h5"));
  const std::string args = "compare " + runs.path("single.h5") + " " + runs.path("per.h5");
  const auto r = run_cli(args);
  EXPECT_EQ(r.exit_code, 2) << describe(args, r);
  EXPECT_CONTAINS(r.err, runs.path("per.rank1.h5") + ": no such file");
  // Without rank 0, the set cannot be read either.
  std::filesystem::rename(runs.path("elsewhere.h5"), runs.path("per.rank1.h5"));
  std::filesystem::remove(runs.path("per.rank0.h5"));
  const auto r0 = run_cli(args);
  EXPECT_EQ(r0.exit_code, 2) << describe(args, r0);
  EXPECT_CONTAINS(r0.err, runs.path("per.rank0.h5") + " is missing");
}

TEST(CliProcessRank, RanksOfDifferentLaunchesAreRefused) {
  ScratchDir dir("rank_mismatch");
  const std::string per = kRun + " --rendezvous " + dir.path("id") + " --out " + dir.path("per.h5");
  run_ok(per + " --rank 0");
  run_ok(per + " --rank 1 --seed 5");
  const std::string args = "inspect " + dir.path("per.h5");
  const auto r = run_cli(args);
  EXPECT_EQ(r.exit_code, 2) << describe(args, r);
  EXPECT_CONTAINS(r.err, dir.path("per.rank1.h5") + " and " + dir.path("per.rank0.h5") + " differ in run options");
  EXPECT_CONTAINS(r.err, "seed 5 vs 0");
}

// Same options, another launch: rank 0 reran (a fresh rendezvous file) and rank 1 did not, so per.rank1.h5 is the
// earlier launch's (made, say, by the binary before a rebuild). The launch ids differ and the set is refused.
TEST(CliProcessRank, ARankFileLeftByAnEarlierLaunchIsRefused) {
  ScratchDir dir("rank_stale");
  const std::string out = " --out " + dir.path("per.h5");
  run_ok(kRun + " --rendezvous " + dir.path("id1") + out + " --rank 0");
  run_ok(kRun + " --rendezvous " + dir.path("id1") + out + " --rank 1");
  const std::string args = "inspect " + dir.path("per.h5");
  ASSERT_EQ(run_cli(args).exit_code, 0);  // one launch: reads as a set
  run_ok(kRun + " --rendezvous " + dir.path("id2") + out + " --rank 0");
  const auto r = run_cli(args);
  EXPECT_EQ(r.exit_code, 2) << describe(args, r);
  EXPECT_CONTAINS(r.err, dir.path("per.rank1.h5") + " and " + dir.path("per.rank0.h5") + " differ in launch");
  // Reusing a rendezvous file is refused before anything runs (rank 0 must be the one to create it).
  const auto again = run_cli(kRun + " --rendezvous " + dir.path("id2") + out + " --rank 0", with_env());
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_CONTAINS(again.err, dir.path("id2"));
}

TEST(CliProcessRank, OneRankFileInspectsAloneButCompareAsksForTheSet) {
  const PerRankRuns runs("rank_alone");
  const std::string lone = runs.path("per.rank1.h5");
  const auto i = run_cli("inspect " + lone);
  ASSERT_EQ(i.exit_code, 0) << describe("inspect " + lone, i);
  EXPECT_CONTAINS(i.out, "process   rank 1 of 2");
  EXPECT_CONTAINS(i.out, "#1");
  DumpReadOptions ro;
  ro.data = false;
  const size_t probes = read_dump(runs.path("single.h5"), ro).probes.size();
  EXPECT_CONTAINS(i.out, std::to_string(probes) + " rank records");  // one per probe: rank 1's
  const std::string args = "compare " + lone + " " + runs.path("single.h5");
  const auto c = run_cli(args);
  EXPECT_EQ(c.exit_code, 2) << describe(args, c);
  EXPECT_CONTAINS(c.err, "holds only rank 1 of a tp 2 run");
  EXPECT_CONTAINS(c.err, "pass " + runs.path("per.h5"));
  // inspect of the set: both parts listed.
  const auto s = run_cli("inspect " + runs.path("per.h5"));
  ASSERT_EQ(s.exit_code, 0) << describe("inspect per.h5", s);
  EXPECT_CONTAINS(s.out, "parts     2 processes, one per rank");
}

// hang-at:rope@1: rank 0's process computes rank 1 too but the hang is rank 1's; its watchdog exits 3, and the set
// says where it stopped.
TEST(CliProcessRank, AHangOnOneRankStopsOnlyThatRanksProcess) {
  ScratchDir dir("rank_hang");
  run_ok(kRun + " --out " + dir.path("single.h5"));
  const std::string per = kRun + " --inject hang-at:rope@1 --watchdog 1 --rendezvous " + dir.path("id") + " --out " +
                          dir.path("per.h5");
  run_ok(per + " --rank 0");
  const auto r1 = run_cli(per + " --rank 1", with_env());
  EXPECT_EQ(r1.exit_code, 3) << describe(per + " --rank 1", r1);
  const std::string args = "compare " + dir.path("per.h5") + " " + dir.path("single.h5");
  const auto c = run_cli(args);
  EXPECT_EQ(c.exit_code, 3) << describe(args, c);
  EXPECT_CONTAINS(c.out, "rank 1 at layer 0 stage rope");
  EXPECT_CONTAINS(c.out, dir.path("per.rank1.h5"));
  const auto i = run_cli("inspect " + dir.path("per.h5"));
  EXPECT_EQ(i.exit_code, 0) << describe("inspect", i);
  EXPECT_CONTAINS(i.out, "rank 1: layer 0 stage rope");
}

// A rank's process killed mid-run (abort) leaves its journal: the set folds it and says where that rank stopped.
TEST(CliProcessRank, ACrashedRanksJournalIsFoldedIntoTheSet) {
  ScratchDir dir("rank_crash");
  const std::string per = kRun + " --inject crash-at:attention_mha@1 --rendezvous " + dir.path("id") + " --out " +
                          dir.path("per.h5");
  run_ok(per + " --rank 0");
  CliRun no_core = with_env();
  no_core.env = "ulimit -c 0; " + no_core.env;  // abort() must not leave a core file behind
  const auto r1 = run_cli(per + " --rank 1", no_core);
  EXPECT_NE(r1.exit_code, 0) << describe(per + " --rank 1", r1);
  EXPECT_TRUE(std::filesystem::exists(dir.path("per.rank1.h5.journal")));
  const auto i = run_cli("inspect " + dir.path("per.h5"));
  ASSERT_EQ(i.exit_code, 0) << describe("inspect", i);
  EXPECT_CONTAINS(i.out, "stopped: after layer 0 probe v rank 1 (in " + dir.path("per.rank1.h5") + ")");
  EXPECT_CONTAINS(i.out, "rank 1: layer 0 stage attention_mha");
  EXPECT_FALSE(std::filesystem::exists(dir.path("per.rank1.h5.journal")));  // folded
}

TEST(CliProcessRank, BadRanksAreUsageErrors) {
  struct Case {
    std::string args, vars, want;
  };
  const Case cases[] = {
      {"run --model tiny --tp 2 --rank 2 --rendezvous /tmp/x", "", "--rank 2 is not a rank of --tp 2"},
      {"run --model tiny --tp 2 --rank 1", "", "needs --rendezvous PATH"},
      {"run --model tiny --tp 2 --rank one --rendezvous /tmp/x", "", "--rank 'one' is not a rank number or 'auto'"},
      {"run --model tiny --tp 2 --rank auto --rendezvous /tmp/x", "", "no launcher's rank variable is set"},
      {"run --model tiny --tp 2 --rank auto --rendezvous /tmp/x", "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=4",
       "OMPI_COMM_WORLD_SIZE=4 processes but --tp is 2"},
      {"run --model tiny --tp 2 --rendezvous /tmp/x", "", "add --rank N or --rank auto"},
      {"run --model tiny --engine other --rank 0", "", "engine 'other' cannot run one process per rank"},
      {"bisect --model tiny --tp 2 --rank 0", "", "mla-bisect compare cand.h5 ref.h5"},
      {"zoo --tp 2 --rendezvous /tmp/x", "", "launch `mla-bisect run --tp N --rank"},
  };
  for (const auto& c : cases) {
    const auto r = run_cli(c.args, with_env(c.vars));
    EXPECT_EQ(r.exit_code, 2) << describe(c.args, r);
    EXPECT_CONTAINS(r.err, c.want);
  }
}

TEST(CliProcessRank, HelpDescribesRankAndRendezvous) {
  const auto r = run_cli("run --help");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_CONTAINS(r.out, "--rank N|auto");
  EXPECT_CONTAINS(r.out, "--rendezvous PATH");
  EXPECT_CONTAINS(r.out, "OMPI_COMM_WORLD");
  EXPECT_CONTAINS(r.out, "FILE.rank<R>.h5");
}

}  // namespace
