// The CUDA engine's boundary: options, the no-GPU error, upload/download conversion, and dtypes.
#include <gtest/gtest.h>

#include <random>

#include "core/model/errors.h"
#include "kernels/cuda_engine.h"
#include "tests/gpu/gpu_cases.h"

namespace mla::gputest {
namespace {

TEST(CudaEngine, NoDeviceIsAClearUsageError) {
  if (have_gpu()) GTEST_SKIP() << "a CUDA device is visible: the no-device error path cannot be exercised here";
  try {
    make_engine(EngineSpec::parse("cuda"));
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
}

TEST(CudaEngine, RejectsUnknownAndBadOptions) {
  MLA_REQUIRE_GPU();
  EXPECT_THROW(cuda_engine("bogus=1"), UsageError);
  EXPECT_THROW(cuda_engine("sync_debug=maybe"), UsageError);
  EXPECT_THROW(cuda_engine("comm=carrier-pigeon"), UsageError);
  EXPECT_THROW(cuda_engine("devices=0"), UsageError);
  EXPECT_THROW(cuda_engine("devices=4096"), UsageError);
  EXPECT_THROW(cuda_engine("mha_kernel=5"), UsageError);
  EXPECT_THROW(cuda_engine("mqa_kernel=4"), UsageError);
  EXPECT_NE(cuda_engine("mqa_kernel=3")->options().find("mqa_kernel=3"), std::string::npos);
  EXPECT_NE(cuda_engine("mqa_kernel=2")->options().find("mqa_kernel=2"), std::string::npos);
  EXPECT_NE(cuda_engine("mha_kernel=2")->options().find("mha_kernel=2"), std::string::npos);
  EXPECT_NE(cuda_engine("mha_kernel=4")->options().find("mha_kernel=4"), std::string::npos);
  EXPECT_THROW(cuda_engine("mqa_kernel=fast"), UsageError);
  EXPECT_THROW(cuda_engine("probe_stream=both"), UsageError);
  EXPECT_NE(cuda_engine()->options().find("probe_stream=rank"), std::string::npos);
  EXPECT_NE(cuda_engine("probe_stream=side")->options().find("probe_stream=side"), std::string::npos);
  EXPECT_NE(cuda_engine()->options().find("mha_kernel=4,mqa_kernel=auto,head_split=gemm"), std::string::npos);
  EXPECT_NE(cuda_engine("head_split=copy")->options().find("head_split=copy"), std::string::npos);
  EXPECT_THROW(cuda_engine("head_split=scatter"), UsageError);
  // The probe launch options: programmatic dependent launches and the done flag's writer (defaults 1 and memop).
  EXPECT_THROW(cuda_engine("probe_pdl=maybe"), UsageError);
  try {
    cuda_engine("probe_flag=interrupt");
    ADD_FAILURE() << "probe_flag=interrupt was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("probe_flag=interrupt (expected memop or kernel)"), std::string::npos)
        << e.what();
  }
  EXPECT_NE(make_engine(EngineSpec::parse("cuda"))
                ->options()
                .find("probe_batch=stage,probe_copy=side,probe_flag=memop,probe_hold_rows=256,probe_launch=layer,"
                      "probe_pdl=1"),
            std::string::npos);
  EXPECT_NE(cuda_engine("probe_pdl=0,probe_flag=kernel,probe_launch=stage,probe_hold_rows=512,probe_batch=probe,"
                        "probe_copy=rank")
                ->options()
                .find("probe_batch=probe,probe_copy=rank,probe_flag=kernel,probe_hold_rows=512,probe_launch=stage,"
                      "probe_pdl=0"),
            std::string::npos);
  try {
    cuda_engine("probe_copy=host");
    ADD_FAILURE() << "probe_copy=host was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("probe_copy=host (expected side or rank)"), std::string::npos) << e.what();
  }
  try {
    cuda_engine("probe_batch=layer");
    ADD_FAILURE() << "probe_batch=layer was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("probe_batch=layer (expected stage, attention or probe)"),
              std::string::npos)
        << e.what();
  }
  try {
    cuda_engine("probe_hold_rows=many");
    ADD_FAILURE() << "probe_hold_rows=many was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("probe_hold_rows=many (expected a row count)"), std::string::npos)
        << e.what();
  }
  try {
    cuda_engine("probe_launch=now");
    ADD_FAILURE() << "probe_launch=now was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("probe_launch=now (expected layer, attention or stage)"), std::string::npos)
        << e.what();
  }
  auto e = cuda_engine("sync_debug=1,poison=0,probe=host");
  EXPECT_EQ(e->name(), "cuda");
  EXPECT_EQ(e->dtype(), "bf16");
  EXPECT_NE(e->options().find("sync_debug=1"), std::string::npos) << e->options();
  EXPECT_NE(e->options().find("probe=host"), std::string::npos) << e->options();
}

TEST(CudaEngine, UploadDownloadRoundsToBf16) {
  MLA_REQUIRE_GPU();
  const GpuRun run = make_run(make_case("updown", "tiny", kDecode, kAbsorbed, 2, 2, 2, {3, 9}));
  auto cuda = cuda_engine();
  const Capture got = capture(*cuda, run);
  std::mt19937_64 rng(42);
  std::normal_distribution<float> nd(0.f, 3.f);
  Tensor t({static_cast<int64_t>(run.inputs.batch.tokens()), static_cast<int64_t>(run.cfg.kv_lora_rank)});
  for (auto& v : t.data) v = nd(rng);
  cuda->upload(1, "kv_c", t);
  const Tensor back = cuda->download(1, "kv_c");
  ASSERT_EQ(back.shape, t.shape);
  for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(back.data[i], round_bf16(t.data[i])) << "element " << i;
  // lse stays fp32 on the device: exact round trip, and the record says so.
  Tensor l = cuda->download(0, "lse");
  for (auto& v : l.data) v = nd(rng);
  cuda->upload(0, "lse", l);
  EXPECT_EQ(cuda->download(0, "lse").data, l.data);
  EXPECT_EQ(got.at(0, "lse", 0).dtype, "fp32");
  EXPECT_EQ(got.at(0, "q_latent", 1).dtype, "bf16");
}

TEST(CudaEngine, MissingTensorIsAnEngineError) {
  MLA_REQUIRE_GPU();
  const GpuRun run = make_run(make_case("missing", "tiny", kPrefill, kMha, 1, 4));
  auto cuda = cuda_engine();
  capture(*cuda, run);
  EXPECT_THROW(cuda->download(0, "no_such_probe"), EngineError);
}

TEST(CudaEngine, HostAndDeviceProbesAgree) {
  MLA_REQUIRE_GPU();
  const GpuRun run = make_run(make_case("hostprobe", "tiny", kChunked, kMha, 2, 3, 2, {5, 70}));
  auto dev = cuda_engine();
  auto host = cuda_engine("probe=host");
  const Capture a = capture(*dev, run), b = capture(*host, run);
  for (const auto& [key, rec] : a.recs) {
    const ProbeRecord& h = b.recs.at(key);
    EXPECT_EQ(rec.checksum, h.checksum) << std::get<1>(key);
    EXPECT_EQ(rec.dtype, h.dtype) << std::get<1>(key);
    EXPECT_NEAR(rec.l2, h.l2, 1e-6 * h.l2) << std::get<1>(key);
  }
}

}  // namespace
}  // namespace mla::gputest
