// Bisect (docs/architecture.md): run a reference (in this process, or a child) and a candidate (in a child process)
// side by side, compare their dumps at calibrated tolerances, then isolate the first divergent stage on the reference's exact inputs, drill down
// and name the pattern.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/compare/compare.h"
#include "harness/compare/diagnose.h"
#include "core/engine/engine.h"
#include "harness/hypotheses/hypotheses.h"
#include "core/weights/loader.h"

namespace mla {

struct BisectOptions {
  MlaConfig cfg;
  RunSpec spec;
  uint64_t weight_seed = 0;
  WeightSpec weights;                 // --weights / --weight-format / --layer-range (the children get them in run_args)
  std::vector<std::string> run_args;  // the run options as command-line args, for the children
  // The run options as a run's dump records them (RunOptions::dump_options) and their probe plan. Given (not null),
  // the plain FP32 reference runs in the bisect's own process and writes the dump its child run would; null: the
  // reference runs in a child process as the candidate does.
  nlohmann::json run_options;
  ProbePlan plan;
  std::string reference = "reference";
  std::string candidate = "reference:precision=bf16";
  std::string inject;                 // planted in the candidate only
  double timeout_s = 120;             // per-stage watchdog of each child
  std::string workdir;                // where the dumps go
  double k = 4.0;                     // tolerance = k x calibrated noise floor
  std::map<std::string, double> overrides;
  bool progress = false;              // print steps on stderr
};

// The values of one probe, candidate and reference, counted on one shared axis: what the HTML report draws as a
// value histogram. Empty (no bins) when no full tensors of the probe were at hand.
struct ValueHistogram {
  std::string probe;                      // "layer 0 q_pe_rope"
  std::string source;                     // where the values came from, in words
  double lo = 0, hi = 0;                  // the axis: bins split [lo, hi] evenly
  std::vector<int64_t> candidate, reference;  // counts per bin (finite values)
  int64_t candidate_nonfinite = 0, reference_nonfinite = 0;
  bool empty() const { return candidate.empty(); }
};
// Bins both tensors' finite values on the range of both (`bins` bins).
ValueHistogram value_histogram(const std::vector<float>& candidate, const std::vector<float>& reference, int bins = 60);

struct BisectReport {
  int exit_code = 0;  // 0 none, 1 divergence, 3 an engine crashed or hung
  std::string headline;
  std::string reference_dump, candidate_dump, candidate_engine, inject;
  std::string crash;                  // what the candidate's child did, when it failed
  std::string last_committed;         // last probe in the candidate's dump
  std::vector<std::string> last_stage;
  CompareReport compare;
  std::optional<ProbeResult> first;   // the first divergence (sketch-level, from the dumps)
  Metrics full;                       // the divergent probe compared on full tensors
  ValueHistogram first_values;        // its values from those full tensors (the HTML report's histogram)
  std::string isolation;              // "introduced by STAGE" | "amplified ..." | ""
  // The weight that explains the first divergence (a weight of its stage or an earlier one differs), compared on
  // the in-process full tensors where the runs recorded weights.
  std::optional<ProbeResult> weight_cause;
  Metrics isolated;
  DrillDown drill;
  Diagnosis diagnosis;
  // The bug classes re-run on the introducing stage's inputs (harness/hypotheses): searched only when the stage
  // introduced the error.
  hyp::Report hypotheses;
  double seconds = 0;
};

BisectReport run_bisect(const BisectOptions& opt);
void print_bisect(std::ostream& os, const BisectReport& rep);
nlohmann::json bisect_to_json(const BisectReport& rep);
std::string bisect_to_junit(const BisectReport& rep);

}  // namespace mla
