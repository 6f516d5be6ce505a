// Every stage of the CUDA engine on exactly the reference's inputs (isolation: before each stage the fp32
// reference's input tensors are uploaded), against the fp32 reference, on the tiny preset and on the
// DeepSeek-V3 and GLM-5 dims; the fast attention kernels also on shapes that cross their tiles (Long), and
// the simple version-1 kernels they replaced (Fallback), attention_mha version 2 on every MHA case and versions 3
// and 4 on real dims (FlashVersions), and attention_mqa version 2 on every absorbed one (MqaV2; the default is
// version 3 on Hopper), and the per-head projections' plain GEMM-and-copy path (HeadSplit).
//
// Tolerance (calibrated, per probe and rank): rel_l2(cuda, fp32) <= 4 x rel_l2(bf16 reference, fp32) + 2^-10,
// and the worst token alike. Why: isolated, both bf16 engines see the same bf16 inputs and round each output
// once; the CUDA engine differs only in fp32 accumulation order and in a few extra bf16 roundings of
// intermediates (the context K/V up-projection of chunked MHA, the GEMM output before the head split), each
// no larger than the output rounding the bf16 reference already shows, so its error is ~1-2x that noise;
// 4x leaves room without hiding a real bug (a wrong lane, scale, mask or page gives O(1e-2..1)). The floor
// 2^-10 (half a bf16 ulp, relative) covers probes the bf16 reference holds exactly (noise 0).
#include <gtest/gtest.h>

#include "tests/gpu/gpu_cases.h"

namespace mla::gputest {
namespace {

constexpr Tolerance kStageTol{4.0, 1.0 / 1024};

// attention_mha's default (version 4 on Hopper at real dims, else version 3: the 256-row flash kernel, 32 rows per
// warp) runs every case of the suites above; version 2 (mha_kernel=2, 128-row blocks) on every MHA case here: tiny
// dims zero-padded (scalar and cp.async loads), the long tiny shapes (several blocks, ragged tiles, chunked prefill's
// context path), DeepSeek-V3 and GLM-5 dims. GLM's D 256 / V 256 and tiny_wide run version 2's wide kernel under
// versions 2 and 3. Plus real DeepSeek-V3 head dims across two 256-row blocks and the causal diagonal under version 3.
std::vector<Case> flash_version_cases() {
  std::vector<Case> v;
  for (const auto& list : {tiny_cases(), long_cases(), big_cases()})
    for (auto c : list)
      if (c.form == kMha) {
        c.name = "v2_" + c.name;
        c.engine_options = "mha_kernel=2";
        v.push_back(c);
      }
  auto long_dsv3 = make_case("v3_dsv3_prefill_t300_tp8", "deepseek-v3", kPrefill, kMha, 8, 300);
  long_dsv3.engine_options = "mha_kernel=3";
  v.push_back(long_dsv3);
  // Version 4 (wgmma and TMA; it falls back to version 3 where it cannot run, so on a GPU other than sm_90 these
  // test version 3), asked for by name: DeepSeek-V3's D 192 / V 128 over three query blocks with a ragged last key
  // tile, two sequences whose tiles cross into each other's rows, the context path (non-causal, an empty context),
  // and GLM-5's D 256 / V 256 with its DSA turned off (GLM-4.7-Flash's head dims: with DSA, GLM-5 attends by its
  // sparse kernel).
  std::vector<Case> v4 = {
      make_case("v4_dsv3_prefill_t300_tp8", "deepseek-v3", kPrefill, kMha, 8, 300),
      make_case("v4_dsv3_prefill_b2_t130_tp8", "deepseek-v3", kPrefill, kMha, 8, 130, 2),
      make_case("v4_dsv3_chunked_t150_tp8", "deepseek-v3", kChunked, kMha, 8, 150, 2, {200, 67}),
      make_case("v4_dsv3_chunked_t40_tp8", "deepseek-v3", kChunked, kMha, 8, 40, 2, {0, 129}),
      make_case("v4_glm5_dense_prefill_t200_tp8", "glm-5", kPrefill, kMha, 8, 200),
      make_case("v4_glm5_dense_chunked_t70_tp8", "glm-5", kChunked, kMha, 8, 70, 2, {130, 5}),
  };
  for (auto& c : v4) {
    c.engine_options = "mha_kernel=4";
    if (c.model == "glm-5") c.tweak = [](MlaConfig& m) { m.index_topk = 0; };
    v.push_back(c);
  }
  return v;
}

// head_split=copy: q_b_proj and kv_b_proj as one GEMM and a per-head copy (the default writes each head's parts with
// GEMMs batched over the heads): the tiny cases and DeepSeek-V3's dims, prefill and decode.
std::vector<Case> head_split_copy_cases() {
  std::vector<Case> v;
  for (auto c : tiny_cases()) v.push_back(c);
  for (auto c : big_cases())
    if (c.model == "deepseek-v3") v.push_back(c);
  for (auto& c : v) {
    c.name = "copy_" + c.name;
    c.engine_options = "head_split=copy";
  }
  return v;
}

class CudaStage : public testing::TestWithParam<Case> {};

TEST_P(CudaStage, CudaIsEquivalentToRef) {
  MLA_REQUIRE_GPU();
  const Case& c = GetParam();
  const GpuRun run = make_run(c);
  auto fp32 = reference_engine("fp32");
  const Capture ref = capture(*fp32, run);
  auto bf16 = reference_engine("bf16");
  const Capture noise = capture(*bf16, run, &ref);
  auto cuda = cuda_engine(c.engine_options);
  const Capture got = capture(*cuda, run, &ref);
  expect_equivalent(run, got, noise, ref, kStageTol, "isolated " + c.describe());
}

INSTANTIATE_TEST_SUITE_P(Tiny, CudaStage, testing::ValuesIn(tiny_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(RealDims, CudaStage, testing::ValuesIn(big_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Long, CudaStage, testing::ValuesIn(long_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Fallback, CudaStage, testing::ValuesIn(fallback_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(MqaV2, CudaStage, testing::ValuesIn(mqa_version_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(MqaDefault, CudaStage, testing::ValuesIn(mqa_extra_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(FlashVersions, CudaStage, testing::ValuesIn(flash_version_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(HeadSplit, CudaStage, testing::ValuesIn(head_split_copy_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Dsa, CudaStage, testing::ValuesIn(dsa_cases()), case_name);

}  // namespace
}  // namespace mla::gputest
