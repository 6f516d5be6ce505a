// Weights first: the weights two runs computed with (Dump::weights, one record per rank as each engine held it,
// after its own dequantization) compared before any activation, and a weight that differs described in the
// checkpoint's terms: which ranks, rows and column blocks, and the pattern (pure scale, block-shaped, a shard of
// another rank, a tensor under the wrong name, transposed, content in the wrong places).
#pragma once
#include <string>
#include <vector>

#include "harness/compare/compare.h"

namespace mla {

// Compares every weight both dumps hold (same layer and name) into rep.weights, in (layer, use) order, and sets
// rep.first_weight. A dump without weights (older dumps, captures, engines that do not say) leaves a note, not a
// failure. Tolerances: tol.for_probe("weights/NAME", layer) (calibrate() fills them from the reference's own
// weights at the candidate's precision; the FP32 floor otherwise).
void compare_weights(const Dump& a, const Dump& b, const ToleranceModel& tol, const CompareOptions& opt,
                     CompareReport& rep);

// The pattern and evidence of a weight beyond its tolerance (r.verdict diverge or nonfinite), from the two dumps'
// records of it (full tensors where both have them, else sketches and norms): fills r.pattern and r.evidence.
// `ga` and `gb`, where the caller has them, are the two records gathered (gather()), not gathered again.
void describe_weight(ProbeResult& r, const Dump& a, const Dump& b, const Gathered* ga = nullptr,
                     const Gathered* gb = nullptr);

// The weight that explains a divergent probe: the first weight beyond tolerance used by the probe's stage or an
// earlier one (of its layer or an earlier layer); nullptr when none does.
const ProbeResult* weight_cause(const CompareReport& rep, const ProbeResult& probe);
// (blame_weight, which names it in a diagnosis: diagnose.h.)

// One line: "weight layer0/q_a_proj differs on rank 1: rows 96..191, pattern: ..." (for headlines and verdicts).
std::string weight_sentence(const ProbeResult& r);

}  // namespace mla
