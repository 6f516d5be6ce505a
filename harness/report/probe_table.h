// A probe sink that keeps per-probe summaries and prints them as a terminal table (the `run` command),
// and one that prints progress lines as the stages begin.
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

#include "harness/report/progress.h"
#include "core/probe/probe.h"

namespace mla {

struct ProbeSummary {
  int layer = 0;
  std::string name;
  std::string contract;
  std::vector<int64_t> shape;  // global
  std::string dtype;
  double l2 = 0, absmax = 0;   // over the gathered tensor (partials: rank 0's, until compare gathers them)
  int64_t nan = 0, inf = 0;
  int ranks = 0;       // records summed into the row
  int first_rank = 0;  // the lowest rank recorded (one process per rank: its rank, the only one)
};

class TableSink : public ProbeSink {
 public:
  // tp: the run's; a row with fewer ranks (one process per rank records its own) says whose shard it shows.
  explicit TableSink(int tp = 1) : tp_(tp) {}
  void record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) override;
  const std::vector<ProbeSummary>& rows() const { return rows_; }
  void print(std::ostream& os) const;

 private:
  ProbeSummary& row(int layer, const ProbeSpec& spec, const ProbeRecord& rec, int rank);
  std::vector<ProbeSummary> rows_;
  std::vector<double> sumsq_;
  int tp_;
};

// Forwards to another sink and prints "[12.3 s] layer l/N stage s rank r/tp (p%), ~E s left" through a ProgressLog:
// the first stage, then each time another tenth of the run's stages has begun (a line, never a redrawn bar: logs read
// it too), the estimate from the pace of the stages so far; and a line when a layer's weight records begin (seconds at
// DeepSeek-V3 dims, before the layer's first stage). The Runner's ticks (ProgressTicks) fill longer gaps.
class ProgressSink : public ProbeSink {
 public:
  ProgressSink(ProbeSink& inner, const ProgressLog& log, int layers, int stages, int tp);
  void stage_begin(int layer, Stage stage, int rank) override;
  void waiting(int layer, Stage stage, int rank) override { inner_.waiting(layer, stage, rank); }
  void waiting_over() override { inner_.waiting_over(); }
  void record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) override;
  void record_weight(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) override;
  void finish(const std::string& status) override;

 private:
  ProbeSink& inner_;
  const ProgressLog& log_;
  int layers_, stages_, tp_, done_ = 0, shown_tenths_ = -1, weights_layer_ = -1;
  double first_stage_s_ = 0;  // the log's seconds at the first stage
};

}  // namespace mla
