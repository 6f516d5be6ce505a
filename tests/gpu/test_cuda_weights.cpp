// Weight records of the CUDA engine: the bf16 weights its kernels read (uploaded, or dequantized on the device from
// the packed checkpoint format, then cut to the rank's shard) agree with the reference's at the calibrated bf16
// tolerance, and a bug in the device dequantization or the shard cut is named by bisect as the weight that differs.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/gpu/gpu_test_util.h"

namespace mla::gputest {
namespace {

// `mla-bisect bisect` with the cuda candidate on tiny, 16 tokens, and ARGS.
CliResult bisect(const std::string& args) {
  return run_cli("bisect --candidate cuda --model tiny --tokens 16 " + args);
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f) << "no " << path;
  return f ? nlohmann::json::parse(f) : nlohmann::json{};
}

TEST(CudaWeights, DeviceDequantizedWeightsAgreeWithTheReference) {
  MLA_REQUIRE_GPU();
  for (const char* fmt : {"", "--weight-format nvfp4", "--weight-format fp8:16"}) {
    SCOPED_TRACE(fmt);
    const std::string dir = test_dir("clean");
    const auto r = bisect(std::string(fmt) + " --tp 2 --workdir " + dir + " --json " + dir + "/b.json");
    EXPECT_EQ(r.code, 0) << r.out;
    const auto j = read_json(dir + "/b.json");
    EXPECT_EQ(j["compare"]["weights"].size(), 7u) << r.out;
    EXPECT_EQ(j["compare"]["divergent_weights"], 0) << r.out;
    std::filesystem::remove_all(dir);
  }
}

TEST(CudaWeights, DequantizationAndShardBugsAreNamedAsWeightDifferences) {
  MLA_REQUIRE_GPU();
  struct Case {
    const char* args;
    const char* weight;
    const char* words;
  };
  // nibble swap and scale transpose act in the device dequantization kernels (kernels/dequant.cu), the shard
  // offset in the engine's upload; the reference runs clean.
  const Case cases[] = {
      {"--weight-format nvfp4 --inject nvfp4-nibble-swap", "q_a_proj", "layout"},
      {"--weight-format fp8:16 --inject fp8-scale-transpose", "q_a_proj", "block-shaped"},
      {"--weight-format nvfp4-ct --inject nvfp4-global-recip", "q_a_proj", "pure scale"},
      {"--tp 2 --inject tp-head-offset", "q_b_proj", "sharding"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const std::string dir = test_dir("bug");
    const auto r = bisect(std::string(c.args) + " --workdir " + dir + " --json " + dir + "/b.json");
    EXPECT_EQ(r.code, 1) << r.out;
    const auto j = read_json(dir + "/b.json");
    ASSERT_TRUE(j["weight_cause"].is_object()) << r.out;
    EXPECT_EQ(j["weight_cause"]["weight"], c.weight) << r.out;
    const std::string pattern = j["diagnosis"]["pattern"].get<std::string>();
    EXPECT_NE(pattern.find(std::string("weight ") + c.weight + " differs"), std::string::npos) << pattern;
    EXPECT_NE(pattern.find(c.words), std::string::npos) << pattern;
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace mla::gputest
