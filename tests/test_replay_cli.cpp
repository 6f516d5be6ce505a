// `mla-bisect replay` end to end on checkpoints written by safetensors (tests/py/make_weight_fixtures.py): a layer
// "captured" from a bf16 engine (our own, with and without a planted bug) replays clean or names the probe, and every
// capture that cannot be replayed is refused with exit 2 saying what and where. tests/py/test_hf_capture.py does the
// same with captures from HF transformers.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "harness/bisect/replay.h"
#include "core/model/errors.h"
#include "probes/dump.h"
#include "tests/cli_util.h"
#include "tests/test_weights_util.h"

namespace mla {
namespace {

using test::CliResult;
namespace fs = std::filesystem;

CliResult mla(const std::string& args) { return test::run_cli(args, {.merge_stderr = true, .timeout_s = 300}); }

struct Capture {
  fs::path dir, ckpt, clean, buggy;
};

// A capture of checkpoint layer 1 in bf16 from the reference engine, clean and with the RoPE lanes paired neox-style.
const Capture& capture() {
  static const Capture c = [] {
    Capture c;
    const auto& fx = test::weight_fixtures();
    if (!fx.skip.empty()) return c;
    c.dir = test::scratch("replay");
    c.ckpt = fx.at("models/hf_fp8");
    c.clean = c.dir / "clean.h5";
    c.buggy = c.dir / "buggy.h5";
    const std::string base = "run --weights '" + c.ckpt.string() +
                             "' --layer-range 1:2 --tokens 12 --probe-level full --engine reference:precision=bf16 --quiet";
    EXPECT_EQ(mla(base + " --out '" + c.clean.string() + "'").exit_code, 0);
    EXPECT_EQ(mla(base + " --inject rope-neox --out '" + c.buggy.string() + "'").exit_code, 0);
    return c;
  }();
  return c;
}

#define MLA_REQUIRE_CAPTURE()                                                    \
  MLA_REQUIRE_WEIGHT_FIXTURES();                                                 \
  const Capture& cap = capture();                                                \
  ASSERT_TRUE(fs::exists(cap.clean) && fs::exists(cap.buggy)) << "captures not made"

// Rewrites a dump after `edit` changed it (the C++ writer: the file stays a valid dump).
template <class F>
fs::path edited(const fs::path& from, const std::string& name, F edit) {
  Dump d = read_dump(from.string());
  edit(d);
  const fs::path to = from.parent_path() / name;
  write_dump_h5(d, to.string());
  return to;
}

TEST(ReplayCli, CleanCaptureReplaysWithoutDivergence) {
  MLA_REQUIRE_CAPTURE();
  const auto json = cap.dir / "clean.json";
  const CliResult r = mla("replay '" + cap.clean.string() + "' --weights '" + cap.ckpt.string() +
                          "' --layer 1 --json '" + json.string() + "'");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("no divergence"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(test::slurp(json));
  EXPECT_TRUE(j["first_divergence"].is_null());
  EXPECT_EQ(j["command"], "replay");
  EXPECT_EQ(j.value("schema_version", 0), 1);
}

TEST(ReplayCli, WrongLayerOfTheCheckpointDiverges) {
  // The capture holds layer 1; layer 0's weights make every projection wrong from q_a on (the inputs are right).
  MLA_REQUIRE_CAPTURE();
  const CliResult r = mla("replay '" + cap.clean.string() + "' --weights '" + cap.ckpt.string() + "' --layer 0 --brief");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("first divergence: layer 0 x (stage input_norm)"), std::string::npos) << r.out;
}

TEST(ReplayCli, PlantedRopeBugIsFoundAndIsolatedOnTheCapturesOwnInputs) {
  MLA_REQUIRE_CAPTURE();
  const auto json = cap.dir / "buggy.json";
  const CliResult r = mla("replay '" + cap.buggy.string() + "' --weights '" + cap.ckpt.string() +
                          "' --layer 1 --json '" + json.string() + "'");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("first divergence: layer 1 q_pe_rope (stage rope)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("introduced by stage rope: on the candidate's own inputs"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(test::slurp(json));
  EXPECT_EQ(j["first_divergence"]["probe"], "q_pe_rope");
}

TEST(ReplayCli, DownstreamProbeAloneIsFoundButNotIsolated) {
  // Only attention's output captured: the divergence shows there, and isolation says which inputs it lacks.
  MLA_REQUIRE_CAPTURE();
  const auto path = edited(cap.buggy, "only_attn_out.h5", [](Dump& d) {
    std::erase_if(d.probes, [](const DumpProbe& p) { return p.name != "attn_out" && p.name != "o"; });
  });
  const CliResult r = mla("replay '" + path.string() + "' --weights '" + cap.ckpt.string() + "' --layer 1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("first divergence: layer 1 attn_out"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not isolated: the capture lacks the full tensors"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not captured (not compared): layer0/h, layer0/x"), std::string::npos) << r.out;
}

TEST(ReplayCli, CaptureThatCannotBeReplayedIsRefusedWithWhatAndWhere) {
  MLA_REQUIRE_CAPTURE();
  const std::string w = " --weights '" + cap.ckpt.string() + "'";
  {  // probes under names nobody knows: the reader refuses them, naming the group
    const auto p = edited(cap.clean, "renamed.h5", [](Dump& d) {
      for (auto& pr : d.probes) pr.name = "self_attn." + pr.name;
    });
    const CliResult r = mla("replay '" + p.string() + "'" + w + " --layer 1");
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_NE(r.out.find("/layer0/self_attn."), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("is not a probe name"), std::string::npos) << r.out;
  }
  {  // a config that disagrees with the checkpoint's
    const auto p = edited(cap.clean, "other_config.h5", [](Dump& d) { d.meta.model["rope_theta"] = 50000.0; });
    const CliResult r = mla("replay '" + p.string() + "'" + w + " --layer 1");
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_NE(r.out.find("disagrees with the checkpoint's"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("rope_theta: capture 50000"), std::string::npos) << r.out;
  }
  {  // no inputs
    const auto p = edited(cap.clean, "no_inputs.h5", [](Dump& d) { d.has_inputs = false; });
    const CliResult r = mla("replay '" + p.string() + "'" + w + " --layer 1");
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_NE(r.out.find("no /inputs group"), std::string::npos) << r.out;
  }
  {  // the checkpoint lacks the layer
    const CliResult r = mla("replay '" + cap.clean.string() + "'" + w + " --layer 40");
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_NE(r.out.find("no layer 40"), std::string::npos) << r.out;
  }
  {  // not a dump at all
    const auto p = cap.dir / "not_a_dump.h5";
    test::spit(p, "this is not HDF5");
    const CliResult r = mla("replay '" + p.string() + "'" + w);
    EXPECT_EQ(r.exit_code, 2) << r.out;
  }
  {  // a capture that stopped early is exit 3, never a pass
    const auto p = edited(cap.clean, "stopped.h5", [](Dump& d) {
      d.status = "stopped: after layer 0 probe kv_c rank 0";
      std::erase_if(d.probes, [](const DumpProbe& pr) { return pr.order > 6; });
    });
    const CliResult r = mla("replay '" + p.string() + "'" + w + " --layer 1");
    EXPECT_EQ(r.exit_code, 3) << r.out;
    EXPECT_NE(r.out.find("capture STOPPED early"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("no divergence"), std::string::npos) << r.out;
  }
}

TEST(ReplayCli, ExploreIsolatesACaptureOnItsOwnInputs) {
  // A capture from another system (its engine cannot run here): replay writes the reference's dump, and explore's
  // isolate re-runs the reference's stage on the capture's own inputs instead of re-running the candidate.
  MLA_REQUIRE_CAPTURE();
  const auto path = edited(cap.buggy, "hf_capture.h5", [](Dump& d) {
    d.meta.engine = "hf-transformers";
    d.meta.engine_options.clear();
    d.meta.inject.clear();
  });
  const auto ref = cap.dir / "hf_reference.h5";
  const CliResult r = mla("replay '" + path.string() + "' --weights '" + cap.ckpt.string() + "' --layer 1 --quiet "
                          "--brief --reference-out '" + ref.string() + "'");
  ASSERT_EQ(r.exit_code, 1) << r.out;
  ASSERT_TRUE(fs::exists(ref)) << r.out;
  const CliResult e = test::run_shell("printf 'isolate q_pe_rope\\nquit\\n' | '" MLA_BINARY "' explore '" +
                                      path.string() + "' '" + ref.string() + "' 2>&1");
  EXPECT_NE(e.out.find("fed the capture's own inputs"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("introduced by stage rope: on the candidate's own inputs"), std::string::npos) << e.out;
  EXPECT_EQ(e.out.find("unknown engine"), std::string::npos) << e.out;
}

TEST(ReplayCli, ConfigDifferencesNameEachField) {
  MlaConfig a = *find_preset("deepseek-v3"), b = a;
  EXPECT_TRUE(config_differences(a, b).empty());
  b.heads = 64;
  b.rope_style = RopeStyle::RopeStyle_neox;
  const auto d = config_differences(a, b);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0], "num_attention_heads: capture 128, checkpoint 64");
  EXPECT_EQ(d[1], "rope lane order: capture interleaved, checkpoint neox");
}

}  // namespace
}  // namespace mla
