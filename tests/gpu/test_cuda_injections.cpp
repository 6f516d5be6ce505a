// The bug zoo on the CUDA engine (docs/bugs.md): every entry that applies to a GPU path is planted in the
// CUDA engine's own kernels, and it is the same bug the reference plants — a CUDA run with the bug equals the
// reference run with the same bug at the calibrated bf16 tolerance, probe by probe. Then the harness end to
// end: `mla-bisect zoo --candidate cuda` localizes every entry (tiny, tp 1 and 2) and flags no clean run, and
// the demo's bisect (rope-neox, DeepSeek-V3 dims, 64 tokens) finds the rope.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/model/errors.h"
#include "probes/dump.h"
#include "tests/gpu/gpu_cases.h"

namespace mla::gputest {
namespace {

// The entries of docs/bugs.md this engine plants (all but the quantized-weight ones).
const std::vector<std::string> kGpuEntries = {
    "rope-neox",      "rope-mscale",   "position-offset", "softmax-scale",  "causal-off",
    "kv-b-split",     "kv-norm-skip",  "q-norm-eps",      "tp-head-offset", "allreduce-skip",
    "wuk-transpose",  "lse-base2",     "page-off-by-one", "decode-empty-cache", "residual-drop",
    "kv-norm-no-weight", "q-norm-width", "o-proj-half-heads", "v-up-head", "sliding-window",
    "kv-norm-weight-wrap", "kv-a-rows-tile", "index-rope-layout", "index-k-norm-skip", "index-weights-skip",
    "index-causal-leak", "topk-off-by-one"};

TEST(CudaInjections, AcceptsEveryGpuEntryAndRejectsTheQuantizedOnesByName) {
  MLA_REQUIRE_GPU();
  auto e = cuda_engine();
  for (const auto& name : kGpuEntries) EXPECT_NO_THROW(e->set_injections(parse_injections(name))) << name;
  EXPECT_NO_THROW(
      e->set_injections(parse_injections("rope-neox,nan-at:q_c:3,hang-at:rope@1,crash-at:o_proj,fault-at:rope@0")));
  for (const auto& z : bug_zoo()) {
    if (!z.needs_quantized) continue;
    try {
      e->set_injections(parse_injections("rope-neox," + z.name));
      ADD_FAILURE() << z.name << ": expected a UsageError";
    } catch (const UsageError& err) {
      EXPECT_NE(std::string(err.what()).find("'" + z.name + "'"), std::string::npos) << err.what();
    }
  }
  // Every zoo entry is either planted here or needs quantized weights: nothing applicable is left out.
  for (const auto& z : bug_zoo())
    EXPECT_TRUE(z.needs_quantized || std::find(kGpuEntries.begin(), kGpuEntries.end(), z.name) != kGpuEntries.end())
        << z.name;
}

// The same bug in both engines: CUDA with the bug against the fp32 reference with the bug, within the
// whole-layer calibration (the bf16 reference with the bug gives the noise).
struct Planted {
  std::string inject;
  Case c;
};

void PrintTo(const Planted& p, std::ostream* os) { *os << p.inject << " on " << p.c.describe(); }

std::vector<Planted> planted_cases() {
  std::vector<Planted> v;
  const Case prefill = make_case("prefill_tp1", "tiny", kPrefill, kMha, 1, 12);
  for (const char* n : {"rope-neox", "rope-mscale", "position-offset", "softmax-scale", "causal-off", "kv-b-split",
                        "kv-norm-skip", "q-norm-eps"})
    v.push_back({n, prefill});
  v.push_back({"softmax-scale", make_case("decode_tp1", "tiny", kDecode, kAbsorbed, 1, 2, 2, {5, 70})});
  v.push_back({"tp-head-offset", make_case("prefill_tp2", "tiny", kPrefill, kMha, 2, 8)});
  v.push_back({"allreduce-skip", make_case("prefill_tp2", "tiny", kPrefill, kMha, 2, 8)});
  v.push_back({"tp-head-offset", make_case("decode_tp8", "tiny", kDecode, kAbsorbed, 8, 1, 2, {40, 100})});
  v.push_back({"wuk-transpose", make_case("prefill_absorbed_tp1", "tiny", kPrefill, kAbsorbed, 1, 10)});
  v.push_back({"lse-base2", make_case("chunked_tp1", "tiny", kChunked, kMha, 1, 8, 2, {0, 30})});
  v.push_back({"page-off-by-one", make_case("decode_tp1", "tiny", kDecode, kAbsorbed, 1, 1, 2, {40, 200})});
  v.push_back({"page-off-by-one", make_case("decode_sq2_tp2", "tiny", kDecode, kAbsorbed, 2, 2, 2, {64, 130})});
  v.push_back({"decode-empty-cache", make_case("prefill_absorbed_tp1", "tiny", kPrefill, kAbsorbed, 1, 10)});
  v.push_back({"decode-empty-cache", make_case("decode_tp2", "tiny", kDecode, kAbsorbed, 2, 2, 2, {3, 66})});
  v.push_back({"rope-neox", make_case("dsv3_prefill_tp1", "deepseek-v3", kPrefill, kMha, 1, 4)});
  for (const char* n : {"kv-norm-no-weight", "q-norm-width", "o-proj-half-heads", "kv-norm-weight-wrap"})
    v.push_back({n, prefill});
  v.push_back({"o-proj-half-heads", make_case("prefill_tp2", "tiny", kPrefill, kMha, 2, 8)});
  v.push_back({"v-up-head", make_case("prefill_absorbed_tp1", "tiny", kPrefill, kAbsorbed, 1, 10)});
  v.push_back({"v-up-head", make_case("decode_tp2", "tiny", kDecode, kAbsorbed, 2, 2, 2, {3, 66})});
  Case two_layers = make_case("prefill_2layers_tp1", "tiny", kPrefill, kMha, 1, 8);
  two_layers.layers = 2;  // a residual stage
  v.push_back({"residual-drop", two_layers});
  // Past the window of 16: the later tokens lose keys.
  v.push_back({"sliding-window", make_case("prefill_t40_tp1", "tiny", kPrefill, kMha, 1, 40)});
  // Past one whole row tile (32): rows 32..39 never written.
  v.push_back({"kv-a-rows-tile", make_case("prefill_t40_tp2", "tiny", kPrefill, kMha, 2, 40)});
  // DSA's bugs on tiny-dsa, past its 12 keys a token.
  for (const char* n : {"index-rope-layout", "index-k-norm-skip", "index-weights-skip", "index-causal-leak",
                        "topk-off-by-one"})
    v.push_back({n, make_case("dsa_prefill_t40_tp1", "tiny-dsa", kPrefill, kMha, 1, 40)});
  // The sparse gather from the wrong page: page-off-by-one in DSA's absorbed attention.
  v.push_back({"page-off-by-one", make_case("dsa_decode_tp1", "tiny-dsa", kDecode, kAbsorbed, 1, 1, 4,
                                            {100, 200, 300, 400})});
  // The attention bugs under attention_mha version 4 (the Hopper kernel, DeepSeek-V3's head dims).
  for (const char* n : {"sliding-window", "causal-off", "softmax-scale"}) {
    Case c = make_case("dsv3_prefill_t40_tp8_v4", "deepseek-v3", kPrefill, kMha, 8, 40);
    c.engine_options = "mha_kernel=4";
    v.push_back({n, c});
  }
  return v;
}

class CudaPlantedBug : public testing::TestWithParam<Planted> {};

TEST_P(CudaPlantedBug, MatchesTheReferenceWithTheSameBug) {
  MLA_REQUIRE_GPU();
  const Planted& p = GetParam();
  const GpuRun run = make_run(p.c);
  const auto inj = parse_injections(p.inject);
  auto fp32 = reference_engine("fp32");
  fp32->set_injections(inj);
  const Capture ref = capture(*fp32, run);
  // DSA: each stage on the reference's inputs (isolation). Run whole, a token whose two selections differ by a swap
  // between near-tied keys attends to another key in each engine, by design, which the bf16 noise need not show.
  const Capture* iso = run.cfg.has_dsa() ? &ref : nullptr;
  auto bf16 = reference_engine("bf16");
  bf16->set_injections(inj);
  const Capture noise = capture(*bf16, run, iso);
  auto cuda = cuda_engine(p.c.engine_options);
  cuda->set_injections(inj);
  const Capture got = capture(*cuda, run, iso);
  expect_equivalent(run, got, noise, ref, kLayerTol, p.inject + " planted, " + p.c.describe());

  // And the bug is really there: some probe of the CUDA run differs from a clean CUDA run.
  auto clean = cuda_engine(p.c.engine_options);
  const Capture base = capture(*clean, run);
  bool differs = false;
  for (const auto& [key, rec] : got.recs) differs = differs || rec.checksum != base.recs.at(key).checksum;
  EXPECT_TRUE(differs || p.inject == "q-norm-eps") << p.inject << ": the planted run is bit-identical to a clean one";
}

std::string planted_name(const testing::TestParamInfo<Planted>& info) {
  std::string n = info.param.inject + "_" + info.param.c.name;
  for (auto& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Zoo, CudaPlantedBug, testing::ValuesIn(planted_cases()), planted_name);

// ---- the harness end to end, through the CLI ----

void expect_zoo_ok(const std::string& tp) {
  const std::string dir = test_dir("zoo_tp" + tp);
  const auto r = run_cli("zoo --candidate cuda --model tiny --tokens 16 --tp " + tp + " --workdir " + dir +
                         " --json " + dir + "/zoo.json");
  std::cout << r.out;
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("0 injected bugs missed or mislocated, 0 clean or benign runs flagged"), std::string::npos)
      << r.out;
  std::ifstream f(dir + "/zoo.json");
  ASSERT_TRUE(f) << "no " << dir << "/zoo.json";
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j.value("schema_version", 0), 1) << "zoo --json is an object with schema_version and cases";
  ASSERT_TRUE(j.contains("cases") && j["cases"].is_array()) << j.dump().substr(0, 400);
  std::set<std::string> seen;
  for (const auto& row : j["cases"]) {
    EXPECT_TRUE(row["ok"].get<bool>()) << row.dump();
    seen.insert(row["inject"].get<std::string>());
  }
  for (const auto& n : kGpuEntries) EXPECT_TRUE(seen.count(n)) << n << " missing from the zoo table";
  EXPECT_TRUE(seen.count("")) << "no clean run in the zoo table";
  std::filesystem::remove_all(dir);
}

TEST(CudaZoo, TinyTp1LocalizesEveryEntryAndFlagsNoCleanRun) {
  MLA_REQUIRE_GPU();
  expect_zoo_ok("1");
}

TEST(CudaZoo, TinyTp2LocalizesEveryEntryAndFlagsNoCleanRun) {
  MLA_REQUIRE_GPU();
  expect_zoo_ok("2");
}

// scripts/demo.sh's bisect with the CUDA candidate: rope-neox on DeepSeek-V3 dims, 64 tokens.
TEST(CudaZoo, DemoBisectFindsRopeNeoxAtTheRope) {
  MLA_REQUIRE_GPU();
  const std::string dir = test_dir("demo");
  const auto r = run_cli("bisect --model deepseek-v3 --tokens 64 --inject rope-neox --candidate cuda --workdir " + dir +
                         " --json " + dir + "/bisect.json");
  std::cout << r.out;
  EXPECT_EQ(r.code, 1) << r.out;
  std::ifstream f(dir + "/bisect.json");
  ASSERT_TRUE(f) << "no " << dir << "/bisect.json";
  const auto j = nlohmann::json::parse(f);
  ASSERT_TRUE(j["first_divergence"].is_object()) << j.dump(2);
  EXPECT_EQ(j["first_divergence"]["probe"], "q_pe_rope") << j["first_divergence"].dump();
  EXPECT_EQ(j["first_divergence"]["stage"], "rope") << j["first_divergence"].dump();
  EXPECT_NE(j["diagnosis"]["pattern"].get<std::string>(), "") << j["diagnosis"].dump();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mla::gputest

namespace mla::gputest {
namespace {

// The records of `d`, a run stopped at a stage, against the clean run's `ref` (`what` names the run): none of a probe
// `after` says came after the stop; every probe `must_keep` says must survive there, equal to the clean record,
// checksum for checksum. Returns how many were compared.
template <class After, class MustKeep>
size_t expect_kept_records(const Dump& ref, const Dump& d, const std::string& what, After after, MustKeep must_keep) {
  size_t kept = 0;
  for (const DumpProbe& p : ref.probes) {
    const DumpProbe* q = d.find(p.layer, p.name);
    if (after(p)) {
      EXPECT_TRUE(q == nullptr || q->ranks.empty())
          << what << ": layer " << p.layer << " " << p.name << " recorded after the stop";
      continue;
    }
    if (!must_keep(p)) continue;
    if (q == nullptr || q->ranks.size() != p.ranks.size()) {
      ADD_FAILURE() << what << ": layer " << p.layer << " " << p.name << " lost (or some of its ranks)";
      continue;
    }
    for (size_t r = 0; r < p.ranks.size(); ++r)
      EXPECT_EQ(q->ranks[r].checksum, p.ranks[r].checksum) << what << ": " << p.name << " rank " << r;
    ++kept;
  }
  return kept;
}
// The stages of a layer after o_proj's entry, where the stop tests stop.
bool from_o_proj(const DumpProbe& p) { return p.stage == "o_proj" || p.stage == "all_reduce" || p.stage == "residual"; }

// A run that crashes or hangs on the CUDA engine keeps every record of the stages before: the probes queued on the
// device are collected (their copies waited for, their records built on the record builder's thread) before the
// planted crash, and before the watchdog ends a hang. Each kept record equals the clean run's, checksum for checksum.
TEST(CudaInjections, CrashAndHangKeepEveryRecordBeforeThem) {
  MLA_REQUIRE_GPU();
  const std::string dir = test_dir("stops");
  const std::string run = "run --quiet --engine cuda --model tiny --tokens 8 --tp 2 --probe-level sketch --out ";
  const auto clean = run_cli(run + dir + "/clean.h5");
  ASSERT_EQ(clean.code, 0) << clean.out;
  const Dump ref = read_dump(dir + "/clean.h5");
  const auto crash = run_cli(run + dir + "/crash.h5 --inject crash-at:o_proj");
  EXPECT_NE(crash.code, 0) << crash.out;
  const auto hang = run_cli(run + dir + "/hang.h5 --inject hang-at:o_proj --watchdog 1");
  EXPECT_EQ(hang.code, 3) << hang.out;
  for (const std::string name : {"crash", "hang"}) {
    const Dump d = read_dump(dir + "/" + name + ".h5");
    EXPECT_FALSE(d.complete()) << name << ": " << d.status;
    EXPECT_GE(expect_kept_records(ref, d, name, from_o_proj, [](const DumpProbe&) { return true; }), 10u) << name;
  }
  std::filesystem::remove_all(dir);
}

// A real device fault (fault-at: a kernel's write to an unmapped address as the stage begins) ends the run with an
// engine error that says so (exit 3), and the dump stays readable and says where the run stopped. With every stage
// synchronized (sync_debug=1) it keeps every record of the stages before the fault, each equal to the clean run's;
// with the defaults (probes held to the layer's end) the run stops the same way, without hanging, and keeps no
// record of the faulting layer's stages after the fault; and a fault in a later layer keeps the layers before.
TEST(CudaInjections, DeviceFaultEndsTheRunAndKeepsTheRecordsBeforeIt) {
  MLA_REQUIRE_GPU();
  const std::string dir = test_dir("fault");
  const std::string run = "run --quiet --model tiny --tokens 8 --tp 2 --probe-level sketch --out ";
  const auto clean = run_cli(run + dir + "/clean.h5 --engine cuda:sync_debug=1");
  ASSERT_EQ(clean.code, 0) << clean.out;
  const Dump ref = read_dump(dir + "/clean.h5");
  for (const std::string engine : {"cuda:sync_debug=1", "cuda"}) {
    const bool held = engine == "cuda";
    const std::string out = dir + "/fault_" + (held ? "held" : "sync") + ".h5";
    const auto fault = run_cli(run + out + " --engine " + engine + " --inject fault-at:o_proj");
    EXPECT_EQ(fault.code, 3) << engine << ": " << fault.out;
    EXPECT_NE(fault.out.find("illegal memory access"), std::string::npos) << engine << ": " << fault.out;
    const Dump d = read_dump(out);
    EXPECT_FALSE(d.complete()) << engine << ": " << d.status;
    // Held to the layer's end, the records before the fault are lost with it.
    const size_t kept = expect_kept_records(ref, d, engine, from_o_proj, [&](const DumpProbe&) { return !held; });
    if (!held) EXPECT_GE(kept, 10u) << engine;
  }
  // Two decode layers, the fault in the second (fault-at:STAGE:LAYER): with the held records' copy ahead of the next
  // layer (probe_copy=rank) every record of the first layer survives, equal to the clean run's.
  const std::string decode = "run --quiet --model tiny --mode decode --batch 3 --context 40 --layers 2 --tp 2 "
                             "--probe-level sketch --engine cuda:probe_copy=rank --out ";
  const auto clean2 = run_cli(decode + dir + "/clean2.h5");
  ASSERT_EQ(clean2.code, 0) << clean2.out;
  const Dump ref2 = read_dump(dir + "/clean2.h5");
  const auto fault2 = run_cli(decode + dir + "/fault2.h5 --inject fault-at:q_a_proj:1");
  EXPECT_EQ(fault2.code, 3) << fault2.out;
  EXPECT_NE(fault2.out.find("illegal memory access"), std::string::npos) << fault2.out;
  const Dump d2 = read_dump(dir + "/fault2.h5");
  EXPECT_FALSE(d2.complete()) << d2.status;
  const auto in_layer_0 = [](const DumpProbe& p) { return p.layer == 0; };
  EXPECT_GE(expect_kept_records(ref2, d2, "fault in layer 1", [](const DumpProbe&) { return false; }, in_layer_0),
            10u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mla::gputest
