// Terminal table of probes and the progress lines of a run.
#include "harness/report/probe_table.h"


#include <cmath>
#include <cstdio>
#include <iostream>

namespace mla {

// A stage's outputs arrive rank by rank (q_nope, q_pe of rank 0, then of rank 1): the row is found by name among
// the current layer's, not taken as the last one.
ProbeSummary& TableSink::row(int layer, const ProbeSpec& spec, const ProbeRecord& rec, int rank) {
  for (size_t i = rows_.size(); i-- > 0 && rows_[i].layer == layer;)
    if (rows_[i].name == spec.name) return rows_[i];
  ProbeSummary s;
  s.layer = layer;
  s.name = spec.name;
  s.contract = contract_name(spec.contract);
  s.shape = spec.shape;
  s.dtype = rec.dtype;
  s.first_rank = rank;
  rows_.push_back(s);
  sumsq_.push_back(0.0);
  return rows_.back();
}

void TableSink::record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) {
  ProbeSummary& s = row(layer, spec, rec, rank);
  double& sumsq = sumsq_[static_cast<size_t>(&s - rows_.data())];
  ++s.ranks;
  s.nan += rec.nan;
  s.inf += rec.inf;
  if (spec.contract == Contract::Contract_heads) {
    sumsq += rec.l2 * rec.l2;
    s.l2 = std::sqrt(sumsq);
    s.absmax = std::max(s.absmax, rec.absmax);
  } else if (rank == s.first_rank) {
    s.l2 = rec.l2;
    s.absmax = rec.absmax;
  }
}

void TableSink::print(std::ostream& os) const {
  char line[256];
  std::snprintf(line, sizeof line, "%-5s %-12s %-10s %-18s %-5s %14s %12s %s\n", "layer", "probe", "contract", "shape",
                "dtype", "L2", "absmax", "nan/inf");
  os << line;
  for (const auto& r : rows_) {
    // One process per rank records one rank of a tp > 1 run: its shard of the heads, its partial sum.
    const bool one_rank = r.ranks == 1 && tp_ > 1;
    const std::string who = "rank " + std::to_string(r.first_rank) + "'s ";
    const std::string note = r.contract == "partial" && (r.ranks > 1 || one_rank) ? who + "partial sum"
                             : r.contract == "heads" && one_rank                  ? who + "heads only"
                                                                                  : "";
    std::snprintf(line, sizeof line, "%-5d %-12s %-10s %-18s %-5s %14.6g %12.6g %lld/%lld%s%s\n", r.layer, r.name.c_str(),
                  r.contract.c_str(), shape_string(r.shape).c_str(), r.dtype.c_str(), r.l2, r.absmax,
                  static_cast<long long>(r.nan), static_cast<long long>(r.inf), note.empty() ? "" : "  ",
                  note.c_str());
    os << line;
  }
}

ProgressSink::ProgressSink(ProbeSink& inner, const ProgressLog& log, int layers, int stages, int tp)
    : inner_(inner), log_(log), layers_(layers), stages_(stages), tp_(tp) {}

void ProgressSink::stage_begin(int layer, Stage stage, int rank) {
  inner_.stage_begin(layer, stage, rank);
  const int total = std::max(layers_ * stages_ * tp_, 1);
  const int pct = 100 * done_ / total;  // of the stages finished before this one
  if (done_ == 0) first_stage_s_ = log_.seconds();
  const double elapsed = log_.seconds() - first_stage_s_;
  // The estimate from the pace of the stages so far (after a second of them: a first stage's time says little).
  const double eta = done_ > 0 && elapsed >= 1.0 ? elapsed / done_ * (total - done_) : -1;
  ++done_;
  if (!log_.on() || pct / 10 <= shown_tenths_) return;
  shown_tenths_ = pct / 10;
  log_.step("layer " + std::to_string(layer + 1) + "/" + std::to_string(layers_) + " stage " + stage_name(stage) +
                (tp_ > 1 ? " rank " + std::to_string(rank) + "/" + std::to_string(tp_) : std::string()),
            pct / 100.0, eta);
}

void ProgressSink::record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) {
  inner_.record(layer, spec, rank, rec);
}

void ProgressSink::record_weight(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) {
  if (layer != weights_layer_) {
    weights_layer_ = layer;
    log_.step("layer " + std::to_string(layer + 1) + "/" + std::to_string(layers_) + " weights: recording");
  }
  inner_.record_weight(layer, spec, rank, rec);
}

void ProgressSink::finish(const std::string& status) {
  inner_.finish(status);
}

}  // namespace mla
