// Isolation, the step of a bisect after the first divergence: re-run an engine in this process with one stage fed
// the reference's exact inputs, and judge whether that stage introduced the error or only amplified error from
// upstream.
// Shared by bisect (after its child runs) and explore (on two dumps).
#pragma once
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "harness/compare/compare.h"
#include "core/engine/engine.h"

namespace mla {

// A run in this process with every probe in full. With `feed`, `stage` of `layer` first gets its input tensors
// from `feed` (a full-level dump of the same spec and tp), rank by rank.
// `packed`: the projections as stored, for an engine that dequantizes them itself (LoadedWeights::packed of a load
// with keep_packed, and the run's dequantization bugs), so the run computes with what a child run would.
struct PackedWeights {
  const std::vector<std::map<std::string, PackedWeight>>* packed = nullptr;
  DequantBugs bugs;
};
// Which weights a run in this process records (in full): none, every one, or the named ones.
struct WeightRecords {
  bool on = false;
  std::set<std::string> only;  // on and not empty: these alone
  WeightRecords(bool all = false) : on(all) {}  // NOLINT: true / false read as every weight / none
  WeightRecords(std::set<std::string> names) : on(!names.empty()), only(std::move(names)) {}  // NOLINT
};
// `weights`: also record the weights the engine computes with (Runner's weight records, level full). `stop`: end the
// run after `stage` of `layer` (fed or not), where nothing later is needed. `after`: Runner::set_after_stage's hook
// (a reference run on a candidate's DSA selection: harness/run/calibrate.h).
Dump run_in_process(Engine& engine, const MlaConfig& cfg, const RunSpec& spec, const std::vector<LayerWeights>& w,
                    const Inputs& in, const Dump* feed = nullptr, int layer = -1, const StageSpec* stage = nullptr,
                    const PackedWeights& packed = {}, const WeightRecords& weights = true, bool stop = false,
                    const std::function<void(Engine&, const StageSpec&, int, int)>& after = nullptr);

struct IsolationResult {
  bool judged = false;      // both runs hold the probe
  bool introduced = false;  // still wrong on the reference's exact inputs
  Metrics isolated;         // the isolated probe against the fed reference
  std::string sentence;     // "introduced by stage S: ..." | "amplified: ..."
};

// `iso` is the candidate's run fed from `ref_full` at `first`'s stage. Still beyond `first`'s tolerance: the stage
// introduced the error. Within it: sub-tolerance error upstream was amplified; `growth` (a comparison of the
// candidate against the reference, graph order) says where the error grew fastest relative to its tolerance.
IsolationResult judge_isolation(const Dump& iso, const Dump& ref_full, const ProbeResult& first,
                                const CompareReport& growth);

// Isolation of a captured candidate, whose engine cannot run here (HF transformers, vLLM, ...): the FP32 reference's
// stage fed the candidate's own captured inputs to it (full tensors of every rank), against the candidate's output.
// Still different: the stage introduced the error. Agrees: the stage is right and the error came in with its inputs
// (`rep`, the candidate against the reference, says which input was off most). Without the inputs' full tensors in
// `cand`, judged is false and the sentence says which inputs to capture.
IsolationResult isolate_on_captured_inputs(const Dump& cand, const MlaConfig& cfg, const RunSpec& spec,
                                           const std::vector<LayerWeights>& w, const Inputs& in,
                                           const ProbeResult& first, const CompareReport& rep);

}  // namespace mla
