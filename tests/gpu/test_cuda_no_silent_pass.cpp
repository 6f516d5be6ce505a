// DSA on the CUDA engine: a token whose top-k swapped near-tied keys with the FP32 reference's is still compared
// after topk, against the reference's attention on the candidate's own selection. A bug planted in the CUDA sparse
// attention (the gather of the selected rows from the wrong page) is found at attn_latent in a decode step at GLM-5's
// dims over 20000 cached keys, and in a chunked prefill of tiny-dsa; the same runs without the bug pass.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/gpu/gpu_test_util.h"

namespace mla::gputest {
namespace {

struct DsaRun {
  const char* name;
  const char* args;
};
const DsaRun kRuns[] = {
    {"glm5_decode", "--model glm-5 --mode decode --batch 1 --context 20000"},
    {"tiny_dsa_chunked", "--model tiny-dsa --mode chunked --attention absorbed --context 300 --tokens 8 --seed 1"},
};

// Runs the bisect; returns its JSON and how many tokens were compared on the candidate's own selection (the notes
// name them; 0 when the selections agreed everywhere).
nlohmann::json bisect(const DsaRun& run, const std::string& inject, int* code, std::string* out) {
  const std::string dir = test_dir(std::string("nsp_") + run.name + (inject.empty() ? "" : "_bug"));
  const auto r = run_cli(std::string("bisect ") + run.args + " --candidate cuda" +
                         (inject.empty() ? "" : " --inject " + inject) + " --workdir " + dir + " --json " + dir +
                         "/b.json");
  std::cout << r.out;
  *code = r.code;
  *out = r.out;
  std::ifstream f(dir + "/b.json");
  if (!f) return nlohmann::json();
  auto j = nlohmann::json::parse(f);
  std::filesystem::remove_all(dir);
  return j;
}

bool fed_on_own_selection(const nlohmann::json& j) {
  if (!j.contains("compare")) return false;
  for (const auto& n : j["compare"]["notes"])
    if (n.get<std::string>().find("against the reference's attention on the candidate's own selection") !=
        std::string::npos)
      return true;
  return false;
}

TEST(CudaNoSilentPass, SparseAttentionBugIsFoundOnTokensThatSwappedNearTies) {
  MLA_REQUIRE_GPU();
  for (const auto& run : kRuns) {
    SCOPED_TRACE(run.args);
    int code = -1;
    std::string out;
    const auto j = bisect(run, "page-off-by-one", &code, &out);
    EXPECT_EQ(code, 1) << out;
    ASSERT_TRUE(j.is_object() && j["first_divergence"].is_object()) << out;
    EXPECT_EQ(j["first_divergence"]["probe"], "attn_latent") << j["first_divergence"].dump();
    // At GLM-5's dims over 20000 keys the candidate's bf16 top-k swaps near-ties with the reference's (the case is
    // about those tokens); tiny-dsa may or may not.
    const bool fed = fed_on_own_selection(j);
    if (std::string(run.name) == "glm5_decode") EXPECT_TRUE(fed) << out;
    std::cout << "[ near-tie swaps ] " << run.name << ": " << (fed ? "yes" : "none") << "\n";
  }
}

TEST(CudaNoSilentPass, CleanDsaRunsPass) {
  MLA_REQUIRE_GPU();
  for (const auto& run : kRuns) {
    SCOPED_TRACE(run.args);
    int code = -1;
    std::string out;
    const auto j = bisect(run, "", &code, &out);
    EXPECT_EQ(code, 0) << out;
    std::cout << "[ near-tie swaps ] " << run.name << ": " << (fed_on_own_selection(j) ? "yes" : "none") << "\n";
  }
}

}  // namespace
}  // namespace mla::gputest
