// Tolerances for two dumps compared after the fact: calibrated from the reference dump's own inputs,
// config and (synthetic) weights at the candidate's precision, or the FP32 floor when both are FP32.
#include "harness/compare/tolerance_for.h"

#include "harness/model/errors.h"

namespace mla {

ToleranceModel tolerance_for(const Dump& candidate, const Dump& reference, const std::string& mode, double k) {
  if (mode == "exact") return {};
  if (mode != "auto" && mode != "calibrate") throw UsageError("--tolerance must be auto, calibrate or exact");
  const std::string dtype = candidate.meta.engine_dtype.empty() ? "fp32" : candidate.meta.engine_dtype;
  const Precision p = parse_precision(dtype);
  if (p == Precision::Precision_fp32 && mode == "auto") return {};
  if (!reference.has_inputs)
    throw UsageError(reference.path + " has no /inputs: cannot calibrate tolerances (use --tolerance exact or --tol)");
  const auto weights_spec = reference.meta.run_options.value("weights", std::string("synthetic"));
  if (weights_spec != "synthetic")
    throw UsageError(reference.path + " was made with weights '" + weights_spec +
                     "': calibration needs them (use --tolerance exact or --tol)");
  const MlaConfig cfg = reference.config();
  const RunSpec spec = reference.spec();
  const uint64_t weight_seed = reference.meta.run_options.value("weight_seed", uint64_t{0});
  const auto weights = synthetic_weights(cfg, spec.layers, spec.graph_shape().input_norm, weight_seed);
  return calibrate(cfg, spec, weights, reference.inputs, p == Precision::Precision_fp32 ? Precision::Precision_bf16 : p, k);
}

}  // namespace mla
