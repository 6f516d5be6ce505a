// In-memory dump accumulation.
#include "probes/collect.h"

namespace mla {

void add_record(Dump& d, int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) {
  if (d.probes.empty() || d.probes.back().layer != layer || d.probes.back().name != spec.name) {
    DumpProbe p;
    p.layer = layer;
    p.name = spec.name;
    p.stage = stage_name(spec.stage);
    p.contract = contract_name(spec.contract);
    p.shape = spec.shape;
    p.order = spec.order;
    p.heads_axis = spec.heads_axis;
    p.rope_from = spec.rope_from;
    p.engine_dtype = rec.dtype;
    d.probes.push_back(std::move(p));
  }
  auto& ranks = d.probes.back().ranks;
  if (static_cast<int>(ranks.size()) <= rank) ranks.resize(rank + 1);
  ranks[rank] = rec;
}

CollectSink::CollectSink(const DumpMeta& meta, int tp) {
  dump_.meta = meta;
  dump_.last_stage.assign(tp, "");
  dump_.status = "running";
}

void CollectSink::stage_begin(int layer, Stage stage, int rank) {
  if (rank < static_cast<int>(dump_.last_stage.size()))
    dump_.last_stage[rank] = "layer " + std::to_string(layer) + " stage " + stage_name(stage);
}

void CollectSink::record(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) {
  add_record(dump_, layer, spec, rank, rec);
}

void CollectSink::finish(const std::string& status) { dump_.status = status; }

}  // namespace mla
