// Tolerance calibration (see calibrate.h): two reference runs, compared probe by probe; the weights' tolerances
// from their own rounding.
#include "harness/run/calibrate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>
#include <string>

#include "harness/compare/diagnose.h"
#include "core/model/progress_hook.h"
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
  if (precision == Precision::Precision_bf16) {
    // Weights bf16 already holds (synthetic ones, bf16 checkpoints): nothing rounds. A bit test in vector lanes.
    int64_t off = 0;
#pragma omp parallel for schedule(static) reduction(+ : off) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) {
      uint32_t b;
      std::memcpy(&b, &w.data[i], 4);
      off += (b & 0xffffu) != 0;
    }
    if (off == 0) return Metrics{};
  }
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
  const ProgressPhase phase("calibration");
  auto run_at = [&](Precision p, const Runner& r) {
    const ProgressPhase run_phase(std::string("reference ") + precision_name(p) + " run");
    ReferenceEngine engine(std::map<std::string, std::string>{{"precision", precision_name(p)}});
    CollectSink sink({}, spec.tp);
    r.run(engine, weights, inputs, plan, sink);
    return sink.take();
  };
  const Dump lo = run_at(precision, runner);
  // DSA: where the two runs' selections swap near-tied keys, the FP32 run attends to the low-precision run's own
  // selection (selection_feed), so the noise measured after topk is rounding, not other keys; a given
  // FP32 run is used only where no selection swaps.
  const bool given = fp32_full && !(cfg.has_dsa() && has_near_tie_swaps(lo, *fp32_full, tm));
  Dump hi_run;
  if (!given) {
    Runner fed(cfg, spec);
    if (cfg.has_dsa()) fed.set_after_stage(selection_feed(lo, inputs, tm, nullptr));
    hi_run = run_at(Precision::Precision_fp32, fed);
  }
  const Dump& hi = given ? *fp32_full : hi_run;
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
  for (const auto& ph : hi.probes)
    if (const DumpProbe* pl = lo.find(ph.layer, ph.name))
      tm.per_probe[std::to_string(ph.layer) + "/" + ph.name] =
          tolerance(compare_gathered(gather(*pl), gather(ph), ph, ph.layer, {}),
                    std::string(precision_name(precision)) + " noise floor ");
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

bool SelectionFed::any() const {
  for (const auto& [layer, t] : tokens)
    if (!t.empty()) return true;
  return false;
}

std::vector<std::string> SelectionFed::notes(const std::string& candidate) const {
  std::vector<std::string> out;
  for (const auto& [layer, t] : tokens) {
    if (t.empty()) continue;
    const auto k = static_cast<int64_t>(t.size());
    const auto it = swaps.find(layer);
    const int64_t s = it == swaps.end() ? 0 : it->second;
    out.push_back("layer " + std::to_string(layer) + ": " + std::to_string(k) + (k == 1 ? " token" : " tokens") +
                  " (" + ranges(t, 8) + ") whose top-k swapped near-tied keys with the reference's (" +
                  std::to_string(s) + (s == 1 ? " swap" : " swaps") + ") " + (k == 1 ? "is" : "are") +
                  " compared in full, in every probe after topk, against the reference's attention on the " +
                  candidate + "'s own selection");
  }
  return out;
}

Runner::BeforeStage selection_feed(const Dump& cand, const Inputs& in, const ToleranceModel& tol,
                                   std::shared_ptr<SelectionFed> fed) {
  struct Held {
    bool ready = false;
    Gathered topk, scores;
  };
  auto held = std::make_shared<std::map<int, Held>>();
  return [&cand, &in, tol, fed, held](Engine& e, const StageSpec& st, int layer, int rank) {
    if (st.stage != Stage::Stage_topk) return;
    Held& h = (*held)[layer];
    if (!h.ready) {
      h.ready = true;
      if (const DumpProbe* p = cand.find(layer, "topk")) h.topk = gather(*p);
      if (const DumpProbe* p = cand.find(layer, "idx_scores")) h.scores = gather(*p);
    }
    if (!h.topk.full || h.topk.data.rank() != 2) return;
    Tensor own = e.download(rank, "topk");
    if (own.shape != h.topk.data.shape) return;
    const Tensor scores = e.download(rank, "idx_scores");
    const bool have = scores.rank() == 2 && scores.dim(0) == own.dim(0);
    const bool have_cand = have && h.scores.full && h.scores.data.shape == scores.shape;
    double fallback = 0;
    if (have) {
      double sum2 = 0;
      for (float v : scores.data) sum2 += static_cast<double>(v) * v;
      const double rms = std::sqrt(sum2 / static_cast<double>(std::max<int64_t>(1, scores.numel())));
      fallback = 2 * tol.for_probe("idx_scores", layer).rel_l2 * rms;
    }
    const Batch* batch = in.batch.tokens() == own.dim(0) ? &in.batch : nullptr;
    const SelectionDiff d = compare_topk(own, h.topk.data, have ? &scores : nullptr,
                                         have_cand ? &h.scores.data : nullptr, batch, fallback);
    if (d.swapped_tokens.empty()) return;
    const int64_t k = own.dim(1);
    for (int64_t t : d.swapped_tokens)
      std::copy_n(h.topk.data.data.begin() + t * k, k, own.data.begin() + t * k);
    e.upload(rank, "topk", own);
    if (fed && fed->tokens.count(layer) == 0) {
      fed->tokens[layer] = d.swapped_tokens;
      fed->swaps[layer] = d.near_tie_swaps;
    }
  };
}

bool has_near_tie_swaps(const Dump& cand, const Dump& ref, const ToleranceModel& tol) {
  for (const auto& p : ref.probes)
    if (p.name == "topk" && !near_tie_tokens(cand, ref, p.layer, tol).empty()) return true;
  return false;
}

}  // namespace mla
