// The Runner owns the dataflow of a run: it walks the stage graph layer by layer, stage by stage, rank by
// rank, hands each stage to the engine, and sends every probe to the sink. With one process per rank
// (set_process_rank), it runs the ranks the engine owns and sends only its process's rank to the sink.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/engine/engine.h"
#include "core/model/inputs.h"
#include "core/model/stage_graph.h"
#include "core/model/weights.h"
#include "core/probe/probe.h"

namespace mla {

class Runner {
 public:
  Runner(const MlaConfig& cfg, const RunSpec& spec);  // validates: throws UsageError
  const StageGraph& graph() const { return graph_; }

  // Called before each stage of each rank; isolation uses it to upload reference inputs.
  using BeforeStage = std::function<void(Engine&, const StageSpec&, int layer, int rank)>;

  void run(Engine& engine, const std::vector<LayerWeights>& weights, const Inputs& inputs, const ProbePlan& plan,
           ProbeSink& sink, const BeforeStage& before = nullptr) const;

  // Called after each stage of each rank, before its probes are recorded (what it leaves in the engine is what the
  // probes and the later stages see): a reference run on a candidate's DSA selection uses it (selection_feed,
  // harness/run/calibrate.h). Applies to every later run().
  void set_after_stage(BeforeStage after) { after_ = std::move(after); }

  // The packed projections (LoadedWeights::packed, kept alive by the caller) and the dequantization bugs,
  // handed to the engine in RunContext by every later run(); nullptr: none.
  void set_packed_weights(const std::vector<std::map<std::string, PackedWeight>>* packed, const DequantBugs& bugs) {
    packed_ = packed;
    dequant_bugs_ = bugs;
  }

  // One process per rank (`run --rank`): handed to the engine in RunContext::process. Each later run() runs the
  // stages of every rank the engine owns (the reference owns all: each process computes every rank, which is how
  // the CPU path splits), but begins stages, probes and records only `p.rank`, and plants hang-at and crash-at only
  // there (a hang planted on another rank is that rank's process's business); nan-at is data and acts wherever
  // its rank is computed. Throws UsageError when p does not fit the spec's tp.
  void set_process_rank(const ProcessRank& p);
  const ProcessRank& process_rank() const { return process_; }

  // Every later run() stops after `stage` of `layer`, its probes recorded: what a look at one stage needs (bisect's
  // full tensors and isolation), without the stages after it. The sink hears "stopped after stage S of layer L".
  void set_stop_after(int layer, Stage stage) {
    stop_layer_ = layer;
    stop_stage_ = stage;
  }

 private:
  void record_weights(Engine& engine, int layer, const ProbePlan& plan, ProbeSink& sink,
                      const std::function<bool(int)>& mine) const;

  MlaConfig cfg_;
  RunSpec spec_;
  StageGraph graph_;
  std::vector<ProbeSpec> weights_;  // build_weights: recorded before each layer's first stage
  const std::vector<std::map<std::string, PackedWeight>>* packed_ = nullptr;
  BeforeStage after_;
  DequantBugs dequant_bugs_;
  ProcessRank process_;
  int stop_layer_ = -1;  // none
  Stage stop_stage_{};
};

}  // namespace mla
