// Calibrated tolerances: the reference at FP32 against itself at the candidate's precision, on the same config,
// weights and inputs. The difference is the precision's own noise, per probe; a tolerance is k times it.
#pragma once
#include <vector>

#include "harness/compare/compare.h"
#include "harness/model/inputs.h"
#include "harness/model/weights.h"

namespace mla {

// Calibrates tolerances: runs the reference at FP32 and at `precision` on the same config, weights and inputs,
// and takes k × the per-probe error (rel_l2, worst token) as the tolerance, with a floor. `fp32_full`: the FP32
// reference's full-level run on exactly these inputs when the caller has it already (replay), so it is not run again.
ToleranceModel calibrate(const MlaConfig& cfg, const RunSpec& spec, const std::vector<LayerWeights>& weights,
                         const Inputs& inputs, Precision precision, double k = 4.0, const Dump* fp32_full = nullptr);

}  // namespace mla
