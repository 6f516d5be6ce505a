// Dumps (probes/dump.h): HDF5 round trip, the documented layout as h5py sees it, crash safety (SIGKILL and
// SIGABRT at random points of a real `mla-bisect run --out`), corrupt and truncated files, and the CLI
// (`run --out`, `run --input`, `inspect`).
//
// The kill test slows the child with --inject slow-at:*:MS (a sleep at each stage start, after the journal
// has the stage marker) so kills land mid-run; kill times are drawn from a fixed seed (kKillSeed),
// printed with every failure.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/engine/engine.h"
#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/model/errors.h"
#include "core/model/inputs.h"
#include "core/model/stage_graph.h"
#include "core/model/weights.h"
#include "harness/run/runner.h"
#include "harness/run/synthetic_inputs.h"
#include "probes/dump.h"
#include "probes/h5.h"
#include "probes/journal.h"
#include "core/probe/probe.h"
#include "tests/cli_util.h"

namespace {

using namespace mla;
namespace fs = std::filesystem;
using test::CliResult;
using test::slurp;
using test::spit;

// A fresh directory per test (temp/mla_test_dump_NAME_PID), removed at the end.
struct ScratchDir : test::ScratchDir {
  explicit ScratchDir(const std::string& name) : test::ScratchDir("dump_" + name) {}
};

constexpr uint32_t kKillSeed = 20240611;

// Everything a run recorded, in the order it recorded it.
struct Captured {
  int layer;
  ProbeSpec spec;
  int rank;
  ProbeRecord rec;
};
class CaptureSink : public ProbeSink {
 public:
  void record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) override {
    records.push_back({layer, spec, rank, rec});
  }
  std::vector<Captured> records;
};

// Throws at the n-th record: an engine exception in the middle of a run.
class ThrowAfter : public ProbeSink {
 public:
  explicit ThrowAfter(int n) : n_(n) {}
  void record(int, const ProbeSpec&, int, const ProbeRecord&) override {
    if (--n_ == 0) throw EngineError("planted failure");
  }

 private:
  int n_;
};

template <class T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void expect_same_record(const ProbeRecord& a, const ProbeRecord& b, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.shape, b.shape);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_TRUE(same_bits(a.l2, b.l2)) << a.l2 << " vs " << b.l2;
  EXPECT_TRUE(same_bits(a.absmax, b.absmax));
  EXPECT_TRUE(same_bits(a.mean, b.mean));
  EXPECT_TRUE(same_bits(a.std, b.std));
  EXPECT_EQ(a.nan, b.nan);
  EXPECT_EQ(a.inf, b.inf);
  EXPECT_EQ(a.checksum, b.checksum);
  EXPECT_TRUE(same_bits(a.token_l2, b.token_l2));
  EXPECT_TRUE(same_bits(a.head_l2, b.head_l2));
  EXPECT_TRUE(same_bits(a.sketch, b.sketch));
  EXPECT_EQ(a.level, b.level);
  EXPECT_EQ(a.data.shape, b.data.shape);
  EXPECT_TRUE(same_bits(a.data.data, b.data.data));
}

void expect_same_inputs(const Inputs& a, const Inputs& b) {
  EXPECT_EQ(a.x.shape, b.x.shape);
  EXPECT_TRUE(same_bits(a.x.data, b.x.data));
  EXPECT_EQ(a.batch.new_lens, b.batch.new_lens);
  EXPECT_EQ(a.batch.context_lens, b.batch.context_lens);
  EXPECT_EQ(a.batch.positions, b.batch.positions);
  EXPECT_EQ(a.batch.token_seq, b.batch.token_seq);
  EXPECT_EQ(a.batch.block_table, b.batch.block_table);
  EXPECT_EQ(a.batch.max_blocks, b.batch.max_blocks);
  EXPECT_EQ(a.batch.num_blocks, b.batch.num_blocks);
  ASSERT_EQ(a.kv_cache.size(), b.kv_cache.size());
  for (size_t l = 0; l < a.kv_cache.size(); ++l) {
    EXPECT_EQ(a.kv_cache[l].shape, b.kv_cache[l].shape) << "layer " << l;
    EXPECT_TRUE(same_bits(a.kv_cache[l].data, b.kv_cache[l].data)) << "layer " << l;
  }
}

DumpMeta make_meta(const MlaConfig& cfg, const RunSpec& spec, const std::string& level) {
  DumpMeta m;
  m.engine = "reference";
  m.engine_options = "precision=fp32";
  m.engine_dtype = "fp32";
  m.model = cfg.to_json();
  m.run_options = run_spec_to_json(spec);
  m.tp = spec.tp;
  m.mode = mode_name(spec.mode);
  m.seed = spec.seed;
  m.probe_level = level;
  m.command = "test_dump";
  return m;
}

struct InProcessRun {
  MlaConfig cfg;
  RunSpec spec;
  Inputs inputs;
  CaptureSink capture;
};

// Runs the reference engine on tiny and writes `path` through DumpWriter (and `extra`, if given).
void run_to_dump(InProcessRun& r, const ProbePlan& plan, const std::string& path, ProbeSink* extra = nullptr) {
  r.cfg = *find_preset("tiny");
  Runner runner(r.cfg, r.spec);
  const auto weights = synthetic_weights(r.cfg, r.spec.layers, r.spec.graph_shape().input_norm, 7);
  r.inputs = synthetic_inputs(r.cfg, r.spec, weights);
  auto engine = make_engine(EngineSpec::parse("reference"));
  DumpWriter writer(path, make_meta(r.cfg, r.spec, probe_level_name(plan.level)), &r.inputs);
  TeeSink tee;
  tee.add(r.capture);
  tee.add(writer);
  if (extra) tee.add(*extra);
  runner.run(*engine, weights, r.inputs, plan, tee);
}

