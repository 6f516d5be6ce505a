// The peak memory a run needs, estimated from its shapes before any work (host, and per GPU for device engines),
// and what the machine has: a run that cannot fit is refused at once (exit 2) saying how much, for what, and what to
// lower, instead of failing with an allocation error after minutes of work.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/model/batch.h"
#include "core/model/config.h"
#include "core/probe/probe.h"

namespace mla {

// One part of a run's memory: weights, activations, attention scores, kv cache (with the inputs), probes.
struct MemoryPart {
  std::string what;
  double bytes = 0;
  std::string lower;  // the options that shrink this part
};

struct MemoryEstimate {
  std::vector<MemoryPart> parts;
  double total() const;
  std::string breakdown() const;  // "weights 1.2 GiB, activations 30 MiB, ..." largest first
};

struct MemoryEstimateInput {
  const MlaConfig* cfg = nullptr;
  const RunSpec* spec = nullptr;
  ProbePlan plan;
  bool dump = false;               // the run writes a dump (--out): its records are folded in memory at the end
  std::string engine = "reference";
  int threads = 1;                 // reference: heads attended at once (one score matrix each)
  bool quantized = false;          // --weight-format: a quantized copy of each projection is made on the way
  bool per_process = false;        // --rank: this process drives one rank (device engines) or records one
  int devices = 1;                 // device engines: GPUs the ranks are spread over
};

// Host memory of the process (the reference computes every rank in it; a device engine holds the loaded weights
// and the probe records on the host).
MemoryEstimate estimate_host_memory(const MemoryEstimateInput& in);
// Device memory of one GPU (device engines): the ranks it holds, each with its shard of the weights, its
// activations and its cache. Flash-style kernels keep no score matrix.
MemoryEstimate estimate_device_memory(const MemoryEstimateInput& in);

// What the machine can give this process: /proc/meminfo MemAvailable, the cgroup's limit less its usage, and the
// address-space limit (ulimit -v) less what is mapped, the smallest of them. bytes < 0: unknown.
struct MemoryAvailable {
  double bytes = -1;
  std::string source;  // which limit it is, for the message
};
MemoryAvailable available_host_memory();

std::string format_bytes(double bytes);

// Throws UsageError (exit 2) when `need` exceeds `have`: the total, each part, and what to lower. `what` names the
// memory ("host memory", "memory of each GPU") and `command` the run ("run", "bisect's in-process drill-down").
void require_memory(const MemoryEstimate& need, const MemoryAvailable& have, const std::string& what);

// A one-line summary of the estimate for an out-of-memory error that still happens (exit 3).
std::string memory_summary(const MemoryEstimate& need, const MemoryAvailable& have);

}  // namespace mla
