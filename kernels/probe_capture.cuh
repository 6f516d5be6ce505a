// Probe records of one rank without a host sync per probe (Engine::probe_async / collect_probes): start()
// queues, on the rank's stream, the stats kernel, the sketch GEMM and the copies of the results (and of the
// whole tensor at full level) into pinned host memory, then a flag in mapped host memory; finish() waits
// and folds. Stream order makes it copy-on-capture: a later kernel cannot change what a probe saw. The flag
// lets a probe whose copies completed before a device fault be recovered after it (the CUDA API then only
// reports the fault), so probes recorded before a crash survive it.
#pragma once
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "kernels/device_tensor.cuh"
#include "kernels/rank_context.cuh"
#include "probes/probe.h"

namespace mla::cuda {

class ProbeCapture {
 public:
  explicit ProbeCapture(RankContext& rc);
  ~ProbeCapture();
  ProbeCapture(const ProbeCapture&) = delete;
  ProbeCapture& operator=(const ProbeCapture&) = delete;

  // Queues the record of `t` (this rank's shard) and returns its slot.
  int start(const DeviceTensor& t, const ProbeRequest& req);
  // The record of a started slot: waits for its copies (or reads the flag after a device fault).
  ProbeRecord finish(int slot);
  // Every slot is free again (after their records were taken).
  void reset() { used_ = 0; }
  void release_last() {
    if (used_ > 0) --used_;
  }
  int pending() const { return used_; }

 private:
  struct Slot;
  const DeviceBuffer& signs(uint64_t key, int64_t col0, int64_t cols);

  RankContext& rc_;
  std::vector<std::unique_ptr<Slot>> slots_;
  int used_ = 0;
  std::map<std::tuple<uint64_t, int64_t, int64_t>, DeviceBuffer> signs_;
};

}  // namespace mla::cuda
