// Runner: graph walk, probe capture.
#include "harness/run/runner.h"

namespace mla {

Runner::Runner(const MlaConfig& cfg, const RunSpec& spec) : cfg_(cfg), spec_(spec) {
  cfg_.validate();
  spec_.validate(cfg_);
  graph_ = build_graph(cfg_, spec_.graph_shape());
}

void Runner::run(Engine& engine, const std::vector<LayerWeights>& weights, const Inputs& inputs,
                 const ProbePlan& plan, ProbeSink& sink, const BeforeStage& before) const {
  RunContext ctx{&cfg_, &spec_, &graph_, &weights, &inputs};
  engine.prepare(ctx);
  for (int layer = 0; layer < spec_.layers; ++layer) {
    for (const auto& st : graph_.stages) {
      for (int rank = 0; rank < spec_.tp; ++rank) {
        sink.stage_begin(layer, st.stage, rank);
        if (before) before(engine, st, layer, rank);
        engine.run_stage(st, layer, rank);
      }
      for (int rank = 0; rank < spec_.tp; ++rank)
        for (const auto& name : st.outputs) {
          const ProbeSpec& p = *graph_.find(name);
          sink.record(layer, p, rank, engine.probe(rank, p, make_probe_request(p, spec_.tp, rank, plan.level_for(name))));
        }
    }
  }
  engine.synchronize();
  sink.finish("complete");
}

}  // namespace mla
