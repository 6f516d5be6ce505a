// Device-side probes: the sketch hash is bit-identical on the device, and every device-computed record
// (stats, token/head L2, sketch, checksum) equals the host's compute_probe_record on the same data,
// non-finite values included.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/probe_stats.cuh"
#include "core/probe/probe_hash.h"
#include "tests/gpu/gpu_cases.h"

namespace mla::gputest {
namespace {

TEST(CudaProbe, SketchHashMatchesHost) {
  MLA_REQUIRE_GPU();
  for (const std::string name : {"q_nope", "o_partial", "kv_cache", "lse"}) {
    const uint64_t key = probe_key(name);
    for (const int64_t col0 : {int64_t{0}, int64_t{12345}, int64_t{1} << 33}) {
      const int64_t cols = 4096;
      const auto dev = cuda::device_sketch_coeffs(key, col0, cols);
      for (int64_t c = 0; c < cols; ++c)
        for (int k = 0; k < kSketchDim; ++k)
          ASSERT_EQ(dev[c * kSketchDim + k], sketch_coeff(key, col0 + c, k))
              << "probe " << name << " column " << col0 + c << " lane " << k;
    }
  }
}

// Every record of each case's run, computed on the device, against the host's on the same (downloaded) data.
void expect_cases_match_host(std::initializer_list<Case> cases) {
  for (const Case& c : cases) {
    const GpuRun run = make_run(c);
    auto cuda = cuda_engine();
    const Capture got = capture(*cuda, run);
    SCOPED_TRACE(c.describe());
    expect_device_probes_match_host(run, got);
  }
}

TEST(CudaProbe, DeviceRecordsMatchHost) {
  MLA_REQUIRE_GPU();
  // Every probe of a tp-2 chunked layer and a tp-8 decode (heads, partial and replicated contracts, fp32 lse).
  expect_cases_match_host({make_case("probe_chunked_tp2", "tiny", kChunked, kMha, 2, 3, 2, {5, 70}),
                           make_case("probe_decode_tp8", "tiny", kDecode, kAbsorbed, 8, 2, 2, {64, 1})});
}

TEST(CudaProbe, WideTensorsMatchHost) {
  MLA_REQUIRE_GPU();
  // Real widths: DeepSeek-V3 (q_nope 16384 columns in 128 one-head segments, so the fold kernel's path; heads of
  // 128 and 64, 7168-wide rows) and GLM-5 (heads of 192 and 256); token counts that leave a partial 16-row tile;
  // tp 2 (column offsets).
  expect_cases_match_host({make_case("probe_dsv3_tp1", "deepseek-v3", kPrefill, kMha, 1, 19),
                           make_case("probe_glm5_tp2", "glm-5", kPrefill, kMha, 2, 21)});
}

struct SyntheticShape {
  int64_t rows, cols, heads, col_offset;
};

// Each shape's device records (stats and sketch levels, uniform values and then planted NaN, ±Inf and a value whose
// square overflows fp32) against the host's on the same bf16 data, and again bit for bit.
void expect_synthetic_shapes_match_host(std::initializer_list<SyntheticShape> shapes) {
  const GpuRun run = make_run(make_case("probe_shapes", "tiny", kPrefill, kMha, 1, 4));
  auto cuda = cuda_engine();
  Capture ignored = capture(*cuda, run);  // prepares the engine's rank
  uint64_t state = 7;
  const auto uniform = [&] { return static_cast<double>(splitmix64(state++) >> 11) * 0x1.0p-53; };
  for (const SyntheticShape& sh : shapes) {
    for (const bool planted : {false, true}) {
      Tensor t({sh.rows, sh.cols});
      for (int64_t i = 0; i < t.numel(); ++i) t.data[i] = static_cast<float>((uniform() - 0.5) * 6.0);
      if (planted) {  // a NaN row, an Inf row (both signs), a huge finite value, one each where they fit
        const auto at = [&](int64_t r, double frac) -> float& {
          return t.data[r * sh.cols + static_cast<int64_t>(frac * (sh.cols - 1))];
        };
        at(0, 0.3) = std::numeric_limits<float>::quiet_NaN();
        at(sh.rows / 2, 0.9) = std::numeric_limits<float>::infinity();
        at(sh.rows / 2, 0.1) = -std::numeric_limits<float>::infinity();
        at(sh.rows - 1, 0.5) = 3e20f;
      }
      const std::string name = "synthetic_" + std::to_string(sh.rows) + "x" + std::to_string(sh.cols);
      cuda->upload(0, name, t);
      ProbeSpec spec;
      spec.name = name;
      for (auto level : {ProbeLevel::ProbeLevel_stats, ProbeLevel::ProbeLevel_sketch}) {
        ProbeRequest req;
        req.level = level;
        req.tokens = sh.rows;
        req.heads = sh.heads;
        req.col_offset = sh.col_offset;
        req.probe_key = probe_key(name);
        const ProbeRecord dev = cuda->probe(0, spec, req);
        const ProbeRecord host = compute_probe_record(cuda->download(0, name), "bf16", req);
        expect_record_matches_host(dev, host,
                                   name + " heads " + std::to_string(sh.heads) + (planted ? " planted" : "") +
                                       (level == ProbeLevel::ProbeLevel_sketch ? " sketch" : " stats"));
        // Twice in a row: the tile counters were left at zero, and a record is reproducible bit for bit.
        const ProbeRecord again = cuda->probe(0, spec, req);
        EXPECT_EQ(again.checksum, dev.checksum);
        const auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {  // NaN included
          return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
        };
        EXPECT_TRUE(same_bits(again.token_l2, dev.token_l2)) << name;
        EXPECT_TRUE(same_bits(again.head_l2, dev.head_l2)) << name;
        EXPECT_TRUE(same_bits(again.sketch, dev.sketch)) << name;
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

// Shapes chosen for the tile kernel's edges: partial 16-row tiles, one segment and many (the last warp of a tile
// folds it, or with enough tiles the tile's block), steps past the row's end, heads of 32..1024 columns whose ends
// fall mid-step (96, 192) or that fill a segment alone (1024), column offsets (tp shards), heads too narrow for it
// (16: the row kernel), and rows with NaN, ±Inf and values whose squares overflow fp32 (those chunks go element by
// element in double).
TEST(CudaProbe, EveryShapeMatchesHostOnPlantedValues) {
  MLA_REQUIRE_GPU();
  expect_synthetic_shapes_match_host({{1, 64, 0, 0},
                                      {15, 7168, 0, 0},
                                      {17, 16384, 128, 0},
                                      {33, 576, 0, 0},
                                      {16, 24, 0, 0},
                                      {40, 1000, 0, 0},
                                      {21, 24576, 128, 8},
                                      {19, 768, 8, 0},
                                      {5, 2048, 2, 4096},
                                      {3, 64, 4, 0},
                                      {300, 512, 4, 0},
                                      {64, 16384, 128, 0},
                                      {129, 4096, 64, 0},
                                      // Enough 16-row tiles for a block each on every SM of an H200 (132): the
                                      // block folds its tile in shared memory (partial last tile, heads, no
                                      // heads, a column offset).
                                      {2117, 4096, 32, 0},
                                      {4099, 576, 0, 0},
                                      {2200, 1536, 0, 64}});
}

// The block fold on small rows (one to several segments a block), small enough for compute-sanitizer's racecheck
// (scripts/gpu_check.sh): 16-row tiles for every SM of the GPUs here (an H200 has 132; 4500 rows = 282 tiles).
TEST(CudaProbe, ManyTilesFoldInTheirBlock) {
  MLA_REQUIRE_GPU();
  expect_synthetic_shapes_match_host({{4500, 64, 0, 0}, {4500, 384, 0, 0}, {4497, 512, 4, 0}, {4500, 1024, 8, 32}});
}

// Blocks of every size in one process: [4096, 16384] in 128-column heads asks the occupancy of 16 down to 8 warps a
// block and takes 8; [2112, 16384] (132 tiles: one block per SM of an H200) then takes 16 warps, the larger shared
// memory. The kernel's opt-in to more than 48 KB of shared memory must cover the largest block of any size asked,
// not only the last one asked.
TEST(CudaProbe, BlockFoldsOfEverySizeInOneProcess) {
  MLA_REQUIRE_GPU();
  expect_synthetic_shapes_match_host({{4096, 16384, 128, 0}, {2112, 16384, 128, 0}, {4096, 7168, 0, 0}});
}

TEST(CudaProbe, NonFiniteValuesAreCountedLikeTheHost) {
  MLA_REQUIRE_GPU();
  const GpuRun run = make_run(make_case("probe_nonfinite", "tiny", kPrefill, kMha, 2, 6));
  auto cuda = cuda_engine();
  Capture ignored = capture(*cuda, run);  // prepares the engine and fills its tensors
  const ProbeSpec& q = *run.graph.find("q_nope");
  Tensor t = cuda->download(1, "q_nope");
  t.data[3] = std::numeric_limits<float>::quiet_NaN();
  t.data[17] = std::numeric_limits<float>::infinity();
  t.data[40] = -std::numeric_limits<float>::infinity();
  t.data[41] = 3.4e38f;  // finite in fp32, above bf16's largest: rounds to +inf
  cuda->upload(1, "q_nope", t);
  for (auto level : {ProbeLevel::ProbeLevel_stats, ProbeLevel::ProbeLevel_sketch, ProbeLevel::ProbeLevel_full}) {
    const ProbeRequest req = make_probe_request(q, run.spec.tp, 1, level);
    const ProbeRecord dev = cuda->probe(1, q, req);
    const ProbeRecord host = compute_probe_record(cuda->download(1, "q_nope"), "bf16", req);
    EXPECT_EQ(dev.nan, 1);
    EXPECT_EQ(dev.inf, 3);
    EXPECT_EQ(dev.nan, host.nan);
    EXPECT_EQ(dev.inf, host.inf);
    EXPECT_EQ(dev.absmax, host.absmax);
    EXPECT_NEAR(dev.l2, host.l2, 1e-6 * host.l2);
    EXPECT_NEAR(dev.mean, host.mean, 1e-6 * (host.std + std::fabs(host.mean)));
    ASSERT_EQ(dev.token_l2.size(), host.token_l2.size());
    for (size_t i = 0; i < host.token_l2.size(); ++i) {
      if (std::isfinite(host.token_l2[i])) EXPECT_NEAR(dev.token_l2[i], host.token_l2[i], 1e-6 * host.token_l2[i]);
      else EXPECT_EQ(std::isnan(dev.token_l2[i]), std::isnan(host.token_l2[i])) << "token " << i;
    }
    EXPECT_EQ(dev.sketch.size(), host.sketch.size());
    EXPECT_EQ(dev.dtype, "bf16");
  }
}

}  // namespace
}  // namespace mla::gputest
