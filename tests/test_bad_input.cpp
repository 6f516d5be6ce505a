// Bad input through the real CLI, case by case: every option validated before work (exit 2 naming it), runs too
// large for the machine refused by the memory estimate before any work, --out handled at start (a directory
// refused, an earlier dump moved aside, a run killed during setup read as such), messages that name the option
// given, and warnings for unknown checkpoint metadata.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/cli_util.h"

namespace mla {
namespace {

using test::describe;
using test::run_cli;
using test::run_shell;
using test::ScratchDir;
using test::slurp;
using test::spit;

// A tight address-space limit (ulimit -v, KiB) for the memory cases: the estimate must refuse them on any machine,
// whatever memory it has, and before allocating anything.
constexpr const char* kLimit4G = "ulimit -v 4000000;";

struct Case {
  std::string args;
  int exit_code;
  std::vector<std::string> says;  // in stderr
  std::string env;                // a shell prefix
};

// The tiny preset's dimensions as an HF config.json, with extra fields.
std::string tiny_config(const std::string& extra = "", int hidden = 64) {
  return "{\"model_type\": \"deepseek_v3\", \"hidden_size\": " + std::to_string(hidden) +
         ", \"num_attention_heads\": 8, \"q_lora_rank\": 48, \"kv_lora_rank\": 32, \"qk_nope_head_dim\": 16, "
         "\"qk_rope_head_dim\": 8, \"v_head_dim\": 12, \"rope_theta\": 10000" +
         (extra.empty() ? "" : ", " + extra) + "}";
}

void run_cases(const std::vector<Case>& cases) {
  for (const auto& c : cases) {
    test::CliRun how;
    how.env = c.env;
    how.timeout_s = 60;
    const auto r = run_cli(c.args, how);
    EXPECT_EQ(r.exit_code, c.exit_code) << describe(c.args, r);
    for (const auto& w : c.says) EXPECT_CONTAINS(r.err, w) << "\n  in: " << c.args;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << describe(c.args, r);
  }
}

TEST(BadInput, OptionsAreValidatedBeforeWork) {
  const ScratchDir dir("bad_input_options");
  const std::string missing = dir.path("none.h5");
  run_cases({
      // --full-probes names against the run's graph; a typo lists the valid names
      {"run --model tiny --full-probes bogus", 2, {"--full-probes", "bogus", "q_c"}},
      {"run --model tiny --mode decode --full-probes k_nope", 2, {"k_nope", "attn_latent"}},  // absorbed: no k_nope
      {"bisect --model tiny --full-probes bogus", 2, {"--full-probes", "bogus"}},
      {"zoo --model tiny --full-probes bogus", 2, {"--full-probes", "bogus"}},
      {"bench --model tiny --full-probes bogus", 2, {"--full-probes", "bogus"}},
      // seeds >= 0 (no wrap to 2^64-1)
      {"run --model tiny --seed -1", 2, {"--seed", "-1"}},
      {"run --model tiny --weight-seed -1", 2, {"--weight-seed"}},
      {"bisect --model tiny --seed -1", 2, {"--seed"}},
      {"zoo --model tiny --seed -2", 2, {"--seed"}},
      {"bench --model tiny --seed -1", 2, {"--seed"}},
      {"golden make " + dir.path("g.h5") + " --model tiny --seed -1", 2, {"--seed"}},
      {"run --model tiny --seed 18446744073709551616", 2, {"--seed"}},
      // timeouts: finite, > 0, or >= 0 where 0 is documented as off
      {"run --model tiny --watchdog -1", 2, {"--watchdog"}},
      {"run --model tiny --watchdog nan", 2, {"--watchdog", "nan"}},
      {"run --model tiny --watchdog inf", 2, {"--watchdog"}},
      {"run --model tiny --rendezvous-timeout -5", 2, {"--rendezvous-timeout"}},
      {"run --model tiny --rendezvous-timeout 0", 2, {"--rendezvous-timeout"}},
      {"bisect --model tiny --timeout 0", 2, {"--timeout"}},
      {"bisect --model tiny --timeout nan", 2, {"--timeout"}},
      {"zoo --model tiny --timeout -1", 2, {"--timeout"}},
      {"golden check " + missing + " --timeout nan", 2, {"--timeout"}},
      // tolerances and counts
      {"bisect --model tiny --tol-factor nan", 2, {"--tol-factor"}},
      {"bisect --model tiny --tol q_c=abc", 2, {"--tol", "abc"}},
      {"bisect --model tiny --tol q_c=-1", 2, {"--tol"}},
      {"golden check " + missing + " --tol-factor 0", 2, {"--tol-factor"}},
      {"golden check " + missing + " --tp -1", 2, {"--tp"}},
      {"explore " + missing + " " + missing + " --tol-factor -1", 2, {"--tol-factor"}},
      {"replay " + missing + " --weights " + missing + " --tol-factor inf", 2, {"--tol-factor"}},
      {"replay " + missing + " --weights " + missing + " --layer -2", 2, {"--layer"}},
      {"zoo --model tiny --clean-seeds -1", 2, {"--clean-seeds"}},
      {"inspect " + missing + " --layer -3", 2, {"--layer"}},
      {"run --model tiny --mode decode --context 100000000", 2, {"--context"}},
      // the first refusals of each kind
      {"run --model tiny --tokens 0", 2, {"--tokens"}},
      {"run --model tiny --inject no-such-bug", 2, {"no-such-bug"}},
      {"run --model no-such-model", 2, {"no-such-model", "neither a preset"}},
  });
}

TEST(BadInput, RunsTooLargeForTheMachineAreRefusedBeforeWork) {
  const ScratchDir dir("bad_input_memory");
  const std::string wide = dir.path("wide_config.json");
  spit(wide, tiny_config("", 16000000));  // hidden_size 16M: tens of GiB of weights
  run_cases({
      {"run --model deepseek-v3 --tokens 200000", 2, {"host memory", "attention scores", "--tokens"}, kLimit4G},
      {"run --model deepseek-v3 --attention absorbed --tokens 60000", 2, {"attention scores"}, kLimit4G},
      {"run --model deepseek-v3 --mode chunked --context 100000", 2, {"host memory", "--context"}, kLimit4G},
      {"run --model tiny --mode decode --context 50000000", 2, {"kv cache", "--context"}, kLimit4G},
      {"run --model deepseek-v3 --layers 1000", 2, {"weights", "--layers"}, kLimit4G},
      {"run --model '" + wide + "' --tokens 4", 2, {"weights"}, kLimit4G},
      {"run --model tiny --tokens 4096 --batch 2000", 2, {"--tokens"}, ""},  // 8M tokens: refused by its own cap
      {"bisect --model deepseek-v3 --tokens 200000", 2, {"host memory"}, kLimit4G},
      {"zoo --model deepseek-v3 --tokens 200000", 2, {"host memory"}, kLimit4G},
      {"bench --model deepseek-v3 --tokens 200000", 2, {"host memory"}, kLimit4G},
      {"golden make " + dir.path("g.h5") + " --model deepseek-v3 --tokens 200000", 2, {"host memory"}, kLimit4G},
  });
  EXPECT_FALSE(std::filesystem::exists(dir.path("g.h5")));
}

TEST(BadInput, OutIsHandledAtStart) {
  const ScratchDir dir("bad_input_out");
  // A directory is refused before any work, leaving nothing beside it.
  const std::string sub = dir.path("adir");
  std::filesystem::create_directories(sub);
  auto r = run_cli("run --model tiny --tokens 4 --out " + sub);
  EXPECT_EQ(r.exit_code, 2) << describe("--out DIR", r);
  EXPECT_CONTAINS(r.err, "directory");
  EXPECT_FALSE(std::filesystem::exists(sub + ".journal"));

  // A complete dump first; a second run moves it aside at start and says so.
  const std::string out = dir.path("run.h5");
  r = run_cli("run --model tiny --tokens 4 --quiet --out " + out);
  ASSERT_EQ(r.exit_code, 0) << describe("first run", r);
  // The second run is killed during its setup (deepseek-v3 weights take seconds to make), once its journal exists.
  const std::string cmd = "'" MLA_BINARY "' run --model deepseek-v3 --tokens 4 --quiet --out '" + out + "' 2>'" +
                          dir.path("err.txt") + "' & P=$!; i=0; while [ ! -e '" + out +
                          ".journal' ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; kill -9 $P; wait $P 2>/dev/null; "
                          "echo waited";
  r = run_shell(cmd);
  EXPECT_CONTAINS(slurp(dir.path("err.txt")), ".previous");
  ASSERT_TRUE(std::filesystem::exists(out + ".previous")) << describe(cmd, r);
  r = run_cli("inspect " + out);
  EXPECT_EQ(r.exit_code, 0) << describe("inspect", r);
  EXPECT_CONTAINS(r.out, "stopped: during setup");
  EXPECT_EQ(r.out.find("status    complete"), std::string::npos) << r.out;
  r = run_cli("inspect " + out + ".previous");
  EXPECT_CONTAINS(r.out, "status    complete");
}

// A GGUF holding only metadata (no tensors), in file order: the key, its type, its value.
struct GgufMeta {
  std::string bytes;
  uint64_t count = 0;
  template <class T>
  void put(T v) {
    bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    bytes += s;
  }
  void u32(const std::string& k, uint32_t v) { str(k), put<uint32_t>(4), put<uint32_t>(v), ++count; }
  void f32(const std::string& k, float v) { str(k), put<uint32_t>(6), put<float>(v), ++count; }
  void text(const std::string& k, const std::string& v) { str(k), put<uint32_t>(8), str(v), ++count; }
  std::string file() const {
    std::string f = "GGUF";
    const uint32_t version = 3;
    const uint64_t tensors = 0;
    f.append(reinterpret_cast<const char*>(&version), 4);
    f.append(reinterpret_cast<const char*>(&tensors), 8);
    f.append(reinterpret_cast<const char*>(&count), 8);
    return f + bytes;
  }
};

TEST(BadInput, CheckpointsMessagesAndWarnings) {
  const ScratchDir dir("bad_input_ckpt");
  // --weights DIR without config.json: the message names --weights (--model was not given).
  const std::string empty_dir = dir.path("ckpt");
  std::filesystem::create_directories(empty_dir);
  auto r = run_cli("run --weights " + empty_dir);
  EXPECT_EQ(r.exit_code, 2) << describe("--weights DIR", r);
  EXPECT_CONTAINS(r.err, "--weights");
  EXPECT_CONTAINS(r.err, "config.json");
  EXPECT_EQ(r.err.find("--model '"), std::string::npos) << r.err;
  r = run_cli("run --weights " + dir.path("no_such_dir"));
  EXPECT_EQ(r.exit_code, 2) << describe("--weights missing", r);
  EXPECT_CONTAINS(r.err, "--weights");

  // inspect of a checkpoint whose layer does not load: exit 2, naming it.
  const std::string ck = dir.path("bad_ckpt");
  std::filesystem::create_directories(ck);
  spit(ck + "/config.json", tiny_config());
  const std::string header =
      "{\"model.layers.0.self_attn.kv_a_proj_with_mqa.weight\": {\"dtype\": \"F32\", \"shape\": [3, 5], "
      "\"data_offsets\": [0, 60]}}";
  std::string st;
  const uint64_t n = header.size();
  st.append(reinterpret_cast<const char*>(&n), 8);
  st += header + std::string(60, '\0');
  spit(ck + "/model.safetensors", st);
  r = run_cli("inspect " + ck);
  EXPECT_EQ(r.exit_code, 2) << describe("inspect bad checkpoint", r);
  EXPECT_CONTAINS(r.err, "cannot be used as a checkpoint");

  // A damaged key of the model's own GGUF namespace is warned about (it would read as absent: YaRN off).
  GgufMeta g;
  g.text("general.architecture", "deepseek2");
  g.u32("deepseek2.embedding_length", 64);
  g.u32("deepseek2.block_count", 1);
  g.u32("deepseek2.attention.head_count", 8);
  g.u32("deepseek2.attention.q_lora_rank", 48);
  g.u32("deepseek2.attention.kv_lora_rank", 32);
  g.u32("deepseek2.attention.key_length", 24);
  g.u32("deepseek2.attention.value_length", 12);
  g.u32("deepseek2.rope.dimension_count", 8);
  g.text("deepseek2.rope.scalinf.type", "yarn");  // one flipped byte in rope.scaling.type
  g.f32("deepseek2.rope.scaling.factor", 4.0f);
  const std::string gguf = dir.path("damaged.gguf");
  spit(gguf, g.file());
  r = run_cli("run --weights " + gguf + " --tokens 2");
  EXPECT_EQ(r.exit_code, 2) << describe("damaged gguf", r);  // it has no tensors
  EXPECT_CONTAINS(r.err, "warning");
  EXPECT_CONTAINS(r.err, "deepseek2.rope.scalinf.type");

  // config.json fields that look like rope/attention settings but are not read, and unknown rope keys.
  const std::string cfg = dir.path("typo_config.json");
  spit(cfg, tiny_config("\"rope_scalling\": {\"type\": \"yarn\", \"factor\": 4}, \"sliding_window\": 128, "
                        "\"rope_scaling\": {\"type\": \"default\", \"attention_factor\": 2}"));
  r = run_cli("run --model " + cfg + " --tokens 2 --quiet");
  EXPECT_EQ(r.exit_code, 0) << describe("config typo", r);  // warnings, not fatal
  EXPECT_CONTAINS(r.err, "rope_scalling");
  EXPECT_CONTAINS(r.err, "sliding_window");
  EXPECT_CONTAINS(r.err, "attention_factor");
  spit(cfg, tiny_config("\"attention_bias\": false, \"num_key_value_heads\": 8"));
  r = run_cli("run --model " + cfg + " --tokens 2 --quiet");
  EXPECT_EQ(r.exit_code, 0) << describe("config clean", r);
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace mla
