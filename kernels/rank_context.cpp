// RankContext (host code, no kernels): per-rank stream, cuBLAS handle, events, batch layout, scratch and the probe
// launches' cache.
#include "kernels/rank_context.cuh"

#include <algorithm>

#include "core/model/batch.h"
#include "kernels/probe_launch_plan.cuh"

namespace mla::cuda {

static_assert(kCachePage == kPageSize, "the CUDA kernels assume the harness's page size");

namespace {
constexpr size_t kCublasWorkspace = 32ull << 20;  // cuBLAS's recommendation for Hopper
}

RankContext::RankContext(int rank, int device)
    : rank_(rank), device_(device), probe_launch_cache_(std::make_unique<ProbeLaunchCache>()) {
  DeviceGuard g(device_);
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&cublas_));
  CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  workspace_ = DeviceBuffer(device_, kCublasWorkspace);
  CUBLAS_CHECK(cublasSetWorkspace(cublas_, workspace_.get(), workspace_.bytes()));
  // bf16 GEMMs accumulate in fp32; forbid split-K reductions in reduced precision so that the only
  // bf16 rounding is the one of the output (what the bf16 reference models).
  CUBLAS_CHECK(cublasSetMathMode(cublas_, static_cast<cublasMath_t>(
                                              CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
}

RankContext::~RankContext() {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device_);
  if (stream_) cudaStreamSynchronize(stream_);
  scratch_.clear();
  if (ready_) cudaEventDestroy(ready_);
  if (done_) cudaEventDestroy(done_);
  if (cublas_) cublasDestroy(cublas_);
  if (stream_) cudaStreamDestroy(stream_);
  cudaSetDevice(prev);
}

void* RankContext::scratch(const std::string& name, size_t bytes) {
  auto& b = scratch_[name];
  if (b.bytes() < bytes) {
    // The old buffer may still be read by work queued on the stream.
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    b = DeviceBuffer(device_, bytes);
  }
  return b.get();
}

void RankContext::upload_batch(const Batch& b) {
  DeviceGuard g(device_);
  const int T = b.tokens(), B = b.num_seqs();
  std::vector<int> token_idx(T), new_start(B), ctx_start(B), total(B);
  std::vector<int64_t> slots(T), ctx_rows;
  for (int s = 0, t = 0, c = 0; s < B; ++s) {
    new_start[s] = t;
    ctx_start[s] = c;
    total[s] = b.context_lens[s] + b.new_lens[s];
    for (int p = 0; p < b.context_lens[s]; ++p, ++c)
      ctx_rows.push_back(static_cast<int64_t>(b.page(s, p)) * kPageSize + p % kPageSize);
    for (int i = 0; i < b.new_lens[s]; ++i, ++t) {
      token_idx[t] = i;
      const int slot = b.context_lens[s] + i;
      slots[t] = static_cast<int64_t>(b.page(s, slot)) * kPageSize + slot % kPageSize;
    }
  }
  batch_.tokens = T;
  batch_.seqs = B;
  batch_.max_blocks = b.max_blocks;
  batch_.ctx_total = static_cast<int>(ctx_rows.size());
  batch_.max_new = batch_.max_ctx = batch_.max_total = 0;
  for (int s = 0; s < B; ++s) {
    batch_.max_new = std::max(batch_.max_new, b.new_lens[s]);
    batch_.max_ctx = std::max(batch_.max_ctx, b.context_lens[s]);
    batch_.max_total = std::max(batch_.max_total, total[s]);
  }
  batch_.positions = to_device(b.positions);
  batch_.token_seq = to_device(b.token_seq);
  batch_.token_idx = to_device(token_idx);
  batch_.slot_mapping = to_device(slots);
  batch_.seq_new_start = to_device(new_start);
  batch_.seq_new_len = to_device(b.new_lens);
  batch_.seq_ctx_start = to_device(ctx_start);
  batch_.seq_ctx_len = to_device(b.context_lens);
  batch_.seq_total_len = to_device(total);
  batch_.block_table = to_device(b.block_table);
  batch_.ctx_rows = to_device(ctx_rows);
}

}  // namespace mla::cuda
