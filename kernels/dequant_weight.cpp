// The host side of kernels/dequant.cuh: a PackedWeight checked and uploaded as stored, then expanded on its
// device by launch_dequant with the DequantBugs that touch its format (the same selection as dequantize()).
#include <cuda_runtime.h>

#include "core/model/errors.h"
#include "core/weights/dequant.h"
#include "kernels/cuda_check.cuh"
#include "kernels/dequant.cuh"

namespace mla::cuda {

namespace {

DeviceBuffer upload_bytes(const std::vector<uint8_t>& bytes, int device, cudaStream_t stream) {
  DeviceBuffer b(device, bytes.size());
  if (bytes.empty()) return b;
  DeviceGuard g(device);
  CUDA_CHECK(cudaMemcpyAsync(b.get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return b;
}

}  // namespace

DevicePackedWeight upload_packed(const PackedWeight& w, int device, cudaStream_t stream) {
  validate_packed(w);  // dequantize()'s checks: the kernels never read outside what was uploaded
  if (ggml_type_of(w.format) != ~0u && !ggml_type_supported(ggml_type_of(w.format)))
    throw UsageError(w.origin + ": no device dequantization for " + weight_format_name(w.format));
  DevicePackedWeight d;
  d.format = w.format;
  d.rows = w.rows;
  d.cols = w.cols;
  d.block_rows = w.block_rows;
  d.block_cols = w.block_cols;
  d.global_scale = w.global_scale;
  d.origin = w.origin;
  d.data = upload_bytes(w.data, device, stream);
  d.scales = upload_bytes(w.scales, device, stream);
  return d;
}

void dequantize_into(const DevicePackedWeight& w, const DequantBugs& bugs, DeviceTensor& y, cudaStream_t stream) {
  if (y.shape != std::vector<int64_t>{w.rows, w.cols} || (y.bytes() > 0 && y.buf.bytes() < y.bytes()))
    throw EngineError(w.origin + ": dequantize_into needs a [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) +
                      "] output");
  DequantParams p;
  p.format = w.format;
  p.data = static_cast<const uint8_t*>(w.data.get());
  p.scales = static_cast<const uint8_t*>(w.scales.get());
  p.rows = w.rows;
  p.cols = w.cols;
  p.block_rows = w.block_rows;
  p.block_cols = w.block_cols;
  p.global_scale = w.global_scale;
  const uint32_t t = ggml_type_of(w.format);
  if (t != ~0u) {
    const GgmlTypeInfo* ti = ggml_type_info(t);
    p.ggml_type = t;
    p.ggml_block = ti->block;
    p.ggml_type_size = ti->type_size;
  }
  // As dequantize() selects them: each bug acts only on the formats it corrupts.
  const bool nv = w.format == WeightFormat::WeightFormat_nvfp4 || w.format == WeightFormat::WeightFormat_nvfp4_ct ||
                  w.format == WeightFormat::WeightFormat_gguf_nvfp4;
  p.fp8_scale_transpose = bugs.fp8_scale_transpose && w.format == WeightFormat::WeightFormat_fp8;
  p.nibble_swap = bugs.nvfp4_nibble_swap && nv;
  p.global_divide = w.format == WeightFormat::WeightFormat_nvfp4_ct && !bugs.nvfp4_global_recip;

  if (y.bytes() == 0) return;
  DeviceGuard g(w.data.device());
  const bool f32 = y.dtype == DType::DType_f32;
  launch_dequant(p, f32 ? y.f32() : nullptr, f32 ? nullptr : y.bf(), stream);
}

DeviceTensor dequantize_on_device(const DevicePackedWeight& w, const DequantBugs& bugs, DType out, cudaStream_t stream) {
  DeviceTensor y;
  y.shape = {w.rows, w.cols};
  y.dtype = out;
  y.buf = DeviceBuffer(w.data.device(), y.bytes());
  dequantize_into(w, bugs, y, stream);
  return y;
}

DeviceTensor dequantize_on_device(const PackedWeight& w, const DequantBugs& bugs, DType out, int device,
                                  cudaStream_t stream) {
  const DevicePackedWeight d = upload_packed(w, device, stream);
  DeviceTensor y = dequantize_on_device(d, bugs, out, stream);
  // d's buffers are freed on return; cudaFree waits for the device, but say so: the kernel must finish first.
  DeviceGuard g(device);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return y;
}

}  // namespace mla::cuda
