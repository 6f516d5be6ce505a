// Negative controls: the equivalence check must catch real bugs. The CUDA engine is run with a planted
// error in its config or weights (the references run the true ones) and the isolated stage comparison must
// flag the probes of the stage that computes with it, and nothing else.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <memory>
#include <regex>
#include <set>

#include "tests/gpu/gpu_cases.h"

namespace mla::gputest {
namespace {

constexpr Tolerance kStageTol{4.0, 1.0 / 1024};  // the stage tests' calibration (test_cuda_stages.cpp)

// Probe names named by the failures `expect_equivalent` reports for `bad` (the CUDA run of a mutated config).
std::set<std::string> flagged_probes(const Case& c, const std::function<void(GpuRun&)>& plant) {
  const GpuRun run = make_run(c);
  GpuRun bad = make_run(c);
  plant(bad);  // config changes come after derive(): the derived constants themselves are wrong
  auto fp32 = reference_engine("fp32");
  const Capture ref = capture(*fp32, run);
  auto bf16 = reference_engine("bf16");
  const Capture noise = capture(*bf16, run, &ref);
  auto cuda = cuda_engine();
  const Capture got = capture(*cuda, bad, &ref);
  testing::TestPartResultArray results;
  {
    testing::ScopedFakeTestPartResultReporter reporter(
        testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    expect_equivalent(run, got, noise, ref, kStageTol, "planted " + c.describe());
  }
  std::set<std::string> probes;
  const std::regex re("probe ([a-z_]+) \\(stage");
  for (int i = 0; i < results.size(); ++i) {
    std::smatch m;
    const std::string msg = results.GetTestPartResult(i).message();
    if (std::regex_search(msg, m, re)) probes.insert(m[1]);
  }
  return probes;
}

TEST(CudaControls, RopeStyleBugIsCaughtAtRope) {
  MLA_REQUIRE_GPU();
  const auto got = flagged_probes(make_case("ctl_rope_neox", "tiny", kPrefill, kMha, 2, 12),
                                  [](GpuRun& r) { r.cfg.rope_style = RopeStyle::RopeStyle_neox; });
  EXPECT_EQ(got, (std::set<std::string>{"q_pe_rope", "k_pe_rope"}));
}

TEST(CudaControls, RopeScaleBugIsCaughtAtRope) {
  MLA_REQUIRE_GPU();
  const auto got = flagged_probes(make_case("ctl_rope_mscale", "tiny", kDecode, kAbsorbed, 1, 2, 2, {5, 64}),
                                  [](GpuRun& r) { r.cfg.rope_mscale *= 1.02; });
  EXPECT_EQ(got, (std::set<std::string>{"q_pe_rope", "k_pe_rope"}));
}

TEST(CudaControls, SoftmaxScaleBugIsCaughtAtAttention) {
  MLA_REQUIRE_GPU();
  const auto mha = flagged_probes(make_case("ctl_scale_mha", "tiny", kChunked, kMha, 2, 4, 2, {3, 70}),
                                  [](GpuRun& r) { r.cfg.softmax_scale *= 1.05; });
  EXPECT_EQ(mha, (std::set<std::string>{"attn_out", "lse"}));
  // One decode token over 64-100 keys: a 5% temperature error moves lse by ~5% (seen on the H200: 24x its
  // limit) but the averaged latent less than its tolerance, so only lse is certain to be flagged.
  const auto mqa = flagged_probes(make_case("ctl_scale_mqa", "tiny", kDecode, kAbsorbed, 8, 1, 2, {64, 100}),
                                  [](GpuRun& r) { r.cfg.softmax_scale *= 1.05; });
  EXPECT_TRUE(mqa.count("lse")) << "lse not flagged";
  for (const auto& p : mqa) EXPECT_TRUE(p == "lse" || p == "attn_latent") << "flagged outside attention: " << p;
}

TEST(CudaControls, NormWeightBugIsCaughtAtTheNorm) {
  MLA_REQUIRE_GPU();
  // kv_a_norm's weights 3% too large: kv_c_norm is 3% off (limit ~1e-2); isolated, nothing else moves.
  const auto got = flagged_probes(make_case("ctl_norm_weight", "tiny", kPrefill, kMha, 1, 8), [](GpuRun& r) {
    auto w = std::make_shared<std::vector<LayerWeights>>(*r.weights);
    for (auto& v : (*w)[0].kv_a_norm.data) v *= 1.03f;
    r.weights = w;
  });
  EXPECT_EQ(got, (std::set<std::string>{"kv_c_norm"}));
}

}  // namespace
}  // namespace mla::gputest
