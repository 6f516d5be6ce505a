// Probe records: what a run captured at one probe, on one rank. Stats always; a sketch (per-token random
// projection) by default; the full tensor on request. Engines compute these on their own side.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/model/stage_graph.h"
#include "core/model/tensor.h"

namespace mla {

enum class ProbeLevel { ProbeLevel_stats, ProbeLevel_sketch, ProbeLevel_full };
const char* probe_level_name(ProbeLevel l);
ProbeLevel parse_probe_level(const std::string& s);

constexpr int kSketchDim = 32;  // k of the per-token projection

// What to capture at a probe, and where this rank's shard sits in the global row.
struct ProbeRequest {
  ProbeLevel level = ProbeLevel::ProbeLevel_sketch;
  int64_t tokens = 0;      // T (first axis)
  int64_t heads = 0;       // heads held by this rank (0: no heads axis)
  int64_t col_offset = 0;  // this shard's first column in the global [T, C] row layout
  uint64_t probe_key = 0;  // hash of the probe name: seeds the sketch matrix
  // Written out: CUDA translation units include this header and compile as C++17.
  bool operator==(const ProbeRequest& o) const {
    return level == o.level && tokens == o.tokens && heads == o.heads && col_offset == o.col_offset &&
           probe_key == o.probe_key;
  }
};

ProbeRequest make_probe_request(const ProbeSpec& p, int tp, int rank, ProbeLevel level);

struct ProbeRecord {
  std::vector<int64_t> shape;  // this rank's shape
  std::string dtype;           // the engine's dtype for this tensor (fp32, bf16, ...)
  double l2 = 0, absmax = 0, mean = 0, std = 0;
  int64_t nan = 0, inf = 0;
  uint64_t checksum = 0;        // sum of mixed (index, raw bits) terms mod 2^64 (core/probe/probe_hash.h)
  std::vector<float> token_l2;  // [T]
  std::vector<float> head_l2;   // [T, heads] (empty without a heads axis)
  std::vector<float> sketch;    // [T, kSketchDim] (empty below sketch level)
  Tensor data;                  // full level only: the tensor as float32
  ProbeLevel level = ProbeLevel::ProbeLevel_stats;
};

// Sketch matrix entry for global column c, sketch lane k: ±1/sqrt(k) from a counter hash. Never stored.
float sketch_coeff(uint64_t probe_key, int64_t column, int lane);
uint64_t probe_key(const std::string& probe_name);
uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull);

// Host implementation (the reference engine's, and the fallback for any engine): `dtype` says which raw
// bytes the checksum covers (bf16/fp16 values count as their 16-bit patterns).
ProbeRecord compute_probe_record(const Tensor& t, const std::string& dtype, const ProbeRequest& req);
// The same for a tensor the caller gives up: at full level it becomes the record's data (no copy).
ProbeRecord compute_probe_record(Tensor&& t, const std::string& dtype, const ProbeRequest& req);

// The record `rec` would be at a level no higher than its own: what compute_probe_record gives at `level` for the same
// tensor (a full record without its data; a sketch record without its sketch at stats).
ProbeRecord record_at_level(const ProbeRecord& rec, ProbeLevel level);

// Which probes get which level in a run.
struct ProbePlan {
  ProbeLevel level = ProbeLevel::ProbeLevel_sketch;
  std::set<std::string> full;  // probes captured in full regardless of level
  bool off = false;            // record nothing at all (benchmarks time the stages alone)
  bool weights = true;         // record the weights the engine computes with (once per layer and rank)
  std::set<std::string> only_weights;  // not empty: record only these weights
  ProbeLevel level_for(const std::string& probe) const {
    return full.count(probe) ? ProbeLevel::ProbeLevel_full : level;
  }
  // What a run records of a probe of `numel` values: level_for, except DSA's selection, which compare reads as sets
  // of keys (every index) with near-ties judged on the reference's scores: topk always in full, idx_scores in full
  // up to kScoresFullMax values (64 MiB). Benchmarks keep level_for.
  static constexpr int64_t kScoresFullMax = int64_t{1} << 24;
  ProbeLevel recorded_level(const std::string& probe, int64_t numel) const {
    if (probe == "topk" || (probe == "idx_scores" && numel <= kScoresFullMax)) return ProbeLevel::ProbeLevel_full;
    return level_for(probe);
  }
};

// Receives every probe a run records, in graph order, and the progress markers.
class ProbeSink {
 public:
  virtual ~ProbeSink() = default;
  virtual void stage_begin(int /*layer*/, Stage /*stage*/, int /*rank*/) {}
  // The Runner is waiting for a device to finish this stage's queued work (the oldest probe it waits for):
  // where a hang would be, though later stages have begun on the host.
  virtual void waiting(int /*layer*/, Stage /*stage*/, int /*rank*/) {}
  // That wait is over: what runs now is the stage last begun.
  virtual void waiting_over() {}
  virtual void record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) = 0;
  // The same record, given up by the caller: a sink that keeps records takes it without a copy. Default: record().
  virtual void record_owned(int layer, const ProbeSpec& spec, int rank, ProbeRecord&& rec) {
    record(layer, spec, rank, rec);
  }
  // A weight the engine computes with (build_weights' spec), recorded once per layer and rank before the
  // layer's first stage. Default: not kept.
  virtual void record_weight(int /*layer*/, const ProbeSpec& /*spec*/, int /*rank*/, const ProbeRecord& /*rec*/) {}
  virtual void finish(const std::string& /*status*/) {}
};

// Forwards everything to several sinks, in the order given (e.g. the terminal table and a dump writer).
class TeeSink : public ProbeSink {
 public:
  TeeSink() = default;
  explicit TeeSink(std::vector<ProbeSink*> sinks) : sinks_(std::move(sinks)) {}
  void add(ProbeSink& sink) { sinks_.push_back(&sink); }
  void stage_begin(int layer, Stage stage, int rank) override;
  void waiting(int layer, Stage stage, int rank) override;
  void waiting_over() override;
  void record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) override;
  void record_weight(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) override;
  void finish(const std::string& status) override;

 private:
  std::vector<ProbeSink*> sinks_;
};

}  // namespace mla