// The record stream of a complete run, in recording order: (layer, probe, rank).
std::vector<std::tuple<int, std::string, int>> record_order(const MlaConfig& cfg, const RunSpec& spec) {
  Runner runner(cfg, spec);
  std::vector<std::tuple<int, std::string, int>> out;
  for (int l = 0; l < spec.layers; ++l)
    for (const auto& st : runner.graph().stages)
      for (int r = 0; r < spec.tp; ++r)
        for (const auto& n : st.outputs) out.emplace_back(l, n, r);
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Round trip
// ---------------------------------------------------------------------------------------------------

struct RoundTripCase {
  const char* name;
  Mode mode;
  int layers, tokens, batch;
  std::vector<int> context;
  ProbeLevel level;
};

void PrintTo(const RoundTripCase& c, std::ostream* os) { *os << c.name; }

class DumpRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(DumpRoundTrip, EveryRecordAndInputIsBitIdentical) {
  const auto& c = GetParam();
  ScratchDir dir(std::string("rt_") + c.name);
  const std::string path = dir.path("rt.h5");
  InProcessRun r;
  r.spec.mode = c.mode;
  r.spec.form = default_form(c.mode);
  r.spec.tp = 2;
  r.spec.layers = c.layers;
  r.spec.tokens = c.tokens;
  r.spec.batch = c.batch;
  r.spec.context = c.context;
  r.spec.seed = 11;
  ProbePlan plan;
  plan.level = c.level;
  plan.full.insert("q_c");
  run_to_dump(r, plan, path);

  EXPECT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(journal::journal_path(path))) << "finish() must remove the journal";
  const Dump d = read_dump(path);
  EXPECT_EQ(d.status, "complete");
  EXPECT_TRUE(d.complete());
  // The reference records its weights: version 2, one record per weight and rank.
  EXPECT_EQ(d.schema_version, 2);
  EXPECT_EQ(d.weights.size(), build_weights(r.cfg, r.spec.graph_shape()).size() * r.spec.layers);
  for (const auto& w : d.weights) EXPECT_EQ(static_cast<int>(w.ranks.size()), r.spec.tp) << w.name;
  EXPECT_EQ(d.tool_version, MLA_VERSION);
  EXPECT_EQ(d.git_sha, MLA_GIT_SHA);
  EXPECT_FALSE(d.created_utc.empty());
  EXPECT_EQ(d.meta.engine, "reference");
  EXPECT_EQ(d.meta.tp, 2);
  EXPECT_EQ(d.meta.seed, 11u);
  EXPECT_EQ(d.meta.command, "test_dump");
  EXPECT_EQ(d.meta.model, r.cfg.to_json());
  EXPECT_EQ(d.config().to_json(), r.cfg.to_json());
  EXPECT_EQ(run_spec_to_json(d.spec()), run_spec_to_json(r.spec));
  ASSERT_EQ(d.last_stage.size(), 2u);
  const char* last = stage_name(Runner(r.cfg, r.spec).graph().stages.back().stage);
  EXPECT_EQ(d.last_stage[0], "layer " + std::to_string(c.layers - 1) + " stage " + last);
  EXPECT_EQ(d.last_stage[1], d.last_stage[0]);

  ASSERT_TRUE(d.has_inputs);
  expect_same_inputs(d.inputs, r.inputs);

  size_t records = 0;
  for (const auto& p : d.probes) records += p.ranks.size();
  EXPECT_EQ(records, r.capture.records.size());
  for (const auto& cap : r.capture.records) {
    const std::string what = "layer " + std::to_string(cap.layer) + " " + cap.spec.name + " rank " +
                             std::to_string(cap.rank);
    const DumpProbe* p = d.find(cap.layer, cap.spec.name);
    ASSERT_NE(p, nullptr) << what;
    EXPECT_EQ(p->stage, stage_name(cap.spec.stage)) << what;
    EXPECT_EQ(p->contract, contract_name(cap.spec.contract)) << what;
    EXPECT_EQ(p->shape, cap.spec.shape) << what;
    EXPECT_EQ(p->order, cap.spec.order) << what;
    EXPECT_EQ(p->heads_axis, cap.spec.heads_axis) << what;
    EXPECT_EQ(p->rope_from, cap.spec.rope_from) << what;
    EXPECT_EQ(p->engine_dtype, "fp32") << what;
    ASSERT_EQ(p->ranks.size(), 2u) << what;
    expect_same_record(p->ranks[cap.rank], cap.rec, what);
  }
  // Graph order: (layer, order) ascending.
  for (size_t i = 1; i < d.probes.size(); ++i) {
    const auto& a = d.probes[i - 1];
    const auto& b = d.probes[i];
    EXPECT_TRUE(a.layer < b.layer || (a.layer == b.layer && a.order < b.order)) << a.name << " before " << b.name;
  }

  // Without data: the same, minus the tensors.
  DumpReadOptions ro;
  ro.data = false;
  const Dump light = read_dump(path, ro);
  ASSERT_EQ(light.probes.size(), d.probes.size());
  for (const auto& p : light.probes)
    for (const auto& rr : p.ranks) EXPECT_TRUE(rr.data.empty()) << p.name;

  // write_dump_h5 of what was read writes the same dump again.
  const std::string again = dir.path("again.h5");
  write_dump_h5(d, again);
  const Dump d2 = read_dump(again);
  EXPECT_EQ(d2.status, d.status);
  EXPECT_EQ(d2.created_utc, d.created_utc);
  ASSERT_EQ(d2.probes.size(), d.probes.size());
  for (size_t i = 0; i < d.probes.size(); ++i)
    for (size_t k = 0; k < d.probes[i].ranks.size(); ++k)
      expect_same_record(d2.probes[i].ranks[k], d.probes[i].ranks[k], "rewrite " + d.probes[i].name);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DumpRoundTrip,
    ::testing::Values(RoundTripCase{"prefill_full", Mode::Mode_prefill, 2, 16, 1, {}, ProbeLevel::ProbeLevel_full},
                      RoundTripCase{"decode_sketch", Mode::Mode_decode, 2, 1, 2, {70, 130}, ProbeLevel::ProbeLevel_sketch},
                      RoundTripCase{"chunked_stats", Mode::Mode_chunked, 1, 8, 1, {65}, ProbeLevel::ProbeLevel_stats}),
    [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------------------------------
// The layout as an independent reader (h5py) sees it
// ---------------------------------------------------------------------------------------------------

std::string python_exe() { return MLA_PYTHON_EXE; }

TEST(DumpLayout, H5pyFindsTheDocumentedLayout) {
  const std::string py = python_exe();
  if (py.empty()) GTEST_SKIP() << "MLA_PYTHON is not set at configure time: h5py layout check skipped";
  if (std::system(("'" + py + "' -c 'import h5py, numpy' >/dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << py << " cannot import h5py and numpy: h5py layout check skipped (run scripts/setup.sh)";
  ScratchDir dir("layout");
  const std::string path = dir.path("layout.h5");
  InProcessRun r;
  r.spec.mode = Mode::Mode_decode;
  r.spec.form = AttentionForm::AttentionForm_absorbed;
  r.spec.tp = 2;
  r.spec.layers = 2;
  r.spec.tokens = 2;
  r.spec.batch = 2;
  r.spec.context = {70, 10};
  ProbePlan plan;  // sketch level, two probes in full
  plan.full = {"q_c", "attn_out"};
  run_to_dump(r, plan, path);

  // Sidecar: what the C++ side recorded, for the script to compare with what h5py reads.
  nlohmann::json side;
  side["tp"] = r.spec.tp;
  side["layers"] = r.spec.layers;
  side["model"] = r.cfg.to_json();
  const auto& b = r.inputs.batch;
  side["inputs"] = {{"x", r.inputs.x.data},
                    {"x_shape", r.inputs.x.shape},
                    {"positions", b.positions},
                    {"seq_lens", b.new_lens},
                    {"context_lens", b.context_lens},
                    {"block_table", b.block_table},
                    {"max_blocks", b.max_blocks},
                    {"num_blocks", b.num_blocks},
                    {"kv_cache_shape", {r.spec.layers, b.num_blocks, kPageSize, r.cfg.cache_row()}}};
  nlohmann::json probes = nlohmann::json::array();
  for (const auto& c : r.capture.records) {
    nlohmann::json rec = {{"layer", c.layer},
                          {"name", c.spec.name},
                          {"rank", c.rank},
                          {"stage", stage_name(c.spec.stage)},
                          {"contract", contract_name(c.spec.contract)},
                          {"shape", c.spec.shape},
                          {"local_shape", c.rec.shape},
                          {"order", c.spec.order},
                          {"heads_axis", c.spec.heads_axis},
                          {"rope_from", c.spec.rope_from},
                          {"level", probe_level_name(c.rec.level)},
                          {"l2", c.rec.l2},
                          {"checksum", c.rec.checksum},
                          {"nan", c.rec.nan},
                          {"token_l2", c.rec.token_l2},
                          {"head_l2", c.rec.head_l2},
                          {"sketch", c.rec.sketch}};
    if (!c.rec.data.empty()) rec["data"] = c.rec.data.data;
    probes.push_back(rec);
  }
  side["records"] = probes;
  const std::string side_path = dir.path("layout.json");
  spit(side_path, side.dump());

  const std::string script = std::string(MLA_SOURCE_DIR) + "/tests/py/check_dump_layout.py";
  const std::string out_path = dir.path("py.txt");
  const int rc = std::system(("'" + py + "' '" + script + "' '" + path + "' '" + side_path + "' >'" + out_path + "' 2>&1").c_str());
  EXPECT_EQ(rc, 0) << "check_dump_layout.py failed:\n" << slurp(out_path);
}

TEST(DumpLayout, H5dumpReadsIt) {
  if (std::system("h5dump --version >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "h5dump (hdf5-tools) is not installed: h5dump check skipped";
  ScratchDir dir("h5dump");
  const std::string path = dir.path("d.h5");
  InProcessRun r;
  r.spec.tp = 2;
  r.spec.tokens = 4;
  ProbePlan plan;
  plan.full = {"q_c"};
  run_to_dump(r, plan, path);
  const std::string out = dir.path("h5dump.txt");
  const int rc = std::system(("h5dump -A '" + path + "' >'" + out + "' 2>&1").c_str());
  const std::string text = slurp(out);
  EXPECT_EQ(rc, 0) << text;
  for (const char* s : {"\"mla-bisect-dump\"", "GROUP \"rank1\"", "ATTRIBUTE \"checksum\"",
                        "H5T_STD_U64LE", "DATASET \"sketch\"", "DATASET \"data\"", "GROUP \"inputs\""})
    EXPECT_NE(text.find(s), std::string::npos) << "h5dump -A output lacks " << s;
}

// ---------------------------------------------------------------------------------------------------
// Crash safety: a real `mla-bisect run --out` killed at random points
// ---------------------------------------------------------------------------------------------------

// Starts `mla-bisect ARGS` (slow_ms > 0: with --inject slow-at:*:slow_ms, a sleep at each stage's start after the
// journal names it); its output goes to /dev/null, no core files.
pid_t spawn_run(std::vector<std::string> args, int slow_ms) {
  // Everything the child needs is made before fork (the child only calls async-signal-safe functions).
  if (slow_ms > 0) {
    char inject[48];
    std::snprintf(inject, sizeof inject, "slow-at:*:%d", slow_ms);
    args.emplace_back("--inject");
    args.emplace_back(inject);
  }
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(MLA_BINARY));
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid != 0) return pid;
  struct rlimit no_core = {0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  const int devnull = open("/dev/null", O_WRONLY);
  dup2(devnull, 1);
  dup2(devnull, 2);
  setenv("OMP_NUM_THREADS", "1", 1);
  execv(MLA_BINARY, argv.data());
  _exit(127);
}

int wait_status(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

std::vector<std::string> kill_run_args(const std::string& out) {
  return {"run", "--model", "tiny", "--layers", "4", "--tp", "2", "--probe-level", "full", "--tokens", "16",
          "--out", out};
}

// A dump from a killed run: every record present equals the complete run's, the records form a prefix of the
// complete run's record stream (nothing partial beyond the last committed record), and the status names the last.
void check_killed_dump(const Dump& d, const Dump& ref, const std::vector<std::tuple<int, std::string, int>>& order,
                       const std::string& what) {
  SCOPED_TRACE(what);
  size_t n = 0;
  for (const auto& p : d.probes) n += p.ranks.size();
  ASSERT_LE(n, order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& [layer, name, rank] = order[i];
    const DumpProbe* p = d.find(layer, name);
    const bool present = p && rank < static_cast<int>(p->ranks.size());
    EXPECT_EQ(present, i < n) << "record " << i << " (layer " << layer << " " << name << " rank " << rank
                              << ") with " << n << " records committed";
    if (!present) continue;
    const DumpProbe* q = ref.find(layer, name);
    ASSERT_NE(q, nullptr);
    expect_same_record(p->ranks[rank], q->ranks[rank], "layer " + std::to_string(layer) + " " + name + " rank " +
                                                           std::to_string(rank));
  }
  if (d.status.rfind("stopped: during setup", 0) == 0) {  // killed while it made its weights and inputs
    EXPECT_EQ(n, 0u);
    EXPECT_FALSE(d.has_inputs);
    return;
  }
  if (d.complete()) {
    EXPECT_EQ(n, order.size());
  } else if (n == 0) {
    EXPECT_EQ(d.status.rfind("stopped: before the first probe", 0), 0u) << d.status;
  } else {
    const auto& [layer, name, rank] = order[n - 1];
    const std::string expect = "stopped: after layer " + std::to_string(layer) + " probe " + name + " rank " +
                               std::to_string(rank);
    EXPECT_EQ(d.status.rfind(expect, 0), 0u) << d.status << " (expected " << expect << ")";
  }
  ASSERT_EQ(d.last_stage.size(), 2u);
  for (const auto& s : d.last_stage) EXPECT_TRUE(s.rfind("layer ", 0) == 0 || s == "not started") << s;
  EXPECT_TRUE(d.has_inputs);
  expect_same_inputs(d.inputs, ref.inputs);
}

TEST(DumpCrash, SigkillAndAbortAtRandomPointsKeepEveryCommittedProbe) {
  ScratchDir dir("kill");
  // The complete run (same binary, same seed, not slowed) is the reference.
  const std::string ref_path = dir.path("complete.h5");
  const pid_t ref_pid = spawn_run(kill_run_args(ref_path), 0);
  const int ref_status = wait_status(ref_pid);
  ASSERT_TRUE(WIFEXITED(ref_status) && WEXITSTATUS(ref_status) == 0) << "complete run failed";
  const Dump ref = read_dump(ref_path);
  ASSERT_TRUE(ref.complete());
  const auto order = record_order(ref.config(), ref.spec());

  // How long a slowed run takes, so kill times cover all of it.
  constexpr int kSlowMs = 3;
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t timing_pid = spawn_run(kill_run_args(dir.path("timing.h5")), kSlowMs);
  wait_status(timing_pid);
  const double run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::mt19937 rng(kKillSeed);
  std::uniform_real_distribution<double> when(0.0, run_s);
  int stopped = 0, attempts = 0, aborted = 0, finished = 0, early = 0, in_finish = 0;
  for (; (stopped < 20 || aborted == 0) && attempts < 80; ++attempts) {
    const bool use_abort = stopped >= 10 && aborted == 0;
    const int sig = use_abort ? SIGABRT : SIGKILL;
    const std::string out = dir.path("k" + std::to_string(attempts) + ".h5");
    const double delay = when(rng);
    const std::string what = "kill seed " + std::to_string(kKillSeed) + ", attempt " + std::to_string(attempts) +
                             ", signal " + strsignal(sig) + " after " + std::to_string(delay) + " s";
    const pid_t pid = spawn_run(kill_run_args(out), kSlowMs);
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    kill(pid, sig);
    const int status = wait_status(pid);
    if (WIFEXITED(status)) {  // finished before the signal
      ++finished;
      continue;
    }
    ASSERT_TRUE(WIFSIGNALED(status)) << what;
    if (!fs::exists(out) && !fs::exists(journal::journal_path(out))) {  // before the journal existed
      ++early;
      continue;
    }
    Dump d;
    try {
      d = read_dump(out);
    } catch (const UsageError& e) {
      // Only a journal whose header never reached the disk may be unreadable.
      const std::string msg = e.what();
      EXPECT_NE(msg.find("no intact header"), std::string::npos) << what << ": " << msg;
      ++early;
      continue;
    }
    EXPECT_FALSE(fs::exists(journal::journal_path(out))) << what << ": recovery must remove the journal";
    check_killed_dump(d, ref, order, what);
    if (!d.complete()) {
      ++stopped;
      if (use_abort) ++aborted;
    } else {
      ++in_finish;
    }
    fs::remove(out);
  }
  std::cout << "[ kills    ] " << attempts << " runs (" << run_s << " s each): " << stopped << " stopped mid-run ("
            << aborted << " by SIGABRT), " << in_finish << " killed while writing the HDF5 file, " << early
            << " before the journal header, " << finished << " finished first; seed " << kKillSeed << "\n";
  EXPECT_GE(stopped, 20) << "only " << stopped << " of " << attempts << " kills landed mid-run";
  EXPECT_EQ(aborted, 1) << "no SIGABRT landed mid-run";
}

TEST(DumpCrash, ExceptionLeavesAJournalThatReadDumpFolds) {
  ScratchDir dir("throw");
  const std::string path = dir.path("t.h5");
  InProcessRun r;
  r.spec.tp = 2;
  r.spec.layers = 2;
  r.spec.tokens = 8;
  ProbePlan plan;
  ThrowAfter thrower(23);
  EXPECT_THROW(run_to_dump(r, plan, path, &thrower), EngineError);
  EXPECT_FALSE(fs::exists(path));
  ASSERT_TRUE(fs::exists(journal::journal_path(path)));
  const Dump d = read_dump(path);
  EXPECT_FALSE(fs::exists(journal::journal_path(path)));
  const auto order = record_order(r.cfg, r.spec);
  size_t n = 0;
  for (const auto& p : d.probes) n += p.ranks.size();
  ASSERT_EQ(n, 23u);  // the tee writes the dump before the thrower sees the record
  const auto& [layer, name, rank] = order[22];
  EXPECT_EQ(d.status, "stopped: after layer " + std::to_string(layer) + " probe " + name + " rank " +
                          std::to_string(rank));
  for (size_t i = 0; i < n; ++i) {
    const auto& [l, nm, rk] = order[i];
    expect_same_record(d.find(l, nm)->ranks[rk], r.capture.records[i].rec, nm);
  }
  // Folded for good: a second read reads the HDF5 file.
  EXPECT_EQ(read_dump(path).status, d.status);
  EXPECT_FALSE(recover_dump(path));
}

TEST(DumpCrash, ReadingALiveRunSnapshotsItAndARerunReplacesAnOldDump) {
  ScratchDir dir("live");
  const std::string path = dir.path("live.h5");
  const MlaConfig cfg = *find_preset("tiny");
  RunSpec spec;
  spec.tp = 2;
  spec.tokens = 4;
  const StageGraph graph = build_graph(cfg, spec.graph_shape());
  const ProbeSpec& q_c = *graph.find("q_c");
  Tensor t({4, cfg.q_lora_rank}, 0.5f);
  const ProbeRecord rec = compute_probe_record(t, "fp32", make_probe_request(q_c, 2, 0, ProbeLevel::ProbeLevel_full));
  {
    DumpWriter done(path, make_meta(cfg, spec, "full"), nullptr);
    done.record(0, q_c, 0, rec);
    done.record(0, q_c, 1, rec);
    done.finish("complete");
  }
  ASSERT_TRUE(read_dump(path).complete());

  DumpWriter w(path, make_meta(cfg, spec, "full"), nullptr);
  EXPECT_FALSE(fs::exists(path)) << "a new run on the same path must not leave the old dump looking current";
  w.stage_begin(0, Stage::Stage_q_a_norm, 0);
  w.record(0, q_c, 0, rec);
  const Dump live = read_dump(path);  // the writer holds the journal's lock: read, do not fold
  EXPECT_EQ(live.status, "running: after layer 0 probe q_c rank 0");
  ASSERT_EQ(live.last_stage.size(), 2u);
  EXPECT_EQ(live.last_stage[0], "layer 0 stage q_a_norm");
  EXPECT_EQ(live.last_stage[1], "not started");
  EXPECT_FALSE(live.has_inputs);
  EXPECT_FALSE(recover_dump(path));
  EXPECT_TRUE(fs::exists(journal::journal_path(path)));
  EXPECT_FALSE(fs::exists(path));
  w.finish("stopped: watchdog: rank 1 at layer 0 stage q_a_norm made no progress");
  w.record(0, q_c, 1, rec);  // after finish (a watchdog closed it): dropped
  const Dump d = read_dump(path);
  EXPECT_EQ(d.status, "stopped: watchdog: rank 1 at layer 0 stage q_a_norm made no progress");
  ASSERT_NE(d.find(0, "q_c"), nullptr);
  EXPECT_EQ(d.find(0, "q_c")->ranks.size(), 1u);
  expect_same_record(d.find(0, "q_c")->ranks[0], rec, "q_c");
}

// ---------------------------------------------------------------------------------------------------
// Corrupt, truncated and foreign files: a UsageError naming the file, never a crash
// ---------------------------------------------------------------------------------------------------

std::string usage_error_of(const std::string& path, const DumpReadOptions& ro = {}) {
  try {
    read_dump(path, ro);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(DumpCorrupt, TruncatedHdf5IsAUsageError) {
  ScratchDir dir("trunc");
  const std::string good = dir.path("good.h5");
  InProcessRun r;
  r.spec.tp = 2;
  r.spec.tokens = 8;
  ProbePlan plan;
  plan.level = ProbeLevel::ProbeLevel_full;
  run_to_dump(r, plan, good);
  const std::string bytes = slurp(good);
  const size_t n = bytes.size();
  ASSERT_GT(n, 4096u);
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{48}, size_t{100}, size_t{512}, size_t{2048},
                     n / 4, n / 3, n / 2, 2 * n / 3, n - 4096, n - 100, n - 1}) {
    const std::string path = dir.path("cut" + std::to_string(cut) + ".h5");
    spit(path, bytes.substr(0, cut));
    const std::string msg = usage_error_of(path);
    EXPECT_NE(msg, "") << "cut at " << cut << " of " << n << " bytes was read without error";
    EXPECT_NE(msg.find(path), std::string::npos) << "cut at " << cut << ": message does not name the file: " << msg;
  }
}

TEST(DumpCorrupt, BitFlippedJournalKeepsAnIntactPrefixOrFailsClearly) {
  ScratchDir dir("flip");
  const std::string src = dir.path("src.h5");
  InProcessRun r;
  r.spec.tp = 2;
  r.spec.tokens = 8;
  ProbePlan plan;
  plan.full = {"q_c"};
  ThrowAfter thrower(30);
  EXPECT_THROW(run_to_dump(r, plan, src, &thrower), EngineError);
  const std::string journal_bytes = slurp(journal::journal_path(src));
  const auto order = record_order(r.cfg, r.spec);
  ASSERT_GT(journal_bytes.size(), 1000u);

  std::mt19937 rng(kKillSeed);
  std::vector<size_t> offsets = {0, 3, 5, 9, 17, 40, journal_bytes.size() - 1, journal_bytes.size() - 5};
  std::uniform_int_distribution<size_t> any(0, journal_bytes.size() - 1);
  for (int i = 0; i < 40; ++i) offsets.push_back(any(rng));
  int failed = 0, folded = 0;
  for (size_t k = 0; k < offsets.size(); ++k) {
    const size_t off = offsets[k];
    const std::string path = dir.path("f" + std::to_string(k) + ".h5");
    std::string bytes = journal_bytes;
    bytes[off] = static_cast<char>(bytes[off] ^ (1 << (k % 8)));
    spit(journal::journal_path(path), bytes);
    const std::string what = "bit " + std::to_string(k % 8) + " of byte " + std::to_string(off) + " flipped";
    try {
      const Dump d = read_dump(path);
      ++folded;
      size_t n = 0;
      for (const auto& p : d.probes) n += p.ranks.size();
      ASSERT_LE(n, 30u) << what;
      EXPECT_EQ(d.status.rfind("stopped: ", 0), 0u) << what << ": " << d.status;
      for (size_t i = 0; i < n; ++i) {
        const auto& [l, nm, rk] = order[i];
        const DumpProbe* p = d.find(l, nm);
        ASSERT_TRUE(p && rk < static_cast<int>(p->ranks.size())) << what << ": record " << i << " missing";
        expect_same_record(p->ranks[rk], r.capture.records[i].rec, what);
      }
    } catch (const UsageError& e) {
      ++failed;
      const std::string msg = e.what();
      EXPECT_NE(msg.find(journal::journal_path(path)), std::string::npos) << what << ": " << msg;
      EXPECT_TRUE(fs::exists(journal::journal_path(path))) << what << ": an unreadable journal must be left alone";
    }
  }
  EXPECT_GT(failed, 0) << "no flip hit the header";
  EXPECT_GT(folded, 0) << "no flip left an intact prefix";
  // Truncated journals (a kill in the middle of a write) keep every whole record.
  for (size_t cut : {size_t{10}, journal_bytes.size() / 2, journal_bytes.size() - 3}) {
    const std::string path = dir.path("t" + std::to_string(cut) + ".h5");
    spit(journal::journal_path(path), journal_bytes.substr(0, cut));
    try {
      const Dump d = read_dump(path);
      EXPECT_EQ(d.status.rfind("stopped: ", 0), 0u) << d.status;
    } catch (const UsageError& e) {
      EXPECT_LT(cut, 100u) << "cut " << cut << ": " << e.what();
    }
  }
}

TEST(DumpCorrupt, ForeignAndMalformedFilesNameTheProblem) {
  ScratchDir dir("foreign");
  const auto expect_error = [&](const std::string& path, const std::string& needle) {
    const std::string msg = usage_error_of(path);
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "expected '" << needle << "' in: " << msg;
  };
  expect_error(dir.path("missing.h5"), "no such file");
  spit(dir.path("text.h5"), "this is not a dump\n");
  expect_error(dir.path("text.h5"), "not an HDF5 file");
  spit(dir.path("empty.h5"), "");
  expect_error(dir.path("empty.h5"), "not an HDF5 file");
  {
    auto f = h5::File::create(dir.path("other.h5"));
    f.set_attr("title", "someone else's file");
  }
  expect_error(dir.path("other.h5"), "no 'format' attribute");
  {
    auto f = h5::File::create(dir.path("format.h5"));
    f.set_attr("format", "gguf");
  }
  expect_error(dir.path("format.h5"), "format is 'gguf'");
  {
    auto f = h5::File::create(dir.path("v2.h5"));
    f.set_attr("format", "mla-bisect-dump");
    f.set_attr("schema_version", 3);
  }
  expect_error(dir.path("v2.h5"), "schema_version 3 is not supported");
  {
    auto f = h5::File::create(dir.path("typ.h5"));
    f.set_attr("format", "mla-bisect-dump");
    f.set_attr("schema_version", "one");
  }
  expect_error(dir.path("typ.h5"), "schema_version");

  // A dump whose pieces are wrong, one at a time.
  const auto probe_file = [&](const std::string& name, const std::function<void(h5::Group&, h5::Group&)>& edit) {
    auto f = h5::File::create(dir.path(name));
    f.set_attr("format", "mla-bisect-dump");
    f.set_attr("schema_version", 1);
    f.set_attr("tp", 2);
    f.set_attr("status", "stopped: after layer 0 probe q_nope rank 0");  // rank1 absent: a complete dump has both
    auto l = f.create_group("layer0");
    auto p = l.create_group("q_nope");
    p.set_attr("order", 4);
    p.set_attr("stage", "q_b_proj");
    p.set_attr("contract", "heads");
    p.set_attr("shape", std::vector<int64_t>{4, 8, 16});
    p.set_attr("heads_axis", 1);
    auto r0 = p.create_group("rank0");
    for (const char* a : {"absmax", "mean", "std"}) r0.set_attr(a, 1.0);
    r0.set_attr("l2", 2.0);  // four rows of norm 1
    r0.set_attr("nan", 0);
    r0.set_attr("inf", 0);
    r0.set_attr("level", "sketch");
    r0.write<float>("token_l2", {4}, std::vector<float>(4, 1.f));
    edit(p, r0);
  };
  probe_file("ok.h5", [](h5::Group&, h5::Group& r) { r.write<float>("sketch", {4, 32}, std::vector<float>(128)); });
  EXPECT_EQ(usage_error_of(dir.path("ok.h5")), "") << "the minimal hand-made dump should read";
  probe_file("sketch_shape.h5", [](h5::Group&, h5::Group& r) {
    r.write<float>("sketch", {4, 16}, std::vector<float>(64));
  });
  expect_error(dir.path("sketch_shape.h5"), "sketch: shape [4,16], expected [4,32]");
  probe_file("data_shape.h5", [](h5::Group&, h5::Group& r) {
    r.write<float>("data", {4, 8, 16}, std::vector<float>(512));  // rank-local is [4,4,16] at tp 2
  });
  expect_error(dir.path("data_shape.h5"), "data: shape [4,8,16], expected [4,4,16]");
  probe_file("no_l2.h5", [](h5::Group& p, h5::Group&) {
    auto r1 = p.create_group("rank1");
    r1.set_attr("absmax", 1.0);
  });
  expect_error(dir.path("no_l2.h5"), "missing attribute 'l2'");
  probe_file("rank_gap.h5", [](h5::Group& p, h5::Group&) { p.create_group("rank3"); });
  expect_error(dir.path("rank_gap.h5"), "rank3 but no rank1");
  probe_file("contract.h5", [](h5::Group& p, h5::Group&) { p.set_attr("contract", "sharded"); });
  expect_error(dir.path("contract.h5"), "contract 'sharded'");
  probe_file("heads.h5", [](h5::Group& p, h5::Group&) { p.set_attr("shape", std::vector<int64_t>{4, 7, 16}); });
  expect_error(dir.path("heads.h5"), "7 heads do not divide over tp 2");
  probe_file("strdata.h5", [](h5::Group&, h5::Group& r) { r.set_attr("l2", "large"); });
  expect_error(dir.path("strdata.h5"), "not a number");
  // Norms not of one tensor: l2 against its rows, a row against its heads.
  probe_file("l2_edited.h5", [](h5::Group&, h5::Group& r) {
    r.write<float>("sketch", {4, 32}, std::vector<float>(128));
    r.set_attr("l2", 2.5);
  });
  expect_error(dir.path("l2_edited.h5"), "l2 2.500000 disagrees with its token_l2, whose rows make 2.000000");
  probe_file("l2_rounded.h5", [](h5::Group&, h5::Group& r) {
    r.write<float>("sketch", {4, 32}, std::vector<float>(128));
    r.set_attr("l2", 2.0004);  // float rows summed in another order: within 1e-3
  });
  EXPECT_EQ(usage_error_of(dir.path("l2_rounded.h5")), "");
  probe_file("head_l2_edited.h5", [](h5::Group&, h5::Group& r) {
    r.write<float>("sketch", {4, 32}, std::vector<float>(128));
    std::vector<float> heads(16, 0.5f);  // 4 heads of 0.5 per token: norm 1, as token_l2 says
    heads[2 * 4 + 1] = 0.9f;             // token 2's head 1 edited
    r.write<float>("head_l2", {4, 4}, heads);
  });
  expect_error(dir.path("head_l2_edited.h5"), "token 2's token_l2 1.000000 disagrees with its head_l2");
  probe_file("head_l2_ok.h5", [](h5::Group&, h5::Group& r) {
    r.write<float>("sketch", {4, 32}, std::vector<float>(128));
    r.write<float>("head_l2", {4, 4}, std::vector<float>(16, 0.5f));
  });
  EXPECT_EQ(usage_error_of(dir.path("head_l2_ok.h5")), "");
  probe_file("nan_rows.h5", [](h5::Group&, h5::Group& r) {  // a record with NaN: its norms are not compared
    r.write<float>("sketch", {4, 32}, std::vector<float>(128));
    r.set_attr("nan", 3);
    r.set_attr("l2", 3.0);
  });
  EXPECT_EQ(usage_error_of(dir.path("nan_rows.h5")), "");
  {
    auto f = h5::File::create(dir.path("inputs.h5"));
    f.set_attr("format", "mla-bisect-dump");
    f.set_attr("schema_version", 1);
    auto in = f.create_group("inputs");
    in.write<float>("x", {4, 8}, std::vector<float>(32));
    in.write<int32_t>("positions", {4}, std::vector<int32_t>{0, 1, 2, 3});
    in.write<int32_t>("seq_lens", {1}, std::vector<int32_t>{4});
    in.write<int32_t>("context_lens", {1}, std::vector<int32_t>{0});
    in.write<int32_t>("block_table", {1, 2}, std::vector<int32_t>{0, 9});
    in.set_attr("num_blocks", 2);
  }
  expect_error(dir.path("inputs.h5"), "page id 9 outside [0, 2)");
  {
    auto f = h5::File::create(dir.path("inputs2.h5"));
    f.set_attr("format", "mla-bisect-dump");
    f.set_attr("schema_version", 1);
    f.create_group("inputs").write<float>("x", {4, 8}, std::vector<float>(32));
  }
  expect_error(dir.path("inputs2.h5"), "missing dataset 'positions'");
  // Dump::config()/spec() without the JSON they need.
  const Dump bare = read_dump(dir.path("ok.h5"));
  try {
    bare.config();
    ADD_FAILURE() << "config() of a dump without a model";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no model configuration"), std::string::npos) << e.what();
  }
  EXPECT_THROW(bare.spec(), UsageError);
}

// ---------------------------------------------------------------------------------------------------
// CLI: run --out, run --input, inspect
// ---------------------------------------------------------------------------------------------------

// Every CLI test has a ScratchDir for its files; the runs themselves need nothing from it.
CliResult run_cli(const ScratchDir&, const std::string& args) { return test::run_cli(args); }

TEST(DumpCli, RunOutThenInspect) {
  ScratchDir dir("cli");
  const std::string a = dir.path("a.h5");
  CliResult r = run_cli(dir, "run --model tiny --tp 2 --layers 2 --tokens 8 --seed 5 --probe-level sketch --full-probes q_c "
                       "--out '" + a + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("q_pe_rope"), std::string::npos) << "the probe table still prints with --out";
  const Dump d = read_dump(a);
  EXPECT_TRUE(d.complete());
  EXPECT_EQ(d.meta.command.rfind("mla-bisect run --model tiny", 0), 0u) << d.meta.command;
  EXPECT_NE(d.meta.command.find("--out"), std::string::npos) << d.meta.command;
  EXPECT_EQ(d.find(0, "q_c")->ranks[0].level, ProbeLevel::ProbeLevel_full);
  EXPECT_EQ(d.find(0, "q_a")->ranks[1].level, ProbeLevel::ProbeLevel_sketch);

  r = run_cli(dir, "inspect '" + a + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* s : {"status    complete", "engine    reference:precision=fp32", "model     tiny", "tp 2",
                        "seed 5", "(git ", "q_pe_rope", "kv_c_norm", "2/2", "inputs    x [8,64]",
                        "o_partial"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "inspect output lacks '" << s << "':\n" << r.out;

  // A killed run: inspect folds the journal and says where it stopped.
  const std::string k = dir.path("killed.h5");
  const pid_t pid = spawn_run(kill_run_args(k), 3);
  for (int i = 0; i < 5000 && !fs::exists(journal::journal_path(k)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  kill(pid, SIGKILL);
  wait_status(pid);
  r = run_cli(dir, "inspect '" + k + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("status    stopped: after layer"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("last stage rank 0: layer"), std::string::npos) << r.out;

  spit(dir.path("garbage.h5"), "garbage, not HDF5");
  r = run_cli(dir, "inspect '" + dir.path("garbage.h5") + "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("not an HDF5 file"), std::string::npos) << r.err;
  r = run_cli(dir, "inspect '" + dir.path("nothing.h5") + "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no such file"), std::string::npos) << r.err;

  r = run_cli(dir, "inspect --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--layer"), std::string::npos);
  r = run_cli(dir, "run --help");
  EXPECT_NE(r.out.find("--out"), std::string::npos);
  EXPECT_NE(r.out.find("--input"), std::string::npos);
}

TEST(DumpCli, RunInputReplaysTheDumpsInputs) {
  ScratchDir dir("input");
  const std::string a = dir.path("a.h5"), b = dir.path("b.h5");
  CliResult r = run_cli(dir, "run --model tiny --mode decode --batch 2 --context 70,100 --tp 2 --layers 2 --seed 3 "
                       "--weight-seed 9 --out '" + a + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Nothing about the step on the command line: it all comes from a.h5 (weights too, through weight_seed).
  r = run_cli(dir, "run --model tiny --tp 1 --input '" + a + "' --out '" + b + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Dump da = read_dump(a), db = read_dump(b);
  expect_same_inputs(db.inputs, da.inputs);
  EXPECT_EQ(db.meta.mode, "decode");
  EXPECT_EQ(db.meta.tp, 1);
  EXPECT_EQ(db.spec().layers, 2);
  EXPECT_EQ(db.meta.run_options.at("input").get<std::string>(), a);
  EXPECT_EQ(db.meta.run_options.at("weight_seed").get<uint64_t>(), 9u);
  // Same inputs and weights: replicated probes at tp 1 equal tp 2's rank 0 up to the TP rounding of o.
  for (const char* name : {"x", "q_c", "kv_c_norm", "kv_cache"}) {
    const auto* pa = da.find(1, name);
    const auto* pb = db.find(1, name);
    ASSERT_TRUE(pa && pb) << name;
    EXPECT_NEAR(pb->ranks[0].l2, pa->ranks[0].l2, 1e-4 * pa->ranks[0].l2) << name;
  }
  EXPECT_EQ(db.find(0, "q_c")->ranks[0].checksum, da.find(0, "q_c")->ranks[0].checksum);

  // Geometry that contradicts the dump, and a model of another size.
  r = run_cli(dir, "run --model tiny --input '" + a + "' --batch 3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--batch"), std::string::npos) << r.err;
  r = run_cli(dir, "run --model deepseek-v2-lite --input '" + a + "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("hidden size"), std::string::npos) << r.err;
  spit(dir.path("junk.h5"), "junk");
  r = run_cli(dir, "run --model tiny --input '" + dir.path("junk.h5") + "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("not an HDF5 file"), std::string::npos) << r.err;
}

}  // namespace
