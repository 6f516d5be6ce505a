// What one tensor-parallel rank of the CUDA engine owns on its device: stream, cuBLAS handle and
// workspace, the step's batch layout as device arrays, scratch buffers, and what its probe launches keep (the
// geometry per shape). No global state: the engine holds one RankContext per rank; ranks may share a device (more
// ranks than GPUs).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/device_tensor.cuh"

namespace mla {
struct Batch;
}

namespace mla::cuda {

class ProbeLaunchCache;

// Rows per page of the latent cache (== mla::kPageSize of core/model/batch.h; rank_context.cpp checks).
constexpr int kCachePage = 64;

// The step's token layout (core/model/batch.h) on the device. Built once per run.
struct DeviceBatch {
  int tokens = 0, seqs = 0, max_blocks = 0, ctx_total = 0;
  int max_new = 0, max_ctx = 0, max_total = 0;  // longest s_q, context, context + s_q (size the attention grids)
  DeviceBuffer positions;      // int32 [T]
  DeviceBuffer token_seq;      // int32 [T] sequence of each new token
  DeviceBuffer token_idx;      // int32 [T] index of the token among its sequence's new tokens
  DeviceBuffer slot_mapping;   // int64 [T] cache row (page·64 + slot) each new token is written to
  DeviceBuffer seq_new_start;  // int32 [B] first new token of each sequence
  DeviceBuffer seq_new_len;    // int32 [B] s_q
  DeviceBuffer seq_ctx_start;  // int32 [B] first row of each sequence's context in the gathered context rows
  DeviceBuffer seq_ctx_len;    // int32 [B] cached tokens before this step
  DeviceBuffer seq_total_len;  // int32 [B] context + new
  DeviceBuffer block_table;    // int32 [B, max_blocks]
  DeviceBuffer ctx_rows;       // int64 [ctx_total] cache row of each context token, sequences concatenated

  const int* i32(const DeviceBuffer& b) const { return static_cast<const int*>(b.get()); }
  const int64_t* i64(const DeviceBuffer& b) const { return static_cast<const int64_t*>(b.get()); }
};

class RankContext {
 public:
  RankContext(int rank, int device);
  ~RankContext();
  RankContext(const RankContext&) = delete;
  RankContext& operator=(const RankContext&) = delete;

  int rank() const { return rank_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  cudaEvent_t ready_event() const { return ready_; }  // the communicator's: partial written
  cudaEvent_t done_event() const { return done_; }    // the communicator's: reduction read every partial

  void upload_batch(const Batch& b);
  const DeviceBatch& batch() const { return batch_; }

  // The probe kernels' geometry per shape and the device's answers behind it (kernels/probe_launch_plan.cuh).
  ProbeLaunchCache& probe_launch_cache() { return *probe_launch_cache_; }

  // A scratch buffer of at least `bytes`, kept between stages (grown, never shrunk).
  void* scratch(const std::string& name, size_t bytes);
  template <class T>
  T* scratch_as(const std::string& name, int64_t count) {
    return static_cast<T*>(scratch(name, static_cast<size_t>(count) * sizeof(T)));
  }

  // Host -> device copy of a vector into a fresh buffer (synchronous on this rank's stream).
  template <class T>
  DeviceBuffer to_device(const std::vector<T>& v) {
    DeviceBuffer b(device_, v.size() * sizeof(T));
    if (!v.empty()) {
      CUDA_CHECK(cudaMemcpyAsync(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    return b;
  }

 private:
  int rank_ = 0, device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer workspace_;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  DeviceBatch batch_;
  std::map<std::string, DeviceBuffer> scratch_;
  std::unique_ptr<ProbeLaunchCache> probe_launch_cache_;
};

}  // namespace mla::cuda
