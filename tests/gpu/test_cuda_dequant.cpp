// Device dequantization (kernels/dequant.cu) against the CPU's (core/weights/dequant.cpp), and the CUDA
// engine on packed weights against the reference.
//
// Exactness: the FP32 output of every format equals dequantize() bit for bit (the kernels mirror its
// arithmetic, one rounding per operation, no FMA); the bf16 output is that FP32 rounded to nearest even
// (to_bf16_bits). Only NaN results are compared as "both NaN": x86 keeps a NaN operand's payload and sign
// through a product while the GPU returns its canonical NaN, and random raw bytes do hold NaN codes (E4M3
// 0x7F, F16 exponent 31); quantize()'s outputs hold none.
//
// Whole layer: the CUDA engine that uploads packed weights and dequantizes on its device must give probes
// bit-identical (checksums) to the CUDA engine given the host's dequantized FP32 (both hold the same bf16
// weights when the kernels are exact), and be within the calibrated bf16 tolerance of the FP32 reference
// on the dequantized weights (4x the bf16 reference's noise + 2^-10, as test_cuda_layer.cpp: why there).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "core/model/injection.h"
#include "core/model/tensor.h"
#include "core/model/weights.h"
#include "harness/run/runner.h"
#include "harness/run/synthetic_inputs.h"
#include "core/weights/dequant.h"
#include "core/weights/loader.h"
#include "core/weights/quantize.h"
#include "kernels/cuda_check.cuh"
#include "kernels/dequant.cuh"
#include "tests/gpu/gpu_cases.h"

