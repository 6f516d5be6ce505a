// A probe sink that keeps everything in memory as a Dump (no file): for in-process comparisons
// (calibration, isolation, tests) and as the accumulator of the dump writer.
#pragma once
#include "probes/dump.h"

namespace mla {

class CollectSink : public ProbeSink {
 public:
  CollectSink(const DumpMeta& meta, int tp);
  void stage_begin(int layer, Stage stage, int rank) override;
  void record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) override;
  void record_owned(int layer, const ProbeSpec& spec, int rank, ProbeRecord&& rec) override;
  void record_weight(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) override;
  void finish(const std::string& status) override;
  Dump& dump() { return dump_; }
  Dump take() { return std::move(dump_); }

 private:
  Dump dump_;
};

// Appends a record to a Dump (the one place that maps a ProbeSpec to a DumpProbe).
void add_record(Dump& dump, int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec);
void add_record(Dump& dump, int layer, const ProbeSpec& spec, int rank, ProbeRecord&& rec);
// The same for a weight record (Dump::weights).
void add_weight_record(Dump& dump, int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec);

}  // namespace mla
