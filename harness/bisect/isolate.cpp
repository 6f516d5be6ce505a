// In-process runs with reference inputs fed to one stage, and the introduced-or-amplified judgment.
#include "harness/bisect/isolate.h"

#include <algorithm>

#include "harness/report/compare_report.h"
#include "harness/run/runner.h"
#include "probes/collect.h"
#include "reference/reference_engine.h"

namespace mla {

namespace {
// The figure that decided an isolation: NaN/Inf where they disagree, else the overall rel_l2 when it is beyond its
// tolerance, else the worst token's against the per-token tolerance ("rel_l2 0.3 > 0.01", "worst token 0.05 >
// 0.02 (overall rel_l2 0.008 within 0.01)"); within both: "rel_l2 0.001 <= 0.01, worst token 0.002 <= 0.02".
std::string deciding_figure(const Metrics& m, const Tolerance& tol) {
  if (!m.nonfinite_agree) return "NaN/Inf where the other has none (" + m.first_nonfinite + ")";
  if (m.rel_l2 > tol.rel_l2) return "rel_l2 " + fmt_num(m.rel_l2) + " > " + fmt_num(tol.rel_l2);
  if (m.max_token_rel > tol.token_rel)
    return "worst token " + fmt_num(m.max_token_rel) + " > " + fmt_num(tol.token_rel) + " (overall rel_l2 " +
           fmt_num(m.rel_l2) + " within " + fmt_num(tol.rel_l2) + ")";
  return "rel_l2 " + fmt_num(m.rel_l2) + " <= " + fmt_num(tol.rel_l2) + ", worst token " + fmt_num(m.max_token_rel) +
         " <= " + fmt_num(tol.token_rel);
}
}  // namespace

Dump run_in_process(Engine& engine, const MlaConfig& cfg, const RunSpec& spec, const std::vector<LayerWeights>& w,
                    const Inputs& in, const Dump* feed, int layer, const StageSpec* stage, const PackedWeights& packed,
                    const WeightRecords& weights, bool stop,
                    const std::function<void(Engine&, const StageSpec&, int, int)>& after) {
  Runner runner(cfg, spec);
  if (after) runner.set_after_stage(after);
  if (packed.packed && !packed.packed->empty()) runner.set_packed_weights(packed.packed, packed.bugs);
  if (stop && stage && layer >= 0) runner.set_stop_after(layer, stage->stage);
  ProbePlan plan;
  plan.level = ProbeLevel::ProbeLevel_full;
  plan.weights = weights.on;
  plan.only_weights = weights.only;
  CollectSink sink({}, spec.tp);
  Runner::BeforeStage before;
  if (feed && stage)
    before = [&](Engine& e, const StageSpec& st, int l, int rank) {
      if (l != layer || st.stage != stage->stage) return;
      for (const auto& name : st.inputs)
        if (const DumpProbe* p = feed->find(l, name); p && rank < static_cast<int>(p->ranks.size()))
          e.upload(rank, name, p->ranks[rank].data);
    };
  runner.run(engine, w, in, plan, sink, before);
  return sink.take();
}

IsolationResult judge_isolation(const Dump& iso, const Dump& ref_full, const ProbeResult& first,
                                const CompareReport& growth) {
  IsolationResult res;
  const DumpProbe* pi = iso.find(first.layer, first.name);
  const DumpProbe* pr = ref_full.find(first.layer, first.name);
  if (!pi || !pr) return res;
  res.judged = true;
  res.isolated = compare_gathered(gather(*pi), gather(*pr), *pr, first.layer, {});
  res.introduced = !res.isolated.nonfinite_agree || res.isolated.rel_l2 > first.tol.rel_l2 ||
                   res.isolated.max_token_rel > first.tol.token_rel;
  if (res.introduced) {
    res.sentence = "introduced by stage " + first.stage + ": on the reference's exact inputs it is still wrong (" +
                   deciding_figure(res.isolated, first.tol) + ")";
    return res;
  }
  // Upstream error below tolerance, amplified here: where did it grow fastest (relative to tolerance)?
  double best = 0;
  std::string where;
  // Upstream: the probes up to the first divergent one (results are in layer and graph order).
  size_t upto = growth.results.size();
  for (size_t i = 0; i < growth.results.size(); ++i)
    if (growth.results[i].layer == first.layer && growth.results[i].name == first.name) upto = i + 1;
  for (size_t i = 1; i < upto; ++i) {
    const auto &a = growth.results[i - 1], &b = growth.results[i];
    const double ra = a.m.rel_l2 / std::max(a.tol.rel_l2, 1e-30), rb = b.m.rel_l2 / std::max(b.tol.rel_l2, 1e-30);
    if (ra > 0 && rb / ra > best) {
      best = rb / ra;
      where = a.name + " -> " + b.name + " (stage " + b.stage + ", layer " + std::to_string(b.layer) + ")";
    }
  }
  res.sentence = "amplified: on the reference's exact inputs stage " + first.stage + " is right (" +
                 deciding_figure(res.isolated, first.tol) + "); error below tolerance upstream grew, fastest at " + where +
                 " (x" + fmt_num(best, 3) + " relative to tolerance)";
  return res;
}

namespace {
// Every rank's full tensor of a probe.
bool has_full(const Dump& d, int layer, const std::string& name) {
  const DumpProbe* p = d.find(layer, name);
  if (!p || p->ranks.empty() || static_cast<int>(p->ranks.size()) < std::max(d.meta.tp, 1)) return false;
  for (const auto& r : p->ranks)
    if (r.data.numel() == 0) return false;
  return true;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}
}  // namespace

IsolationResult isolate_on_captured_inputs(const Dump& cand, const MlaConfig& cfg, const RunSpec& spec,
                                           const std::vector<LayerWeights>& w, const Inputs& in,
                                           const ProbeResult& first, const CompareReport& rep) {
  IsolationResult res;
  const StageGraph graph = build_graph(cfg, spec.graph_shape());
  const StageSpec* stage = graph.find_stage(parse_stage(first.stage));
  if (!stage) {
    res.sentence = "not isolated: stage " + first.stage + " is not in this run's graph";
    return res;
  }
  if (stage->inputs.empty()) {
    res.introduced = true;
    res.sentence = "introduced by stage " + first.stage + ": it reads only the captured /inputs, which the reference "
                   "ran on too";
    return res;
  }
  std::vector<std::string> lacking;
  for (const auto& n : stage->inputs)
    if (graph.find(n) && !has_full(cand, first.layer, n)) lacking.push_back(n);
  if (!lacking.empty()) {
    res.sentence = "not isolated: the capture lacks the full tensors of stage " + first.stage + "'s inputs (" +
                   joined(lacking) + "); capture them to tell whether the stage introduced the error";
    return res;
  }
  ReferenceEngine engine(std::map<std::string, std::string>{});
  const Dump iso = run_in_process(engine, cfg, spec, w, in, &cand, first.layer, stage, {}, false);
  const DumpProbe* pi = iso.find(first.layer, first.name);
  const DumpProbe* pc = cand.find(first.layer, first.name);
  if (!pi || !pc) return res;
  res.judged = true;
  res.isolated = compare_gathered(gather(*pc), gather(*pi), *pi, first.layer, {});
  res.introduced = !res.isolated.nonfinite_agree || res.isolated.rel_l2 > first.tol.rel_l2 ||
                   res.isolated.max_token_rel > first.tol.token_rel;
  if (res.introduced) {
    res.sentence = "introduced by stage " + first.stage + ": on the candidate's own inputs (" + joined(stage->inputs) +
                   ") the reference's " + first.stage + " gives a different " + first.name + " (" +
                   deciding_figure(res.isolated, first.tol) + ")";
    return res;
  }
  std::string worst_in;
  double worst = -1;
  for (const auto& r : rep.results)
    for (const auto& n : stage->inputs)
      if (r.layer == first.layer && r.name == n && r.m.rel_l2 > worst) {
        worst = r.m.rel_l2;
        worst_in = n + " (rel_l2 " + fmt_num(r.m.rel_l2) + ")";
      }
  res.sentence = "carried in: on the candidate's own inputs the reference's " + first.stage + " agrees with it (" +
                 first.name + " " + deciding_figure(res.isolated, first.tol) + "); the error arrived with its inputs" + (worst_in.empty() ? "" : ", largest in " + worst_in) +
                 ": an earlier stage that was not captured, or error below tolerance amplified here";
  return res;
}

}  // namespace mla
