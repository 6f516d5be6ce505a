// The causes of two dumps' first divergence tested by re-execution (harness/hypotheses), for the tools that hold
// dumps but run no bisect: compare and golden check. The candidate's own full tensors of the divergent stage's inputs
// and outputs are needed, and the weights the reference dump names (synthetic by seed, or its checkpoint).
#pragma once
#include "harness/compare/compare.h"
#include "harness/hypotheses/hypotheses.h"

namespace mla {

// Searched only when the reference's stage on the candidate's own inputs disagrees with the candidate (the stage
// introduced the error); otherwise, or when a tensor or the weights are not at hand, `reason` says why not.
hyp::Report causes_of_first_divergence(const Dump& candidate, const Dump& reference, const CompareReport& rep);

}  // namespace mla
