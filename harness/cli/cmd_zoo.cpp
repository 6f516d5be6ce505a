// `mla-bisect zoo`: the harness testing itself on its planted bugs (the zoo table, core/model/injection.cpp).
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <sstream>

#include "harness/bisect/zoo.h"
#include "harness/cli/commands.h"
#include "harness/cli/run_options.h"
#include "core/model/errors.h"
#include "harness/report/compare_report.h"
#include "harness/report/progress.h"

namespace mla::cli {

std::string default_candidate();

namespace {
// The --weight-format a weight injection runs with. FP8 uses DeepSeek's 128x128 blocks, unless the first
// projection has fewer than two blocks in a dimension (then a scale grid read transposed is the right one and
// the bug cannot show): small models get 16x16 blocks.
std::string zoo_weight_format(const std::string& injection, const MlaConfig& cfg) {
  const WeightFormat f = injection_weight_format(injection);
  if (f != WeightFormat::WeightFormat_fp8) return weight_format_name(f);
  const int rows = cfg.has_q_lora() ? cfg.q_lora_rank : cfg.heads * cfg.qk_head();
  return std::min(rows, cfg.hidden) >= 256 ? "fp8" : "fp8:16";
}

struct ZooCmdOptions {
  RunOptions run;
  std::string candidate;
  int clean_seeds = 3;
  std::string only;  // comma list of injections
  std::string shard;  // "I/N": cases i with i % N == I only
  bool progress = false;  // accepted for older scripts: the per-case lines are the default
  bool quiet = false;     // no progress lines on stderr
  std::string workdir = "mla-bisect-zoo";
  std::string json;
  double timeout = 120;
};

int run_zoo(ZooCmdOptions o) {
  const MlaConfig zoo_cfg = o.run.load_config();
  const MlaConfig& cfg = zoo_cfg;
  {
    // The cases run in several modes and forms: a --full-probes name must be a probe of one of them.
    std::vector<StageGraph> graphs;
    RunSpec s = o.run.to_spec();
    for (Mode m : {Mode::Mode_prefill, Mode::Mode_decode, Mode::Mode_chunked})
      for (AttentionForm f : {AttentionForm::AttentionForm_mha, AttentionForm::AttentionForm_absorbed}) {
        s.mode = m;
        s.form = f;
        graphs.push_back(build_graph(cfg, s.graph_shape()));
      }
    o.run.check_full_probes(graphs);
  }
  std::vector<ZooCase> cases;
  const auto only = split_list(o.only);
  auto selected = [&](const std::string& n) { return only.empty() || std::find(only.begin(), only.end(), n) != only.end(); };
  auto make_case = [&](const std::string& inject, RunOptions ro, std::vector<std::string> expected, std::string pattern) {
    const MlaConfig cfg = ro.model == o.run.model ? zoo_cfg : ro.load_config();
    ZooCase c;
    c.inject = inject;
    c.expected = std::move(expected);
    c.expected_pattern = std::move(pattern);
    c.pattern_words = c.expected.empty() ? "" : zoo_pattern_words(inject);
    c.options.cfg = cfg;
    c.options.spec = ro.to_spec();
    c.options.spec.validate(cfg);
    ProbePlan full;  // each case's drill-down recomputes full tensors in this process
    full.level = ProbeLevel::ProbeLevel_full;
    check_run_memory(cfg, c.options.spec, full, {.dump = true, .quantized = !ro.weight_format.empty()});
    c.options.weight_seed = ro.weight_seed;
    c.options.weights = ro.weight_spec();
    c.options.run_args = ro.to_args();
    c.options.run_options = ro.dump_options(c.options.spec, ro.weight_seed, "synthetic");
    c.options.plan = ro.to_plan();
    c.options.candidate = o.candidate.empty() ? default_candidate() : o.candidate;
    c.options.timeout_s = o.timeout;
    c.options.workdir = o.workdir + "/" + (inject.empty() ? "clean" + std::to_string(ro.seed) : inject);
    for (auto& ch : c.options.workdir)
      if (ch == ':') ch = '_';
    return c;
  };
  for (const auto& e : bug_zoo()) {
    if (!selected(e.name)) continue;
    RunOptions ro = o.run;
    // DSA's bugs need an indexer: the default tiny model lends them its DSA twin; other models without one skip them.
    if (e.needs_dsa && !cfg.has_dsa()) {
      if (o.run.model != "tiny") continue;
      ro.model = "tiny-dsa";
    }
    // A bug of the q LoRA's norm has nothing to be planted in on a model without q LoRA (DeepSeek-V2-Lite).
    if (e.needs_q_lora && !cfg.has_q_lora()) continue;
    if (e.needs_quantized) ro.weight_format = zoo_weight_format(e.name, cfg);
    if (!e.mode.empty()) ro.mode = e.mode;
    if (!e.form.empty()) ro.attention = e.form;
    else if (ro.mode != o.run.mode) ro.attention.clear();
    ro.tp = std::max(ro.tp, e.min_tp);
    // Layouts that make a pattern visible: a sequence within one page beside a longer one; a sequence
    // without context beside one with context.
    if (e.name == "page-off-by-one") { ro.batch = 2; ro.context = "40,200"; ro.tokens = 1; }
    if (e.name == "lse-base2") { ro.batch = 2; ro.context = "0,30"; ro.tokens = std::min(ro.tokens > 0 ? ro.tokens : 16, 16); }
    if (e.name == "decode-empty-cache") { ro.mode = "prefill"; ro.context.clear(); }
    // The residual stage runs only when a layer starts at h (stacked layers).
    if (e.name == "residual-drop") ro.layers = std::max(ro.layers, 2);
    // Tokens past the window, so that the later ones lose keys to it.
    if (e.name == "sliding-window") ro.tokens = std::max(ro.tokens > 0 ? ro.tokens : 16, 3 * kSlidingWindowBug);
    // A token count past a whole tile and short of the next: the tail rows are the ones left unwritten.
    if (e.name == "kv-a-rows-tile") ro.tokens = kRowsTileBug + 8;
    if (ro.mode == "prefill") ro.context.clear();
    cases.push_back(make_case(e.name, ro, e.expected, e.pattern));
  }
  if (selected("nan-at"))
    cases.push_back(make_case("nan-at:kv_c_norm:5", o.run, {"kv_c_norm"}, "NaN localized to its coordinates"));
  if (only.empty())
    for (int s = 0; s < o.clean_seeds; ++s) {
      RunOptions ro = o.run;
      ro.seed = o.run.seed + 1000 + s;
      cases.push_back(make_case("", ro, {}, "clean: must not be flagged"));
    }
  if (!o.shard.empty()) {
    int si = -1, sn = 0;
    char slash = 0;
    std::string rest;
    std::istringstream is(o.shard);
    if (!(is >> si >> slash >> sn) || slash != '/' || sn < 1 || si < 0 || si >= sn || (is >> rest))
      throw UsageError("--shard " + o.shard + ": expected I/N with 0 <= I < N");
    std::vector<ZooCase> mine;
    for (size_t i = 0; i < cases.size(); ++i)
      if (static_cast<int>(i % sn) == si) mine.push_back(std::move(cases[i]));
    cases = std::move(mine);
  }
  std::vector<ZooRow> rows;
  // A line per finished case, terminal or log alike (--quiet: none); a case is two runs and a bisect.
  const ProgressLog log(!o.quiet);
  log.step("zoo: " + std::to_string(cases.size()) + " case(s), model " + o.run.model);
  for (size_t i = 0; i < cases.size(); ++i) {
    rows.push_back(run_zoo_case(cases[i]));
    const auto& r = rows.back();
    log.step("zoo [" + std::to_string(i + 1) + "/" + std::to_string(cases.size()) + "] " +
             (r.c.inject.empty() ? "clean seed " + std::to_string(r.c.options.spec.seed) : r.c.inject) + ": " +
             r.verdict + " (found " + r.found + ", " + fmt_num(r.seconds, 3) + " s)");
  }
  print_zoo(std::cout, rows);
  if (!o.json.empty()) {
    nlohmann::json cases = nlohmann::json::array();
    for (auto& r : rows)
      cases.push_back({{"inject", r.c.inject}, {"mode", mode_name(r.c.options.spec.mode)},
                       {"tp", r.c.options.spec.tp}, {"expected", r.c.expected}, {"found", r.found},
                       {"pattern", r.pattern}, {"verdict", r.verdict}, {"ok", r.ok},
                       {"pattern_words", r.c.pattern_words}, {"pattern_ok", r.pattern_ok}, {"cause", r.cause},
                       {"cause_verdict", r.cause_verdict}, {"seconds", r.seconds}});
    const bool all_ok = std::all_of(rows.begin(), rows.end(), [](const ZooRow& r) { return r.ok; });
    const nlohmann::json j = {{"schema_version", kJsonSchemaVersion}, {"command", "zoo"}, {"model", o.run.model},
                              {"ok", all_ok}, {"cases", std::move(cases)}};
    write_text_file(o.json, j.dump(2));
  }
  for (auto& r : rows)
    if (!r.ok) return ExitCode_divergence;
  return ExitCode_ok;
}
}  // namespace

void setup_zoo(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ZooCmdOptions>();
  o->run.model = "tiny";
  o->run.tokens = 16;
  auto* cmd = app.add_subcommand("zoo", "Run every planted bug of the zoo against the clean reference and score "
                                        "localization and the pattern named; clean runs must not be flagged. Exit 0 "
                                        "only when every bug is localized and no clean run flagged (the pattern "
                                        "count is reported beside)");
  add_run_options(*cmd, o->run);
  cmd->get_option("--tokens")->description("New tokens per sequence of each case, >= 1 (omitted: 16; page-off-by-one "
                                          "runs 1, lse-base2 at most 16)");
  cmd->add_option("--candidate", o->candidate, "Candidate engine (default: cuda when a GPU is present, else "
                                               "reference:precision=bf16)");
  cmd->add_option("--clean-seeds", o->clean_seeds, "Clean runs (seeds) that must not be flagged")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--only", o->only, "Comma list of injections to run (default: all)");
  cmd->add_option("--shard", o->shard, "I/N: run only the cases i with i % N == I (0 <= I < N), so that N "
                                       "processes share one zoo; the totals are the shard's");
  cmd->add_flag("--progress", o->progress, "One line per finished case on stderr: the default (kept for scripts)");
  cmd->add_flag("--quiet", o->quiet, "No progress lines on stderr");
  cmd->add_option("--workdir", o->workdir, "Where the dumps go")->capture_default_str();
  cmd->add_option("--timeout", o->timeout, "Per-stage watchdog, seconds")->capture_default_str()
      ->check(finite_number(0, true, "seconds"));
  cmd->add_option("--json", o->json, "Write the table as JSON");
  refuse_rank_options(*cmd);
  cmd->callback([o, &exit_code] { exit_code = run_zoo(*o); });
}

}  // namespace mla::cli
