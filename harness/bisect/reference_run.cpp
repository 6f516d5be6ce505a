#include "harness/bisect/reference_run.h"

#include "harness/run/runner.h"
#include "probes/collect.h"

namespace mla {

namespace {

// Hands the dump writer each record at the level the run options give it and keeps every probe's record in full.
class LevelSplitSink : public ProbeSink {
 public:
  LevelSplitSink(ProbeSink& writer, CollectSink& full, const ProbePlan& plan, int tp)
      : writer_(writer), full_(full), plan_(plan), tp_(tp) {}
  void stage_begin(int layer, Stage stage, int rank) override {
    writer_.stage_begin(layer, stage, rank);
    full_.stage_begin(layer, stage, rank);
  }
  void waiting(int layer, Stage stage, int rank) override { writer_.waiting(layer, stage, rank); }
  void waiting_over() override { writer_.waiting_over(); }
  void record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) override {
    const ProbeLevel level = plan_.recorded_level(spec.name, shape_numel(local_shape(spec, tp_)));
    writer_.record(layer, spec, rank, record_at_level(rec, level));
    full_.record(layer, spec, rank, rec);
  }
  void record_owned(int layer, const ProbeSpec& spec, int rank, ProbeRecord&& rec) override {
    const ProbeLevel level = plan_.recorded_level(spec.name, shape_numel(local_shape(spec, tp_)));
    writer_.record(layer, spec, rank, record_at_level(rec, level));
    full_.record_owned(layer, spec, rank, std::move(rec));
  }
  void record_weight(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) override {
    writer_.record_weight(layer, spec, rank, rec);
  }
  void finish(const std::string& status) override {
    writer_.finish(status);
    full_.finish(status);
  }

 private:
  ProbeSink& writer_;
  CollectSink& full_;
  const ProbePlan& plan_;
  int tp_;
};

}  // namespace

Dump run_reference_here(Engine& engine, const MlaConfig& cfg, const RunSpec& spec, const std::vector<LayerWeights>& w,
                        const Inputs& in, const ProbePlan& plan, const DumpMeta& meta, const std::string& path) {
  Runner runner(cfg, spec);
  // Every probe in full; the weights at the run options' levels (no weight is named as a probe).
  ProbePlan all = plan;
  for (const auto& p : runner.graph().probes) all.full.insert(p.name);
  CollectSink full({}, spec.tp);
  DumpWriter writer(path, meta, &in);
  LevelSplitSink split(writer, full, plan, spec.tp);
  runner.run(engine, w, in, all, split);
  return full.take();
}

}  // namespace mla
