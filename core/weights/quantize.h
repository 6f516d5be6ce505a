// Quantization of FP32 weights into every format (--weight-format: synthetic weights quantized, then
// dequantized for the reference), so each format runs without downloads. Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1
// reproduce gguf-py's (and ggml's reference) quantizers bit for bit; the K-quants, FP8, NVFP4 and MXFP4
// use simple absmax/min-max scales: any valid block is a fair test of the dequantizers and the engines.
#pragma once
#include <string>

#include "core/model/tensor.h"
#include "core/weights/dequant.h"

namespace mla {

// w: [rows, cols] ([out, in]); quantized along cols. Throws UsageError (naming origin) when cols is not a
// multiple of the format's block size. fp8_block: the square block of the fp8 format (DeepSeek: 128).
PackedWeight quantize(const Tensor& w, WeightFormat f, const std::string& origin, int64_t fp8_block = 128);

// One row of a ggml block format, n a multiple of its block size; dst holds n / block * type_size bytes.
void quantize_ggml_row(uint32_t ggml_type, const float* src, uint8_t* dst, int64_t n);

}  // namespace mla
