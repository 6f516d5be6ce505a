// A probe's (or a weight's) group of a dump and its rank records (probes/dump_records.h).
#include "probes/dump_records.h"

#include <algorithm>
#include <map>
#include <vector>

#include "core/model/errors.h"

namespace mla::dump_detail {

namespace {

std::vector<int64_t> local_probe_shape(const DumpProbe& p, int tp) {
  auto s = p.shape;
  if (p.contract == "heads") s[p.heads_axis] /= tp;
  if (p.contract == "rows") s[0] /= tp;
  if (p.contract == "columns" && s.size() > 1) s[1] /= tp;
  return s;
}

// A group name as write_probe writes it: rank{r}, no sign or leading zeros, r < 10^6.
bool parse_rank_name(const std::string& c, int* rank) {
  if (c.rfind("rank", 0) != 0 || c.size() == 4 || c.size() > 10) return false;
  if (c.find_first_not_of("0123456789", 4) != std::string::npos || (c[4] == '0' && c.size() > 5)) return false;
  *rank = std::stoi(c.substr(4));
  return true;
}

// One rank's record. Without `data` the statistics and token_l2 are required; with it, any of them missing is
// computed from it as the C++ writer computes them (compute_probe_record).
ProbeRecord read_rank(const h5::Group& rg, const DumpProbe& p, int rank, const ProbeContext& ctx) {
  const std::string& w = rg.where();
  for (const auto& c : rg.children()) {
    if (c != "token_l2" && c != "head_l2" && c != "sketch" && c != "data")
      throw UsageError(w + "/" + c + ": not part of a rank's record (token_l2, head_l2, sketch, data)");
    if (!rg.has_dataset(c)) throw UsageError(w + "/" + c + ": is not a dataset");
  }
  const auto local = local_probe_shape(p, ctx.tp);
  const int64_t T = local[0];  // tokens, or this rank's rows of a weight
  ProbeRecord rec;
  rec.shape = rg.has_attr("shape") ? rg.attr_ints("shape") : local;
  if (rec.shape != local)
    throw UsageError(w + ": shape " + shape_string(rec.shape) + ", expected " + shape_string(local) + " (" +
                     p.contract + " probe " + shape_string(p.shape) + " at tp " + std::to_string(ctx.tp) + ")");
  rec.dtype = rg.attr_string_or("dtype", p.engine_dtype);
  check_dtype(w, "dtype", rec.dtype, kRecordDtypes);
  const bool has_data = rg.has("data"), has_sketch = rg.has("sketch");
  if (has_data) {
    const auto ds = rg.open_dataset("data").shape();
    if (ds != local)
      throw UsageError(w + "/data: shape " + shape_string(ds) + ", expected " + shape_string(local) + " (the rank's " +
                       "shape: " + p.contract + " probe " + shape_string(p.shape) + " at tp " + std::to_string(ctx.tp) +
                       ")");
  }
  const std::string level = rg.attr_string_or("level", has_data ? "full" : has_sketch ? "sketch" : "stats");
  try {
    rec.level = parse_probe_level(level);
  } catch (const UsageError&) {
    throw UsageError(w + ": level '" + level + "' (expected stats, sketch or full)");
  }
  if (rec.level == ProbeLevel::ProbeLevel_full && !has_data)
    throw UsageError(w + ": level 'full' without a 'data' dataset");
  if (rec.level != ProbeLevel::ProbeLevel_full && has_data)
    throw UsageError(w + ": a 'data' dataset at level '" + level + "' (a record with its tensor is level full)");
  if (rg.has("token_l2")) rec.token_l2 = rg.read<float>("token_l2", {T});
  if (rg.has("head_l2")) {
    if (p.heads_axis < 0) throw UsageError(w + ": head_l2 on a probe without a heads axis");
    rec.head_l2 = rg.read<float>("head_l2", {T, local[p.heads_axis]});
  }
  if (has_sketch) rec.sketch = rg.read<float>("sketch", {T, kSketchDim});

  static const char* const kStats[] = {"l2", "absmax", "mean", "std", "nan", "inf", "checksum"};
  bool incomplete = rec.token_l2.empty() || (p.heads_axis >= 0 && rec.head_l2.empty()) || rec.sketch.empty();
  for (const char* a : kStats) incomplete = incomplete || !rg.has_attr(a);
  Tensor data;
  if (has_data && (ctx.opts->data || incomplete)) {
    data.data = rg.read<float>("data", local);
    data.shape = local;
  }
  ProbeRecord computed;
  if (has_data && incomplete) {
    ProbeRequest req;
    req.level = ProbeLevel::ProbeLevel_full;
    req.tokens = T;
    req.heads = p.heads_axis >= 0 ? local[p.heads_axis] : 0;
    req.col_offset = p.contract == "heads" || p.contract == "columns"
                         ? static_cast<int64_t>(rank) * (shape_numel(local) / T)
                         : 0;
    req.probe_key = probe_key(p.name);
    computed = compute_probe_record(data, rec.dtype, req);
    if (rec.dtype.rfind("fp8_", 0) == 0 && !rg.has_attr("checksum"))
      computed.checksum = fp8_checksum(data, T, rec.dtype, w);
  }
  // Without data a missing statistic is an error (the attribute readers name it); with data it is computed.
  const auto number = [&](const char* a, double computed_value) {
    return has_data && !rg.has_attr(a) ? computed_value : rg.attr_double(a);
  };
  const auto count = [&](const char* a, int64_t computed_value) {
    return has_data && !rg.has_attr(a) ? computed_value : rg.attr_int(a);
  };
  rec.l2 = number("l2", computed.l2);
  rec.absmax = number("absmax", computed.absmax);
  rec.mean = number("mean", computed.mean);
  rec.std = number("std", computed.std);
  rec.nan = count("nan", computed.nan);
  rec.inf = count("inf", computed.inf);
  const int64_t numel = shape_numel(local);
  if (rec.nan < 0 || rec.inf < 0 || rec.nan > numel || rec.inf > numel - rec.nan)
    throw UsageError(w + ": nan " + std::to_string(rec.nan) + " and inf " + std::to_string(rec.inf) +
                     " do not fit the rank's " + std::to_string(numel) + " values");
  rec.checksum = rg.has_attr("checksum") ? rg.attr_uint("checksum") : computed.checksum;
  if (!has_data && rec.token_l2.empty())
    throw UsageError(w + ": missing dataset 'token_l2' (required when the record has no 'data')");
  if (rg.has_attr("l2") && !rec.token_l2.empty()) check_norms_agree(w, rec);
  if (rec.token_l2.empty()) rec.token_l2 = computed.token_l2;
  if (rec.head_l2.empty()) rec.head_l2 = computed.head_l2;
  if (rec.sketch.empty()) rec.sketch = computed.sketch;
  if (ctx.opts->data) rec.data = std::move(data);
  return rec;
}

}  // namespace

DumpProbe read_probe(const h5::Group& g, int layer, const std::string& name, const ProbeContext& ctx) {
  const std::string& w = g.where();
  const int tp = ctx.tp;
  DumpProbe p;
  p.layer = layer;
  p.name = name;
  p.stage = g.attr_string("stage");
  p.contract = g.attr_string("contract");
  p.shape = g.attr_ints("shape");
  const int64_t order = g.attr_int("order");
  p.engine_dtype = g.attr_string_or("engine_dtype", "");
  const int64_t heads_axis = g.attr_int_or("heads_axis", -1), rope_from = g.attr_int_or("rope_from", -1);
  if (!ctx.weights && p.contract != "replicated" && p.contract != "heads" && p.contract != "partial")
    throw UsageError(w + ": contract '" + p.contract + "' (expected replicated, heads or partial)");
  if (ctx.weights && p.contract != "replicated" && p.contract != "rows" && p.contract != "columns")
    throw UsageError(w + ": contract '" + p.contract + "' (a weight's is replicated, rows or columns)");
  if (ctx.weights && p.shape.size() == 2 && p.shape[p.contract == "columns" ? 1 : 0] % tp != 0 &&
      p.contract != "replicated")
    throw UsageError(w + ": " + p.contract + " " + shape_string(p.shape) + " do not divide over tp " +
                     std::to_string(tp));
  try {
    parse_stage(p.stage);
  } catch (const UsageError&) {
    throw UsageError(w + ": stage '" + p.stage + "' is not a stage name");
  }
  check_dtype(w, "engine_dtype", p.engine_dtype, kRecordDtypes);
  if (order < 0 || order > 1000) throw UsageError(w + ": order " + std::to_string(order) + " is out of range");
  p.order = static_cast<int>(order);
  if (p.shape.empty()) throw UsageError(w + ": empty shape");
  int64_t values = 1;  // below 2^62, as a dataset's
  for (int64_t s : p.shape) {
    if (s <= 0 || s > (int64_t{1} << 40) || values > (int64_t{1} << 62) / s)
      throw UsageError(w + ": shape " + shape_string(p.shape) + " is not valid");
    values *= s;
  }
  if (heads_axis < -1 || heads_axis >= static_cast<int64_t>(p.shape.size()))
    throw UsageError(w + ": heads_axis " + std::to_string(heads_axis) + " outside shape " + shape_string(p.shape));
  p.heads_axis = static_cast<int>(heads_axis);
  if (rope_from < -1 || rope_from >= p.shape.back())
    throw UsageError(w + ": rope_from " + std::to_string(rope_from) + " outside the last axis of shape " +
                     shape_string(p.shape));
  p.rope_from = static_cast<int>(rope_from);
  if (p.contract == "heads") {
    if (p.heads_axis < 0) throw UsageError(w + ": contract heads without a heads_axis");
    if (p.shape[p.heads_axis] % tp != 0)
      throw UsageError(w + ": " + std::to_string(p.shape[p.heads_axis]) + " heads do not divide over tp " +
                       std::to_string(tp));
  }
  if (!ctx.weights && ctx.tokens >= 0 && p.shape[0] != ctx.tokens)
    throw UsageError(w + ": shape " + shape_string(p.shape) + " holds " + std::to_string(p.shape[0]) + " tokens, " +
                     ctx.tokens_from + " " + std::to_string(ctx.tokens) + " (every probe and the inputs hold the "
                     "step's T tokens)");
  check_against_graph(p, *ctx.table, w);

  std::map<int, std::string> rank_groups;
  for (const auto& c : g.children()) {
    int r = 0;
    if (!parse_rank_name(c, &r))
      throw UsageError(w + "/" + c + ": not a rank group (a probe's group holds rank0, rank1, ... only)");
    if (!g.has_group(c)) throw UsageError(w + "/" + c + ": is not a group");
    rank_groups[r] = c;
  }
  if (rank_groups.empty()) throw UsageError(w + ": no rank groups (rank0, ...): a probe holds at least one record");
  int expect = ctx.own >= 0 ? ctx.own : 0;
  for (const auto& [r, c] : rank_groups) {
    if (ctx.own >= 0 && r != ctx.own)
      throw UsageError(w + ": has " + c + " but the dump holds only rank " + std::to_string(ctx.own) +
                       " (one process per rank)");
    if (r != expect) throw UsageError(w + ": has " + c + " but no rank" + std::to_string(expect));
    if (r >= tp) throw UsageError(w + ": has " + c + " but the dump's tp is " + std::to_string(tp));
    ++expect;
  }
  if (ctx.complete && ctx.own < 0 && expect != tp)
    throw UsageError(w + ": rank" + std::to_string(expect) + " is missing: the dump's status is complete at tp " +
                     std::to_string(tp) + ", so every probe holds rank0 ... rank" + std::to_string(tp - 1));
  for (const auto& [r, c] : rank_groups) p.ranks.push_back(read_rank(g.open_group(c), p, r, ctx));
  return p;
}

bool parse_layer_name(const std::string& name, int* layer) {
  if (name.rfind("layer", 0) != 0 || name.size() == 5 || name.size() > 12) return false;
  if (name.find_first_not_of("0123456789", 5) != std::string::npos) return false;
  if (name[5] == '0' && name.size() > 6) return false;
  *layer = std::stoi(name.substr(5));
  return true;
}

void read_weights(const h5::File& f, Dump& d, ProbeContext ctx, const MlaConfig* cfg, const RunSpec* spec) {
  if (!f.has_group("weights")) throw UsageError(f.where() + "weights: is not a group");
  const h5::Group wg = f.open_group("weights");
  const ProbeTable table = make_probe_table(cfg, spec, true);
  ctx.table = &table;
  ctx.weights = true;
  for (const auto& c : wg.children()) {
    int layer = 0;
    if (!parse_layer_name(c, &layer) || !wg.has_group(c))
      throw UsageError(wg.where() + "/" + c + ": not a layer group (/weights holds layer{l} groups)");
    if (spec && layer >= spec->layers)
      throw UsageError(wg.where() + "/" + c + ": the run options have " + std::to_string(spec->layers) + " layer" +
                       (spec->layers == 1 ? "" : "s"));
    const h5::Group lg = wg.open_group(c);
    for (const auto& wn : lg.children()) {
      if (!lg.has_group(wn))
        throw UsageError(lg.where() + "/" + wn + ": is not a group (a layer holds one group per weight)");
      d.weights.push_back(read_probe(lg.open_group(wn), layer, wn, ctx));
    }
  }
  std::stable_sort(d.weights.begin(), d.weights.end(), [](const DumpProbe& a, const DumpProbe& b) {
    return a.layer != b.layer ? a.layer < b.layer : a.order < b.order;
  });
}

}  // namespace mla::dump_detail
