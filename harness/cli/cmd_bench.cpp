// `mla-bisect bench`: times one engine's layer stage by stage (harness/run/bench.h) and prints the table.
#include <fstream>
#include <iostream>
#include <memory>

#include "harness/cli/commands.h"
#include "harness/cli/run_options.h"
#include "core/model/errors.h"
#include "harness/report/bench_report.h"
#include "harness/report/progress.h"

namespace mla::cli {

namespace {
struct BenchCmdOptions {
  RunOptions run;
  std::string engine = "reference";
  int repeats = 5;
  int warmup = 1;
  int probe_repeats = 5;
  int run_layers = 8;
  std::string json;
  bool quiet = false;  // no progress lines on stderr
};

int run_bench_cmd(BenchCmdOptions o, const CLI::App& cmd) {
  if (!cmd.count("--tokens") && o.run.mode == "prefill") o.run.tokens = 512;
  // A device layer takes milliseconds: more rounds (a median of >= 20 after warm-up).
  const bool device = o.engine.rfind("cuda", 0) == 0;
  if (device && !cmd.count("--repeats")) o.repeats = 20;
  if (device && !cmd.count("--warmup")) o.warmup = 3;
  BenchOptions b;
  b.engine = o.engine;
  b.cfg = o.run.load_config();
  b.spec = o.run.to_spec();
  b.spec.validate(b.cfg);
  o.run.check_full_probes({build_graph(b.cfg, b.spec.graph_shape())});
  b.weight_seed = o.run.weight_seed;
  b.repeats = o.repeats;
  b.warmup = o.warmup;
  b.probe_repeats = o.probe_repeats;
  b.run_layers = o.run_layers;
  const ProbePlan plan = o.run.to_plan();
  // The engine is made by run_bench; its devices' memory is checked there by the allocations themselves.
  check_run_memory(b.cfg, b.spec, plan, {.engine = device ? "cuda" : "reference"});
  b.full_probes = plan.full;
  b.probe_levels.clear();
  for (ProbeLevel l : {ProbeLevel::ProbeLevel_stats, ProbeLevel::ProbeLevel_sketch, ProbeLevel::ProbeLevel_full})
    if (l <= plan.level) b.probe_levels.push_back(l);
  if (!o.json.empty() && !std::ofstream(o.json)) throw UsageError("--json: cannot write " + o.json);  // before the long part

  const ProgressLog log(!o.quiet);
  if (log.on()) b.progress = [&log](const std::string& what) { log.step(what); };
  const BenchResult r = run_bench(b);
  log.step("bench done");
  print_bench(r, std::cout);
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    out << bench_to_json(r).dump(2) << "\n";
    if (!out) throw UsageError("--json: cannot write " + o.json);
    std::cout << "json " << o.json << "\n";
  }
  return 0;
}
}  // namespace

void setup_bench(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<BenchCmdOptions>();
  auto* cmd = app.add_subcommand(
      "bench", "Time every stage and the whole layer of one engine (probes off, then with probes at each level up "
               "to --probe-level), with FLOPs, GFLOP/s and, measured in the same run, an Eigen GEMM of the largest "
               "projection's size as the ceiling. --tokens defaults to 512 in prefill.");
  add_run_options(*cmd, o->run);
  cmd->get_option("--tokens")->description("New tokens per sequence, >= 1 (omitted: 512 prefill, 1 decode, 32 chunked)");
  cmd->add_option("--engine", o->engine, "Engine and options, e.g. reference, reference:precision=bf16, cuda, "
                  "cuda:poison=0,mha_kernel=1 (cuda: device events, ceilings measured on the GPU; --repeats 20 and "
                  "--warmup 3 unless given)")
      ->capture_default_str();
  cmd->add_option("--repeats", o->repeats, "Timed rounds (figures are their median)")->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", o->warmup, "Untimed rounds first")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--probe-repeats", o->probe_repeats,
                  "Device engines: rounds of the probe-overhead comparison (the layer's wall with and without probes, its host "
                  "and device parts, and each stage's probes' device time; at most --repeats; 0: skip it)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--run-layers", o->run_layers,
                  "Device engines: the probe overhead is also measured per layer of runs of this many layers back to "
                  "back (the model's layers again and again, as a deeper model or decode steps run; where the probes "
                  "are held, a layer's records are built while the next one runs), beside one layer alone")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--json", o->json, "Also write the figures (every sample included) to this JSON file");
  cmd->add_flag("--quiet", o->quiet, "No progress lines on stderr");
  cmd->callback([o, cmd, &exit_code] { exit_code = run_bench_cmd(*o, *cmd); });
}

}  // namespace mla::cli
