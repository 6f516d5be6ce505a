// In-memory dump accumulation.
#include "probes/collect.h"

#include <utility>

namespace mla {

namespace {
// `rec`: a const ProbeRecord& (copied in) or a ProbeRecord&& (moved in).
template <class Rec>
void add_to(std::vector<DumpProbe>& list, int layer, const ProbeSpec& spec, int rank, Rec&& rec) {
  // A stage's outputs arrive rank by rank (q_nope, q_pe of rank 0, then of rank 1): look back a little.
  DumpProbe* found = nullptr;
  for (auto it = list.rbegin(); it != list.rend() && it->layer == layer; ++it)
    if (it->name == spec.name) {
      found = &*it;
      break;
    }
  if (!found) {
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
    list.push_back(std::move(p));
    found = &list.back();
  }
  auto& ranks = found->ranks;
  if (static_cast<int>(ranks.size()) <= rank) ranks.resize(rank + 1);
  ranks[rank] = std::forward<Rec>(rec);
}
}  // namespace

void add_record(Dump& d, int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) {
  add_to(d.probes, layer, spec, rank, rec);
}

void add_record(Dump& d, int layer, const ProbeSpec& spec, int rank, ProbeRecord&& rec) {
  add_to(d.probes, layer, spec, rank, std::move(rec));
}

void add_weight_record(Dump& d, int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) {
  add_to(d.weights, layer, spec, rank, rec);
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

void CollectSink::record_owned(int layer, const ProbeSpec& spec, int rank, ProbeRecord&& rec) {
  add_record(dump_, layer, spec, rank, std::move(rec));
}

void CollectSink::record_weight(int layer, const ProbeSpec& spec, int rank, const ProbeRecord& rec) {
  add_weight_record(dump_, layer, spec, rank, rec);
}

void CollectSink::finish(const std::string& status) { dump_.status = status; }

}  // namespace mla
