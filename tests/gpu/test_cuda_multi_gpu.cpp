// Tensor parallelism over several GPUs of one host: one GPU per rank with NCCL (comm=nccl), and more ranks
// than GPUs with the device-side sum reading other GPUs' partials by peer copy (comm=local). Against the
// fp32 reference with the whole-layer tolerance of test_cuda_layer.cpp. Skipped, visibly, below 2 GPUs
// (scripts/multi_gpu_check.sh runs them on a multi-GPU machine).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tests/gpu/gpu_cases.h"

namespace mla::gputest {
namespace {

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

#define MLA_REQUIRE_GPUS(n)                                                                            \
  do {                                                                                                 \
    if (gpu_count() < (n))                                                                             \
      GTEST_SKIP() << "needs " << (n) << " GPUs, " << gpu_count() << " visible (multi-GPU test skipped)"; \
  } while (0)

// tp: ranks; comm: the communicator the engine must pick (nccl needs a GPU per rank).
struct MultiCase {
  Case c;
  std::string comm;
};

std::vector<MultiCase> multi_cases() {
  std::vector<MultiCase> v;
  for (int tp : {2, 4, 8}) {
    const std::string t = std::to_string(tp);
    v.push_back({make_case("tiny_prefill_tp" + t, "tiny", kPrefill, kMha, tp, 16), "nccl"});
    v.push_back({make_case("tiny_decode_tp" + t, "tiny", kDecode, kAbsorbed, tp, 2, 3, {1, 64, 130}), "nccl"});
    auto chunked = make_case("tiny_chunked_2layers_tp" + t, "tiny", kChunked, kMha, tp, 3, 2, {5, 70});
    chunked.layers = 2;
    v.push_back({chunked, "nccl"});
    v.push_back({make_case("tiny_prefill_shared_tp" + t, "tiny", kPrefill, kMha, tp, 9), "local"});
  }
  v.push_back({make_case("dsv3_prefill_tp2", "deepseek-v3", kPrefill, kMha, 2, 6), "nccl"});
  v.push_back({make_case("dsv3_decode_tp8", "deepseek-v3", kDecode, kAbsorbed, 8, 2, 2, {33, 80}), "nccl"});
  v.push_back({make_case("glm5_prefill_tp8", "glm-5", kPrefill, kMha, 8, 5), "nccl"});
  v.push_back({make_case("glm5_decode_tp8", "glm-5", kDecode, kAbsorbed, 8, 1, 2, {70, 129}), "nccl"});
  return v;
}

class CudaMultiGpu : public testing::TestWithParam<MultiCase> {};

TEST_P(CudaMultiGpu, CudaIsEquivalentToRef) {
  const MultiCase& m = GetParam();
  const Case& c = m.c;
  // nccl: one GPU per rank; local: more ranks than the GPUs used (devices=tp/2), at least two GPUs.
  const int need = m.comm == "nccl" ? c.tp : 2;
  MLA_REQUIRE_GPUS(need);
  const int devices = m.comm == "nccl" ? c.tp : std::max(2, std::min(gpu_count(), c.tp / 2));
  const GpuRun run = make_run(c);
  auto fp32 = reference_engine("fp32");
  const Capture ref = capture(*fp32, run);
  auto bf16 = reference_engine("bf16");
  const Capture noise = capture(*bf16, run);
  auto cuda = cuda_engine("comm=" + m.comm + ",devices=" + std::to_string(devices));
  ASSERT_NE(cuda->options().find("comm=" + m.comm), std::string::npos) << cuda->options();
  const Capture got = capture(*cuda, run);
  expect_equivalent(run, got, noise, ref, kLayerTol,
                    c.describe() + " over " + std::to_string(devices) + " GPUs, comm=" + m.comm);
  expect_device_probes_match_host(run, got);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CudaMultiGpu, testing::ValuesIn(multi_cases()),
                         [](const testing::TestParamInfo<MultiCase>& i) { return i.param.c.name + "_" + i.param.comm; });

// NCCL and the device-side sum give the same layer up to the bf16 rounding of the sum's order: every probe
// before all_reduce is bit-identical (same kernels, same shards), o differs by a few bf16 ulps at most.
TEST(CudaMultiGpuComm, NcclAgreesWithLocalSum) {
  MLA_REQUIRE_GPUS(2);
  const GpuRun run = make_run(make_case("tiny_prefill_tp2", "tiny", kPrefill, kMha, 2, 16));
  auto nccl = cuda_engine("comm=nccl,devices=2");
  auto local = cuda_engine("comm=local,devices=1");
  const Capture a = capture(*nccl, run), b = capture(*local, run);
  ASSERT_EQ(a.recs.size(), b.recs.size());
  for (const auto& [key, rec] : a.recs) {
    const auto& [layer, probe, rank] = key;
    const ProbeRecord& other = b.recs.at(key);
    const ProbeSpec& p = *run.graph.find(probe);
    if (p.stage < Stage::Stage_all_reduce) {
      EXPECT_EQ(rec.checksum, other.checksum) << probe << " rank " << rank << " differs before the all-reduce";
      continue;
    }
    double worst = 0;
    for (int64_t i = 0; i < rec.data.numel(); ++i) {
      const double x = rec.data.data[i], y = other.data.data[i];
      worst = std::max(worst, std::fabs(x - y) / std::max(std::fabs(y), 1e-3));
    }
    EXPECT_LE(worst, 4.0 / 256) << probe << " rank " << rank << ": nccl vs local sum differ by more than 4 bf16 ulps";
  }
}

// comm=auto picks NCCL when every rank has its own GPU, and the engine says which devices it used.
TEST(CudaMultiGpuComm, RanksRunOnTheirOwnDevices) {
  MLA_REQUIRE_GPUS(2);
  auto e = cuda_engine("devices=2");
  const GpuRun run = make_run(make_case("tiny_prefill_tp2", "tiny", kPrefill, kMha, 2, 4));
  const Capture got = capture(*e, run);
  EXPECT_NE(e->device().find("x2"), std::string::npos) << e->device();
  EXPECT_NE(e->options().find("comm=nccl"), std::string::npos) << e->options();
  EXPECT_FALSE(got.recs.empty());
}

}  // namespace
}  // namespace mla::gputest
