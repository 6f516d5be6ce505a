// `mla-bisect replay CAPTURE.h5 --weights CKPT`: a layer captured from another system against the reference.
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <optional>

#include "harness/bisect/bisect_html.h"
#include "harness/bisect/replay.h"
#include "harness/bisect/replay_layers.h"
#include "core/weights/loader.h"
#include "probes/dump.h"
#include "harness/cli/commands.h"
#include "harness/cli/run_options.h"
#include "core/model/errors.h"
#include "harness/report/compare_report.h"

namespace mla::cli {

std::map<std::string, double> parse_tol_overrides(const std::vector<std::string>& items);

namespace {
struct ReplayCmdOptions {
  std::string capture, weights, reference_out, json, junit, html, layers;
  int layer = -1;
  int jobs = 0;
  double k = 4.0;
  std::vector<std::string> tol;
  bool brief = false, quiet = false;
};

int run_replay_scan_cmd(const ReplayCmdOptions& o, ReplayOptions r) {
  if (o.layer >= 0)
    throw UsageError("--layer " + std::to_string(o.layer) + ": " + o.capture + " is a whole-model capture (" +
                     o.capture.substr(0, o.capture.size() - 3) + ".layer<L>.h5); narrow it with --layers A:B");
  std::optional<std::pair<int, int>> only;
  if (!o.layers.empty()) {
    const LayerRange lr = parse_layer_range(o.layers);
    only = std::make_pair(lr.begin, lr.end);
  }
  const ReplayScan scan = run_replay_layers(r, layer_capture_files(o.capture), only, o.jobs);
  if (o.brief) {
    std::cout << scan.headline << "\n";
  } else {
    print_replay_scan(std::cout, scan);
  }
  if (!o.json.empty()) {
    auto j = replay_scan_to_json(scan);
    j["schema_version"] = kJsonSchemaVersion;  // as every report's JSON; each layer's "report" carries it too
    write_text_file(o.json, j.dump(2));
  }
  if (!o.junit.empty()) write_text_file(o.junit, replay_scan_to_junit(scan));
  if (!o.html.empty()) write_text_file(o.html, replay_scan_to_html(scan));
  return scan.exit_code;
}

int run_replay_cmd(const ReplayCmdOptions& o) {
  ReplayOptions r;
  r.capture = o.capture;
  r.weights = o.weights;
  r.layer = o.layer;
  r.reference_out = o.reference_out;
  r.k = o.k;
  r.overrides = parse_tol_overrides(o.tol);
  r.progress = !o.quiet;
  if (is_layer_capture_set(o.capture)) return run_replay_scan_cmd(o, r);
  if (o.jobs > 0)
    throw UsageError("--jobs " + std::to_string(o.jobs) + ": " + o.capture + " is a single-layer capture (--jobs "
                     "replays the layers of a whole-model capture side by side)");
  if (!o.layers.empty())
    throw UsageError("--layers " + o.layers + ": " + o.capture + " is a single-layer capture (--layers narrows a "
                     "whole-model capture, FILE.layer<L>.h5)");
  const BisectReport rep = run_replay(r);
  if (o.brief) {
    std::cout << rep.headline << "\n";
    if (!rep.crash.empty()) std::cout << "why: " << rep.crash << "\n";
    if (rep.first) {
      if (!rep.isolation.empty()) std::cout << "isolation: " << rep.isolation << "\n";
      std::cout << "diagnosis: " << rep.diagnosis.pattern << "\n";
    }
  } else {
    print_bisect(std::cout, rep);
  }
  if (!o.json.empty()) {
    auto j = bisect_to_json(rep);
    j["command"] = "replay";
    write_text_file(o.json, j.dump(2));
  }
  if (!o.junit.empty()) write_text_file(o.junit, bisect_to_junit(rep));
  if (!o.html.empty()) write_text_file(o.html, bisect_to_html(rep));
  return rep.exit_code;
}
}  // namespace

void setup_replay(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ReplayCmdOptions>();
  auto* cmd = app.add_subcommand(
      "replay",
      "Debug your own system: replay an MLA layer captured from it (HF transformers, vLLM, SGLang, your kernels; "
      "python/mla_bisect writes captures, docs/capture.md shows where) against the FP32 reference run on the "
      "captured inputs with the checkpoint's weights for that layer. Reports the first divergent probe, whether the "
      "stage introduced it (the reference's stage re-run on the capture's own inputs), the ranks, heads and tokens "
      "off, and the pattern. A capture may hold any subset of probes; those it lacks are listed. A whole-model "
      "capture (FILE.layer<L>.h5 beside FILE.h5, from mla_bisect.hf.capture_model) is replayed layer by layer, each "
      "on its own captured inputs: one line per layer and the first layer whose MLA diverges. Exit 0 none, "
      "1 divergence, 2 bad input (a capture or checkpoint that cannot be replayed), 3 a capture that stopped early");
  cmd->add_option("capture", o->capture, "The captured dump (.h5; FILE.h5 also reads a per-rank set FILE.rank*.h5, or a "
                                           "whole-model capture FILE.layer*.h5)")
      ->required();
  cmd->add_option("--weights", o->weights, "The checkpoint the captured system ran: a directory of safetensors with "
                                           "config.json, a .safetensors file (config.json beside it) or a .gguf; or "
                                           "synthetic[:SEED], the weights of `mla-bisect run`, with the capture's "
                                           "model config")
      ->required();
  cmd->add_option("--layer", o->layer, "The checkpoint layer the capture holds (default: the capture's layer_index "
                                       "attribute, else the first layer of its run_options.layer_range, else 0)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--layers", o->layers, "A whole-model capture (FILE.layer<L>.h5 beside FILE.h5): replay only "
                                         "checkpoint layers A..B-1 (A:B)");
  cmd->add_option("--jobs", o->jobs, "A whole-model capture: layers replayed at once (default 0: one per core, "
                                     "bounded by the host memory); the cores are shared among them")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--reference-out", o->reference_out,
                  "Write the reference's dump here (then `mla-bisect explore CAPTURE REF` explores the pair)");
  cmd->add_option("--json", o->json, "Write the report as JSON");
  cmd->add_option("--junit", o->junit, "Write JUnit XML (one testcase per probe)");
  cmd->add_option("--html", o->html, "Write a self-contained HTML report");
  cmd->add_option("--tol-factor", o->k, "Tolerance = factor x calibrated noise floor")->capture_default_str()
      ->check(finite_number(0, true));
  cmd->add_option("--tol", o->tol, "Override a probe's tolerance: PROBE=REL_L2 (repeatable)");
  cmd->add_flag("--brief", o->brief, "Print only the headline, isolation and diagnosis");
  cmd->add_flag("--quiet", o->quiet, "No progress lines on stderr");
  cmd->callback([o, &exit_code] { exit_code = run_replay_cmd(*o); });
}

}  // namespace mla::cli
