// Tolerances for two dumps compared after the fact: calibrated from the reference dump's own inputs,
// config and (synthetic) weights at the candidate's precision, or the FP32 floor when both are FP32.
#include "harness/run/tolerance_for.h"

#include "core/model/errors.h"
#include "harness/run/calibration_cache.h"
#include "core/weights/loader.h"

namespace mla {

ToleranceModel tolerance_for(const Dump& candidate, const Dump& reference, const std::string& mode, double k) {
  if (mode == "exact") return {};
  if (mode != "auto" && mode != "calibrate") throw UsageError("--tolerance must be auto, calibrate or exact");
  const std::string dtype = candidate.meta.engine_dtype.empty() ? "fp32" : candidate.meta.engine_dtype;
  const Precision p = parse_precision(dtype);
  if (p == Precision::Precision_fp32 && mode == "auto") return {};
  if (!reference.has_inputs)
    throw UsageError(reference.path + " has no /inputs: cannot calibrate tolerances (use --tolerance exact or --tol)");
  // The weights the reference ran with: synthetic (seeded, maybe through --weight-format) or a checkpoint,
  // which must still be where the dump says.
  const auto& ro = reference.meta.run_options;
  WeightSpec ws;
  ws.source = ro.value("weights", std::string("synthetic"));
  ws.format = ro.value("weight_format", std::string());
  ws.layer_range = ro.value("layer_range", std::string());
  const MlaConfig cfg = reference.config();
  const RunSpec spec = reference.spec();
  const uint64_t weight_seed = ro.value("weight_seed", uint64_t{0});
  const auto load = [&] {
    try {
      return load_weights(ws, cfg, spec, weight_seed).layers;
    } catch (const UsageError& e) {
      throw UsageError(reference.path + " was made with weights '" + ws.source + "', which calibration needs: " +
                       e.what() + " (use --tolerance exact or --tol)");
    }
  };
  const Precision at = p == Precision::Precision_fp32 ? Precision::Precision_bf16 : p;
  // A checkpoint's weights are keyed by their bytes (and one that is gone is an error, cached or not); synthetic
  // weights by their seed and format, so a cached calibration needs no weights at all.
  if (!ws.synthetic()) return calibrate_cached(cfg, spec, load(), reference.inputs, at, k);
  const CalibrationWeights weights{"synthetic " + ws.source + " seed " + std::to_string(weight_seed) + " format " +
                                       ws.format + " layers " + ws.layer_range,
                                   load};
  return calibrate_cached(cfg, spec, weights, reference.inputs, at, k);
}

}  // namespace mla
