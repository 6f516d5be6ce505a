// Dequantization of packed weights on the device: the engine uploads a weight as the file stores
// it (elements or blocks, plus scales) and expands it to bf16 [rows, cols] for cuBLAS, or to FP32 for tests.
// The FP32 result is bit-identical to core/weights/dequant.cpp (the same products and sums, in the same
// order, each rounded once: no contraction into FMA); the bf16 result is that FP32 rounded to nearest even,
// exactly as the host's to_bf16_bits rounds it. The quantized-weight injections (DequantBugs) apply here too.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/weights/formats.h"
#include "kernels/device_tensor.cuh"

namespace mla {
struct PackedWeight;
struct DequantBugs;
}  // namespace mla

namespace mla::cuda {

// The launcher's plain parameters; everything validated by the host API below.
struct DequantParams {
  WeightFormat format = WeightFormat::WeightFormat_f32;
  const uint8_t* data = nullptr;    // device; fp8 [R, C]; nvfp4/mxfp4 [R, C/2]; GGUF [R, C/block blocks]
  const uint8_t* scales = nullptr;  // device; fp8 F32 [ceil(R/br), ceil(C/bc)]; nvfp4 E4M3 [R, C/16]; mxfp4 E8M0 [R, C/32]
  int64_t rows = 0, cols = 0;
  int64_t block_rows = 128, block_cols = 128;  // fp8 scale block
  int64_t ggml_block = 1, ggml_type_size = 4;  // GGUF formats (and f32/f16/bf16): elements and bytes per block
  uint32_t ggml_type = 0;
  float global_scale = 1.0f;       // nvfp4 / nvfp4-ct
  bool global_divide = false;      // nvfp4-ct (and no nvfp4-global-recip): s8 / global instead of s8 * global
  bool fp8_scale_transpose = false;  // injection fp8-scale-transpose
  bool nibble_swap = false;        // injection nvfp4-nibble-swap (nvfp4, nvfp4-ct, gguf-nvfp4)
};

// y: [rows, cols] row-major, exactly one of y32 (FP32) and y16 (bf16) non-null.
void launch_dequant(const DequantParams& p, float* y32, bf16* y16, cudaStream_t stream);

// A PackedWeight's bytes on one device: what a real engine keeps in memory.
struct DevicePackedWeight {
  WeightFormat format = WeightFormat::WeightFormat_f32;
  int64_t rows = 0, cols = 0;
  int64_t block_rows = 128, block_cols = 128;
  float global_scale = 1.0f;
  DeviceBuffer data, scales;
  std::string origin;
};

// Checks w as dequantize() does (shape against format, byte counts; UsageError naming w.origin) and copies its
// bytes to `device` (synchronously: w may be freed on return).
DevicePackedWeight upload_packed(const PackedWeight& w, int device, cudaStream_t stream);

// Into y, allocated by the caller on w's device with shape [rows, cols] (bf16 or FP32), queued on `stream`, with
// the bugs that touch w's format (as dequantize() selects them).
void dequantize_into(const DevicePackedWeight& w, const DequantBugs& bugs, DeviceTensor& y, cudaStream_t stream);

// The same into a new [rows, cols] tensor of dtype `out`.
DeviceTensor dequantize_on_device(const DevicePackedWeight& w, const DequantBugs& bugs, DType out, cudaStream_t stream);

// upload_packed, then dequantize_on_device; the packed copy is freed once the kernel has run.
DeviceTensor dequantize_on_device(const PackedWeight& w, const DequantBugs& bugs, DType out, int device,
                                  cudaStream_t stream);

}  // namespace mla::cuda
