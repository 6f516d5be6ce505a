// Probe records built off the thread that launches the stages, for an engine that queues its probes on a device
// (Engine::queues_probes). Each started probe is pushed as a job: `ship` queues its results' way to the host (on
// the device: copies and a done flag behind its kernels) and `finish` waits for them and builds the record. A worker
// thread ships every queued job as soon as it can, then finishes the oldest, so the launching thread's share of a
// probe is its start alone and the device never waits for a record to be built. take() hands the built records
// back in push order. The CUDA engine's jobs: kernels/probe_capture.cuh.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/probe/probe.h"

namespace mla {

class ProbeRecordBuilder {
 public:
  struct Job {
    std::function<void()> ship;           // called on the worker, before it waits for any older job
    std::function<ProbeRecord()> finish;  // called on the worker, oldest job first; may throw (a device fault)
  };

  ProbeRecordBuilder();
  // Stops after the record being built; jobs not yet finished are dropped.
  ~ProbeRecordBuilder();
  ProbeRecordBuilder(const ProbeRecordBuilder&) = delete;
  ProbeRecordBuilder& operator=(const ProbeRecordBuilder&) = delete;

  void push(Job job);
  // Appends the built records in push order: all of them (wait), or those built now. When a job's ship or finish
  // threw, appends the records before it, drops the jobs after it and rethrows.
  void take(std::vector<ProbeRecord>& out, bool wait);
  // Drops every queued job and built record (waits for the one being built).
  void clear();

 private:
  void work();
  // Nothing is being built and nothing more can be (every job built, or one failed): under mu_.
  bool settled() const { return !building_ && (todo_.empty() || failed_); }
  // How long take(wait) spins on settled_ before it blocks.
  static constexpr std::chrono::microseconds kSpin{2000};

  struct Queued {
    Job job;
    bool shipped = false;           // under mu_
    std::exception_ptr ship_error;  // the worker's alone
  };
  std::mutex mu_;
  std::condition_variable queued_, built_;
  std::deque<std::shared_ptr<Queued>> todo_;  // shared: the worker ships them while take() may drop them
  std::deque<ProbeRecord> done_;
  std::exception_ptr failed_;  // a job that could not be built: nothing more is built until take() reports it
  bool building_ = false;      // a job is out of todo_ and not yet in done_
  bool stop_ = false;
  std::atomic<bool> settled_{true};  // settled() as of the last change, read without the lock
  std::thread thread_;
};

}  // namespace mla
