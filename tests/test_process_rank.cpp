// One process per rank (core/engine/process_rank.h, runner.h): --rank and each launcher's environment variables,
// every mismatch refused with the variable and its value named; the Runner of one process per rank runs the ranks
// its engine owns and records only its own, bit for bit what one process records of that rank.
#include <gtest/gtest.h>

#include <map>
#include <ostream>
#include <set>
#include <string>

#include "core/engine/process_rank.h"
#include "core/model/errors.h"
#include "core/model/inputs.h"
#include "core/model/weights.h"
#include "harness/run/runner.h"
#include "harness/run/synthetic_inputs.h"
#include "probes/collect.h"
#include "reference/reference_engine.h"
#include "tests/cli_util.h"
#include "tests/stage_test_util.h"

namespace mla {
namespace {

// A fake environment: only these variables are set.
struct Env {
  std::map<std::string, std::string> vars;
  GetenvFn fn() const {
    return [this](const char* name) -> const char* {
      const auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

ProcessRank resolve(const std::string& rank, const std::string& rdv, int tp, const Env& env) {
  return resolve_process_rank(rank, rdv, tp, env.fn());
}

// The UsageError's message (the test fails when none is thrown).
std::string usage_error(const std::string& rank, const std::string& rdv, int tp, const Env& env) {
  try {
    resolve(rank, rdv, tp, env);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError for --rank '" << rank << "' --rendezvous '" << rdv << "' --tp " << tp;
  return "";
}

TEST(ProcessRank, WithoutRankOneProcessRunsEveryRank) {
  const ProcessRank p = resolve("", "", 4, Env{});
  EXPECT_FALSE(p.per_process());
  EXPECT_EQ(p.rank, -1);
  EXPECT_CONTAINS(usage_error("", "/tmp/id", 4, Env{}), "--rank");  // a rendezvous without a rank is a mistake
}

TEST(ProcessRank, ANumberIsTheRankOfTpProcesses) {
  const ProcessRank p = resolve("3", "/shared/id", 4, Env{});
  EXPECT_TRUE(p.per_process());
  EXPECT_EQ(p.rank, 3);
  EXPECT_EQ(p.world, 4);
  EXPECT_EQ(p.local_rank, 3);  // processes of one host: the rank picks the GPU
  EXPECT_EQ(p.rendezvous, "/shared/id");
  Env env;
  env.vars = {{"MLA_LOCAL_RANK", "1"}};
  EXPECT_EQ(resolve("3", "/shared/id", 4, env).local_rank, 1);
  // tp 1 needs no rendezvous: there is no communicator.
  EXPECT_EQ(resolve("0", "", 1, Env{}).rank, 0);
}

TEST(ProcessRank, ANumberOutsideTpOrNotANumberIsRefused) {
  EXPECT_CONTAINS(usage_error("4", "/x", 4, Env{}), "--rank 4 is not a rank of --tp 4");
  for (const char* bad : {"-1", "one", "1.5", "2x", " 1", ""})
    if (*bad) EXPECT_CONTAINS(usage_error(bad, "/x", 4, Env{}), std::string("--rank '") + bad + "'");
  Env env;
  env.vars = {{"MLA_LOCAL_RANK", "gpu0"}};
  EXPECT_CONTAINS(usage_error("1", "/x", 4, env), "MLA_LOCAL_RANK='gpu0'");
}

TEST(ProcessRank, TpAboveOneNeedsARendezvous) {
  const std::string e = usage_error("1", "", 2, Env{});
  EXPECT_CONTAINS(e, "--rendezvous PATH");
  EXPECT_CONTAINS(e, "fresh");
}

struct LauncherCase {
  const char* name;
  const char *rank_var, *size_var, *local_var;
};

void PrintTo(const LauncherCase& c, std::ostream* os) { *os << c.name; }  // test names show the launcher

class ProcessRankLauncher : public ::testing::TestWithParam<LauncherCase> {};

TEST_P(ProcessRankLauncher, AutoReadsItsVariables) {
  const auto& c = GetParam();
  Env env;
  env.vars = {{c.rank_var, "5"}, {c.size_var, "8"}, {c.local_var, "1"}};
  const ProcessRank p = resolve("auto", "/shared/id", 8, env);
  EXPECT_EQ(p.rank, 5);
  EXPECT_EQ(p.world, 8);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_CONTAINS(p.source, std::string(c.rank_var) + "=5");
  // Without the local-rank variable: one host, the rank.
  env.vars.erase(c.local_var);
  EXPECT_EQ(resolve("auto", "/shared/id", 8, env).local_rank, 5);
}

TEST_P(ProcessRankLauncher, AutoRefusesEachMismatchNamingTheVariable) {
  const auto& c = GetParam();
  Env env;
  env.vars = {{c.rank_var, "1"}, {c.size_var, "4"}};
  EXPECT_CONTAINS(usage_error("auto", "/x", 8, env), std::string(c.size_var) + "=4 processes but --tp is 8");
  env.vars = {{c.rank_var, "8"}, {c.size_var, "8"}};
  EXPECT_CONTAINS(usage_error("auto", "/x", 8, env), std::string(c.rank_var) + "=8 is not a rank of --tp 8");
  env.vars = {{c.rank_var, "x1"}, {c.size_var, "8"}};
  EXPECT_CONTAINS(usage_error("auto", "/x", 8, env), std::string(c.rank_var) + "='x1' is not a non-negative number");
  env.vars = {{c.rank_var, "1"}};
  EXPECT_CONTAINS(usage_error("auto", "/x", 8, env), std::string(c.size_var) + " is not set");
  env.vars = {{c.rank_var, "1"}, {c.size_var, "8"}, {c.local_var, "-1"}};
  EXPECT_CONTAINS(usage_error("auto", "/x", 8, env), std::string(c.local_var) + "='-1'");
  env.vars = {{c.rank_var, "1"}, {c.size_var, "8"}};
  EXPECT_CONTAINS(usage_error("auto", "", 8, env), "--rendezvous PATH");
}

INSTANTIATE_TEST_SUITE_P(Launchers, ProcessRankLauncher,
                         ::testing::Values(LauncherCase{"Ours", "MLA_RANK", "MLA_WORLD_SIZE", "MLA_LOCAL_RANK"},
                                           LauncherCase{"OpenMpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                                        "OMPI_COMM_WORLD_LOCAL_RANK"},
                                           LauncherCase{"MpichIntelMpi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
                                           LauncherCase{"Srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ProcessRank, AutoWithoutALauncherNamesWhatItLookedFor) {
  const std::string e = usage_error("auto", "/x", 2, Env{});
  for (const char* v : {"MLA_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) EXPECT_CONTAINS(e, v);
}

// mpirun inside a SLURM allocation: every process inherits SLURM_PROCID=0; the MPI variables must win.
TEST(ProcessRank, AutoPrefersMpiOverTheSlurmAllocationAroundIt) {
  Env env;
  env.vars = {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"},
              {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}};
  const ProcessRank p = resolve("auto", "/x", 4, env);
  EXPECT_EQ(p.rank, 3);
  EXPECT_EQ(p.local_rank, 3);
  // Ours overrides any launcher.
  env.vars.insert({{"MLA_RANK", "1"}, {"MLA_WORLD_SIZE", "4"}});
  EXPECT_EQ(resolve("auto", "/x", 4, env).rank, 1);
}

// ---------------------------------------------------------------------------------------------------
// The Runner with one process per rank
// ---------------------------------------------------------------------------------------------------

struct TinyRun {
  MlaConfig cfg = test::preset("tiny");
  RunSpec spec;
  std::vector<LayerWeights> weights;
  Inputs inputs;
  TinyRun() {
    spec.tp = 2;
    spec.tokens = 6;
    weights = synthetic_weights(cfg, spec.layers, spec.graph_shape().input_norm, 3);
    inputs = synthetic_inputs(cfg, spec, weights);
  }
};

Dump run_collect(const TinyRun& t, Engine& engine, const ProcessRank& p) {
  Runner runner(t.cfg, t.spec);
  runner.set_process_rank(p);
  CollectSink sink(DumpMeta{}, t.spec.tp);
  ProbePlan plan;
  runner.run(engine, t.weights, t.inputs, plan, sink);
  return sink.take();
}

ProcessRank rank_of(int rank, int world) {
  ProcessRank p;
  p.rank = rank;
  p.world = world;
  p.rendezvous = "/unused";
  return p;
}

TEST(RunnerPerProcess, RecordsOnlyItsRankBitForBitAsOneProcessDoes) {
  const TinyRun t;
  ReferenceEngine all_engine({});
  const Dump all = run_collect(t, all_engine, {});
  for (int r = 0; r < t.spec.tp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ReferenceEngine engine({});
    const Dump one = run_collect(t, engine, rank_of(r, t.spec.tp));
    ASSERT_EQ(one.probes.size(), all.probes.size());
    for (size_t i = 0; i < all.probes.size(); ++i) {
      const auto& p = one.probes[i];
      // CollectSink keeps index = rank: the other rank's slots stay empty (never recorded).
      ASSERT_EQ(p.ranks.size(), static_cast<size_t>(r + 1)) << p.name;
      for (int k = 0; k < r; ++k) EXPECT_TRUE(p.ranks[k].shape.empty()) << p.name << " rank " << k << " recorded";
      EXPECT_EQ(p.ranks[r].checksum, all.probes[i].ranks[r].checksum) << p.name;
      EXPECT_EQ(p.ranks[r].sketch, all.probes[i].ranks[r].sketch) << p.name;
    }
    // The stage markers are this rank's only.
    for (int k = 0; k < t.spec.tp; ++k)
      EXPECT_EQ(one.last_stage[k].empty(), k != r) << "rank " << k << ": " << one.last_stage[k];
  }
}

// An engine that holds one rank (as the CUDA engine does per process): only its stages run.
class OneRankEngine : public ReferenceEngine {
 public:
  OneRankEngine() : ReferenceEngine({}) {}
  void prepare(const RunContext& ctx) override {
    own = ctx.process.rank;
    ReferenceEngine::prepare(ctx);
  }
  bool owns_rank(int rank) const override { return rank == own; }
  void run_stage(const StageSpec& st, int layer, int rank) override {
    ran.insert(rank);
    if (st.stage == Stage::Stage_all_reduce)  // the other rank's partial is another process's: keep this one's
      upload(rank, "o", download(rank, "o_partial"));
    else
      ReferenceEngine::run_stage(st, layer, rank);
  }
  int own = -2;
  std::set<int> ran;
};

TEST(RunnerPerProcess, RunsOnlyTheRanksTheEngineOwnsAndHandsItTheProcessRank) {
  const TinyRun t;
  OneRankEngine engine;
  const Dump one = run_collect(t, engine, rank_of(1, 2));
  EXPECT_EQ(engine.own, 1);  // RunContext::process reached prepare
  EXPECT_EQ(engine.ran, std::set<int>{1});
  ASSERT_FALSE(one.probes.empty());
  for (const auto& p : one.probes) EXPECT_EQ(p.ranks.size(), 2u) << p.name;  // index = rank 1
}

TEST(RunnerPerProcess, AProcessRankThatDoesNotFitTpIsRefused) {
  const TinyRun t;
  Runner runner(t.cfg, t.spec);
  EXPECT_THROW(runner.set_process_rank(rank_of(2, 2)), UsageError);
  EXPECT_THROW(runner.set_process_rank(rank_of(0, 4)), UsageError);
}

// A hang planted on rank 1 is rank 1's process's business: rank 0's process (which computes rank 1 too) finishes.
TEST(RunnerPerProcess, AHangOnAnotherRankDoesNotStopThisProcess) {
  const TinyRun t;
  ReferenceEngine engine({});
  engine.set_injections(parse_injections("hang-at:rope@1"));
  const Dump one = run_collect(t, engine, rank_of(0, 2));
  EXPECT_EQ(one.status, "complete");
}

}  // namespace
}  // namespace mla
