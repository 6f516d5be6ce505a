// `mla-bisect run`: one engine on one model and input; prints the per-probe table.
#include <chrono>
#include <iostream>

#include "harness/cli/commands.h"
#include "harness/cli/run_options.h"
#include "harness/model/inputs.h"
#include "harness/model/weights.h"
#include "harness/report/probe_table.h"
#include "harness/run/engine.h"
#include "harness/run/runner.h"

namespace mla::cli {

namespace {
struct RunCmdOptions {
  RunOptions run;
  std::string engine = "reference";
};

int run_run(const RunCmdOptions& o) {
  const MlaConfig cfg = load_model_config(o.run.model);
  const RunSpec spec = o.run.to_spec();
  const ProbePlan plan = o.run.to_plan();
  Runner runner(cfg, spec);
  auto engine = make_engine(EngineSpec::parse(o.engine));
  const auto t0 = std::chrono::steady_clock::now();
  const auto weights = synthetic_weights(cfg, spec.layers, spec.graph_shape().input_norm, o.run.weight_seed);
  const Inputs inputs = synthetic_inputs(cfg, spec, weights);
  TableSink table;
  ProgressSink progress(table, spec.layers, static_cast<int>(runner.graph().stages.size()), spec.tp);
  const auto t1 = std::chrono::steady_clock::now();
  runner.run(*engine, weights, inputs, plan, progress);
  const auto t2 = std::chrono::steady_clock::now();
  std::cout << "model " << cfg.name << "  engine " << engine->name() << ":" << engine->options() << "  mode "
            << mode_name(spec.mode) << "  attention " << form_name(spec.form) << "  tokens " << inputs.batch.tokens()
            << "  tp " << spec.tp << "  layers " << spec.layers << "  seed " << spec.seed << "\n"
            << "softmax scale " << cfg.softmax_scale << "  rope cos/sin scale " << cfg.rope_mscale << "\n\n";
  table.print(std::cout);
  std::cout << "\nsetup " << std::chrono::duration<double>(t1 - t0).count() << " s, run "
            << std::chrono::duration<double>(t2 - t1).count() << " s\n";
  return 0;
}
}  // namespace

void setup_run(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<RunCmdOptions>();
  auto* cmd = app.add_subcommand("run", "Run one engine over every MLA stage and print each probe's shape, L2 norm "
                                        "and absmax");
  add_run_options(*cmd, o->run);
  cmd->add_option("--engine", o->engine, "Engine and options, e.g. reference, reference:precision=bf16, cuda")
      ->capture_default_str();
  cmd->callback([o, &exit_code] { exit_code = run_run(*o); });
}

}  // namespace mla::cli
