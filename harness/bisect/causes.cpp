// The causes of a comparison's first divergence, on the candidate dump's own tensors.
#include "harness/bisect/causes.h"

#include "core/weights/loader.h"

namespace mla {

hyp::Report causes_of_first_divergence(const Dump& cand, const Dump& ref, const CompareReport& rep) {
  hyp::Report r;
  if (rep.first_divergence < 0) return r;
  const ProbeResult& first = rep.results[rep.first_divergence];
  r.stage = first.stage;
  r.layer = first.layer;
  if (first.weight) {
    r.reason = "not searched: the first divergence is a weight";
    return r;
  }
  const Dump& with_inputs = cand.has_inputs ? cand : ref;
  if (!with_inputs.has_inputs || ref.meta.model.is_null() || ref.meta.run_options.is_null()) {
    r.reason = "not searched: the dumps carry no inputs or run spec to re-run the stage on";
    return r;
  }
  try {
    const MlaConfig cfg = ref.config();
    const RunSpec spec = ref.spec();
    const auto& ro = ref.meta.run_options;
    WeightSpec ws;
    ws.source = ro.value("weights", std::string("synthetic"));
    ws.format = ro.value("weight_format", std::string());
    ws.layer_range = ro.value("layer_range", std::string());
    const auto weights = load_weights(ws, cfg, spec, ro.value("weight_seed", uint64_t{0})).layers;
    if (first.layer >= static_cast<int>(weights.size())) {
      r.reason = "not searched: layer " + std::to_string(first.layer) + " has no weights here";
      return r;
    }
    hyp::StageCase hc;
    std::string why;
    if (!hyp::make_case(hc, cand, cand, cfg, spec, weights[first.layer], with_inputs.inputs, first.layer,
                        parse_stage(first.stage), hyp::stage_tolerances(rep, first.layer, first.stage), why)) {
      r.reason = "not searched: " + why + " (record it in full, e.g. --full-probes, to test causes)";
      return r;
    }
    hc.focus = first.name;
    return hyp::search(std::move(hc));
  } catch (const std::exception& e) {
    r.reason = std::string("not searched: ") + e.what();
    return r;
  }
}

}  // namespace mla
