// Terminal table of probes and the progress line.
#include "harness/report/probe_table.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>

namespace mla {

void TableSink::record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) {
  if (rank == 0) {
    ProbeSummary s;
    s.layer = layer;
    s.name = spec.name;
    s.contract = contract_name(spec.contract);
    s.shape = spec.shape;
    s.dtype = rec.dtype;
    rows_.push_back(s);
    sumsq_.push_back(0.0);
  }
  auto& s = rows_.back();
  s.ranks = rank + 1;
  s.nan += rec.nan;
  s.inf += rec.inf;
  if (spec.contract == Contract::Contract_heads) {
    sumsq_.back() += rec.l2 * rec.l2;
    s.l2 = std::sqrt(sumsq_.back());
    s.absmax = std::max(s.absmax, rec.absmax);
  } else if (rank == 0) {
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
    const char* note = r.contract == "partial" && r.ranks > 1 ? "rank 0's partial sum" : "";
    std::snprintf(line, sizeof line, "%-5d %-12s %-10s %-18s %-5s %14.6g %12.6g %lld/%lld%s%s\n", r.layer, r.name.c_str(),
                  r.contract.c_str(), shape_string(r.shape).c_str(), r.dtype.c_str(), r.l2, r.absmax,
                  static_cast<long long>(r.nan), static_cast<long long>(r.inf), *note ? "  " : "", note);
    os << line;
  }
}

ProgressSink::ProgressSink(ProbeSink& inner, int layers, int stages, int tp)
    : inner_(inner), layers_(layers), stages_(stages), tp_(tp), tty_(isatty(STDERR_FILENO)) {}

void ProgressSink::stage_begin(int layer, Stage stage, int rank) {
  inner_.stage_begin(layer, stage, rank);
  ++done_;
  if (!tty_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  const int total = layers_ * stages_ * tp_;
  std::fprintf(stderr, "\r\033[K[%3d%%] layer %d/%d  %-14s rank %d/%d", 100 * done_ / std::max(total, 1), layer + 1,
               layers_, stage_name(stage), rank, tp_);
  std::fflush(stderr);
}

void ProgressSink::record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) {
  inner_.record(layer, spec, rank, rec);
}

void ProgressSink::finish(const std::string& status) {
  if (tty_) std::fprintf(stderr, "\r\033[K");
  inner_.finish(status);
}

}  // namespace mla
