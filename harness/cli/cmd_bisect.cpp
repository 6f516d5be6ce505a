// `mla-bisect bisect`: reference vs candidate, first divergence, isolation, drill-down, diagnosis.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "harness/bisect/bisect.h"
#include "harness/bisect/bisect_html.h"
#include "harness/cli/commands.h"
#include "harness/cli/run_options.h"
#include "core/model/errors.h"
#include "harness/report/compare_report.h"

#ifdef MLA_WITH_CUDA
#include "kernels/cuda_engine.h"
#endif

namespace mla::cli {

std::string default_candidate() {
#ifdef MLA_WITH_CUDA
  if (cuda_device_count() > 0) return "cuda";
#endif
  return "reference:precision=bf16";
}

std::map<std::string, double> parse_tol_overrides(const std::vector<std::string>& items) {
  std::map<std::string, double> out;
  for (const auto& t : items) {
    const auto eq = t.find('=');
    if (eq == std::string::npos || eq == 0) throw UsageError("--tol " + t + ": expected PROBE=VALUE");
    const std::string v = t.substr(eq + 1);
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(d) || !(d > 0))
      throw UsageError("--tol " + t + ": '" + v + "' is not a number > 0 (a relative L2 tolerance)");
    out[t.substr(0, eq)] = d;
  }
  return out;
}

namespace {
struct BisectCmdOptions {
  RunOptions run;
  std::string candidate;
  std::string reference = "reference";
  std::string inject;
  double timeout = 120;
  std::string workdir = "mla-bisect-out";
  std::string json, junit, html;
  double k = 4.0;
  std::vector<std::string> tol;
  bool brief = false;
  bool quiet = false;  // no progress lines on stderr
};

int run_bisect_cmd(const BisectCmdOptions& o) {
  BisectOptions b;
  b.cfg = o.run.load_config();
  b.spec = o.run.to_spec();
  b.spec.validate(b.cfg);
  const StageGraph graph = build_graph(b.cfg, b.spec.graph_shape());
  o.run.check_full_probes({graph});
  // The drill-down recomputes both runs' full tensors in this process; the children check their own runs.
  ProbePlan full;
  full.level = ProbeLevel::ProbeLevel_full;
  check_run_memory(b.cfg, b.spec, full, {.dump = true, .quantized = !o.run.weight_format.empty()});
  b.weight_seed = o.run.weight_seed;
  b.weights = o.run.weight_spec();
  b.run_args = o.run.to_args();
  b.run_options = o.run.dump_options(b.spec, b.weight_seed, "synthetic");
  b.plan = o.run.to_plan();
  b.reference = o.reference;
  b.candidate = o.candidate.empty() ? default_candidate() : o.candidate;
  b.inject = o.inject;
  parse_injections(o.inject);  // bad names are a usage error here, not a crashed child
  b.timeout_s = o.timeout;
  b.workdir = o.workdir;
  b.k = o.k;
  b.overrides = parse_tol_overrides(o.tol);
  std::vector<std::string> names;
  for (const auto& p : graph.probes) names.push_back(p.name);
  check_tol_overrides(b.overrides, names, "the run's stage graph");
  b.progress = !o.quiet;  // a line per phase, terminal or log alike
  const BisectReport rep = run_bisect(b);
  if (o.brief) {
    std::cout << rep.headline << "\n";
    if (!rep.crash.empty()) std::cout << "why: " << rep.crash << "\n";
    if (rep.first) std::cout << "diagnosis: " << rep.diagnosis.pattern << "\n";
  } else {
    print_bisect(std::cout, rep);
  }
  if (!o.json.empty()) write_text_file(o.json, bisect_to_json(rep).dump(2));
  if (!o.junit.empty()) write_text_file(o.junit, bisect_to_junit(rep));
  if (!o.html.empty()) write_text_file(o.html, bisect_to_html(rep));
  return rep.exit_code;
}
}  // namespace

void setup_bisect(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<BisectCmdOptions>();
  auto* cmd = app.add_subcommand(
      "bisect", "Run the reference (in this process) and a candidate (a child process), find the first stage, rank, head and token where "
                "they diverge, prove which stage introduced it, and name the pattern. Exit 0 none, 1 divergence, "
                "2 bad usage, 3 the candidate crashed or hung");
  add_run_options(*cmd, o->run);
  cmd->add_option("--candidate", o->candidate, "Candidate engine (default: cuda when a GPU is present, else "
                                               "reference:precision=bf16)");
  cmd->add_option("--reference", o->reference, "Reference engine")->capture_default_str();
  cmd->add_option("--inject", o->inject,
                  "Plant bugs in the candidate: NAME[,NAME...] from docs/bugs.md, nan-at:PROBE:INDEX, "
                  "hang-at:STAGE[@rank], crash-at:STAGE[@rank], fault-at:STAGE[:LAYER][@rank] (cuda: a device fault), "
                  "slow-at:STAGE:MS[@rank] (STAGE * for every stage)");
  cmd->add_option("--timeout", o->timeout, "Per-stage watchdog of each run, seconds")->capture_default_str()
      ->check(finite_number(0, true, "seconds"));
  cmd->add_option("--workdir", o->workdir, "Where the reference and candidate dumps are written")->capture_default_str();
  cmd->add_option("--json", o->json, "Write the report as JSON");
  cmd->add_option("--junit", o->junit, "Write JUnit XML (one testcase per probe)");
  cmd->add_option("--html", o->html, "Write a self-contained HTML report (error profile, per-token chart, "
                                     "token x head heat map)");
  cmd->add_option("--tol-factor", o->k, "Tolerance = factor x calibrated noise floor")->capture_default_str()
      ->check(finite_number(0, true));
  cmd->add_option("--tol", o->tol, "Override a probe's tolerance: PROBE=REL_L2 (repeatable)");
  cmd->add_flag("--brief", o->brief, "Print only the headline and the diagnosis");
  cmd->add_flag("--quiet", o->quiet, "No progress lines on stderr");
  refuse_rank_options(*cmd);
  cmd->callback([o, &exit_code] { exit_code = run_bisect_cmd(*o); });
}

}  // namespace mla::cli
