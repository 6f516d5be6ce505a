// attention_mha version 4's coverage check. The FlashVersions v4_ stage cases fall back to version 3 where version 4
// cannot run; on an sm_90 GPU with an sm_90a build they must run version 4 itself: its check says yes to
// DeepSeek-V3's and GLM-4.7-Flash's operands as attention_mha lays them out, and no to other dims and to an operand
// TMA cannot address.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include "kernels/attention_flash.cuh"
#include "kernels/tensor_map.cuh"
#include "tests/gpu/gpu_test_util.h"

namespace mla::gputest {
namespace {

cuda::FlashParams layout(const cuda::bf16* base, int P, int R, int V, int64_t heads) {
  cuda::FlashParams p;
  p.P = P;
  p.R = R;
  p.V = V;
  p.heads = static_cast<int>(heads);
  p.q_nope = {base, heads * P, P};
  p.q_pe = {base, heads * R, R};
  p.k_nope = {base, heads * P, P};
  p.k_pe = {base, R, 0};  // one vector a key, shared by the heads
  p.v = {base, heads * V, V};
  p.q_rows = p.k_rows = 8;
  return p;
}

TEST(FlashVersion4, RunsTheRealDimsOnHopper) {
  MLA_REQUIRE_GPU();
  if (!cuda::sm90a_available(0)) GTEST_SKIP() << "not an sm_90 GPU with an sm_90a build: attention_mha runs version 3";
  void* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 1 << 20), cudaSuccess);
  const auto* base = static_cast<const cuda::bf16*>(buf);
  EXPECT_TRUE(cuda::flash_wgmma_supports(layout(base, 128, 64, 128, 16), 0));  // DeepSeek-V3, tp 8
  EXPECT_TRUE(cuda::flash_wgmma_supports(layout(base, 192, 64, 256, 20), 0));  // GLM-4.7-Flash
  EXPECT_FALSE(cuda::flash_wgmma_supports(layout(base, 16, 8, 12, 8), 0));     // tiny
  cuda::FlashParams odd = layout(base, 128, 64, 128, 16);
  odd.k_pe.ptr = base + 1;  // 2 bytes off the 16-byte alignment TMA needs
  EXPECT_FALSE(cuda::flash_wgmma_supports(odd, 0));
  cudaFree(buf);
}

}  // namespace
}  // namespace mla::gputest
