// `mla-bisect golden make|check|update-manifest`: golden dumps as a CI gate (harness/golden/golden.h).
#include <filesystem>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "harness/bisect/causes.h"
#include "harness/cli/commands.h"
#include "harness/cli/run_options.h"
#include "harness/compare/format.h"
#include "harness/golden/golden.h"
#include "core/model/errors.h"
#include "harness/report/compare_report.h"
#include "harness/report/progress.h"

namespace mla::cli {

std::map<std::string, double> parse_tol_overrides(const std::vector<std::string>& items);

namespace {

namespace fs = std::filesystem;

struct GoldenMakeOptions {
  RunOptions run;
  std::string out;
  std::string manifest;  // default: OUT's directory / MANIFEST.json
  bool no_manifest = false;
  bool quiet = false;  // no progress lines on stderr
};

struct GoldenCheckCmdOptions {
  std::string golden, engine = "reference", inject, json, junit, manifest;
  std::vector<std::string> tol, probes, allow_missing;
  double k = 4.0, timeout = 0;
  int tp = 0;
  bool brief = false, no_manifest = false;
  bool quiet = false;  // no progress lines on stderr
};

struct GoldenManifestOptions {
  std::string dir = "golden";
  std::string manifest;  // default: DIR/MANIFEST.json
};

// The command as parsed: positionals, then the options given, in declaration order.
std::string command_line(const CLI::App& cmd, const std::string& prefix) {
  std::string s = prefix;
  for (const CLI::Option* opt : cmd.get_options())
    if (!opt->nonpositional())
      for (const auto& r : opt->results()) s += " " + shell_quote(r);
  for (const CLI::Option* opt : cmd.get_options()) {
    if (!opt->nonpositional() || opt->count() == 0) continue;
    if (opt->get_expected_min() == 0) {
      s += " " + opt->get_name();
      continue;
    }
    for (const auto& r : opt->results()) s += " " + opt->get_name() + " " + shell_quote(r);
  }
  return s;
}

std::string manifest_for(const std::string& golden, const std::string& given) {
  if (!given.empty()) return given;
  const fs::path dir = fs::path(golden).parent_path();
  return ((dir.empty() ? fs::path(".") : dir) / "MANIFEST.json").string();
}

int run_make(const GoldenMakeOptions& o, const CLI::App& cmd) {
  if (cmd.count("--probe-level") && o.run.probe_level != "full")
    throw UsageError("golden make: goldens hold every probe in full; drop --probe-level");
  if (!o.run.full_probes.empty()) throw UsageError("golden make: goldens hold every probe in full; drop --full-probes");
  const MlaConfig cfg = o.run.load_config();
  const RunSpec spec = o.run.to_spec();
  spec.validate(cfg);
  ProbePlan full;  // goldens hold every probe in full, written from memory
  full.level = ProbeLevel::ProbeLevel_full;
  check_run_memory(cfg, spec, full, {.dump = true});
  const std::string command = command_line(cmd, "mla-bisect golden make");
  const ProgressLog log(!o.quiet);
  ProgressTicks ticks(log);  // the reference run's stages, when a line is due
  log.step("golden make: the FP32 reference on " + cfg.name + ", every probe in full");
  const Dump d = make_golden(cfg, spec, o.run.weight_seed, command);
  log.step("writing " + o.out);
  write_dump_h5(d, o.out);  // temp file, fsync, rename
  const auto bytes = fs::file_size(o.out);
  std::cout << "golden " << o.out << ": " << d.probes.size() << " probes in full, " << bytes / 1024 << " KiB\n"
            << "command: " << command << "\n";
  if (bytes > 512 * 1024)
    std::cout << "note: goldens are committed; this one is large (fewer tokens, a smaller context or one layer keep "
                 "it small)\n";
  if (!o.no_manifest) {
    const std::string mpath = manifest_for(o.out, o.manifest);
    update_manifest(mpath, {o.out}, false);
    std::cout << "manifest " << mpath << " updated (sha256 " << sha256_file(o.out) << ")\n";
  }
  return ExitCode_ok;
}

// The manifest entry of a golden, if its directory's manifest lists it; a stale sha256 is a bad input (exit 2).
// A manifest named with --manifest must exist; the default one's absence is said, never passed over.
void check_manifest(const std::string& golden, const std::string& mpath, bool named) {
  if (!fs::exists(mpath)) {
    if (named) throw UsageError("--manifest " + mpath + ": no such file");
    std::cout << "note: no manifest " << mpath << ": the sha256 of " << golden
              << " is not checked (golden make or golden update-manifest writes one; --no-manifest skips the check "
                 "without this note)\n";
    return;
  }
  const fs::path dir = fs::path(mpath).parent_path().empty() ? fs::path(".") : fs::path(mpath).parent_path();
  std::error_code ec;
  const std::string rel = fs::relative(fs::absolute(golden), fs::absolute(dir), ec).generic_string();
  for (const auto& e : read_manifest(mpath)) {
    if (e.file != rel) continue;
    const std::string sha = sha256_file(golden);
    if (sha != e.sha256)
      throw UsageError(golden + ": sha256 " + sha + " differs from " + mpath + " (" + e.sha256 +
                       "): the file changed since the manifest was written. Regenerate it from the repository root "
                       "with:\n  " + e.command + "\n(golden make updates the manifest)");
    std::cout << "golden " << golden << ": sha256 matches " << mpath << "\n";
    return;
  }
  std::cout << "note: " << golden << " is not listed in " << mpath << " (golden update-manifest adds it)\n";
}

int run_check(const GoldenCheckCmdOptions& o) {
  const ProgressLog log(!o.quiet);
  ProgressTicks ticks(log);  // reading, the engine's run, calibration: when a line is due
  if (!o.no_manifest) check_manifest(o.golden, manifest_for(o.golden, o.manifest), !o.manifest.empty());
  log.step("reading " + o.golden);
  const Dump golden = read_dump(o.golden);
  GoldenCheckOptions c;
  c.engine = o.engine;
  c.inject = o.inject;
  c.tp = o.tp;
  c.k = o.k;
  c.overrides = parse_tol_overrides(o.tol);
  c.timeout_s = o.timeout;
  for (const auto& i : o.probes)
    for (auto& n : split_list(i)) c.only.push_back(n);
  for (const auto& i : o.allow_missing)
    for (auto& n : split_list(i)) c.allow_missing.push_back(n);
  const std::string suite = "mla-bisect.golden." + fs::path(o.golden).stem().string();
  // A hang ends the process from the watchdog thread: leave CI a JUnit error naming where it stopped.
  const auto on_stop = [&](const std::string& status) {
    if (o.junit.empty()) return;
    try {
      write_text_file(o.junit, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n<testsuite name=\"" +
                                   xml_escape(suite) + "\" tests=\"1\" failures=\"0\" errors=\"1\">\n  <testcase classname=\"" +
                                   xml_escape(suite) + "\" name=\"run_complete\"><error message=\"" + xml_escape(status) +
                                   "\"/></testcase>\n</testsuite>\n</testsuites>\n");
    } catch (const std::exception&) {
    }
  };
  log.step("running " + o.engine + " on the golden's inputs (" + golden.meta.command + "), then comparing");
  const GoldenCheck res = check_golden(golden, c, on_stop);
  log.step("compared");
  const CompareReport& rep = res.report;
  auto findings = explain_first_divergence(rep, batch_of(golden, res.candidate));
  // The candidate's run holds every probe in full: its divergent stage is re-run under the bug classes.
  const hyp::Report causes = causes_of_first_divergence(res.candidate, golden, rep);
  if (findings && findings->diagnosis.confidence != "measured") hyp::explain(findings->diagnosis, causes);
  std::cout << "golden check " << o.golden << " (" << golden.meta.command << ")\n";
  print_compare(std::cout, rep, !o.brief, findings ? &*findings : nullptr);
  if (findings) hyp::print_report(std::cout, causes);
  if (!o.json.empty()) {
    auto j = compare_to_json(rep, findings ? &*findings : nullptr);
    if (findings) j["hypotheses"] = hyp::report_to_json(causes);
    j["golden"] = {{"path", o.golden}, {"command", golden.meta.command}, {"tool_version", golden.tool_version},
                   {"created", golden.created_utc}};
    j["engine"] = o.engine;
    j["inject"] = o.inject;
    write_text_file(o.json, j.dump(2));
  }
  if (!o.junit.empty()) write_text_file(o.junit, compare_to_junit(rep, suite));
  const int code = rep.exit_code();
  const char* verdict = code == ExitCode_ok ? "PASSED" : code == ExitCode_engine ? "STOPPED" : "FAILED";
  std::cout << "\ngolden check " << verdict << ": " << o.engine << (o.inject.empty() ? "" : " --inject " + o.inject)
            << " vs " << o.golden << "\n";
  if (code == ExitCode_engine)
    std::cout << "stopped early: "
              << (res.candidate.complete() ? golden.path + ": " + golden.status : "candidate: " + res.candidate.status)
              << "\n";
  if (code == ExitCode_divergence && !o.inject.empty())
    std::cout << "(a planted bug was expected to fail)\n";
  else if (code == ExitCode_divergence && rep.first_divergence >= 0)
    std::cout << "if the change is intended, regenerate the golden from the repository root with:\n  "
              << golden.meta.command << "\n";
  return code;
}

int run_update_manifest(const GoldenManifestOptions& o) {
  if (!fs::is_directory(o.dir)) throw UsageError(o.dir + ": not a directory");
  std::vector<std::string> goldens;
  for (const auto& e : fs::directory_iterator(o.dir))
    if (e.is_regular_file() && e.path().extension() == ".h5") goldens.push_back(e.path().string());
  std::sort(goldens.begin(), goldens.end());
  const std::string mpath = o.manifest.empty() ? (fs::path(o.dir) / "MANIFEST.json").string() : o.manifest;
  const auto entries = update_manifest(mpath, goldens, true);
  for (const auto& e : entries) std::cout << e.sha256 << "  " << e.file << "\n";
  std::cout << "manifest " << mpath << ": " << entries.size() << " goldens\n";
  return ExitCode_ok;
}

}  // namespace

void setup_golden(CLI::App& app, int& exit_code) {
  auto* golden = app.add_subcommand("golden", "Golden dumps as a CI gate: make one from the FP32 reference, check an "
                                              "engine against one, maintain golden/MANIFEST.json");
  golden->require_subcommand(1);

  auto mo = std::make_shared<GoldenMakeOptions>();
  auto* make = golden->add_subcommand("make", "Run the FP32 reference with every probe in full and write a golden "
                                              "atomically (temp, fsync, rename), recording this command; updates "
                                              "MANIFEST.json beside it");
  make->add_option("out", mo->out, "Golden file to write (.h5)")->required();
  add_run_options(*make, mo->run);
  make->add_option("--manifest", mo->manifest, "Manifest to update (default: MANIFEST.json beside OUT)");
  make->add_flag("--no-manifest", mo->no_manifest, "Do not touch a manifest");
  make->add_flag("--quiet", mo->quiet, "No progress lines on stderr");
  make->callback([mo, make, &exit_code] { exit_code = run_make(*mo, *make); });

  auto co = std::make_shared<GoldenCheckCmdOptions>();
  auto* check = golden->add_subcommand("check", "Re-run an engine in process on a golden's inputs, config and run "
                                                "spec and compare probe by probe, every probe of its graph "
                                                "matched; exit 0 pass, 1 divergence or a missing probe, 2 unreadable "
                                                "or stale golden, 3 a run that stopped");
  check->add_option("golden", co->golden, "Golden dump (.h5)")->required();
  check->add_option("--engine", co->engine, "Engine to check, e.g. reference, reference:precision=bf16, cuda")
      ->capture_default_str();
  check->add_option("--inject", co->inject, "Plant bugs in the engine (docs/bugs.md): the check must then fail");
  check->add_option("--tp", co->tp, "Run the engine at this many ranks (default: the golden's tp)")
      ->check(CLI::PositiveNumber);
  check->add_option("--json", co->json, "Write the comparison as JSON");
  check->add_option("--junit", co->junit, "Write JUnit XML, one testcase per probe");
  check->add_option("--tol", co->tol, "Override a probe's tolerance: PROBE=REL_L2 (repeatable)");
  check->add_option("--probes", co->probes,
                    "Check only these probes (comma list: NAME for every layer, or layerL/NAME); the rest are not "
                    "expected");
  check->add_option("--allow-missing", co->allow_missing,
                    "Probes the engine may leave out without failing (comma list: NAME or layerL/NAME); still "
                    "reported");
  check->add_option("--tol-factor", co->k, "Tolerance = factor x calibrated noise floor (non-FP32 engines)")
      ->capture_default_str()
      ->check(finite_number(0, true));
  check->add_option("--timeout", co->timeout, "Per-stage watchdog in seconds: a hung engine exits 3 (0: off)")
      ->capture_default_str()
      ->check(finite_number(0, false, "seconds (0: off)"));
  check->add_option("--manifest", co->manifest, "Manifest holding the golden's sha256 (default: MANIFEST.json "
                                                "beside it, if present)");
  check->add_flag("--no-manifest", co->no_manifest, "Do not verify the golden's sha256 against a manifest");
  check->add_flag("--brief", co->brief, "Only the summary, not every probe");
  check->add_flag("--quiet", co->quiet, "No progress lines on stderr");
  check->callback([co, &exit_code] { exit_code = run_check(*co); });

  auto uo = std::make_shared<GoldenManifestOptions>();
  auto* upd = golden->add_subcommand("update-manifest", "Rewrite DIR/MANIFEST.json from the goldens in DIR (file, "
                                                        "sha256, command, tool_version, created)");
  upd->add_option("dir", uo->dir, "Directory of goldens")->capture_default_str();
  upd->add_option("--manifest", uo->manifest, "Manifest to write (default: DIR/MANIFEST.json)");
  upd->callback([uo, &exit_code] { exit_code = run_update_manifest(*uo); });
}

}  // namespace mla::cli
