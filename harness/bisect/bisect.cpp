// Bisect orchestration.
#include "harness/bisect/bisect.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <iostream>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "harness/bisect/child.h"
#include "harness/bisect/isolate.h"
#include "harness/bisect/reference_run.h"
#include "harness/compare/format.h"
#include "harness/compare/weight_diff.h"
#include "core/model/errors.h"
#include "core/weights/weight_cache.h"
#include "harness/report/compare_report.h"
#include "harness/report/progress.h"
#include "harness/run/calibration_cache.h"
#include "harness/run/run_meta.h"
#include "harness/run/runner.h"
#include "harness/run/synthetic_inputs.h"
#include "probes/full_sidecar.h"
#include "probes/collect.h"

namespace mla {

namespace {

std::string child_engine_line(const std::vector<std::string>& argv) {
  std::string s;
  for (auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

// A progress line of a child run ("[12.3 s] what"): its words, or "" for any other line.
std::string child_progress_words(const std::string& line) {
  if (line.size() < 7 || line[0] != '[') return "";
  const size_t end = line.find(" s] ");
  if (end == std::string::npos || end < 2) return "";
  for (size_t i = 1; i < end; ++i)
    if (!std::isdigit(static_cast<unsigned char>(line[i])) && line[i] != '.') return "";
  return line.substr(end + 4);
}

// The folder of loaded weights the child runs read (core/weights/weight_cache.h): WORKDIR/.weights, removed when
// the children are done or the bisect ends.
struct WeightCacheFolder {
  std::string dir;
  explicit WeightCacheFolder(const std::string& workdir) : dir((std::filesystem::path(workdir) / ".weights").string()) {
    remove();  // what a killed bisect left
  }
  ~WeightCacheFolder() { remove(); }
  void remove() const {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

}  // namespace

BisectReport run_bisect(const BisectOptions& opt) {
  const ProgressLog progress(opt.progress);
  ProgressTicks ticks(progress);  // the work below says how far it is (weights, in-process runs, calibration)
  BisectReport rep;
  rep.candidate_engine = opt.candidate;
  rep.inject = opt.inject;
  auto step = [&](const std::string& what) { progress.step(what); };
  // Everything that can refuse the options comes before any file of the workdir is touched: the engines, the
  // injections and the weights they act on (a weight injection needs quantized weights: load_weights says).
  const MlaConfig& cfg = opt.cfg;
  const RunSpec& spec = opt.spec;
  const EngineSpec ref_spec = EngineSpec::parse(opt.reference);
  const EngineSpec cand_spec = EngineSpec::parse(opt.candidate);
  // Calibration's FP32 side is the plain reference: the reference given is it when its canonical options are.
  const bool ref_is_fp32 = ref_spec.name == "reference" && make_engine(ref_spec)->options() ==
                                                               make_engine(EngineSpec::parse("reference"))->options();
  if (cand_spec.name == "reference") make_engine(cand_spec);  // its options checked (another engine: its child's)
  // Weight injections are a wrong dequantization (core/weights): the candidate's in-process runs get their own.
  const auto injections = parse_injections(opt.inject);
  const bool weight_bugs = engine_injections(injections).size() != injections.size();
  // An engine that dequantizes on its own side (cuda) gets the packed weights in process too, as its child run did:
  // a bug in its dequantization must show in the in-process runs as well.
  const bool cand_packed = engine_dequantizes(cand_spec.name, opt.weights);
  // The weights are loaded once, here: the candidate's injected ones dequantized again from the same packed bytes,
  // and both handed to the child runs through a cache folder (below).
  step("weights: " + opt.weights.source + (opt.weights.format.empty() ? "" : ", through " + opt.weights.format));
  const LoadedWeights ref_loaded = load_weights(opt.weights, cfg, spec, opt.weight_seed, {}, cand_packed || weight_bugs);
  const auto& weights = ref_loaded.layers;
  LoadedWeights cand_own;
  if (weight_bugs) {
    step("weights for the candidate's in-process runs (with --inject " + opt.inject + ")");
    if (!redequantize(ref_loaded, injections, cand_packed, cand_own))
      cand_own = load_weights(opt.weights, cfg, spec, opt.weight_seed, injections, cand_packed);
  }
  const LoadedWeights& cand_loaded = weight_bugs ? cand_own : ref_loaded;
  const auto& cand_weights = cand_loaded.layers;
  const PackedWeights cand_pw{cand_packed ? &cand_loaded.packed : nullptr, dequant_bugs(injections)};

  // The dumps of an earlier bisect in the workdir are kept as FILE.h5.previous (as run --out keeps them).
  std::filesystem::create_directories(opt.workdir);
  rep.reference_dump = (std::filesystem::path(opt.workdir) / "reference.h5").string();
  rep.candidate_dump = (std::filesystem::path(opt.workdir) / "candidate.h5").string();
  for (auto& p : {rep.reference_dump, rep.candidate_dump, full_sidecar_path(rep.reference_dump),
                  full_sidecar_path(rep.candidate_dump)}) {
    std::error_code ec;
    if (std::filesystem::exists(p + ".journal", ec)) std::filesystem::rename(p + ".journal", p + ".previous.journal", ec);
    if (std::filesystem::exists(p, ec)) std::filesystem::rename(p, p + ".previous", ec);
    if (ec) throw UsageError(p + ": cannot move the earlier dump there aside: " + ec.message());
  }
  const double backstop = std::max(60.0, 20 * opt.timeout_s);
  auto child_argv = [&](const std::string& engine, const std::string& out, const std::string& inject) {
    // With progress on, the children print their own lines, which come back here (forward, below).
    std::vector<std::string> a = {self_exe(), "run", "--no-table"};
    if (!opt.progress) a.push_back("--quiet");
    a.insert(a.end(), opt.run_args.begin(), opt.run_args.end());
    a.insert(a.end(), {"--engine", engine, "--out", out, "--watchdog", fmt_num(opt.timeout_s, 6)});
    if (!inject.empty()) a.insert(a.end(), {"--inject", inject});
    return a;
  };

  // The two runs at once, so the reference's CPU work overlaps the candidate's (its device work, or its own CPU work
  // where cores are free). The candidate runs in a child process, which a crash or hang of it cannot take down. The
  // plain FP32 reference runs in this process when the run options are at hand (it writes the dump its child would,
  // and keeps every probe in full for calibration and the drill-down); otherwise in a child too. Idle OpenMP threads
  // of a child sleep instead of spinning (unless OMP_WAIT_POLICY says otherwise), so neither starves the other.
  const bool ref_here = ref_is_fp32 && !opt.run_options.is_null();
  step("reference run (" + opt.reference + (ref_here ? ", in this process" : "") + ") and candidate run (" +
       opt.candidate + (opt.inject.empty() ? "" : " --inject " + opt.inject) + "), side by side");
  const auto ref_argv = child_argv(opt.reference, rep.reference_dump, "");
  const auto cand_argv = child_argv(opt.candidate, rep.candidate_dump, opt.inject);
  std::vector<std::string> child_env;
  if (!std::getenv("OMP_WAIT_POLICY")) child_env.push_back("OMP_WAIT_POLICY=PASSIVE");
  // The children read the weights loaded above instead of loading them again; the folder goes when they are done.
  // The two entries are written side by side, and each child starts once the entry it reads is there. Synthetic
  // weights in FP32 are made as fast as they are written and read back: those children make their own.
  const WeightCacheFolder weight_cache(opt.workdir);
  const bool share = !opt.weights.synthetic() || !opt.weights.format.empty();
  const auto share_async = [&](const std::vector<Injection>& inj, const LoadedWeights& w, bool wanted) {
    return std::async(std::launch::async, [&, inj, wanted] {
      if (share && wanted) share_weights(weight_cache.dir, opt.weights, cfg, spec, opt.weight_seed, inj, w);
    }).share();
  };
  const std::shared_future<void> ref_shared = share_async({}, ref_loaded, !ref_here || !weight_bugs);
  const std::shared_future<void> cand_shared = weight_bugs ? share_async(injections, cand_own, true) : ref_shared;
  if (share) child_env.push_back(std::string(kWeightCacheEnv) + "=" + weight_cache.dir);
  // The runs' progress lines (a child's taken out of its output): one line says where both runs are, when one is due.
  std::mutex runs_mu;
  std::string runs_at[2] = {"starting", "starting"};
  const auto progress_at = [&](int which, const std::string& words) {
    const std::lock_guard<std::mutex> lock(runs_mu);
    runs_at[which] = words;
    if (progress.due()) progress.step("reference run: " + runs_at[0] + " | candidate run: " + runs_at[1]);
  };
  const auto forward = [&](int which) {
    return [&, which](const std::string& line) {
      const std::string words = child_progress_words(line);
      if (words.empty()) return false;
      progress_at(which, words);
      return true;
    };
  };
  auto cand_run = std::async(std::launch::async, [&] {
    cand_shared.wait();
    return run_child(cand_argv, backstop, child_env, forward(1));
  });
  // The calibration's FP32 side and the drill-down's reference tensors (below): every probe in full, made once.
  std::optional<Dump> ref_full;
  std::set<std::string> ref_full_weights;  // the weights it holds in full
  bool ref_full_fed = false;
  std::optional<Inputs> inputs_here;
  ChildResult ref_child;
  if (ref_here) {
    struct RunsLine : ProgressHook {
      std::function<void(const std::string&)> at;
      void tick(const std::string& what, double fraction, double eta_s) override {
        at(what + fmt_fraction_eta(fraction, eta_s));
      }
    } line;
    line.at = [&](const std::string& words) { progress_at(0, words); };
    try {
      const ProgressHookScope scope(progress.on() ? &line : nullptr);
      inputs_here = synthetic_inputs(cfg, spec, weights);
      auto e = make_engine(ref_spec);
      std::string command = "mla-bisect run";
      for (size_t i = 3; i < ref_argv.size(); ++i)  // past the binary, "run" and "--no-table"
        if (ref_argv[i] != "--quiet") command += " " + shell_quote(ref_argv[i]);
      const RunDescription described{opt.run_options, probe_level_name(opt.plan.level), "", command};
      const DumpMeta meta = run_dump_meta(*e, cfg, spec, described, ref_loaded.description);
      ref_full = run_reference_here(*e, cfg, spec, weights, *inputs_here, opt.plan, meta, rep.reference_dump);
      line.at("run done");
      ref_child.exit_code = 0;
    } catch (const std::exception& ex) {
      ref_child.exit_code = ExitCode_engine;
      ref_child.output = ex.what();
    }
  } else {
    ref_shared.wait();
    ref_child = run_child(ref_argv, backstop, child_env, forward(0));
  }
  const ChildResult cand_child = cand_run.get();
  weight_cache.remove();
  if (ref_child.exit_code != 0)
    throw EngineError("the reference run " + (ref_here ? "(in this process) failed: " + ref_child.output
                                                       : ref_child.describe() + ":\n  " + child_engine_line(ref_argv) +
                                                             "\n" + ref_child.output));
  if (cand_child.exit_code == ExitCode_usage)
    throw UsageError("the candidate rejected its options: " + cand_child.output);

  const Dump ref = read_dump(rep.reference_dump);
  if (!std::filesystem::exists(rep.candidate_dump) && !std::filesystem::exists(rep.candidate_dump + ".journal")) {
    rep.exit_code = ExitCode_engine;
    rep.crash = "the candidate " + cand_child.describe() + " before writing anything:\n" + cand_child.output;
    rep.headline = "candidate failed before its first probe";
    return rep;
  }
  const Dump cand = read_dump(rep.candidate_dump);

  // Tolerances: the reference at the candidate's precision against FP32, on these very inputs and weights.
  step("calibrating tolerances (reference fp32 vs " + cand.meta.engine_dtype + ")");
  const Inputs inputs = inputs_here ? *inputs_here : ref.has_inputs ? ref.inputs : synthetic_inputs(cfg, spec, weights);
  const Precision cand_precision =
      cand.meta.engine_dtype.empty() ? Precision::Precision_fp32 : parse_precision(cand.meta.engine_dtype);
  // The reference's full-level run on these inputs: calibration's FP32 side (when the reference is the plain FP32
  // reference) and the full tensors below; made once. Weight records only where a weight differs (weight_cause).
  // `upto`: a run that may stop after that stage of that layer (nullptr: every stage, as calibration needs).
  // `fed` set: the run is made on the candidate's selection where its top-k swapped near-tied keys
  // (harness/run/calibrate.h).
  std::shared_ptr<SelectionFed> fed;
  ToleranceModel tol;
  // `with_weights`: these weights too, in full (a run that stops after the first stage of `layer` records them: each
  // layer's weights are recorded before its first stage).
  const auto reference_full = [&](const std::set<std::string>& with_weights, int layer,
                                  const StageSpec* upto) -> const Dump& {
    if (!ref_full || ref_full_fed != static_cast<bool>(fed)) {
      const ProgressPhase phase("reference run with every probe in full");
      auto e = make_engine(ref_spec);
      ref_full = run_in_process(*e, cfg, spec, weights, inputs, nullptr, layer, upto, {}, false, upto,
                                fed ? selection_feed(cand, inputs, tol, fed) : nullptr);
      ref_full_weights.clear();
      ref_full_fed = static_cast<bool>(fed);
    }
    if (!with_weights.empty() && with_weights != ref_full_weights) {
      const ProgressPhase phase("reference's weights in full");
      const StageGraph g = build_graph(cfg, spec.graph_shape());
      auto e = make_engine(ref_spec);
      ref_full->weights = run_in_process(*e, cfg, spec, weights, inputs, nullptr, std::max(layer, 0),
                                         &g.stages.front(), {}, with_weights, true)
                              .weights;
      ref_full_weights = with_weights;
    }
    return *ref_full;
  };
  // DSA: calibration makes its own FP32 run, on its low-precision run's selection where they swap near-ties.
  tol = calibrate_cached(cfg, spec, weights, inputs, cand_precision, opt.k, [&]() -> const Dump* {
    return ref_is_fp32 && !cfg.has_dsa() ? &reference_full({}, -1, nullptr) : nullptr;
  });
  tol.overrides = opt.overrides;

  // DSA: a candidate whose top-k swapped near-tied keys with the reference's attends to other keys there by design;
  // those tokens are held, in every probe after topk, to the reference's attention on the candidate's own selection
  // (a reference run in this process), never excused.
  const Dump* against = &ref;
  if (cfg.has_dsa() && has_near_tie_swaps(cand, ref, tol)) {
    step("reference on the candidate's selection (its top-k swapped near-tied keys)");
    fed = std::make_shared<SelectionFed>();
    against = &reference_full({}, -1, nullptr);
  }
  rep.compare = compare_dumps(cand, *against, tol);
  if (fed) {
    rep.compare.b_path = rep.reference_dump + " (re-run in process on the candidate's selection)";
    for (auto& n : fed->notes()) rep.compare.notes.push_back(n);
  }
  if (!cand.complete() || cand_child.exit_code != 0) {
    rep.exit_code = ExitCode_engine;
    rep.crash = "the candidate " + cand_child.describe() + "; its dump says: " + cand.status;
    rep.last_stage = cand.last_stage;
    if (!cand.probes.empty()) {
      const auto& p = cand.probes.back();
      rep.last_committed = "layer " + std::to_string(p.layer) + " probe " + p.name + " (" +
                           std::to_string(p.ranks.size()) + " rank" + (p.ranks.size() == 1 ? "" : "s") + ")";
    }
    rep.headline = cand_child.timed_out || cand.status.find("hung") != std::string::npos ? "candidate HUNG"
                                                                                           : "candidate CRASHED";
    if (rep.compare.first_divergence >= 0) rep.first = rep.compare.results[rep.compare.first_divergence];
    rep.seconds = progress.seconds();
    return rep;
  }
  if (rep.compare.first_divergence < 0) {
    // A candidate that finished without recording every probe of the graph has not passed.
    rep.exit_code = rep.compare.exit_code();
    rep.headline = rep.exit_code == ExitCode_ok ? "no divergence: every probe within its calibrated tolerance"
                   : rep.compare.first_weight >= 0
                       ? "weight differs, no probe beyond tolerance: " + weight_sentence(rep.compare.weights[rep.compare.first_weight])
                       : "probes missing: " + rep.compare.verdict_line();
    rep.seconds = progress.seconds();
    return rep;
  }
  rep.exit_code = ExitCode_divergence;
  rep.first = rep.compare.results[rep.compare.first_divergence];
  const ProbeResult& first = *rep.first;

  // Full tensors where needed: the reference and the candidate in this process, then the isolation run. Each stops
  // after the divergent stage: the drill-down, the diagnosis and isolation look at it and what came before.
  step("full tensors for " + first.name + " and isolation of stage " + first.stage);
  const StageGraph graph = build_graph(cfg, spec.graph_shape());
  const StageSpec* stage = graph.find_stage(parse_stage(first.stage));
  // Weights in full only where the dumps say one differs that the divergent stage, or a stage before it, computes
  // with (the cause weight_cause names): the in-process comparison names its pattern.
  std::set<std::string> cause_weights;
  const auto no_later = [&](const ProbeResult& w) {  // the stage enum runs in execution order
    try {
      return static_cast<int>(parse_stage(w.stage)) <= static_cast<int>(parse_stage(first.stage));
    } catch (const std::exception&) {
      return true;  // a stage this build does not know: kept
    }
  };
  for (const auto& w : rep.compare.weights)
    if ((w.verdict == Verdict::Verdict_diverge || w.verdict == Verdict::Verdict_nonfinite) &&
        (w.layer < first.layer || (w.layer == first.layer && no_later(w))))
      cause_weights.insert(w.name);
  const Dump& ref_full_dump = reference_full(cause_weights, first.layer, stage);
  auto make_candidate = [&] {
    auto e = make_engine(EngineSpec::parse(opt.candidate));
    e->set_injections(engine_injections(injections));
    return e;
  };
  auto cand_engine = make_candidate();
  const Dump cand_full = [&] {
    const ProgressPhase phase("candidate run with every probe in full");
    return run_in_process(*cand_engine, cfg, spec, cand_weights, inputs, nullptr, first.layer, stage, cand_pw,
                          cause_weights, true);
  }();
  const CompareReport full_rep = [&] {
    const ProgressPhase phase("the full tensors");
    return compare_dumps(cand_full, ref_full_dump, tol);
  }();
  for (const auto& r : full_rep.results)
    if (r.layer == first.layer && r.name == first.name) rep.full = r.m;
  if (const DumpProbe *pa = cand_full.find(first.layer, first.name), *pb = ref_full_dump.find(first.layer, first.name);
      pa && pb) {
    const Gathered ga = gather(*pa), gb = gather(*pb);
    if (ga.full && gb.full) {
      rep.first_values = value_histogram(ga.data.data, gb.data.data);
      rep.first_values.probe = "layer " + std::to_string(first.layer) + " " + first.name;
      rep.first_values.source = "full tensors recomputed in process";
    }
  }

  // The full tensors of the divergent stage (its inputs and outputs) stay in the workdir beside the dumps, for
  // explore's worst, slice and channels (taken where they equal the dumps' records, checksum for checksum).
  if (stage) {
    std::set<std::string> names(stage->inputs.begin(), stage->inputs.end());
    names.insert(stage->outputs.begin(), stage->outputs.end());
    try {
      const ProgressPhase phase("keeping the stage's full tensors beside the dumps");
      write_full_sidecar(cand, cand_full, first.layer, names);
      write_full_sidecar(ref, ref_full_dump, first.layer, names);
    } catch (const std::exception& e) {
      std::cerr << "warning: the full tensors of stage " << first.stage << " were not kept in " << opt.workdir << ": "
                << e.what() << "\n";
    }
  }

  auto iso_engine = make_candidate();
  const Dump iso = [&] {
    const ProgressPhase phase("isolation: the candidate with stage " + first.stage + " fed the reference's inputs");
    return run_in_process(*iso_engine, cfg, spec, cand_weights, inputs, &ref_full_dump, first.layer, stage, cand_pw,
                          false, true);
  }();
  const IsolationResult judged = judge_isolation(iso, ref_full_dump, first, full_rep);
  if (judged.judged) {
    rep.isolated = judged.isolated;
    rep.isolation = judged.sentence;
  }
  // The stage introduced the error: re-run it under each known bug class, on the same inputs the candidate's stage
  // just read (the reference's), against what it wrote.
  if (judged.judged && judged.introduced && stage && first.layer < static_cast<int>(weights.size())) {
    step("hypotheses: the bug classes of stage " + first.stage + " on its inputs");
    hyp::StageCase hc;
    std::string why;
    if (hyp::make_case(hc, ref_full_dump, iso, cfg, spec, weights[first.layer], inputs, first.layer, stage->stage,
                       hyp::stage_tolerances(full_rep, first.layer, first.stage), why)) {
      hc.focus = first.name;
      rep.hypotheses = hyp::search(std::move(hc));
    } else {
      rep.hypotheses.reason = "not searched: " + why;
    }
  } else if (judged.judged && !judged.introduced) {
    rep.hypotheses.reason = "not searched: stage " + first.stage + " is right on the reference's inputs (amplified)";
  }
  const Metrics& m = rep.full.basis.empty() ? first.m : rep.full;
  const ProgressPhase phase("drill-down and diagnosis");
  rep.drill = drill_down(first, m, first.tol);
  rep.diagnosis = diagnose(first, m, first.tol, inputs.batch, full_rep);
  hyp::explain(rep.diagnosis, rep.hypotheses);
  rep.headline = "first divergence: layer " + std::to_string(first.layer) + " " + first.name + " (stage " +
                 first.stage + ")";
  // A weight the stage (or an earlier one) computes with differs: that is the cause, whatever isolation says. The
  // in-process comparison has the weights in full (block shapes, transposes); the dumps' sketches stand in otherwise.
  const ProbeResult* cause = weight_cause(full_rep, first);
  if (!cause) cause = weight_cause(rep.compare, first);
  if (cause) {
    rep.weight_cause = *cause;
    blame_weight(rep.diagnosis, *cause);
    rep.headline = "first divergence: layer " + std::to_string(cause->layer) + " weight " + cause->name +
                   " (stage " + cause->stage + "), then probe " + first.name;
    if (!rep.isolation.empty())
      rep.isolation += "; the stage computes with a weight that differs (" + cause->name + "): the weight is the cause";
  }
  rep.seconds = progress.seconds();
  return rep;
}

ValueHistogram value_histogram(const std::vector<float>& a, const std::vector<float>& b, int bins) {
  ValueHistogram h;
  bool any = false;
  for (const auto* v : {&a, &b})
    for (float x : *v)
      if (std::isfinite(x)) {
        h.lo = any ? std::min<double>(h.lo, x) : x;
        h.hi = any ? std::max<double>(h.hi, x) : x;
        any = true;
      }
  if (!any || bins < 1) return h;
  if (h.hi <= h.lo) h.hi = h.lo + 1;
  h.candidate.assign(bins, 0);
  h.reference.assign(bins, 0);
  const auto fill = [&](const std::vector<float>& v, std::vector<int64_t>& n, int64_t& bad) {
    for (float x : v) {
      if (!std::isfinite(x)) {
        ++bad;
        continue;
      }
      n[std::clamp(static_cast<int>((x - h.lo) / (h.hi - h.lo) * bins), 0, bins - 1)]++;
    }
  };
  fill(a, h.candidate, h.candidate_nonfinite);
  fill(b, h.reference, h.reference_nonfinite);
  return h;
}

void print_bisect(std::ostream& os, const BisectReport& r) {
  os << "\n== mla-bisect: " << r.headline << " ==\n";
  os << "candidate " << r.candidate_engine << (r.inject.empty() ? "" : " (inject " + r.inject + ")") << "\n";
  if (!r.crash.empty()) {
    os << "\n" << r.crash << "\n";
    if (!r.last_committed.empty()) os << "last committed probe: " << r.last_committed << "\n";
    for (size_t k = 0; k < r.last_stage.size(); ++k)
      if (!r.last_stage[k].empty()) os << "  rank " << k << ": last began " << r.last_stage[k] << "\n";
  }
  if (r.first) {
    const auto& f = *r.first;
    os << "\nwhere     layer " << f.layer << ", probe " << f.name << ", stage " << f.stage << "\n";
    // The dumps' numbers come from sketches when they hold no full tensors; the drill-down and diagnosis below
    // read the full tensors recomputed in this process. Both are printed, each with what it rests on.
    // DSA's topk is compared as sets of keys from its full indices: exact, with nothing to recompute.
    const bool exact = f.m.basis == "full" || f.m.basis == "sets";
    os << "error     " << f.why << (exact ? "" : "  [estimate (from sketches/norms)]") << "\n";
    if (!exact && !r.full.basis.empty())
      os << "          rel_l2 " << fmt_num(r.full.rel_l2) << ", worst token " << fmt_num(r.full.max_token_rel)
         << " on full tensors (recomputed in process): drill-down and diagnosis below use these\n";
    os << "tolerance " << f.tol.origin << "\n";
    if (!r.isolation.empty()) os << "isolation " << r.isolation << "\n";
    hyp::print_report(os, r.hypotheses);
    if (r.weight_cause) print_weight_difference(os, *r.weight_cause);
    print_findings(os, Findings{r.drill, r.diagnosis});
  }
  if (!r.compare.results.empty()) {
    os << "\nprobes (candidate vs reference, graph order)\n";
    print_compare(os, r.compare, true);
  }
  os << "\ndumps: " << r.reference_dump << " " << r.candidate_dump << "   (" << fmt_num(r.seconds, 3) << " s)\n";
  if (r.first) {
    std::error_code ec;
    const std::string cs = full_sidecar_path(r.candidate_dump), rs = full_sidecar_path(r.reference_dump);
    if (std::filesystem::exists(cs, ec) && std::filesystem::exists(rs, ec))
      os << "full tensors of stage " << r.first->stage << " (inputs and outputs): " << rs << " " << cs
         << "\n  mla-bisect explore " << r.candidate_dump << " " << r.reference_dump
         << "   reads them: worst, slice and channels show values there\n";
  }
}

nlohmann::json bisect_to_json(const BisectReport& r) {
  nlohmann::json j;
  j["schema_version"] = 1;  // of this report's layout, as compare's JSON
  j["exit_code"] = r.exit_code;
  j["headline"] = r.headline;
  j["candidate"] = r.candidate_engine;
  j["inject"] = r.inject;
  j["dumps"] = {{"reference", r.reference_dump}, {"candidate", r.candidate_dump}};
  if (!r.crash.empty()) j["crash"] = {{"what", r.crash}, {"last_committed", r.last_committed}, {"last_stage", r.last_stage}};
  if (r.first) {
    j["first_divergence"] = {{"layer", r.first->layer}, {"probe", r.first->name}, {"stage", r.first->stage},
                             {"why", r.first->why}, {"tolerance", r.first->tol.rel_l2},
                             {"tolerance_origin", r.first->tol.origin},
                             // rel_l2 of the dumps, with its basis ("sketch": an estimate); full_metrics has the
                             // full-tensor numbers the drill-down and diagnosis use
                             {"rel_l2", r.first->m.rel_l2}, {"basis", r.first->m.basis}};
    j["isolation"] = r.isolation;
    j["hypotheses"] = hyp::report_to_json(r.hypotheses);
    j["weight_cause"] = nullptr;
    if (r.weight_cause)
      j["weight_cause"] = {{"layer", r.weight_cause->layer},       {"weight", r.weight_cause->name},
                           {"stage", r.weight_cause->stage},       {"why", r.weight_cause->why},
                           {"ranks_off", r.weight_cause->ranks_off}, {"pattern", r.weight_cause->pattern},
                           {"evidence", r.weight_cause->evidence},   {"sentence", weight_sentence(*r.weight_cause)}};
    const auto f = findings_to_json(Findings{r.drill, r.diagnosis});
    j["diagnosis"] = f["diagnosis"];
    j["drill_down"] = f["drill_down"];
    if (!r.full.basis.empty()) j["full_metrics"] = metrics_to_json(r.full);
  } else {
    j["first_divergence"] = nullptr;
  }
  j["compare"] = compare_to_json(r.compare);
  j["seconds"] = r.seconds;
  return j;
}

std::string bisect_to_junit(const BisectReport& r) {
  std::string xml = compare_to_junit(r.compare, "mla-bisect");
  if (!r.crash.empty()) {
    const std::string tc = "  <testcase classname=\"mla-bisect\" name=\"candidate_run\"><error message=\"" +
                           xml_escape(r.headline) + "\">" + xml_escape(r.crash) + "</error></testcase>\n";
    xml.insert(xml.rfind("</testsuite>"), tc);
  }
  return xml;
}

}  // namespace mla
