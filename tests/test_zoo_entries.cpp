// The zoo entries for the rules of unwritten rows' neighbours, norms, sums, heads, masks and channel groups (label
// cpu, through the CLI): each planted in the bf16 reference candidate is localized at its probe and diagnosed by the
// rule that describes its mechanism (the zoo's pattern score), at tp 1 and 2.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/bisect/zoo.h"
#include "tests/cli_util.h"

namespace {

// The DSA entries run on tiny-dsa, the zoo's DSA twin of tiny.
const char* kEntries[] = {"residual-drop",      "kv-norm-no-weight", "q-norm-width",       "o-proj-half-heads",
                          "v-up-head",          "sliding-window",    "kv-norm-weight-wrap", "kv-a-rows-tile",
                          "index-rope-layout",  "index-k-norm-skip", "index-weights-skip", "index-causal-leak",
                          "topk-off-by-one"};

TEST(ZooEntries, EachIsLocalizedAndItsPatternNamed) {
  static const mla::test::ScratchDir root("zoo_entries");
  std::string only;
  for (const char* e : kEntries) only += (only.empty() ? "" : ",") + std::string(e);
  for (const char* tp : {"1", "2"}) {
    SCOPED_TRACE(std::string("tp ") + tp);
    const auto dir = root.dir() / (std::string("tp") + tp);
    std::filesystem::create_directories(dir);
    const auto r = mla::test::run_cli("zoo --model tiny --candidate reference:precision=bf16 --tp " + std::string(tp) +
                                          " --only " + only + " --workdir " + dir.string() + " --json " +
                                          (dir / "zoo.json").string(),
                                      {.merge_stderr = true, .timeout_s = 0});
    EXPECT_EQ(r.exit_code, 0) << r.out;
    std::ifstream f(dir / "zoo.json");
    ASSERT_TRUE(f) << r.out;
    const auto j = nlohmann::json::parse(f);
    EXPECT_EQ(j.value("schema_version", 0), 1);
    std::set<std::string> seen;
    for (const auto& row : j["cases"]) {
      const std::string name = row["inject"];
      seen.insert(name);
      EXPECT_TRUE(row["ok"].get<bool>()) << row.dump();
      EXPECT_TRUE(row["pattern_ok"].get<bool>()) << row.dump();
      EXPECT_EQ(row["pattern_words"].get<std::string>(), mla::zoo_pattern_words(name));
    }
    for (const char* e : kEntries) EXPECT_TRUE(seen.count(e)) << e << " not run";
  }
}

// q-norm-width is planted in the q LoRA's norm: on a model without q LoRA (DeepSeek-V2-Lite) the zoo leaves it out
// rather than count a bug with nothing to plant it in as missed; the entry beside it still runs.
TEST(ZooEntries, QNormWidthNeedsQLora) {
  static const mla::test::ScratchDir root("zoo_q_lora");
  const auto r = mla::test::run_cli("zoo --model deepseek-v2-lite --tokens 4 --candidate reference:precision=bf16 "
                                    "--only q-norm-width,kv-norm-no-weight --workdir " +
                                        root.dir().string() + " --json " + (root.dir() / "zoo.json").string(),
                                    {.merge_stderr = true, .timeout_s = 0});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  std::ifstream f(root.dir() / "zoo.json");
  ASSERT_TRUE(f) << r.out;
  std::set<std::string> seen;
  const auto j = nlohmann::json::parse(f);
  for (const auto& row : j["cases"]) seen.insert(row["inject"].get<std::string>());
  EXPECT_EQ(seen, (std::set<std::string>{"kv-norm-no-weight"}));
}

// Like every named entry, they take no argument: NAME:ARG is refused (exit 2, naming it).
TEST(ZooEntries, TakeNoArgument) {
  for (const char* e : kEntries) {
    const auto r = mla::test::run_cli(std::string("run --model tiny --tokens 2 --inject ") + e + ":3",
                                      {.merge_stderr = true});
    EXPECT_EQ(r.exit_code, 2) << e << ": " << r.out;
    EXPECT_NE(r.out.find("takes no argument"), std::string::npos) << r.out;
  }
}

}  // namespace
