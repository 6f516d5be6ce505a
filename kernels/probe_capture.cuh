// Probe records of one rank without a host sync per probe (Engine::probe_async / collect_probes). start()
// queues, on the rank's stream, the stats-and-sketch kernel (and, at full level, a device copy of the tensor) and
// an event; ship() makes a copy stream wait for that event, bring the results into pinned host memory and then set
// a flag in mapped host memory, so the rank's stream never waits for PCIe; finish() waits for the flag and folds.
// start() is all that the thread launching the stages spends on a probe: ship() and finish() run on the record
// builder's thread (core/engine/probe_record_builder.h). Stream order makes it copy-on-capture: a later kernel
// cannot change what a probe saw. The flag also lets a probe whose copies completed before a device fault be
// recovered after it (the CUDA API then only reports the fault), so probes recorded before a crash survive it. It is
// written by a stream memory operation (cuStreamWriteValue32, no SM needed); with
// ProbeCaptureOptions::flag_by_kernel (or a driver without it) by a one-thread kernel instead
// (kernels/probe_flag.cuh). The copy stream has the device's greatest priority (with probe_stream=side, where the
// probe kernels run on it, the least). start_many() starts several probes at once (the engine's held probes, or a
// stage's probes): their kernels in batch launches, their results in one arena copied in one piece under one flag:
// right behind them on the rank's stream, or on the copy stream after an event (a stage's probes, launched after
// it, and the engine's held probes unless its option probe_copy=rank).
#pragma once
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/device_tensor.cuh"
#include "kernels/probe_flag.cuh"
#include "kernels/probe_stats.cuh"
#include "kernels/rank_context.cuh"
#include "core/probe/probe.h"

namespace mla::cuda {

// How the probes are captured (the CUDA engine's options probe_stream, probe_pdl and probe_flag).
struct ProbeCaptureOptions {
  // The probe kernels run on the copy stream, after an event on the rank's stream, so they overlap the rank's next
  // stages; the tensor must then stay unchanged until finish() (the Runner waits for every probe at the end of each
  // layer, before any stage writes a probed tensor again; freeing a buffer synchronizes the device). Otherwise they
  // run on the rank's stream, in order with its stages.
  bool side_stream = false;
  // The tile kernel launched as a programmatic dependent of the kernel before it (compute capability 9 on;
  // launch_probe_stats); false: plain launches.
  bool programmatic = true;
  // The done flag written by a one-thread kernel instead of the stream memory operation.
  bool flag_by_kernel = false;
};

class ProbeCapture {
 public:
  ProbeCapture(RankContext& rc, const ProbeCaptureOptions& options);
  ~ProbeCapture();
  ProbeCapture(const ProbeCapture&) = delete;
  ProbeCapture& operator=(const ProbeCapture&) = delete;

  // Queues the kernels of the record of `t` (this rank's shard, the probe named `probe`) on the rank's stream
  // and returns its slot (busy until finish). Called from the thread that launches the stages.
  int start(const std::string& probe, const DeviceTensor& t, const ProbeRequest& req);
  // Several probes at once: as start() for each, in order, with the kernels of the tensors that allow it in a few
  // batch launches (launch_probe_stats_batch); the same records. Their results go in one arena, copied in one piece
  // under one flag: right behind the kernels on the rank's stream (the engine's held probes with probe_copy=rank:
  // a device fault in a later stage cannot stop the copy), or, with `beside` (a stage's probes launched after it, or
  // a layer's held ones), on the copy stream after an event, so that the copy overlaps the rank's next stages
  // (queued by the first of the slots' ship() calls), the kernels' first launch a programmatic dependent of the
  // kernel before it. With side_stream the kernels, the copy and the flag all go on the copy stream, after one
  // event on the rank's.
  struct Start {
    std::string probe;
    const DeviceTensor* tensor;
    ProbeRequest req;
  };
  std::vector<int> start_many(const std::vector<Start>& list, bool beside = false);
  // Queues a started slot's copies to pinned host memory and its flag on the copy stream, after its kernels (a
  // slot of start_many's: its arena's copy and flag, the first time one of its slots is shipped with `beside`, else
  // nothing: they are queued).
  void ship(int slot);
  // The record of a shipped slot, which becomes free: waits for its copies (or reads the flag after a device
  // fault). ship() and finish() may be called from another thread than start() (the record builder's), one slot at
  // a time.
  ProbeRecord finish(int slot);
  // Host seconds finish() spent building records once their results were in (not waiting for them): in all, and
  // for the last one.
  double build_seconds() const;
  double last_build_seconds() const;

 private:
  struct Slot;
  // The sketch's sign-bit table for (probe key, first global column, width), built once and kept.
  const uint32_t* sign_bits(uint64_t key, int64_t col0, int64_t cols);

  // start() but the kernels, in two steps: the slot and its record's layout (a: the tensor's part), then its memory
  // and the rest of `a` (results: where its results go on the device; nullptr: the slot's scratch) and `stream`,
  // where the kernels go (the copy stream with side_stream, after the tensor's event).
  int layout(const std::string& probe, const DeviceTensor& t, const ProbeRequest& req, ProbeStatsArgs& a);
  void place(int id, const ProbeRequest& req, ProbeStatsArgs& a, unsigned char* results, cudaStream_t& stream);
  struct Arena;
  Arena& free_arena(size_t bytes);
  void copy_full(Slot& s, const DeviceTensor& t, cudaStream_t stream);  // full level: the tensor beside its results
  Slot& slot(int id) const;
  void wait_for_flag(const volatile unsigned* flag, unsigned seq) const;

  RankContext& rc_;
  bool side_stream_ = false, programmatic_ = true;
  StreamWriteValue32 write_flag_ = nullptr;  // the driver's memory operation; nullptr: the flag kernel
  cudaStream_t copy_ = nullptr;
  mutable std::mutex mu_;  // slots_ (start() adds slots while finish() runs on another thread) and the build times
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::unique_ptr<Arena>> arenas_;  // start_many's, reused once their records are finished
  // Slots by probe name: a probe gets a free slot of its own name, whose buffers already have its size (a
  // slot shared between probes of different sizes would grow, and growing reallocates pinned memory, slow,
  // and device memory, whose freeing synchronizes the device).
  std::map<std::string, std::vector<int>> by_probe_;
  std::map<std::tuple<uint64_t, int64_t, int64_t>, DeviceBuffer> signs_;
  double built_s_ = 0, last_built_s_ = 0;
};

}  // namespace mla::cuda
