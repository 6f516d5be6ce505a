// Tolerance calibration (see calibrate.h): two reference runs, compared probe by probe; the weights' tolerances
// from their own rounding.
#include "harness/run/calibrate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <string>

#include "harness/run/runner.h"
#include "probes/collect.h"
#include "reference/reference_engine.h"

namespace mla {

namespace {

// A weight against itself rounded to `precision` (what the reference at that precision computes with): rel_l2 over
// the tensor and the worst row's, as compare_gathered measures a weight's records (rows: the first axis; a norm's
// weight is one row). The same numbers as recording both runs' weights in full and comparing them, without a run.
Metrics weight_rounding(const Tensor& w, Precision precision) {
  const int64_t n = w.numel();
  const int64_t rows = w.shape.size() > 1 ? w.shape[0] : 1, cols = rows ? n / rows : 0;
  const auto round = [&](float v) { return precision == Precision::Precision_bf16 ? round_bf16(v) : round_fp16(v); };
  std::vector<double> row_d(rows, 0.0), row_b(rows, 0.0);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float y = w.data[r * cols + c], x = round(y);
      if (!std::isfinite(x) || !std::isfinite(y)) continue;  // a weight's non-finite values are the weight check's
      const double d = static_cast<double>(x) - y;
      row_d[r] += d * d;
      row_b[r] += static_cast<double>(y) * y;
    }
  Metrics m;
  double dd = 0, bb = 0;
  for (int64_t r = 0; r < rows; ++r) {
    dd += row_d[r];
    bb += row_b[r];
    m.max_token_rel = std::max(m.max_token_rel, ratio_or_inf(std::sqrt(row_d[r]), std::sqrt(row_b[r])));
  }
  m.rel_l2 = ratio_or_inf(std::sqrt(dd), std::sqrt(bb));
  return m;
}

}  // namespace

ToleranceModel calibrate(const MlaConfig& cfg, const RunSpec& spec, const std::vector<LayerWeights>& weights,
                         const Inputs& inputs, Precision precision, double k, const Dump* fp32_full) {
  ToleranceModel tm;
  if (precision == Precision::Precision_fp32) return tm;  // the fallback floor is the model
  Runner runner(cfg, spec);
  ProbePlan plan;
  plan.level = ProbeLevel::ProbeLevel_full;
  plan.weights = false;  // the weights' tolerances come from their rounding, below
  auto run_at = [&](Precision p) {
    ReferenceEngine engine(std::map<std::string, std::string>{{"precision", precision_name(p)}});
    CollectSink sink({}, spec.tp);
    runner.run(engine, weights, inputs, plan, sink);
    return sink.take();
  };
  const Dump lo = run_at(precision);
  const Dump hi_run = fp32_full ? Dump{} : run_at(Precision::Precision_fp32);
  const Dump& hi = fp32_full ? *fp32_full : hi_run;
  // One ulp of the candidate's format, relative: an error below it is rounding, whatever the stage.
  const double ulp = precision == Precision::Precision_bf16 ? 1.0 / 256 : 1.0 / 2048;
  const auto tolerance = [&](const Metrics& m, const std::string& what) {
    Tolerance t;
    t.rel_l2 = std::max(k * m.rel_l2, ulp);
    t.token_rel = std::max(k * m.max_token_rel, 2 * ulp);
    std::ostringstream os;
    os.precision(2);
    os << "calibrated: " << k << " x " << what << std::scientific << m.rel_l2 << " (floor: 1 "
       << precision_name(precision) << " ulp)";
    t.origin = os.str();
    return t;
  };
  // DSA: tokens whose two selections swap near-tied keys attend to other keys by design; compare excuses them in the
  // probes that read the selection, and so does the noise measured here (else it would hold those swaps).
  std::map<int, std::vector<int64_t>> swapped;
  for (int l = 0; l < spec.layers && cfg.has_dsa(); ++l) swapped[l] = near_tie_tokens(lo, hi, l, tm);
  for (const auto& ph : hi.probes)
    if (const DumpProbe* pl = lo.find(ph.layer, ph.name)) {
      Gathered g_lo = gather(*pl);
      const Gathered g_hi = gather(ph);
      if (reads_selection(ph.stage) && swapped.count(ph.layer)) excuse_tokens(g_lo, g_hi, swapped[ph.layer]);
      tm.per_probe[std::to_string(ph.layer) + "/" + ph.name] =
          tolerance(compare_gathered(g_lo, g_hi, ph, ph.layer, {}),
                    std::string(precision_name(precision)) + " noise floor ");
    }
  // The weights as the candidate's precision holds them: the FP32 weights rounded (their rounding is the floor).
  for (int l = 0; l < spec.layers && l < static_cast<int>(weights.size()); ++l)
    for (const auto& ws : build_weights(cfg, spec.graph_shape())) {
      const auto field = weight_field(ws.name);
      if (!field || (weights[l].*field).numel() == 0) continue;
      tm.per_probe[std::to_string(l) + "/weights/" + ws.name] =
          tolerance(weight_rounding(weights[l].*field, precision),
                    std::string("the weight's own ") + precision_name(precision) + " rounding ");
    }
  return tm;
}

}  // namespace mla
