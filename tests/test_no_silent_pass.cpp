// End-to-end tests (label cpu) that no command passes what it must not, or says what it cannot support:
// - DSA: a token whose top-k swapped near-tied keys with the reference's is still compared after topk, against the
//   reference's attention on the candidate's own selection: a wrong sparse attention on such a token is found, and
//   clean runs of the same configs pass.
// - compare: named --candidate/--reference beside the positional pair; a pair whose provenance says it is reversed
//   gives no verdict (exit 2) unless named.
// - bisect: every option checked before any file of the workdir is touched; earlier dumps kept as .previous.
// - options: unknown probes in --tol, empty --context items and a negative --tol-factor refused; a mistyped
//   subcommand names the nearest; inspect of a GGUF without MLA layers fails.
// - replay: a capture stopped before its first probe is a stop (exit 3); --weights synthetic takes the capture's model.
// - golden check says when no manifest checks the golden's sha256; run --quiet keeps the probe table.
// - bisect keeps the divergent stage's full tensors beside the dumps; explore shows their values.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "probes/dump.h"
#include "tests/cli_util.h"
#include "tests/test_weights_util.h"

namespace {

using mla::test::CliResult;

const char* kCandidate = " --candidate reference:precision=bf16";

CliResult sh(const std::string& args) { return mla::test::run_cli(args, {.merge_stderr = true, .timeout_s = 0}); }

std::string tmpdir(const std::string& name) {
  static const mla::test::ScratchDir root("no_silent_pass");
  const auto d = root.dir() / name;
  std::filesystem::create_directories(d);
  return d.string();
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

bool has_fed_note(const nlohmann::json& j) {
  for (const auto& n : j["compare"]["notes"])
    if (n.get<std::string>().find("against the reference's attention on the candidate's own selection") !=
        std::string::npos)
      return true;
  return false;
}

// tiny-dsa decode, one sequence over 300 keys (seed 1): the bf16 candidate's top-k swaps near-tied keys with the
// FP32 reference's on the only token, so every probe after topk is about that token. A bug in the attention over the
// selected rows (absorbed form: the sparse gather from the wrong page; MHA form: the softmax scale) must be found at
// the attention's output; the same runs without a bug pass.
struct DsaCase {
  const char* run;
  const char* inject;
  const char* probe;
};
const DsaCase kDsaCases[] = {
    {"--mode decode --batch 1 --context 300 --seed 1", "page-off-by-one", "attn_latent"},
    {"--mode decode --attention mha --batch 1 --context 300 --seed 1", "softmax-scale", "attn_out"},
};

TEST(NoSilentPass, DsaNearTieSwapNeverExemptsAWrongAttention) {
  for (const auto& c : kDsaCases) {
    SCOPED_TRACE(std::string(c.run) + " --inject " + c.inject);
    const std::string dir = tmpdir(std::string("dsa_") + c.inject);
    const auto r = sh(std::string("bisect --model tiny-dsa ") + c.run + kCandidate + " --inject " + c.inject +
                      " --workdir " + dir + " --json " + dir + "/b.json");
    EXPECT_EQ(r.exit_code, 1) << r.out;
    const auto j = read_json(dir + "/b.json");
    ASSERT_FALSE(j["first_divergence"].is_null()) << r.out;
    EXPECT_EQ(j["first_divergence"]["probe"], c.probe) << r.out;
    EXPECT_TRUE(has_fed_note(j)) << "the case must swap near-ties:\n" << r.out;
  }
}

TEST(NoSilentPass, DsaCleanRunsWithNearTieSwapsPass) {
  for (const auto& c : kDsaCases) {
    SCOPED_TRACE(c.run);
    const std::string dir = tmpdir("dsa_clean");
    const auto r = sh(std::string("bisect --model tiny-dsa ") + c.run + kCandidate + " --workdir " + dir +
                      " --json " + dir + "/b.json");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_TRUE(has_fed_note(read_json(dir + "/b.json"))) << "the case must swap near-ties:\n" << r.out;
  }
}

// Two dumps of tiny's prefill (8 tokens): the FP32 reference and its bf16 run.
struct Pair {
  std::string f32, b16;
};
const Pair& tiny_pair() {
  static const Pair p = [] {
    Pair q{tmpdir("pair") + "/f32.h5", tmpdir("pair") + "/b16.h5"};
    EXPECT_EQ(sh("run --quiet --model tiny --tokens 8 --out " + q.f32).exit_code, 0);
    EXPECT_EQ(sh("run --quiet --model tiny --tokens 8 --engine reference:precision=bf16 --out " + q.b16).exit_code, 0);
    return q;
  }();
  return p;
}

// The FP32 dump given as the candidate and the bf16 one as the reference: no verdict, exit 2, saying the arguments
// look reversed and how to compare them as given; named, the same pair is compared (and fails: bf16 is no FP32).
TEST(NoSilentPass, CompareRefusesAPairThatLooksReversedUnlessNamed) {
  const Pair& p = tiny_pair();
  const auto rev = sh("compare " + p.f32 + " " + p.b16);
  EXPECT_EQ(rev.exit_code, 2) << rev.out;
  EXPECT_CONTAINS(rev.out, "the arguments look reversed");
  EXPECT_CONTAINS(rev.out, "is less precise than the candidate");
  EXPECT_CONTAINS(rev.out, "--candidate " + p.f32 + " --reference " + p.b16);
  EXPECT_EQ(rev.out.find("PASS"), std::string::npos) << rev.out;
  EXPECT_EQ(rev.out.find("FAIL"), std::string::npos) << rev.out;
  const auto named = sh("compare --brief --candidate " + p.f32 + " --reference " + p.b16);
  EXPECT_EQ(named.exit_code, 1) << named.out;
  // The right order, positional or named: a pass.
  for (const std::string& args : {"compare --brief " + p.b16 + " " + p.f32,
                                  "compare --brief --reference " + p.f32 + " --candidate " + p.b16}) {
    const auto r = sh(args);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.out;
    EXPECT_CONTAINS(r.out, "PASS");
  }
  // Named and positional at once, or one name alone: refused.
  EXPECT_EQ(sh("compare --candidate " + p.b16 + " " + p.b16 + " " + p.f32).exit_code, 2);
  EXPECT_EQ(sh("compare --candidate " + p.b16).exit_code, 2);
}

// A capture (another system's engine) as the reference and a run of this program as the candidate: reversed.
TEST(NoSilentPass, CompareRefusesACaptureAsTheReference) {
  const Pair& p = tiny_pair();
  const std::string cap = tmpdir("capture") + "/capture.h5";
  std::filesystem::copy_file(p.b16, cap, std::filesystem::copy_options::overwrite_existing);
  // The dump's engine attribute says where it came from (docs/dump-format.md): a capture names its system.
  const std::string py = std::string(MLA_PYTHON_EXE).empty() ? "python3" : "'" + std::string(MLA_PYTHON_EXE) + "'";
  const auto set = mla::test::run_shell(py + " -c \"import h5py; f = h5py.File('" + cap +
                                        "', 'r+'); f.attrs['engine'] = 'vllm'; f.close()\" 2>&1");
  if (set.exit_code != 0) GTEST_SKIP() << "h5py is needed to edit the dump: " << set.out;
  const auto r = sh("compare " + p.b16 + " " + cap);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "is a capture from vllm");
  EXPECT_EQ(sh("compare --brief " + cap + " " + p.f32).exit_code, 0);
}

std::string bytes_of(const std::string& path) { return mla::test::slurp(path); }

// A bisect whose options cannot work (a weight injection on unquantized weights, an unknown reference option)
// touches no file of the workdir; a bisect that runs keeps the earlier dumps as FILE.h5.previous.
TEST(NoSilentPass, BisectChecksEveryOptionBeforeTouchingTheWorkdir) {
  const std::string dir = tmpdir("workdir");
  ASSERT_EQ(sh("bisect --brief --quiet --model tiny --tokens 8" + std::string(kCandidate) + " --workdir " + dir).exit_code, 0);
  const std::string ref = bytes_of(dir + "/reference.h5"), cand = bytes_of(dir + "/candidate.h5");
  ASSERT_FALSE(ref.empty());
  ASSERT_FALSE(cand.empty());
  for (const std::string& bad : {std::string(" --inject nvfp4-nibble-swap"), std::string(" --inject fp8-scale-transpose"),
                                 std::string(" --reference reference:precision=bogus"),
                                 std::string(" --candidate reference:bogus=1"), std::string(" --tol bogus=0.1")}) {
    SCOPED_TRACE(bad);
    const auto r = sh("bisect --quiet --model tiny --tokens 8 --workdir " + dir + bad);
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_EQ(bytes_of(dir + "/reference.h5"), ref);
    EXPECT_EQ(bytes_of(dir + "/candidate.h5"), cand);
    EXPECT_FALSE(std::filesystem::exists(dir + "/reference.h5.previous"));
  }
  const auto again = sh("bisect --brief --quiet --model tiny --tokens 8 --seed 3" + std::string(kCandidate) +
                        " --workdir " + dir);
  EXPECT_EQ(again.exit_code, 0) << again.out;
  EXPECT_EQ(bytes_of(dir + "/reference.h5.previous"), ref);
  EXPECT_EQ(bytes_of(dir + "/candidate.h5.previous"), cand);
  EXPECT_TRUE(std::filesystem::exists(dir + "/reference.h5"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/candidate.h5"));
}

// --tol naming no probe of the graph: refused, naming it and listing the probes (compare, bisect, golden check).
TEST(NoSilentPass, TolOfAnUnknownProbeIsRefusedListingTheProbes) {
  const Pair& p = tiny_pair();
  const std::string golden = std::string(MLA_SOURCE_DIR) + "/golden/tiny_prefill_t8_tp1.h5";
  for (const std::string& args :
       {"compare " + p.b16 + " " + p.f32 + " --tol bogus=0.1", "bisect --model tiny --tokens 8 --tol bogus=0.1 --workdir " + tmpdir("tol"),
        "golden check " + golden + " --tol bogus=0.1"}) {
    SCOPED_TRACE(args);
    const auto r = sh(args);
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_CONTAINS(r.out, "--tol bogus=0.1: no probe bogus in");
    EXPECT_CONTAINS(r.out, "q_c, q_nope");
  }
  // A known probe still works.
  EXPECT_EQ(sh("compare --brief " + p.b16 + " " + p.f32 + " --tol q_c=0.5").exit_code, 0);
}

TEST(NoSilentPass, EmptyContextItemsAndANegativeTolFactorAreRefused) {
  for (const char* ctx : {",", "5,,5", "5,", ",5"}) {
    const auto r = sh(std::string("run --quiet --model tiny --mode decode --batch 2 --context '") + ctx + "'");
    EXPECT_EQ(r.exit_code, 2) << ctx << "\n" << r.out;
    EXPECT_CONTAINS(r.out, "an empty item");
  }
  const Pair& p = tiny_pair();
  for (const char* k : {"-1", "0"}) {
    const auto r = sh("compare " + p.b16 + " " + p.f32 + " --tol-factor " + k);
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_CONTAINS(r.out, "--tol-factor");
  }
}

TEST(NoSilentPass, AMistypedSubcommandNamesTheNearest) {
  const auto r = sh("bisct --model tiny");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "'bisct' is not a subcommand; did you mean 'bisect'?");
  EXPECT_CONTAINS(r.out, "compare");
  const auto far = sh("xyzzyqq");
  EXPECT_EQ(far.exit_code, 2);
  EXPECT_EQ(far.out.find("did you mean"), std::string::npos) << far.out;
}

// A deepseek2 GGUF holding no MLA layer: inspect says so and exits 2 (a run on it could not work).
TEST(NoSilentPass, InspectOfAGgufWithoutMlaLayersFails) {
  const std::string path = tmpdir("gguf") + "/no_mla.gguf";
  const auto w = mla::test::small_gguf();
  mla::test::spit(path, std::string(w.b.begin(), w.b.end()));
  const auto r = sh("inspect " + path);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "no MLA attention layer");
}

// A capture whose system was killed after its header and inputs, before its first probe: replay says the capture
// stopped (exit 3), as it does for one that stopped later, not that the file is bad.
TEST(NoSilentPass, ReplayOfACaptureStoppedBeforeItsFirstProbeIsAStop) {
  const Pair& p = tiny_pair();
  const mla::Dump d = mla::read_dump(p.f32);
  const std::string cut = tmpdir("cut") + "/cut.h5";
  { mla::DumpWriter w(cut, d.meta, &d.inputs); }  // destroyed without finish(): the journal holds the header alone
  const auto r = sh("replay " + cut + " --weights synthetic");
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_CONTAINS(r.out, "stopped before its first probe");
}

// replay --weights synthetic[:SEED] replays against the tool's own weights with the capture's model config: the
// run's own dump agrees; other weights are found.
TEST(NoSilentPass, ReplayWithSyntheticWeightsTakesTheCapturesModel) {
  const Pair& p = tiny_pair();
  const auto same = sh("replay " + p.f32 + " --weights synthetic");
  EXPECT_EQ(same.exit_code, 0) << same.out;
  EXPECT_EQ(same.out.find("--model"), std::string::npos) << same.out;
  const auto other = sh("replay " + p.f32 + " --weights synthetic:7");
  EXPECT_EQ(other.exit_code, 1) << other.out;
}

// golden check without a manifest says that the golden's sha256 is not checked; a --manifest that does not exist
// is refused.
TEST(NoSilentPass, GoldenCheckWithoutAManifestSaysTheShaIsNotChecked) {
  const std::string g = tmpdir("golden_nm") + "/g.h5";
  ASSERT_EQ(sh("golden make " + g + " --model tiny --tokens 4 --no-manifest").exit_code, 0);
  const auto r = sh("golden check " + g + " --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_CONTAINS(r.out, "is not checked");
  const auto named = sh("golden check " + g + " --manifest " + tmpdir("golden_nm") + "/none.json");
  EXPECT_EQ(named.exit_code, 2) << named.out;
  EXPECT_CONTAINS(named.out, "no such file");
}

// run --quiet drops the progress lines and keeps the result; --no-table drops the table.
TEST(NoSilentPass, RunQuietKeepsTheProbeTable) {
  const std::string out = tmpdir("quiet") + "/q.h5";
  const auto q = mla::test::run_cli("run --quiet --model tiny --tokens 4 --out " + out, {.timeout_s = 0});
  EXPECT_EQ(q.exit_code, 0) << q.err;
  EXPECT_CONTAINS(q.out, "kv_c_norm");
  EXPECT_EQ(q.err.find("[0."), std::string::npos) << q.err;
  const auto n = mla::test::run_cli("run --quiet --no-table --model tiny --tokens 4 --out " + out, {.timeout_s = 0});
  EXPECT_EQ(n.exit_code, 0) << n.err;
  EXPECT_EQ(n.out.find("kv_c_norm"), std::string::npos) << n.out;
}

// After a bisect at sketch level, the workdir keeps the full tensors of the divergent stage (its inputs and outputs)
// beside the dumps; explore of the workdir's pair shows their values (worst, slice). Kept tensors of another run are
// not used.
TEST(NoSilentPass, BisectKeepsTheDivergentStagesFullTensorsForExplore) {
  const std::string dir = tmpdir("keep_full"), other = tmpdir("keep_full_other");
  const auto b = sh("bisect --model tiny --tokens 16 --inject rope-neox --workdir " + dir);
  ASSERT_EQ(b.exit_code, 1) << b.out;
  EXPECT_CONTAINS(b.out, "full tensors of stage rope (inputs and outputs)");
  for (const char* f : {"/candidate.full.h5", "/reference.full.h5"})
    EXPECT_TRUE(std::filesystem::exists(dir + f)) << f;
  const std::string bin = std::string("'") + MLA_BINARY + "'";
  const auto ex = mla::test::run_shell(bin + " explore --quiet " + dir + "/candidate.h5 " + dir +
                                       "/reference.h5 2>&1 <<'EOF'\nworst\nslice\nquit\nEOF\n");
  EXPECT_CONTAINS(ex.out, "full tensors from " + dir + "/candidate.full.h5");
  EXPECT_CONTAINS(ex.out, "worst 10 elements of layer 0 q_pe_rope");
  EXPECT_CONTAINS(ex.out, "slice of layer 0 q_pe_rope at token");
  EXPECT_EQ(ex.out.find("run both sides again"), std::string::npos) << ex.out;
  // Another run's dumps with these kept tensors beside them: not used, and said.
  ASSERT_EQ(sh("bisect --model tiny --tokens 16 --seed 3 --inject rope-neox --workdir " + other).exit_code, 1);
  std::filesystem::copy_file(dir + "/candidate.full.h5", other + "/candidate.full.h5",
                             std::filesystem::copy_options::overwrite_existing);
  const auto ex2 = mla::test::run_shell(bin + " explore --quiet " + other + "/candidate.h5 " + other +
                                        "/reference.h5 2>&1 <<'EOF'\nquit\nEOF\n");
  EXPECT_CONTAINS(ex2.out, other + "/candidate.full.h5 not used: made for another run");
}

// A config.json whose quantization_config cannot be read is refused naming the field, with --model as with --weights.
TEST(NoSilentPass, AMalformedQuantizationConfigIsRefused) {
  const std::string dir = tmpdir("qcfg");
  mla::test::spit(dir + "/config.json",
                  R"({"model_type": "deepseek_v3", "hidden_size": 64, "num_attention_heads": 8, "q_lora_rank": 48,
                      "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12,
                      "quantization_config": {"quant_method": "fp8", "weight_block_size": "bogus"}})");
  const auto r = sh("run --model " + dir + "/config.json --tokens 4 --no-table");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_CONTAINS(r.out, "quantization_config.weight_block_size must be two positive integers");
  mla::test::spit(dir + "/config.json",
                  R"({"model_type": "deepseek_v3", "hidden_size": 64, "num_attention_heads": 8, "q_lora_rank": 48,
                      "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12,
                      "quantization_config": "fp8"})");
  const auto s = sh("run --model " + dir + "/config.json --tokens 4 --no-table");
  EXPECT_EQ(s.exit_code, 2) << s.out;
  EXPECT_CONTAINS(s.out, "quantization_config must be an object");
}

}  // namespace
