// `mla-bisect compare CANDIDATE.h5 REFERENCE.h5`: probe-by-probe comparison of two dumps.
#include <iostream>

#include "harness/cli/commands.h"
#include "harness/compare/tolerance_for.h"
#include "harness/model/errors.h"
#include "harness/report/compare_report.h"

namespace mla::cli {

std::map<std::string, double> parse_tol_overrides(const std::vector<std::string>& items);

namespace {
struct CompareCmdOptions {
  std::string a, b, json, junit, tolerance = "auto";
  double k = 4.0;
  std::vector<std::string> tol;
  bool brief = false;
};

int run_compare(const CompareCmdOptions& o) {
  const Dump a = read_dump(o.a);
  const Dump b = read_dump(o.b);
  require_every_rank(a, "compare");
  require_every_rank(b, "compare");
  ToleranceModel tol = tolerance_for(a, b, o.tolerance, o.k);
  tol.overrides = parse_tol_overrides(o.tol);
  const CompareReport rep = compare_dumps(a, b, tol);
  print_compare(std::cout, rep, !o.brief);
  if (!o.json.empty()) write_text_file(o.json, compare_to_json(rep).dump(2));
  if (!o.junit.empty()) write_text_file(o.junit, compare_to_junit(rep, "mla-bisect.compare"));
  if (rep.stopped_early()) {
    std::cout << "\na dump stopped early: " << (a.complete() ? b.path + ": " + b.status : a.path + ": " + a.status)
              << "\n";
    return ExitCode_engine;
  }
  return rep.first_divergence >= 0 ? ExitCode_divergence : ExitCode_ok;
}
}  // namespace

void setup_compare(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<CompareCmdOptions>();
  auto* cmd = app.add_subcommand("compare", "Compare two dumps probe by probe (the first is the candidate, the second "
                                            "the reference); exit 0 none, 1 divergence, 2 unreadable input, 3 a dump "
                                            "that stopped early");
  cmd->add_option("candidate", o->a, "Candidate dump (.h5)")->required();
  cmd->add_option("reference", o->b, "Reference dump (.h5)")->required();
  cmd->add_option("--json", o->json, "Write the comparison as JSON");
  cmd->add_option("--junit", o->junit, "Write JUnit XML, one testcase per probe");
  cmd->add_option("--tolerance", o->tolerance, "auto (calibrate unless the candidate is FP32), calibrate, or exact")
      ->capture_default_str();
  cmd->add_option("--tol-factor", o->k, "Tolerance = factor x calibrated noise floor")->capture_default_str();
  cmd->add_option("--tol", o->tol, "Override a probe's tolerance: PROBE=REL_L2 (repeatable)");
  cmd->add_flag("--brief", o->brief, "Only the summary, not every probe");
  cmd->callback([o, &exit_code] { exit_code = run_compare(*o); });
}

}  // namespace mla::cli
