// Device memory owned by the CUDA engine: an RAII buffer and a typed tensor (shape + dtype) on one device.
// Activations are bf16; a few outputs that real kernels keep in fp32 (lse) are fp32.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda_check.cuh"

namespace mla::cuda {

using bf16 = __nv_bfloat16;

enum class DType { DType_bf16, DType_f32 };
inline size_t dtype_size(DType d) { return d == DType::DType_bf16 ? 2 : 4; }
inline const char* dtype_name(DType d) { return d == DType::DType_bf16 ? "bf16" : "fp32"; }

// Sets the current device for a scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    if (prev_ != device_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0, device_ = 0;
};

// cudaMalloc'd bytes on `device`; freed on that device.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(int device, size_t bytes) : device_(device), bytes_(bytes) {
    if (bytes_ == 0) return;
    DeviceGuard g(device_);
    CUDA_CHECK(cudaMalloc(&ptr_, bytes_));
  }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      device_ = o.device_;
      bytes_ = o.bytes_;
      ptr_ = std::exchange(o.ptr_, nullptr);
      o.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  int device() const { return device_; }

 private:
  void release() {
    if (ptr_) {
      int prev = 0;
      cudaGetDevice(&prev);
      cudaSetDevice(device_);
      cudaFree(ptr_);
      cudaSetDevice(prev);
      ptr_ = nullptr;
    }
  }
  int device_ = 0;
  size_t bytes_ = 0;
  void* ptr_ = nullptr;
};

struct DeviceTensor {
  std::vector<int64_t> shape;
  DType dtype = DType::DType_bf16;
  DeviceBuffer buf;

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bf16* bf() const { return static_cast<bf16*>(buf.get()); }
  float* f32() const { return static_cast<float*>(buf.get()); }
};

}  // namespace mla::cuda
