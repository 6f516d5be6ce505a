// The explorer's isolate command: the probe's stage re-run on the reference's exact inputs (or, for a capture from
// another system, the reference's stage on the capture's own inputs), and the bug classes of a stage that
// introduced the error re-run on the inputs its candidate read (harness/hypotheses).
#include "harness/explore/explore.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <ostream>
#include <sstream>

#include "harness/bisect/isolate.h"
#include "harness/hypotheses/hypotheses.h"
#include "core/engine/engine.h"
#include "core/model/errors.h"
#include "core/model/injection.h"
#include "core/weights/loader.h"

namespace mla {

void Explorer::cmd_isolate(int i) {
  const ProbeResult r = rep_.results[i];
  if (r.verdict == Verdict::Verdict_missing) {
    os_ << r.name << " is not in both dumps: nothing to isolate\n";
    return;
  }
  const Dump& in_dump = ref_.has_inputs ? ref_ : cand_;
  if (!in_dump.has_inputs) {
    os_ << "isolate needs the run's inputs: neither dump has /inputs\n";
    return;
  }
  const MlaConfig cfg = ref_.config();
  RunSpec spec = cand_.meta.run_options.is_null() ? ref_.spec() : cand_.spec();
  const uint64_t weight_seed = ref_.meta.run_options.value("weight_seed", uint64_t{0});
  if (cand_.meta.run_options.value("weight_seed", weight_seed) != weight_seed)
    os_ << "note: the dumps name different weight seeds; isolation uses the reference's (" << weight_seed << ")\n";
  // The candidate engine as its dump recorded it; a hang, crash or fault injection would take this session down.
  const std::string cand_engine = cand_.meta.engine + (cand_.meta.engine_options.empty() ? "" : ":" + cand_.meta.engine_options);
  std::vector<Injection> inject;
  std::string skipped;
  for (auto& inj : parse_injections(cand_.meta.inject)) {
    if (inj.name == "hang-at" || inj.name == "crash-at" || inj.name == "fault-at")
      skipped += (skipped.empty() ? "" : ",") + inj.text;
    else inject.push_back(inj);
  }
  if (!skipped.empty()) os_ << "note: leaving out " << skipped << " (it would stop this session)\n";
  // The weights the reference dump ran with (synthetic, a --weight-format, or a checkpoint that must still be
  // where the dump says); weight injections are a wrong dequantization, so the candidate loads its own.
  const auto& ro = ref_.meta.run_options;
  WeightSpec ws;
  ws.source = ro.value("weights", std::string("synthetic"));
  ws.format = ro.value("weight_format", std::string());
  ws.layer_range = ro.value("layer_range", std::string());
  const StageGraph graph = build_graph(cfg, spec.graph_shape());
  const StageSpec* stage = graph.find_stage(parse_stage(r.stage));
  if (!stage) {
    os_ << "stage " << r.stage << " is not in this run's graph\n";
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto names = engine_names();
  if (std::find(names.begin(), names.end(), cand_.meta.engine) == names.end()) {
    // A capture from another system (HF transformers, vLLM, ...): its engine cannot run here, so the reference's
    // stage runs on the candidate's own captured inputs instead.
    std::vector<LayerWeights> weights;
    try {
      weights = load_weights(ws, cfg, spec, weight_seed).layers;
    } catch (const UsageError& e) {
      os_ << "isolate needs the weights the reference was made with ('" << ws.source << "'): " << e.what() << "\n";
      return;
    }
    os_ << "candidate: " << (cand_.meta.engine.empty() ? "a capture" : cand_.meta.engine)
        << " (captured: it cannot run here); the reference's " << r.stage << " of layer " << r.layer
        << " fed the capture's own inputs ..." << std::endl;
    const IsolationResult res = isolate_on_captured_inputs(cand_, cfg, spec, weights, in_dump.inputs, r, rep_);
    if (res.judged)
      os_ << "isolated " << r.name << ": rel_l2 " << fmt_num(res.isolated.rel_l2) << ", worst token "
          << fmt_num(res.isolated.max_token_rel) << " (tolerance " << fmt_num(r.tol.rel_l2) << ")\n";
    os_ << "isolation: " << res.sentence << "   ("
        << fmt_num(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3) << " s)\n";
    if (res.judged && res.introduced) search_causes(cand_, cand_, cfg, spec, weights, in_dump.inputs, r);
    return;
  }
  std::vector<LayerWeights> weights, cand_weights;
  try {
    weights = load_weights(ws, cfg, spec, weight_seed).layers;
    cand_weights = engine_injections(inject).size() != inject.size()
                       ? load_weights(ws, cfg, spec, weight_seed, inject).layers
                       : weights;
  } catch (const UsageError& e) {
    os_ << "isolate needs the weights the dumps were made with ('" << ws.source << "'): " << e.what() << "\n";
    return;
  }
  if (!ref_full_) {
    os_ << "reference: reference (fp32) on the dumps' inputs, every probe in full ..." << std::endl;
    auto ref_engine = make_engine(EngineSpec::parse("reference"));
    ref_full_ = run_in_process(*ref_engine, cfg, spec, weights, in_dump.inputs, nullptr, -1, nullptr, {}, false);
  }
  auto engine = make_engine(EngineSpec::parse(cand_engine));
  engine->set_injections(engine_injections(inject));
  os_ << "candidate: " << cand_engine << (cand_.meta.inject.empty() ? "" : " (inject " + cand_.meta.inject + ")")
      << ", stage " << r.stage << " of layer " << r.layer << " fed the reference's";
  for (auto& n : stage->inputs) os_ << " " << n;
  os_ << " ..." << std::endl;
  const Dump iso =
      run_in_process(*engine, cfg, spec, cand_weights, in_dump.inputs, &*ref_full_, r.layer, stage, {}, false);
  const IsolationResult res = judge_isolation(iso, *ref_full_, r, rep_);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!res.judged) {
    os_ << "isolation: " << r.name << " is missing from the isolated run or the reference run\n";
    return;
  }
  os_ << "isolated " << r.name << ": rel_l2 " << fmt_num(res.isolated.rel_l2) << ", worst token "
      << fmt_num(res.isolated.max_token_rel) << ", cosine " << fmt_num(res.isolated.cosine, 6) << " (tolerance "
      << fmt_num(r.tol.rel_l2) << ", worst token " << fmt_num(r.tol.token_rel) << ")\n";
  if (!divergent(i) && !res.introduced)
    os_ << "isolation: stage " << r.stage << " is right on the reference's exact inputs (and " << r.name
        << " is within tolerance in the dumps)";
  else
    os_ << "isolation: " << res.sentence;
  os_ << "   (" << fmt_num(secs, 3) << " s)\n";
  if (res.introduced) search_causes(*ref_full_, iso, cfg, spec, weights, in_dump.inputs, r);
}

void Explorer::search_causes(const Dump& inputs_dump, const Dump& outputs_dump, const MlaConfig& cfg,
                             const RunSpec& spec, const std::vector<LayerWeights>& weights, const Inputs& inputs,
                             const ProbeResult& r) {
  if (r.layer >= static_cast<int>(weights.size())) return;
  hyp::StageCase hc;
  std::string why;
  hyp::Report rep;
  if (hyp::make_case(hc, inputs_dump, outputs_dump, cfg, spec, weights[r.layer], inputs, r.layer, parse_stage(r.stage),
                     hyp::stage_tolerances(rep_, r.layer, r.stage), why)) {
    hc.focus = r.name;
    rep = hyp::search(std::move(hc));
  } else {
    rep.reason = "not searched: " + why;
  }
  hyp::print_report(os_, rep);
  if (!rep.confirmed.empty()) os_ << "cause (confirmed by re-running the stage): " << rep.sentence() << "\n";
}

}  // namespace mla
