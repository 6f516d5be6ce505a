// Drill-down and diagnosis of a divergent probe: which ranks, heads, tokens and channels carry the error,
// and the pattern it shows in plain words, with how sure it is and the numbers that say so.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "harness/compare/compare.h"
#include "harness/compare/format.h"  // ranges, fmt_num
#include "core/model/batch.h"
#include "probes/dump.h"

namespace mla {

struct DrillDown {
  std::vector<int> ranks_off;       // ranks whose shard exceeds the tolerance
  std::vector<int64_t> heads_off;   // heads above the tolerance
  std::vector<int64_t> tokens_off;  // tokens above the worst-token tolerance
  int64_t heads = 0, tokens = 0;
  std::string channels;             // "rope lanes only", "nope lanes only", "first half", ...
  std::vector<std::string> lines;   // readable summary
};

// Each rule fires on its own evidence (rows of exact zeros, a position where the error starts, the channels or
// heads that hold it, a neighbouring probe whose energy it has, per-token or per-channel factors, ...) and says which
// numbers it used; when none fits, the pattern is "no known pattern" and the evidence says where the error sits.
//
// A pattern read in the error tensor is never proof of a cause: its `confidence` is "unconfirmed", and `fit` says how
// well the pattern matches its own evidence (high | medium | low). Two things raise it: a bug class that reproduces
// the candidate when the stage is re-run ("confirmed", harness/hypotheses), and a weight measured to differ
// ("measured").
struct Diagnosis {
  std::string pattern;     // plain words; "no known pattern" when nothing fits
  std::string confidence;  // confirmed | measured | unconfirmed
  std::string fit;         // the pattern's fit to its evidence: high | medium | low
  std::string rule_pattern;  // what the pattern rules read in the error, kept when a cause replaces `pattern`
  std::vector<std::string> evidence;  // the overall numbers, then the rule's own (or where the error sits)
};
// "confirmed by re-running the stage", "measured", "unconfirmed pattern (fits its evidence: high)": for headings.
std::string diagnosis_label(const Diagnosis& d);

DrillDown drill_down(const ProbeResult& r, const Metrics& m, const Tolerance& tol);
// `all` is the whole comparison (some patterns read neighbours, e.g. o_partial for an all-reduce).
Diagnosis diagnose(const ProbeResult& r, const Metrics& m, const Tolerance& tol, const Batch& batch,
                   const CompareReport& all);

// The drill-down and diagnosis of a report's first divergence.
struct Findings {
  DrillDown drill;
  Diagnosis diagnosis;
};
// Empty when the report has no first divergence. `batch`: the run's token layout (the reference's inputs).
std::optional<Findings> explain_first_divergence(const CompareReport& rep, const Batch& batch);
// Names a weight that differs (harness/compare/weight_diff.h: weight_cause) as the cause in a probe's diagnosis:
// "weight q_a_proj differs: <its pattern>" becomes the pattern; the weight's evidence comes first, then what the
// probe's own rules saw.
void blame_weight(Diagnosis& d, const ProbeResult& weight);
// The token layout of two dumps' run: the reference's inputs, else the candidate's, else its run spec, else none.
Batch batch_of(const Dump& reference, const Dump& candidate);

}  // namespace mla
