// Calibrated tolerances: the reference at FP32 against itself at the candidate's precision, on the same config,
// weights and inputs. The difference is the precision's own noise, per probe; a tolerance is k times it.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/compare/compare.h"
#include "core/model/inputs.h"
#include "core/model/weights.h"
#include "harness/run/runner.h"

namespace mla {

// Calibrates tolerances: runs the reference at FP32 and at `precision` on the same config, weights and inputs,
// and takes k × the per-probe error (rel_l2, worst token) as the tolerance, with a floor. `fp32_full`: the FP32
// reference's full-level run on exactly these inputs when the caller has it already (replay), so it is not run again.
// DSA: where the two runs' top-k swap near-tied keys, the FP32 run is made on the other run's selection there
// (selection_feed, below), `fp32_full` not used, so the noise after topk is rounding and never other keys.
ToleranceModel calibrate(const MlaConfig& cfg, const RunSpec& spec, const std::vector<LayerWeights>& weights,
                         const Inputs& inputs, Precision precision, double k = 4.0, const Dump* fp32_full = nullptr);

// DSA: a reference run on a candidate's own selection. Where the candidate's top-k differs from the reference's only
// by swaps between near-tied keys (harness/compare/compare.h, compare_topk), the candidate's attention reads other
// keys than the reference's by design, and its output there is only comparable with the reference's attention over
// the same keys. The hook below makes the reference's topk, at those tokens, the candidate's before anything reads
// it (its probe included), so every probe after topk is compared in full against a reference that attended to what
// the candidate selected; tokens whose sets differ beyond near-ties keep the reference's own selection (a divergence
// at topk).

struct SelectionFed {
  std::map<int, std::vector<int64_t>> tokens;  // per layer: the tokens that took the candidate's selection
  std::map<int, int64_t> swaps;                // per layer: the near-tie swaps among them
  bool any() const;
  // One note per layer: "layer 0: 3 tokens (0-2) whose top-k swapped 5 near-tied keys ...".
  std::vector<std::string> notes(const std::string& candidate = "candidate") const;
};

// A Runner after-stage hook (Runner::set_after_stage): after each layer's topk, on every rank, the tokens whose
// selection differs from `cand`'s topk (full records) only by near-tie swaps take the candidate's selection. Near-ties
// are judged on the engine's own idx_scores against the candidate's (full records), else by twice idx_scores'
// tolerance in `tol` times the scores' RMS; `in` says which keys each token sees. `fed` (kept alive by the caller)
// hears which tokens took it. `cand` must outlive the runs.
Runner::BeforeStage selection_feed(const Dump& cand, const Inputs& in, const ToleranceModel& tol,
                                   std::shared_ptr<SelectionFed> fed);

// Whether, in any layer, `cand`'s topk differs from `ref`'s by near-tie swaps (near_tie_tokens).
bool has_near_tie_swaps(const Dump& cand, const Dump& ref, const ToleranceModel& tol);

}  // namespace mla
