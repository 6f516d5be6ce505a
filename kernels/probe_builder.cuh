// Probe records built off the thread that launches the stages. Started device probes (ProbeCapture::start: their
// kernels) are handed to a worker thread in start order; it queues their copies to the host (ProbeCapture::ship),
// waits for each one's and builds its record (ProbeCapture::finish: the fold of the units, the maps out of pinned
// memory, the full tensor's conversion). So the host's share of a probe beside the stages is its kernel's launch
// and one event, and the device never waits for a record to be built (on an H200, DeepSeek-V3 prefill T = 512 at
// sketch level, building a layer's records takes ~0.3-0.4 ms against a 0.5 ms layer). take() hands the built
// records back, oldest first.
#pragma once
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "probes/probe.h"

namespace mla::cuda {

class ProbeCapture;

class ProbeRecordBuilder {
 public:
  ProbeRecordBuilder();
  // Stops after the record being built; records not yet built are dropped (their slots stay busy).
  ~ProbeRecordBuilder();
  ProbeRecordBuilder(const ProbeRecordBuilder&) = delete;
  ProbeRecordBuilder& operator=(const ProbeRecordBuilder&) = delete;

  // Queues the started slot `slot` of `capture` (which must outlive this builder or be drained first).
  void push(ProbeCapture& capture, int slot);
  // Appends the built records in the order they were pushed: all of them (wait), or those built now. When one
  // could not be built (a device fault), appends the ones before it, drops the rest and throws its error.
  void take(std::vector<ProbeRecord>& out, bool wait);
  // Drops everything queued and built (a new run).
  void clear();

 private:
  void work();

  struct Job {
    ProbeCapture* capture;
    int slot;
    bool shipped;  // ProbeCapture::ship called
  };
  std::mutex mu_;
  std::condition_variable queued_, built_;
  std::deque<Job> todo_;
  std::deque<ProbeRecord> done_;
  std::exception_ptr failed_;  // a job that could not be built: nothing more is built until take() reports it
  bool building_ = false;      // a job is out of todo_ and not yet in done_
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace mla::cuda