namespace mla::gputest {
namespace {

using cuda::DType;

Tensor random_weight(int64_t rows, int64_t cols, uint64_t seed) {
  Tensor w({rows, cols});
  fill_normal(w.ptr(), w.numel(), seed, 0, 1.0f / std::sqrt(static_cast<float>(cols)));
  return w;
}

// Device output, downloaded: FP32 values or bf16 bit patterns, into outputs poisoned with 0xFF bytes (NaN)
// first, so that an element the kernel forgot reads NaN where the CPU has a number.
template <class T>
std::vector<T> gpu_dequant(const PackedWeight& w, const DequantBugs& bugs, DType dt) {
  const cuda::DevicePackedWeight d = cuda::upload_packed(w, 0, nullptr);
  cuda::DeviceTensor y;
  y.shape = {w.rows, w.cols};
  y.dtype = dt;
  y.buf = cuda::DeviceBuffer(0, y.bytes());
  std::vector<T> h(static_cast<size_t>(w.rows * w.cols));
  if (h.empty()) return h;
  CUDA_CHECK(cudaMemset(y.buf.get(), 0xFF, y.bytes()));
  cuda::dequantize_into(d, bugs, y, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(h.data(), y.buf.get(), y.bytes(), cudaMemcpyDeviceToHost));
  return h;
}
std::vector<float> gpu_f32(const PackedWeight& w, const DequantBugs& bugs = {}) {
  return gpu_dequant<float>(w, bugs, DType::DType_f32);
}
std::vector<uint16_t> gpu_bf16(const PackedWeight& w, const DequantBugs& bugs = {}) {
  return gpu_dequant<uint16_t>(w, bugs, DType::DType_bf16);
}

uint32_t bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

// Bit-exact FP32 and RNE bf16, NaN as "both NaN"; reports the first mismatch with its coordinates.
void expect_exact(const PackedWeight& w, const DequantBugs& bugs, const std::string& what) {
  const Tensor cpu = dequantize(w, bugs);
  const std::vector<float> g = gpu_f32(w, bugs);
  const std::vector<uint16_t> gb = gpu_bf16(w, bugs);
  ASSERT_EQ(g.size(), cpu.data.size());
  int64_t bad = 0, bad_bf = 0, first = -1, first_bf = -1;
  for (size_t i = 0; i < g.size(); ++i) {
    const float c = cpu.data[i];
    const bool nan = std::isnan(c);
    if (nan ? !std::isnan(g[i]) : bits(g[i]) != bits(c)) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
    const bool bf_nan = (gb[i] & 0x7fff) > 0x7f80;
    if (nan ? !bf_nan : gb[i] != to_bf16_bits(c)) {
      if (first_bf < 0) first_bf = static_cast<int64_t>(i);
      ++bad_bf;
    }
  }
  if (first >= 0)
    ADD_FAILURE() << what << ": " << bad << " FP32 elements differ from the CPU's; first at [" << first / w.cols
                  << ", " << first % w.cols << "]: gpu " << g[first] << " (0x" << std::hex << bits(g[first])
                  << "), cpu " << cpu.data[first] << " (0x" << bits(cpu.data[first]) << ")" << std::dec;
  if (first_bf >= 0)
    ADD_FAILURE() << what << ": " << bad_bf << " bf16 elements are not RNE(cpu FP32); first at ["
                  << first_bf / w.cols << ", " << first_bf % w.cols << "]: gpu 0x" << std::hex << gb[first_bf]
                  << ", want 0x" << to_bf16_bits(cpu.data[first_bf]) << std::dec;
}

// Raw random bytes of the right sizes, with finite scales where the format stores them apart: fp8 F32
// scale_inv ~ N(0, 1) (sign included), nvfp4 E4M3 codes but the two NaNs, mxfp4 E8M0 codes 0..254 (2^-127
// subnormal to 2^127). GGUF blocks are all random, their F16 scales included (NaN/Inf codes: see the top).
PackedWeight random_packed(WeightFormat f, int64_t rows, int64_t cols, uint64_t seed, int64_t fp8_block = 128) {
  std::mt19937_64 rng(seed);
  PackedWeight w;
  w.format = f;
  w.rows = rows;
  w.cols = cols;
  w.block_rows = w.block_cols = fp8_block;
  w.origin = std::string("random ") + weight_format_name(f);
  w.data.resize(w.expected_data_bytes());
  for (auto& b : w.data) b = static_cast<uint8_t>(rng());
  w.scales.resize(w.expected_scale_bytes());
  if (f == WeightFormat::WeightFormat_fp8) {
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (size_t i = 0; i < w.scales.size() / 4; ++i) {
      const float s = n(rng);
      std::memcpy(&w.scales[4 * i], &s, 4);
    }
  } else {
    for (auto& b : w.scales) {
      do b = static_cast<uint8_t>(rng());
      while (f == WeightFormat::WeightFormat_mxfp4 ? b == 0xFF : (b & 0x7F) == 0x7F);
    }
  }
  w.global_scale = f == WeightFormat::WeightFormat_nvfp4_ct ? 2688.0f / 0.37f : 0.37f / 2688.0f;  // not powers of 2
  return w;
}

TEST(CudaDequant, EveryFormatIsEquivalentToRefBitForBit) {
  MLA_REQUIRE_GPU();
  // 37 rows: no multiple of any block; 512 columns: two K-quant super-blocks, 4 fp8 blocks of 128.
  const Tensor w = random_weight(37, 512, 11);
  for (WeightFormat f : all_weight_formats()) {
    const std::string name = weight_format_name(f);
    expect_exact(quantize(w, f, "quantized " + name), {}, "quantized " + name + " [37, 512], seed 11");
    expect_exact(random_packed(f, 37, 512, 12), {}, "random bytes " + name + " [37, 512], seed 12");
  }
}

// The GGUF-only types (IQ*, TQ*): random blocks (their grid indices are all valid; F16 scales random, NaN and Inf
// included, and the same blocks with finite scales, so that most elements are numbers), rows of several blocks.
TEST(CudaDequant, GgufOnlyTypesAreEquivalentToRefBitForBit) {
  MLA_REQUIRE_GPU();
  const auto only = gguf_only_weight_formats();
  ASSERT_EQ(only.size(), 11u);  // IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ4_NL IQ4_XS TQ1_0 TQ2_0
  for (WeightFormat f : only) {
    const std::string name = weight_format_name(f);
    PackedWeight w = random_packed(f, 37, 768, 31);  // 3 blocks of 256 (24 of IQ4_NL's 32) per row
    expect_exact(w, {}, "random bytes " + name + " [37, 768], seed 31");
    // Finite scales: each block's F16 scale field(s) set to a random finite value of either sign.
    const GgmlTypeInfo* ti = ggml_type_info(ggml_type_of(f));
    std::mt19937_64 rng(32);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    for (size_t k = 0; k + ti->type_size <= w.data.size(); k += static_cast<size_t>(ti->type_size)) {
      uint8_t* b = w.data.data() + k;
      const uint16_t h = to_fp16_bits(u(rng));
      if (f == WeightFormat::WeightFormat_iq1_m) {  // the scale is the top nibbles of the 4 u16 words at 48
        for (int q = 0; q < 4; ++q) b[49 + 2 * q] = static_cast<uint8_t>((b[49 + 2 * q] & 0x0F) | (((h >> (4 * q)) & 0xF) << 4));
      } else {
        const int at = f == WeightFormat::WeightFormat_tq1_0 ? 52 : f == WeightFormat::WeightFormat_tq2_0 ? 64 : 0;
        std::memcpy(b + at, &h, 2);
      }
    }
    const Tensor cpu = dequantize(w);
    int64_t finite = 0;
    for (float v : cpu.data) finite += std::isfinite(v);
    EXPECT_EQ(finite, cpu.numel()) << name << ": finite scales should give finite values";
    expect_exact(w, {}, "random blocks with finite scales " + name + " [37, 768], seeds 31, 32");
  }
}

TEST(CudaDequant, Fp8PartialAndNonSquareBlocks) {
  MLA_REQUIRE_GPU();
  // Partial blocks at both edges ([300, 260] over 128: grid [3, 3]); a small block (48) for a wider grid.
  const Tensor w = random_weight(300, 260, 3);
  expect_exact(quantize(w, WeightFormat::WeightFormat_fp8, "fp8/128"), {}, "fp8 [300, 260] block 128, seed 3");
  expect_exact(quantize(w, WeightFormat::WeightFormat_fp8, "fp8/48", 48), {}, "fp8 [300, 260] block 48, seed 3");
  PackedWeight r = random_packed(WeightFormat::WeightFormat_fp8, 300, 260, 4, 48);
  r.block_cols = 40;  // a non-square block: scale grid [7, 7] from different divisions
  r.scales.resize(r.expected_scale_bytes());
  std::mt19937_64 rng(5);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (size_t i = 0; i < r.scales.size() / 4; ++i) {
    const float s = n(rng);
    std::memcpy(&r.scales[4 * i], &s, 4);
  }
  expect_exact(r, {}, "random fp8 [300, 260] block 48x40, seeds 4, 5");
}

TEST(CudaDequant, InjectionsAreEquivalentToRef) {
  MLA_REQUIRE_GPU();
  DequantBugs transpose, swap, recip, all;
  transpose.fp8_scale_transpose = true;
  swap.nvfp4_nibble_swap = true;
  recip.nvfp4_global_recip = true;
  all.fp8_scale_transpose = all.nvfp4_nibble_swap = all.nvfp4_global_recip = true;
  // fp8 [256, 512] over 128: a [2, 4] scale grid, which the transposed read scrambles (a 1x1 one it would
  // leave alone). 512 columns: a whole number of blocks of every format.
  const Tensor w = random_weight(256, 512, 21);
  struct Hit {
    WeightFormat f;
    DequantBugs bugs;
    const char* bug;
  };
  for (const Hit& h : {Hit{WeightFormat::WeightFormat_fp8, transpose, "fp8-scale-transpose"},
                       Hit{WeightFormat::WeightFormat_nvfp4, swap, "nvfp4-nibble-swap"},
                       Hit{WeightFormat::WeightFormat_nvfp4_ct, swap, "nvfp4-nibble-swap"},
                       Hit{WeightFormat::WeightFormat_gguf_nvfp4, swap, "nvfp4-nibble-swap"},
                       Hit{WeightFormat::WeightFormat_nvfp4_ct, recip, "nvfp4-global-recip"}}) {
    const std::string what = std::string(h.bug) + " on " + weight_format_name(h.f) + " [256, 512], seed 21";
    const PackedWeight p = quantize(w, h.f, what);
    expect_exact(p, h.bugs, what);
    // The bug acts (else the test above would prove nothing about it).
    const std::vector<float> clean = gpu_f32(p), bug = gpu_f32(p, h.bugs);
    EXPECT_NE(clean, bug) << what << ": the injected dequantization equals the clean one";
  }
  // Every bug at once on every format: each acts only where the CPU's does.
  for (WeightFormat f : all_weight_formats())
    expect_exact(quantize(w, f, "all bugs"), all, std::string("all weight bugs on ") + weight_format_name(f));
}

TEST(CudaDequant, RejectsWrongByteCounts) {
  MLA_REQUIRE_GPU();
  PackedWeight p = quantize(random_weight(4, 64, 1), WeightFormat::WeightFormat_q8_0, "short q8_0");
  p.data.pop_back();
  EXPECT_THROW(cuda::upload_packed(p, 0, nullptr), UsageError);
  PackedWeight s = quantize(random_weight(4, 64, 1), WeightFormat::WeightFormat_nvfp4, "short nvfp4 scales");
  s.scales.pop_back();
  EXPECT_THROW(cuda::upload_packed(s, 0, nullptr), UsageError);
}

// ---------------------------------------------------------------- the engine on packed weights

// capture() of gpu_test_util with the packed weights (and the bugs the engine plants in them) handed over.
Capture capture_packed(Engine& engine, const GpuRun& run, const LoadedWeights& loaded, const DequantBugs& bugs) {
  return capture(engine, run, nullptr, [&](Runner& r) { r.set_packed_weights(&loaded.packed, bugs); });
}

void expect_same_checksums(const Capture& a, const Capture& b, const std::string& what) {
  ASSERT_EQ(a.recs.size(), b.recs.size()) << what;
  int diff = 0;
  for (const auto& [key, rec] : a.recs)
    if (rec.checksum != b.recs.at(key).checksum && diff++ < 5)
      ADD_FAILURE() << what << ": probe " << std::get<1>(key) << " layer " << std::get<0>(key) << " rank "
                    << std::get<2>(key) << " differs between packed and host-dequantized weights";
}

struct PackedCase {
  Case c;
  std::string format;  // --weight-format
  std::string inject;  // a weight injection, or ""
};

std::vector<PackedCase> packed_cases() {
  std::vector<PackedCase> v;
  v.push_back({make_case("fp8_tiny_tp1", "tiny", kPrefill, kMha, 1, 8), "fp8", ""});
  // 40x40 fp8 blocks: q_b_proj's and kv_b_proj's row shards and o_proj's column shards cut through blocks.
  v.push_back({make_case("fp8_40_tiny_tp2", "tiny", kPrefill, kMha, 2, 8), "fp8:40", ""});
  v.push_back({make_case("nvfp4_tiny_tp2", "tiny", kDecode, kAbsorbed, 2, 1, 2, {17, 64}), "nvfp4", ""});
  v.push_back({make_case("nvfp4ct_tiny_tp1", "tiny", kPrefill, kAbsorbed, 1, 6), "nvfp4-ct", ""});
  // q4_k needs K % 256 == 0 (hidden 2048, kv_lora 512, N·V 2048): DeepSeek-V2-Lite dims.
  v.push_back({make_case("q4k_v2lite_tp1", "deepseek-v2-lite", kPrefill, kMha, 1, 8), "q4_k", ""});
  v.push_back({make_case("q4k_v2lite_tp4", "deepseek-v2-lite", kPrefill, kMha, 4, 8), "q4_k", ""});
  // The weight injections, planted on the device: fp8 16x16 blocks so that tiny's scale grids are not 1x1.
  v.push_back({make_case("inj_fp8_transpose_tiny_tp2", "tiny", kPrefill, kMha, 2, 8), "fp8:16", "fp8-scale-transpose"});
  v.push_back({make_case("inj_nibble_swap_tiny_tp2", "tiny", kPrefill, kMha, 2, 8), "nvfp4", "nvfp4-nibble-swap"});
  v.push_back({make_case("inj_global_recip_tiny_tp1", "tiny", kPrefill, kMha, 1, 8), "nvfp4-ct", "nvfp4-global-recip"});
  return v;
}

std::string packed_case_name(const testing::TestParamInfo<PackedCase>& info) { return info.param.c.name; }

class CudaPackedLayer : public testing::TestWithParam<PackedCase> {};

TEST_P(CudaPackedLayer, CudaIsEquivalentToRef) {
  MLA_REQUIRE_GPU();
  const PackedCase& pc = GetParam();
  const std::string what = "whole layer " + pc.c.describe() + " --weight-format " + pc.format +
                           (pc.inject.empty() ? "" : " --inject " + pc.inject) + " (weight seed 7)";
  GpuRun run = make_run(pc.c);
  WeightSpec ws;
  ws.format = pc.format;
  const auto injections = pc.inject.empty() ? std::vector<Injection>{} : parse_injections(pc.inject);
  const LoadedWeights clean = load_weights(ws, run.cfg, run.spec, 7, {}, /*keep_packed=*/true);
  run.weights = std::make_shared<const std::vector<LayerWeights>>(clean.layers);
  run.inputs = synthetic_inputs(run.cfg, run.spec, *run.weights);

  if (pc.inject.empty()) {
    auto fp32 = reference_engine("fp32");
    const Capture ref = capture(*fp32, run);
    auto bf16 = reference_engine("bf16");
    const Capture noise = capture(*bf16, run);
    auto host = cuda_engine();
    const Capture from_host = capture(*host, run);
    auto dev = cuda_engine();
    const Capture packed = capture_packed(*dev, run, clean, {});
    expect_same_checksums(packed, from_host, what);
    expect_equivalent(run, packed, noise, ref, kLayerTol, what);
    return;
  }
  // Injected: the device's wrong dequantization of the clean packed bytes equals the host's wrong one, and
  // changes the run.
  const LoadedWeights bugged = load_weights(ws, run.cfg, run.spec, 7, injections, /*keep_packed=*/true);
  GpuRun host_run = run;
  host_run.weights = std::make_shared<const std::vector<LayerWeights>>(bugged.layers);
  auto host = cuda_engine();
  const Capture from_host = capture(*host, host_run);
  auto dev = cuda_engine();
  const Capture packed = capture_packed(*dev, run, clean, dequant_bugs(injections));
  expect_same_checksums(packed, from_host, what);
  auto ok = cuda_engine();
  const Capture unbugged = capture_packed(*ok, run, clean, {});
  bool differs = false;
  for (const auto& [key, rec] : packed.recs) differs = differs || rec.checksum != unbugged.recs.at(key).checksum;
  EXPECT_TRUE(differs) << what << ": the injection changed no probe";
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaPackedLayer, testing::ValuesIn(packed_cases()), packed_case_name);

}  // namespace
}  // namespace mla::gputest
