// `mla-bisect compare CANDIDATE.h5 REFERENCE.h5`: probe-by-probe comparison of two dumps, gated on every probe the
// reference's stage graph expects being matched (or named by --allow-missing / --probes).
#include <algorithm>
#include <iostream>

#include "harness/bisect/causes.h"
#include "harness/bisect/replay_layers.h"
#include "harness/cli/commands.h"
#include "harness/compare/layer_sets.h"
#include "harness/cli/run_options.h"
#include "core/engine/engine.h"
#include "core/model/errors.h"
#include "harness/report/compare_report.h"
#include "harness/report/progress.h"
#include "harness/run/tolerance_for.h"

namespace mla::cli {

std::map<std::string, double> parse_tol_overrides(const std::vector<std::string>& items);

namespace {
struct CompareCmdOptions {
  std::string a, b, json, junit, tolerance = "auto";
  std::string named_a, named_b;  // --candidate, --reference: the pair as given, never questioned
  double k = 4.0;
  std::vector<std::string> tol, probes, allow_missing;
  bool brief = false;
  bool quiet = false;  // no progress lines on stderr
};

std::vector<std::string> split_all(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  for (const auto& i : items)
    for (auto& n : split_list(i)) out.push_back(n);
  return out;
}

// How precise a dump's activations are, from its engine_dtype: 2 fp32, 1 a 16-bit format, 0 below; -1 unknown.
int precision_rank(const Dump& d) {
  const std::string& t = d.meta.engine_dtype.empty() ? std::string("fp32") : d.meta.engine_dtype;
  if (t == "fp32") return 2;
  if (t == "bf16" || t == "fp16") return 1;
  if (t.rfind("fp8", 0) == 0 || t.rfind("fp4", 0) == 0 || t.rfind("nvfp4", 0) == 0) return 0;
  return -1;
}

// A run of this program's engines (reference, cuda), as opposed to a capture from another system.
bool is_engine_run(const Dump& d) {
  const auto names = engine_names();
  return std::find(names.begin(), names.end(), d.meta.engine) != names.end();
}

// Why the pair given positionally looks reversed (candidate first, reference second), from the dumps' provenance;
// "" when nothing says so.
std::string looks_reversed(const Dump& a, const Dump& b) {
  const auto dtype = [](const Dump& d) { return d.meta.engine_dtype.empty() ? std::string("fp32") : d.meta.engine_dtype; };
  const auto engine = [&](const Dump& d) { return (d.meta.engine.empty() ? std::string("?") : d.meta.engine) + " " + dtype(d); };
  const int ra = precision_rank(a), rb = precision_rank(b);
  if (ra >= 0 && rb >= 0 && rb < ra)
    return "the reference (" + b.path + ", " + engine(b) + ") is less precise than the candidate (" + a.path + ", " +
           engine(a) + ")";
  if (is_engine_run(a) && !is_engine_run(b) && !b.meta.engine.empty())
    return "the reference (" + b.path + ") is a capture from " + b.meta.engine + ", the candidate (" + a.path +
           ") a run of mla-bisect's " + a.meta.engine + " engine";
  return "";
}

int run_compare(const CompareCmdOptions& o) {
  const bool named = !o.named_a.empty() || !o.named_b.empty();
  if (named && (o.named_a.empty() || o.named_b.empty()))
    throw UsageError("compare: give both --candidate FILE and --reference FILE (or neither, and the two dumps "
                     "positionally, candidate first)");
  if (named && (!o.a.empty() || !o.b.empty()))
    throw UsageError("compare: the dumps are given by --candidate/--reference and positionally; give them one way");
  if (!named && (o.a.empty() || o.b.empty()))
    throw UsageError("compare: two dumps are needed: compare CANDIDATE.h5 REFERENCE.h5, or --candidate FILE "
                     "--reference FILE");
  const std::string path_a = named ? o.named_a : o.a, path_b = named ? o.named_b : o.b;
  // Reading large dumps and calibrating (two reference runs) take a while: progress lines on stderr, a line per phase
  // and, within one, a line when one is due; the report stays on stdout.
  const ProgressLog log(!o.quiet);
  ProgressTicks ticks(log);
  // Two whole-model captures (FILE.layer<L>.h5 sets): where the error enters, layer by layer.
  const bool set_a = is_layer_capture_set(path_a), set_b = is_layer_capture_set(path_b);
  if (set_a != set_b)
    throw UsageError("compare: " + (set_a ? path_a : path_b) + " is a whole-model capture (FILE.layer<L>.h5) and " +
                     (set_a ? path_b : path_a) + " is not: compare two whole-model captures, or two dumps");
  if (set_a) {
    log.step("comparing two whole-model captures layer by layer");
    const LayerSetComparison c =
        compare_layer_sets(path_a, layer_capture_files(path_a), path_b, layer_capture_files(path_b), o.k);
    if (o.brief) std::cout << c.headline << "\n";
    else print_layer_sets(std::cout, c);
    if (!o.json.empty()) write_text_file(o.json, layer_sets_to_json(c).dump(2));
    return c.exit_code;
  }
  log.step("reading " + path_a);
  const Dump a = read_dump(path_a);
  log.step("reading " + path_b);
  const Dump b = read_dump(path_b);
  // Positional dumps whose provenance says they are the other way round: no verdict on them.
  if (!named) {
    const std::string why = looks_reversed(a, b);
    if (!why.empty())
      throw UsageError("compare: the arguments look reversed (" + why + "); compare takes the candidate first and "
                       "the reference second: swap them, or, to compare them as given on purpose, name them: "
                       "mla-bisect compare --candidate " + o.a + " --reference " + o.b);
  }
  require_every_rank(a, "compare");
  require_every_rank(b, "compare");
  // Refusals first, before calibration spends time on dumps that cannot be compared.
  require_comparable(a, b);
  require_readable(a);
  require_readable(b);
  CompareOptions copt;
  copt.only = split_all(o.probes);
  copt.allow_missing = split_all(o.allow_missing);
  const ExpectedProbes ex = expected_probes(a, b, copt);  // unknown probe names are a usage error
  const auto overrides = parse_tol_overrides(o.tol);
  std::vector<std::string> names;
  for (const auto& p : ex.probes) names.push_back(p.name);
  check_tol_overrides(overrides, names, ex.from);
  const std::string dtype = a.meta.engine_dtype.empty() ? "fp32" : a.meta.engine_dtype;
  if (o.tolerance == "calibrate" || (o.tolerance == "auto" && dtype != "fp32"))
    log.step("calibrating tolerances (the reference at fp32 and at " + (dtype == "fp32" ? "bf16" : dtype) +
             " on the reference dump's inputs)");
  ToleranceModel tol = tolerance_for(a, b, o.tolerance, o.k);
  tol.overrides = overrides;
  log.step("comparing " + std::to_string(ex.probes.size()) + " probes and the weights");
  const CompareReport rep = compare_dumps(a, b, tol, copt);
  auto findings = explain_first_divergence(rep, batch_of(b, a));
  // The causes tested by re-running the divergent stage on the candidate's own tensors, where it holds them.
  if (findings && rep.first_divergence >= 0)
    log.step("causes: the bug classes of stage " + rep.results[rep.first_divergence].stage);
  const hyp::Report causes = causes_of_first_divergence(a, b, rep);
  if (findings && findings->diagnosis.confidence != "measured") hyp::explain(findings->diagnosis, causes);
  print_compare(std::cout, rep, !o.brief, findings ? &*findings : nullptr);
  if (findings) hyp::print_report(std::cout, causes);
  if (!o.json.empty()) {
    auto j = compare_to_json(rep, findings ? &*findings : nullptr);
    if (findings) j["hypotheses"] = hyp::report_to_json(causes);
    write_text_file(o.json, j.dump(2));
  }
  if (!o.junit.empty()) write_text_file(o.junit, compare_to_junit(rep, "mla-bisect.compare"));
  return rep.exit_code();
}
}  // namespace

void setup_compare(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<CompareCmdOptions>();
  auto* cmd = app.add_subcommand(
      "compare",
      "Compare two dumps probe by probe (the first is the candidate, the second the reference; or named by "
      "--candidate and --reference). A positional pair whose provenance looks reversed (the reference less precise "
      "than the candidate, or a capture) is refused with exit 2; named, it is compared as given. Every probe the "
      "reference's stage graph expects must be matched: exit 0 all matched and within tolerance, 1 a divergence or a "
      "missing probe, 2 unreadable or incomparable dumps (different model dims, mode, tokens, batch, context or probe "
      "shapes) or no probe matched, 3 a dump that stopped early");
  // Positional names apart from the options' (CLI11 2.2+ refuses a positional named like a long option).
  cmd->add_option("candidate_dump", o->a, "Candidate dump (.h5); or --candidate");
  cmd->add_option("reference_dump", o->b, "Reference dump (.h5); or --reference");
  cmd->add_option("--candidate", o->named_a,
                  "Candidate dump, named (with --reference): the pair is compared as given, even where its provenance "
                  "looks reversed (a less precise reference, or a capture as the reference)");
  cmd->add_option("--reference", o->named_b, "Reference dump, named (with --candidate)");
  cmd->add_option("--json", o->json, "Write the comparison as JSON (verdict, matched, missing with reasons, probes)");
  cmd->add_option("--junit", o->junit, "Write JUnit XML, one testcase per probe (a missing probe is a failure)");
  cmd->add_option("--tolerance", o->tolerance, "auto (calibrate unless the candidate is FP32), calibrate, or exact")
      ->capture_default_str();
  cmd->add_option("--tol-factor", o->k, "Tolerance = factor x calibrated noise floor")->capture_default_str()
      ->check(finite_number(0, true));
  cmd->add_option("--tol", o->tol, "Override a probe's tolerance: PROBE=REL_L2 (repeatable)");
  cmd->add_option("--probes", o->probes,
                  "Compare only these probes (comma list: NAME for every layer, or layerL/NAME); the rest are not "
                  "expected");
  cmd->add_option("--allow-missing", o->allow_missing,
                  "Probes that may be absent without failing (comma list: NAME or layerL/NAME); still reported");
  cmd->add_flag("--brief", o->brief, "Only the summary (first divergence, diagnosis, missing probes, verdict)");
  cmd->add_flag("--quiet", o->quiet, "No progress lines on stderr (reading the dumps, calibrating, comparing)");
  cmd->callback([o, &exit_code] { exit_code = run_compare(*o); });
}

}  // namespace mla::cli
