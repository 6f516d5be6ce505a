// Whole layers (and stacks of layers) on the CUDA engine, each engine feeding its own outputs forward,
// against the fp32 reference: prefill, decode (context lengths across page boundaries, s_q 1 and 2, both
// attention forms), chunked prefill; tp 1, 2 and 8 with all ranks on one GPU.
//
// Tolerance (calibrated, per probe and rank): rel_l2(cuda, fp32) <= 4 x rel_l2(bf16 reference, fp32) + 2^-10,
// worst token alike. Why: both bf16 engines round every stage output once and carry their own rounding
// forward, so their errors grow alike through the layer; the CUDA engine's differ in accumulation order and
// a few extra roundings of intermediates (see test_cuda_stages.cpp), which stay within a small factor of the
// bf16 reference's noise. 4x is headroom, far below a real bug's O(1e-2..1). Floor: as in the stage tests.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>

#include "tests/gpu/gpu_cases.h"

namespace mla::gputest {
namespace {

class CudaLayer : public testing::TestWithParam<Case> {};

TEST_P(CudaLayer, CudaIsEquivalentToRef) {
  MLA_REQUIRE_GPU();
  const Case& c = GetParam();
  const GpuRun run = make_run(c);
  auto fp32 = reference_engine("fp32");
  const Capture ref = capture(*fp32, run);
  auto bf16 = reference_engine("bf16");
  const Capture noise = capture(*bf16, run);
  auto cuda = cuda_engine(c.engine_options);
  const Capture got = capture(*cuda, run);
  expect_equivalent(run, got, noise, ref, kLayerTol, "whole layer " + c.describe());
}

INSTANTIATE_TEST_SUITE_P(Tiny, CudaLayer, testing::ValuesIn(tiny_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(RealDims, CudaLayer, testing::ValuesIn(big_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(MqaV2, CudaLayer, testing::ValuesIn(mqa_version_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(MqaDefault, CudaLayer, testing::ValuesIn(mqa_extra_cases()), case_name);

// The same layer computed twice gives bit-identical probes (checksums): no races, no nondeterministic
// reductions, on one rank and on eight sharing the GPU.
TEST(CudaLayerDeterminism, RepeatedRunsAreBitIdentical) {
  MLA_REQUIRE_GPU();
  for (const Case& c : {make_case("det_decode_tp8", "tiny", kDecode, kAbsorbed, 8, 2, 2, {64, 130}),
                        make_case("det_chunked_tp1", "tiny", kChunked, kMha, 1, 5, 2, {3, 66}),
                        make_case("det_dsv3_prefill_tp1", "deepseek-v3", kPrefill, kMha, 1, 33)}) {
    const GpuRun run = make_run(c);
    // Queued probes on the rank's stream (default), on the side stream, and synchronized after every stage.
    auto a = cuda_engine();
    auto b = cuda_engine("sync_debug=1");
    auto r = cuda_engine("probe_stream=side");
    const Capture ca = capture(*a, run), cb = capture(*b, run), cr = capture(*r, run);
    ASSERT_EQ(ca.recs.size(), cb.recs.size());
    ASSERT_EQ(ca.recs.size(), cr.recs.size());
    for (const auto& [key, rec] : ca.recs) {
      EXPECT_EQ(rec.checksum, cb.recs.at(key).checksum)
          << c.describe() << ": probe " << std::get<1>(key) << " layer " << std::get<0>(key) << " rank "
          << std::get<2>(key) << " differs between two identical runs";
      EXPECT_EQ(rec.checksum, cr.recs.at(key).checksum)
          << c.describe() << ": probe " << std::get<1>(key) << " layer " << std::get<0>(key) << " rank "
          << std::get<2>(key) << " differs between probes on the side stream and on the rank's stream";
    }
  }
}

// Probes held and launched together — all at the end of the layer (probe_launch=layer, the default; their copy beside
// the next layer or, with probe_copy=rank, ahead of it), or before the attention and at the end
// (probe_launch=attention) — give the same records, bit for bit, as each probe launched
// alone after its stage (probe_launch=stage,probe_batch=probe): every statistic, map, sketch and full tensor; over
// two layers (the second layer's stages rewrite every tensor the first layer's probes read), at tp 8 on one GPU, and
// with DSA's fp32 index scores and top-k (rows of the row kernel's, taken beside the tiles in a batch launch).
// The held ones pipeline their probes (the Runner takes the first layer's records while the second runs); those
// launched after each stage, a stage's probes together (probe_launch=stage, or nothing held: probe_hold_rows=0),
// those of the stages before the attention together (probe_batch=attention) and those on a side stream
// (probe_stream=side) do not, and give the same records too.
TEST(CudaLayerDeterminism, HeldProbesAreTheSameRecords) {
  MLA_REQUIRE_GPU();
  const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (Case c : {make_case("held_decode_tp8", "tiny", kDecode, kAbsorbed, 8, 2, 2, {64, 130}),
                 make_case("held_chunked_tp2", "tiny", kChunked, kMha, 2, 5, 2, {3, 66}),
                 make_case("held_dsa_decode_tp2", "tiny-dsa", kDecode, kAbsorbed, 2, 1, 3, {5, 100, 300}),
                 make_case("held_dsv3_prefill_tp1", "deepseek-v3", kPrefill, kMha, 1, 33)}) {
    c.layers = 2;
    c.input_norm = true;  // h and h_out: the second layer's input is the first's output
    const GpuRun run = make_run(c);
    auto each = cuda_engine("probe_launch=stage,probe_batch=probe");
    const Capture b = capture(*each, run);
    EXPECT_FALSE(each->pipelines_probes());  // (asked after the run's prepare, as the Runner asks)
    for (const std::string launch : {"", "probe_copy=rank", "probe_launch=attention", "probe_stream=side",
                                     "probe_launch=stage", "probe_hold_rows=0",
                                     "probe_hold_rows=0,probe_batch=attention"}) {
      auto held = cuda_engine(launch);
      std::stringstream parts(launch.empty() ? "probe_launch=layer" : launch);
      for (std::string part; std::getline(parts, part, ',');)
        ASSERT_NE(held->options().find(part), std::string::npos) << held->options();
      const Capture a = capture(*held, run);
      const bool holds = launch.empty() || launch == "probe_copy=rank" || launch == "probe_launch=attention";
      EXPECT_EQ(held->pipelines_probes(), holds) << held->options();
      ASSERT_EQ(a.recs.size(), b.recs.size());
      for (const auto& [key, x] : a.recs) {
        const ProbeRecord& y = b.recs.at(key);
        const std::string what = c.describe() + " " + held->options() + ": probe " + std::get<1>(key) + " layer " +
                                 std::to_string(std::get<0>(key)) + " rank " + std::to_string(std::get<2>(key));
        EXPECT_EQ(x.checksum, y.checksum) << what;
        EXPECT_EQ(x.nan, y.nan) << what;
        EXPECT_EQ(x.inf, y.inf) << what;
        for (const auto& [u, v] : {std::pair{x.l2, y.l2}, {x.absmax, y.absmax}, {x.mean, y.mean}, {x.std, y.std}})
          EXPECT_EQ(std::memcmp(&u, &v, sizeof u), 0) << what << ": " << u << " vs " << v;
        EXPECT_TRUE(same(x.token_l2, y.token_l2)) << what << ": token L2";
        EXPECT_TRUE(same(x.head_l2, y.head_l2)) << what << ": head L2";
        EXPECT_TRUE(same(x.sketch, y.sketch)) << what << ": sketch";
        EXPECT_EQ(x.data.shape, y.data.shape) << what;
        EXPECT_TRUE(same(x.data.data, y.data.data)) << what << ": full tensor";
      }
    }
  }
}

}  // namespace
}  // namespace mla::gputest
