// `mla-bisect compare CANDIDATE.h5 REFERENCE.h5`: probe-by-probe comparison of two dumps, gated on every probe the
// reference's stage graph expects being matched (or named by --allow-missing / --probes).
#include <iostream>

#include "harness/bisect/causes.h"
#include "harness/cli/commands.h"
#include "harness/cli/run_options.h"
#include "harness/model/errors.h"
#include "harness/report/compare_report.h"
#include "harness/run/tolerance_for.h"

namespace mla::cli {

std::map<std::string, double> parse_tol_overrides(const std::vector<std::string>& items);

namespace {
struct CompareCmdOptions {
  std::string a, b, json, junit, tolerance = "auto";
  double k = 4.0;
  std::vector<std::string> tol, probes, allow_missing;
  bool brief = false;
};

std::vector<std::string> split_all(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  for (const auto& i : items)
    for (auto& n : split_list(i)) out.push_back(n);
  return out;
}

int run_compare(const CompareCmdOptions& o) {
  const Dump a = read_dump(o.a);
  const Dump b = read_dump(o.b);
  require_every_rank(a, "compare");
  require_every_rank(b, "compare");
  // Refusals first, before calibration spends time on dumps that cannot be compared.
  require_comparable(a, b);
  require_readable(a);
  require_readable(b);
  CompareOptions copt;
  copt.only = split_all(o.probes);
  copt.allow_missing = split_all(o.allow_missing);
  expected_probes(a, b, copt);  // unknown probe names are a usage error
  ToleranceModel tol = tolerance_for(a, b, o.tolerance, o.k);
  tol.overrides = parse_tol_overrides(o.tol);
  const CompareReport rep = compare_dumps(a, b, tol, copt);
  auto findings = explain_first_divergence(rep, batch_of(b, a));
  // The causes tested by re-running the divergent stage on the candidate's own tensors, where it holds them.
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
      "Compare two dumps probe by probe (the first is the candidate, the second the reference). Every probe the "
      "reference's stage graph expects must be matched: exit 0 all matched and within tolerance, 1 a divergence or a "
      "missing probe, 2 unreadable or incomparable dumps (different model dims, mode, tokens, batch, context or probe "
      "shapes) or no probe matched, 3 a dump that stopped early");
  cmd->add_option("candidate", o->a, "Candidate dump (.h5)")->required();
  cmd->add_option("reference", o->b, "Reference dump (.h5)")->required();
  cmd->add_option("--json", o->json, "Write the comparison as JSON (verdict, matched, missing with reasons, probes)");
  cmd->add_option("--junit", o->junit, "Write JUnit XML, one testcase per probe (a missing probe is a failure)");
  cmd->add_option("--tolerance", o->tolerance, "auto (calibrate unless the candidate is FP32), calibrate, or exact")
      ->capture_default_str();
  cmd->add_option("--tol-factor", o->k, "Tolerance = factor x calibrated noise floor")->capture_default_str();
  cmd->add_option("--tol", o->tol, "Override a probe's tolerance: PROBE=REL_L2 (repeatable)");
  cmd->add_option("--probes", o->probes,
                  "Compare only these probes (comma list: NAME for every layer, or layerL/NAME); the rest are not "
                  "expected");
  cmd->add_option("--allow-missing", o->allow_missing,
                  "Probes that may be absent without failing (comma list: NAME or layerL/NAME); still reported");
  cmd->add_flag("--brief", o->brief, "Only the summary (first divergence, diagnosis, missing probes, verdict)");
  cmd->callback([o, &exit_code] { exit_code = run_compare(*o); });
}

}  // namespace mla::cli
