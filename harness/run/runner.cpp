// Runner: graph walk, probe capture.
#include "harness/run/runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <exception>
#include <limits>
#include <thread>

#include "core/model/errors.h"
#include "core/model/progress_hook.h"

namespace mla {

namespace {
bool targets(const Injection& inj, const StageSpec& st, int rank) {
  // "*" (every stage) is accepted by the parser only where it means something (slow-at).
  return (inj.target == "*" || inj.target == stage_name(st.stage)) && (inj.rank < 0 || inj.rank == rank);
}

// The engine-agnostic injections: a hang, a crash or a sleep at a stage's entry (after the sinks heard the stage
// begin: a dump's journal already names it), one NaN written into a probe.
void apply_entry_injections(const Engine& engine, const StageSpec& st, int rank) {
  for (const auto& inj : engine.injections()) {
    if (inj.name == "slow-at" && targets(inj, st, rank))
      std::this_thread::sleep_for(std::chrono::milliseconds(inj.ms));
    if (inj.name == "hang-at" && targets(inj, st, rank))
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    if (inj.name == "crash-at" && targets(inj, st, rank)) std::abort();
  }
}

bool stops_at_entry(const Engine& engine, const StageSpec& st, int rank) {
  for (const auto& inj : engine.injections())
    if ((inj.name == "hang-at" || inj.name == "crash-at") && targets(inj, st, rank)) return true;
  return false;
}

void apply_nan_injections(Engine& engine, const StageSpec& st, int rank) {
  for (const auto& inj : engine.injections()) {
    if (inj.name != "nan-at" || (inj.rank >= 0 ? inj.rank : 0) != rank) continue;
    for (const auto& out : st.outputs)
      if (out == inj.target) {
        Tensor t = engine.download(rank, out);
        if (inj.index >= t.numel())
          throw UsageError("--inject " + inj.text + ": index " + std::to_string(inj.index) + " is outside " + out +
                           " " + shape_string(t.shape) + " on rank " + std::to_string(rank));
        t.data[inj.index] = std::numeric_limits<float>::quiet_NaN();
        engine.upload(rank, out, t);
      }
  }
}

}  // namespace

Runner::Runner(const MlaConfig& cfg, const RunSpec& spec) : cfg_(cfg), spec_(spec) {
  cfg_.validate();
  spec_.validate(cfg_);
  graph_ = build_graph(cfg_, spec_.graph_shape());
  weights_ = build_weights(cfg_, spec_.graph_shape());
}

void Runner::set_process_rank(const ProcessRank& p) {
  if (p.per_process() && (p.rank >= spec_.tp || p.world != spec_.tp))
    throw UsageError("process rank " + std::to_string(p.rank) + " of " + std::to_string(p.world) +
                     " processes does not fit --tp " + std::to_string(spec_.tp));
  process_ = p;
}

// The weights of `layer` as the engine computes with them, one record per weight and rank, before the layer's
// first stage: a comparison checks them before any activation. Engines that do not say record nothing.
void Runner::record_weights(Engine& engine, int layer, const ProbePlan& plan, ProbeSink& sink,
                            const std::function<bool(int)>& mine) const {
  int ranks = 0, done = 0;
  for (int rank = 0; rank < spec_.tp; ++rank) ranks += mine(rank) && engine.owns_rank(rank);
  const auto wanted = [&](const ProbeSpec& w) { return plan.only_weights.empty() || plan.only_weights.count(w.name); };
  const double total = static_cast<double>(std::count_if(weights_.begin(), weights_.end(), wanted)) * ranks;
  for (const auto& w : weights_) {
    if (!wanted(w)) continue;
    // A replicated weight the engine holds once for every rank (the same tensor in memory, asked for with the same
    // request) has one record: it is computed for the first rank and given to the others.
    const Tensor* last_held = nullptr;
    ProbeRequest last_req;
    ProbeRecord last_rec;
    for (int rank = 0; rank < spec_.tp; ++rank) {
      if (!mine(rank) || !engine.owns_rank(rank)) continue;
      if (progress_wanted())
        progress_tick("weights", "layer " + std::to_string(layer + 1) + "/" + std::to_string(spec_.layers) +
                      " weights: recording " + w.name + (spec_.tp > 1 ? " rank " + std::to_string(rank) : ""),
                      done++, total);
      Tensor scratch;
      const Tensor* held = engine.weight(layer, rank, w.name, scratch);
      if (!held) return;
      const Tensor& t = *held;
      const auto local = local_shape(w, spec_.tp);
      if (t.shape != local)
        throw EngineError("engine " + engine.name() + " gave layer " + std::to_string(layer) + " weight " + w.name +
                          " of rank " + std::to_string(rank) + " as " + shape_string(t.shape) + ", expected " +
                          shape_string(local));
      ProbeLevel level = plan.level_for(w.name);
      if (plan.full.count("weights")) level = ProbeLevel::ProbeLevel_full;
      const ProbeRequest req = make_probe_request(w, spec_.tp, rank, level);
      if (held == &scratch || held != last_held || req != last_req) {
        last_rec = compute_probe_record(t, engine.dtype(), req);
        last_held = held != &scratch ? held : nullptr;
        last_req = req;
      }
      sink.record_weight(layer, w, rank, last_rec);
    }
  }
}

void Runner::run(Engine& engine, const std::vector<LayerWeights>& weights, const Inputs& inputs,
                 const ProbePlan& plan, ProbeSink& sink, const BeforeStage& before) const {
  if (cfg_.has_dsa())
    for (size_t l = 0; l < weights.size(); ++l)
      if (weights[l].idx_wq_b.empty())
        throw UsageError("layer " + std::to_string(l) + " of the run has no indexer weights: model '" + cfg_.name +
                         "' selects keys with DSA's indexer, and a shared indexer layer (indexer_types 'shared': the "
                         "previous layer's top-k reused) is not modelled; run layers that have their own indexer");
  RunContext ctx{&cfg_, &spec_, &graph_, &weights, &inputs};
  ctx.packed = packed_;
  ctx.dequant_bugs = dequant_bugs_;
  ctx.process = process_;
  engine.prepare(ctx);
  // One process per rank: this process's rank is the only one the sink hears of.
  const bool per_process = process_.per_process();
  const auto mine = [&](int rank) { return !per_process || rank == process_.rank; };
  if (per_process && !engine.owns_rank(process_.rank))
    throw EngineError("engine " + engine.name() + " does not hold rank " + std::to_string(process_.rank) +
                      ", this process's rank");
  // Probes are started after their stage; an engine that queues them on a device (queues_probes) hands back
  // the finished records after each stage and the rest at the end of each layer (a pipelining engine's at the end
  // of the next one, pipelines_probes), so it never waits for them mid-layer. Whatever is pending is collected
  // before a planted hang or crash and when the run fails: probes of finished stages reach the sink.
  struct Started {
    int layer;
    const ProbeSpec* spec;
    int rank;
  };
  std::deque<Started> started;
  // take: hands the records the engine has (all of them with wait) to the sink, oldest first.
  auto take = [&](bool wait) {
    if (started.empty()) return;
    std::vector<ProbeRecord> recs;
    std::exception_ptr failed;
    try {
      engine.collect_probes(recs, wait);
    } catch (...) {
      failed = std::current_exception();
    }
    const size_t n = std::min(recs.size(), started.size());
    for (size_t i = 0; i < n; ++i)
      sink.record_owned(started[i].layer, *started[i].spec, started[i].rank, std::move(recs[i]));
    started.erase(started.begin(), started.begin() + static_cast<std::ptrdiff_t>(n));
    if (failed) {
      started.clear();
      std::rethrow_exception(failed);
    }
  };
  // collect(true) on a queuing engine polls, naming the stage it waits for (a device hang is there): the stage
  // whose device work the engine says is not done, else the stage of the oldest record not yet in. It waits for
  // every record started, or (a pipelining engine at a layer's end) for those of the layers before `keep`'s: that
  // layer's records are built while the next layer runs.
  const bool queued = engine.queues_probes();
  const bool pipelined = queued && engine.pipelines_probes();
  auto collect = [&](bool wait, int keep = -1) {
    if (!wait || !queued) return take(wait);
    if (!started.empty()) engine.flush_probes();
    struct Where {
      int layer = -1;
      Stage stage{};
      int rank = -1;
      bool operator!=(const Where& o) const { return layer != o.layer || stage != o.stage || rank != o.rank; }
    } told;  // what the sink was last told
    while (!started.empty() && started.front().layer != keep) {
      const Started oldest = started.front();
      Where now{oldest.layer, oldest.spec->stage, oldest.rank};
      engine.device_stage(oldest.rank, now.layer, now.stage);
      if (now != told) sink.waiting(now.layer, now.stage, now.rank);
      told = now;
      const size_t before_take = started.size();
      take(false);
      if (started.size() == before_take) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    if (told.rank >= 0) sink.waiting_over();  // e.g. a planted hang that follows is the begun stage's, not the wait's
  };
  // The stages (of every rank this process computes) up to the end of the run, or to the stage it stops after: the
  // count the progress ticks measure.
  int ranks_here = 0, begun = 0;
  for (int rank = 0; rank < spec_.tp; ++rank) ranks_here += engine.owns_rank(rank);
  const int per_layer = static_cast<int>(graph_.stages.size()) * ranks_here;
  double stages_total = static_cast<double>(per_layer) * spec_.layers;
  if (stop_layer_ >= 0 && stop_layer_ < spec_.layers)
    for (size_t i = 0; i < graph_.stages.size(); ++i)
      if (graph_.stages[i].stage == stop_stage_)
        stages_total = static_cast<double>(per_layer) * stop_layer_ + static_cast<double>(i + 1) * ranks_here;
  bool stopped = false;
  try {
    for (int layer = 0; layer < spec_.layers && !stopped; ++layer) {
      if (!plan.off && plan.weights) record_weights(engine, layer, plan, sink, mine);
      for (const auto& st : graph_.stages) {
        // Per process, the stage begins (for the journal and the watchdog) before the other ranks this process
        // computes: the time they take is this stage's.
        if (per_process) sink.stage_begin(layer, st.stage, process_.rank);
        for (int rank = 0; rank < spec_.tp; ++rank) {
          if (!engine.owns_rank(rank)) continue;
          if (!per_process) sink.stage_begin(layer, st.stage, rank);
          if (progress_wanted())
            progress_tick("stages", "layer " + std::to_string(layer + 1) + "/" + std::to_string(spec_.layers) +
                          " stage " + stage_name(st.stage) + (spec_.tp > 1 ? " rank " + std::to_string(rank) + "/" +
                          std::to_string(spec_.tp) : ""), begun, stages_total);
          ++begun;
          if (mine(rank)) {
            if (stops_at_entry(engine, st, rank)) collect(true);
            apply_entry_injections(engine, st, rank);
          }
          if (before) before(engine, st, layer, rank);
          engine.run_stage(st, layer, rank);
          apply_nan_injections(engine, st, rank);
          if (after_) after_(engine, st, layer, rank);
        }
        if (!plan.off)
          for (int rank = 0; rank < spec_.tp; ++rank) {
            if (!mine(rank) || !engine.owns_rank(rank)) continue;
            for (const auto& name : st.outputs) {
              const ProbeSpec& p = *graph_.find(name);
              const ProbeLevel level = plan.recorded_level(name, shape_numel(local_shape(p, spec_.tp)));
              engine.probe_async(rank, p, make_probe_request(p, spec_.tp, rank, level));
              started.push_back({layer, &p, rank});
            }
          }
        collect(!queued);
        if (layer == stop_layer_ && st.stage == stop_stage_) {
          stopped = true;
          break;
        }
      }
      const bool last = stopped || layer + 1 == spec_.layers;
      collect(true, pipelined && !last ? layer : -1);
    }
  } catch (...) {
    try {
      take(true);
    } catch (...) {  // the first failure is the one to report
    }
    throw;
  }
  engine.synchronize();
  sink.finish(stopped ? std::string("stopped after stage ") + stage_name(stop_stage_) + " of layer " +
                            std::to_string(stop_layer_)
                      : std::string("complete"));
}

}  // namespace mla
