// CPU dequantization of every weight format to FP32, the reference the GPU kernels are
// compared against. Results are bit-exact with gguf-py's dequantize and with ml_dtypes' conversions: every
// formula keeps their order of operations (and this file is compiled without FP contraction).
//
// The quantized-weight injections (docs/bugs.md) are wrong variants of these functions (DequantBugs): the
// loader selects them when the run asks for them and the weight's format is the one they corrupt.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/model/tensor.h"
#include "core/weights/formats.h"

namespace mla {

// Element types.
float e4m3_to_float(uint8_t b);   // float8_e4m3fn: bias 7, no inf, S.1111.111 NaN, max 448
float e5m2_to_float(uint8_t b);   // float8_e5m2: bias 15, IEEE-like
float e8m0_to_float(uint8_t b);   // 2^(b-127); 0xFF NaN
float e2m1_to_float(uint8_t nibble);  // low 4 bits: sign bit 3, magnitude {0, .5, 1, 1.5, 2, 3, 4, 6}
float ue4m3_gguf_to_float(uint8_t b);  // GGUF NVFP4 block scale, as gguf-py decodes it (x0.5 folded in)
uint8_t float_to_e4m3(float v);   // round to nearest even, saturating to +-448 (NaN -> 0x7F)
uint8_t float_to_e2m1(float v);   // round to nearest even, saturating to +-6
uint8_t float_to_e8m0_floor(float v);  // the E8M0 code of 2^floor(log2 v) (v > 0), clamped to [0, 254]

// One linear weight as a file stores it, [rows, cols] = [out, in] (rows of a GGUF tensor are everything
// but ne[0]). What the CUDA engine uploads; what dequantize() turns into the reference's FP32.
struct PackedWeight {
  WeightFormat format = WeightFormat::WeightFormat_f32;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> data;    // elements or blocks, row-major, little-endian, as stored
  std::vector<uint8_t> scales;  // fp8: F32 scale_inv [ceil(rows/br), ceil(cols/bc)]; nvfp4: E4M3 [rows, cols/16];
                                // mxfp4: E8M0 [rows, cols/32]; empty otherwise
  int64_t block_rows = 128, block_cols = 128;  // fp8 block shape (quantization_config.weight_block_size)
  float global_scale = 1.0f;    // nvfp4: weight_scale_2 (multiplied); nvfp4-ct: weight_global_scale (divisor)
  std::string origin;           // "file: tensor" for errors
  size_t expected_data_bytes() const;
  size_t expected_scale_bytes() const;
};

struct DequantBugs {
  bool fp8_scale_transpose = false;  // fp8: scale_inv read as [ceil(K/128), ceil(N/128)], i.e. [j/128][i/128]
  bool nvfp4_nibble_swap = false;    // nvfp4, nvfp4-ct, gguf-nvfp4: high and low nibble exchanged
  bool nvfp4_global_recip = false;   // nvfp4-ct: weight_global_scale multiplied instead of divided
  bool any() const { return fp8_scale_transpose || nvfp4_nibble_swap || nvfp4_global_recip; }
  // Whether this set corrupts a weight of format f.
  bool touches(WeightFormat f) const;
};

// [rows, cols] FP32. Checks the byte counts against the shape (UsageError naming origin).
// Throws UsageError naming w.origin when the shape, block shape or byte counts do not fit the format (what
// dequantize and the GPU upload check before reading a byte).
void validate_packed(const PackedWeight& w);
Tensor dequantize(const PackedWeight& w, const DequantBugs& bugs = {});

// One row (n elements, a whole number of blocks) of a ggml type: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1, Q2_K..Q6_K, MXFP4, NVFP4, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, TQ1_0,
// TQ2_0. Throws UsageError for types without a dequantizer.
void dequantize_ggml_row(uint32_t ggml_type, const uint8_t* src, float* dst, int64_t n, bool nibble_swap = false);
bool ggml_type_supported(uint32_t ggml_type);

// A plain (unscaled) safetensors dtype to float: F64, F32, F16, BF16, F8_E4M3, F8_E5M2, F8_E8M0, and the
// integer types (exact up to 2^24). F4 unpacks low nibble first.
std::vector<float> st_to_float(StDtype t, const uint8_t* src, int64_t numel);

}  // namespace mla
