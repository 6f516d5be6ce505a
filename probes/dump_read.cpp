// Reading a dump (schema_versions 1 and 2, docs/dump-format.md: the layout and what the reader refuses), a journal
// folded first; read_dump also reads a one-process-per-rank set as one dump (dump_ranks.cpp).
#include "probes/dump.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>

#include "core/model/errors.h"
#include "core/model/progress_hook.h"
#include "probes/dump_internal.h"
#include "probes/h5.h"
#include "probes/journal.h"
#include "core/probe/probe_hash.h"

namespace mla {

using nlohmann::json;
using namespace dump_detail;

namespace {

// ---------------------------------------------------------------------------------------------------
// HDF5 reading. Dumps come from other programs too (h5py, the Python package): everything docs/dump-format.md
// calls invalid is a UsageError naming the file and the object inside it ("x.h5:/layer0/q_c/rank0: ...").
// ---------------------------------------------------------------------------------------------------

// The root's engine_dtype: the activations' precision, which tolerances are calibrated for.
constexpr const char* kEngineDtypes = "fp32|bf16|fp16";
// A record's dtype (and its probe's engine_dtype): the format the producer held the tensor in, whose bit patterns
// the checksum covers. fp8 records come from captures of engines that keep some activations in fp8.
constexpr const char* kRecordDtypes = "fp32|bf16|fp16|fp8_e4m3|fp8_e5m2";
// The layers a stopped run's dump without a stored cache is read with at most (its layer groups may be fewer than
// its run options' layers): the reader makes an empty cache per layer.
constexpr int64_t kMaxLayersUnstored = 1024;

// "" (not given) or one of `allowed` ("a|b|c").
void check_dtype(const std::string& where, const char* attr, const std::string& v, const char* allowed) {
  if (v.empty()) return;
  const std::string all = std::string("|") + allowed + "|";
  if (v.find('|') == std::string::npos && all.find("|" + v + "|") != std::string::npos) return;
  throw UsageError(where + ": " + attr + " '" + v + "' is not one of " + allowed);
}

// The value of OCP float8 code `code`: e4m3fn (exp_bits 4: no infinities, NaN at S.1111.111) or e5m2 (exp_bits 5,
// IEEE-like: infinities and NaNs at exponent 31).
float fp8_value(unsigned code, int exp_bits) {
  const int mant_bits = 7 - exp_bits, bias = (1 << (exp_bits - 1)) - 1;
  const double s = (code & 0x80) ? -1.0 : 1.0;
  const unsigned e = (code >> mant_bits) & ((1u << exp_bits) - 1), m = code & ((1u << mant_bits) - 1);
  if (exp_bits == 4 && e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  if (exp_bits == 5 && e == 31)
    return m == 0 ? static_cast<float>(s * HUGE_VAL) : std::numeric_limits<float>::quiet_NaN();
  const double frac = static_cast<double>(m) / (1 << mant_bits);
  if (e == 0) return static_cast<float>(s * frac * std::ldexp(1.0, 1 - bias));
  return static_cast<float>(s * (1.0 + frac) * std::ldexp(1.0, static_cast<int>(e) - bias));
}

// The checksum of an fp8 record (its data as float32 values, which fp8 holds exactly): the 8-bit codes in place of
// compute_probe_record's 16/32-bit patterns; NaN counts as sign|0x7f (e4m3) or sign|0x7e (e5m2).
uint64_t fp8_checksum(const Tensor& t, int64_t T, const std::string& dtype, const std::string& where) {
  const int exp_bits = dtype == "fp8_e4m3" ? 4 : 5;
  std::map<uint32_t, uint32_t> code_of;  // float32 bits -> code, every non-NaN code
  for (unsigned c = 0; c < 256; ++c) {
    const float v = fp8_value(c, exp_bits);
    uint32_t b;
    std::memcpy(&b, &v, 4);
    if (!std::isnan(v)) code_of[b] = c;
  }
  const uint32_t nan_code = exp_bits == 4 ? 0x7f : 0x7e;
  const int64_t n = t.numel(), C = n / std::max<int64_t>(T, 1);
  return checksum_walk(t.ptr(), n, C, [&](float v, int64_t i) -> uint64_t {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    if (std::isnan(v)) return nan_code | ((b >> 24) & 0x80);
    const auto it = code_of.find(b);
    if (it == code_of.end())
      throw UsageError(where + "/data: value " + std::to_string(v) + " at flat index " + std::to_string(i) +
                       " is not an " + dtype + " value (the record's dtype)");
    return it->second;
  });
}

json json_attr(const h5::Object& o, const std::string& name) {
  if (!o.has_attr(name)) return nullptr;
  const std::string text = o.attr_string(name);
  try {
    check_json_nesting(text, o.where() + ": attribute '" + name + "'");
    return json::parse(text);
  } catch (const json::exception& e) {
    throw UsageError(o.where() + ": attribute '" + name + "' is not valid JSON: " + e.what());
  }
}

// config_from_json prints notices (an unknown model_type, DSA's index_topk) for the commands that use a model;
// reading a dump only checks it, so they are held back meanwhile. Dumps are read before a run starts its threads.
class QuietStderr {
 public:
  QuietStderr() : saved_(std::cerr.rdbuf(nullptr)) {}
  ~QuietStderr() { std::cerr.rdbuf(saved_); }
  QuietStderr(const QuietStderr&) = delete;
  QuietStderr& operator=(const QuietStderr&) = delete;

 private:
  std::streambuf* saved_;
};

// The probes a dump may hold and what each must look like, from as much of the graph as the dump pins down: its
// model and run options (one graph: every attribute exact), its model alone (every graph of that model: shapes
// but the token axis, rope_from; stages of either form), or neither (the names, contracts, heads axes, stages and
// ranks of every graph of every model).
struct ProbeTable {
  std::string basis;   // "the graph of the dump's model and run options (...)" for messages
  bool exact = false;  // one graph: shapes with the token axis, and orders
  bool dims = false;   // the model's dimensions: shapes but the token axis, rope_from
  std::map<std::string, std::vector<ProbeSpec>> by_name;
  std::string names;   // "x, q_a, ..." in graph order, for messages
  bool weights = false;  // the table of layer weights (build_weights), not of probes
};

ProbeTable make_probe_table(const MlaConfig* cfg, const RunSpec* spec, bool weights = false) {
  ProbeTable t;
  std::vector<MlaConfig> cfgs;
  if (cfg) {
    cfgs.push_back(*cfg);
  } else {  // any dimensions do: only what every model shares is compared
    MlaConfig c = *find_preset("tiny");
    cfgs.push_back(c);
    c.q_lora_rank = 0;
    cfgs.push_back(c);
  }
  std::vector<GraphShape> shapes;
  if (cfg && spec) {
    shapes.push_back(spec->graph_shape());
  } else {
    for (const auto form : {AttentionForm::AttentionForm_mha, AttentionForm::AttentionForm_absorbed})
      for (const bool norm : {false, true}) {
        GraphShape g;
        g.tokens = 1;
        g.form = form;
        g.input_norm = norm;
        shapes.push_back(g);
      }
  }
  for (const auto& c : cfgs)
    for (const auto& g : shapes)
      for (const auto& p : weights ? build_weights(c, g) : build_graph(c, g).probes) {
        auto& v = t.by_name[p.name];
        if (v.empty()) t.names += (t.names.empty() ? "" : ", ") + p.name;
        v.push_back(p);
      }
  t.exact = cfg && spec;
  t.dims = cfg != nullptr;
  t.weights = weights;
  if (weights) {
    t.basis = t.exact ? "the weights of the dump's model and run options" : t.dims ? "the dump's model" : "the weight table";
  } else if (t.exact) {
    const GraphShape g = spec->graph_shape();
    t.basis = std::string("the graph of the dump's model and run options (") + form_name(g.form) + " form, " +
              std::to_string(g.tokens) + " tokens" + (g.input_norm ? ", layers starting at h" : "") +
              (cfg->has_q_lora() ? "" : ", no q LoRA") + ")";
  } else {
    t.basis = t.dims ? "the dump's model" : "the probe table";
  }
  return t;
}

const ProbeTable& every_probe(bool weights = false) {
  static const ProbeTable t = make_probe_table(nullptr, nullptr), tw = make_probe_table(nullptr, nullptr, true);
  return weights ? tw : t;
}

// The probe's attributes against the table's expectations for its name.
void check_against_graph(const DumpProbe& p, const ProbeTable& t, const std::string& w) {
  const auto it = t.by_name.find(p.name);
  if (it == t.by_name.end()) {
    const ProbeTable& all = every_probe(t.weights);
    const char* what = t.weights ? "weight" : "probe";
    if (all.by_name.count(p.name))
      throw UsageError(w + ": '" + p.name + "' is not a " + what + " of " + t.basis + "; its " + what + "s: " + t.names);
    throw UsageError(w + ": '" + p.name + "' is not a " + what + " name (the " + what + "s: " + all.names + ")");
  }
  const ProbeSpec& e = it->second.front();
  const auto differs = [&](const char* attr, const std::string& got, const std::string& want) {
    throw UsageError(w + ": attribute '" + attr + "' is " + got + " but " + t.basis + " gives " + want + " for " +
                     p.name);
  };
  if (p.contract != contract_name(e.contract)) differs("contract", "'" + p.contract + "'", contract_name(e.contract));
  if (p.heads_axis != e.heads_axis)
    differs("heads_axis", std::to_string(p.heads_axis), std::to_string(e.heads_axis));
  std::vector<int64_t> want = e.shape;
  if (!t.exact && !t.weights) want[0] = p.shape[0];  // any T here; one T for every probe is checked across them
  if (t.dims ? p.shape != want : p.shape.size() != want.size())
    differs("shape", shape_string(p.shape),
            t.dims ? shape_string(want) : std::to_string(want.size()) + " axes");
  // Without a model, kv_cache's rope_from (kv_lora_rank) is unknown; read_probe checks its range.
  if ((t.dims || p.name != "kv_cache") && p.rope_from != e.rope_from)
    differs("rope_from", std::to_string(p.rope_from), std::to_string(e.rope_from));
  std::string stages;
  bool stage_ok = false;
  for (const auto& c : it->second) {
    const std::string s = stage_name(c.stage);
    stage_ok = stage_ok || s == p.stage;
    if (stages.find("'" + s + "'") == std::string::npos) stages += (stages.empty() ? "'" : " or '") + s + "'";
  }
  if (!stage_ok) differs("stage", "'" + p.stage + "'", stages);
  if (t.exact && p.order != e.order) differs("order", std::to_string(p.order), std::to_string(e.order));
}

// `stored_layers`: the layer groups the file holds (the highest layer{l} + 1).
void read_inputs(const h5::Group& root, Dump& d, const MlaConfig* cfg, const RunSpec* spec, int64_t stored_layers) {
  const h5::Group g = root.open_group("inputs");
  const std::string& w = g.where();
  for (const auto& c : g.children()) {
    static const char* kNames[] = {"x",           "positions", "seq_lens",   "context_lens",
                                   "block_table", "kv_cache",  "index_cache"};
    if (std::find_if(std::begin(kNames), std::end(kNames), [&](const char* n) { return c == n; }) == std::end(kNames))
      throw UsageError(w + "/" + c + ": not part of /inputs (x, positions, seq_lens, context_lens, block_table, "
                       "kv_cache, index_cache)");
  }
  Inputs& in = d.inputs;
  auto& b = in.batch;
  std::vector<int64_t> xs;
  in.x.data = g.read<float>("x", {-1, -1}, &xs);
  in.x.shape = xs;
  const int64_t T = xs[0];
  if (T <= 0 || xs[1] <= 0) throw UsageError(w + "/x: empty [" + std::to_string(T) + "," + std::to_string(xs[1]) + "]");
  if (cfg && xs[1] != cfg->hidden)
    throw UsageError(w + "/x: shape " + shape_string(xs) + ", but the dump's model has hidden_size " +
                     std::to_string(cfg->hidden));
  if (spec && T != spec->graph_shape().tokens)
    throw UsageError(w + "/x: shape " + shape_string(xs) + " holds " + std::to_string(T) +
                     " tokens, the run options " + std::to_string(spec->graph_shape().tokens) + " (tokens " +
                     std::to_string(spec->tokens) + " x batch " + std::to_string(spec->batch) + ")");
  b.positions = g.read<int32_t>("positions", {T});
  std::vector<int64_t> ss;
  b.new_lens = g.read<int32_t>("seq_lens", {-1}, &ss);
  const int64_t B = ss[0];
  if (B <= 0) throw UsageError(w + "/seq_lens: empty (one entry per sequence)");
  b.context_lens = g.read<int32_t>("context_lens", {B});
  std::vector<int64_t> bs;
  b.block_table = g.read<int32_t>("block_table", {B, -1}, &bs);
  if (bs[1] > std::numeric_limits<int>::max())
    throw UsageError(w + "/block_table: " + std::to_string(bs[1]) + " columns (a sequence's pages are an int)");
  b.max_blocks = static_cast<int>(bs[1]);
  const int64_t nb = g.attr_int("num_blocks");
  if (nb <= 0 || nb > (int64_t{1} << 30))
    throw UsageError(w + ": num_blocks " + std::to_string(nb) + " is out of range");
  b.num_blocks = static_cast<int>(nb);

  // Everything an engine indexes with must be in range: a bad dump is a usage error, never a wild read.
  int64_t total = 0;
  bool any_context = false;
  for (int64_t s = 0; s < B; ++s) {
    if (b.new_lens[s] <= 0) throw UsageError(w + "/seq_lens: sequence " + std::to_string(s) + " has no new tokens");
    if (b.context_lens[s] < 0) throw UsageError(w + "/context_lens: negative for sequence " + std::to_string(s));
    any_context = any_context || b.context_lens[s] > 0;
    const int64_t pages = (static_cast<int64_t>(b.context_lens[s]) + b.new_lens[s] + kPageSize - 1) / kPageSize;
    if (pages > b.max_blocks)
      throw UsageError(w + "/block_table: sequence " + std::to_string(s) + " needs " + std::to_string(pages) +
                       " pages, the table has " + std::to_string(b.max_blocks) + " columns");
    total += b.new_lens[s];
    if (total <= T)  // else refused below, before a token map longer than x is made
      for (int i = 0; i < b.new_lens[s]; ++i) b.token_seq.push_back(static_cast<int>(s));
  }
  if (total != T)
    throw UsageError(w + ": seq_lens add up to " + std::to_string(total) + " tokens, x has " + std::to_string(T));
  // Without a stored cache, the reader makes empty caches of num_blocks pages for every layer of the run options:
  // both sizes are bounded by what the file stores (the sequences' pages, the layer groups) before anything is
  // allocated. A stored cache bounds them by its own extents.
  const bool cache_stored = g.has("kv_cache") || g.has("index_cache");
  if (!cache_stored) {
    int64_t pages = 0;
    for (int64_t s = 0; s < B; ++s)
      pages += (static_cast<int64_t>(b.context_lens[s]) + b.new_lens[s] + kPageSize - 1) / kPageSize;
    if (nb > pages + 1)
      throw UsageError(w + ": attribute 'num_blocks' is " + std::to_string(nb) + ", but the file stores no kv_cache " +
                       "and its " + std::to_string(B) + " sequence" + (B == 1 ? "" : "s") + " occupy " +
                       std::to_string(pages) + " pages (at most " + std::to_string(pages + 1) +
                       " with a spare page)");
    if (cfg && spec) {
      const bool complete = d.status == "complete";
      const int64_t bound = complete ? std::max<int64_t>(stored_layers, 1) : std::max<int64_t>(stored_layers, kMaxLayersUnstored);
      if (spec->layers > bound)
        throw UsageError(root.where() + ": attribute 'run_options' has layers " + std::to_string(spec->layers) +
                         ", but the file stores no kv_cache and " +
                         (complete ? "its complete run holds " + std::to_string(stored_layers) + " layer group" +
                                         (stored_layers == 1 ? "" : "s")
                                   : "a stopped run is read with " + std::to_string(kMaxLayersUnstored) + " layers at most"));
    }
  }
  for (int v : b.block_table)
    if (v < 0 || v >= b.num_blocks)
      throw UsageError(w + "/block_table: page id " + std::to_string(v) + " outside [0, " + std::to_string(nb) + ")");
  for (int64_t t = 0; t < T; ++t)
    if (b.positions[t] < 0 || b.positions[t] >= static_cast<int64_t>(b.max_blocks) * kPageSize)
      throw UsageError(w + "/positions: token " + std::to_string(t) + " at position " +
                       std::to_string(b.positions[t]) + " is outside the block table");

  if (g.has("kv_cache")) {
    std::vector<int64_t> cs;
    const auto all = g.read<float>("kv_cache", {-1, nb, kPageSize, -1}, &cs);
    if (cs[0] <= 0 || cs[3] <= 0) throw UsageError(w + "/kv_cache: empty " + shape_string(cs));
    if (cfg && cs[3] != cfg->cache_row())
      throw UsageError(w + "/kv_cache: shape " + shape_string(cs) + ", but the dump's model caches rows of " +
                       "kv_lora_rank + qk_rope_head_dim = " + std::to_string(cfg->cache_row()));
    if (spec && cs[0] != spec->layers)
      throw UsageError(w + "/kv_cache: shape " + shape_string(cs) + " holds " + std::to_string(cs[0]) +
                       " layers, the run options " + std::to_string(spec->layers));
    const int64_t per = nb * kPageSize * cs[3];
    for (int64_t l = 0; l < cs[0]; ++l) {
      Tensor c;
      c.shape = {nb, kPageSize, cs[3]};
      c.data.assign(all.begin() + l * per, all.begin() + (l + 1) * per);
      in.kv_cache.push_back(std::move(c));
    }
  } else if (any_context) {
    throw UsageError(w + ": missing dataset 'kv_cache': context_lens has cached tokens, and the cache rows they "
                     "are attended from are not given");
  } else if (cfg) {
    // Nothing cached: an empty cache per layer, so every engine finds the pages its cache_write stage fills.
    in.kv_cache.assign(spec ? spec->layers : 1, Tensor({nb, kPageSize, cfg->cache_row()}));
  }
  if (g.has("index_cache")) {  // DSA: [layers, blocks, 64, Di]
    std::vector<int64_t> cs;
    const auto all = g.read<float>("index_cache", {-1, nb, kPageSize, -1}, &cs);
    if (cs[0] <= 0 || cs[3] <= 0) throw UsageError(w + "/index_cache: empty " + shape_string(cs));
    const int64_t per = nb * kPageSize * cs[3];
    for (int64_t l = 0; l < cs[0]; ++l) {
      Tensor c;
      c.shape = {nb, kPageSize, cs[3]};
      c.data.assign(all.begin() + l * per, all.begin() + (l + 1) * per);
      in.index_cache.push_back(std::move(c));
    }
  }
  if (cfg) complete_index_cache(in, *cfg, spec ? spec->layers : static_cast<int>(in.kv_cache.size()), w);
  d.has_inputs = true;
}

std::vector<int64_t> local_probe_shape(const DumpProbe& p, int tp) {
  auto s = p.shape;
  if (p.contract == "heads") s[p.heads_axis] /= tp;
  if (p.contract == "rows") s[0] /= tp;
  if (p.contract == "columns" && s.size() > 1) s[1] /= tp;
  return s;
}

// What read_probe needs of the dump around a probe.
struct ProbeContext {
  int tp = 1;
  int own = -1;           // the rank a one-rank dump holds (its only rank group), -1 for every rank
  bool complete = false;  // status "complete": every rank of every probe is there
  const ProbeTable* table = nullptr;
  const DumpReadOptions* opts = nullptr;
  bool weights = false;    // reading /weights: contracts replicated, rows, columns; rows are not tokens
  int64_t tokens = -1;     // T of every probe: /inputs/x's, else the first probe's (-1: not known yet)
  std::string tokens_from;  // where that T comes from, for messages
};

// A group name as write_probe writes it: rank{r}, no sign or leading zeros, r < 10^6.
bool parse_rank_name(const std::string& c, int* rank) {
  if (c.rfind("rank", 0) != 0 || c.size() == 4 || c.size() > 10) return false;
  if (c.find_first_not_of("0123456789", 4) != std::string::npos || (c[4] == '0' && c.size() > 5)) return false;
  *rank = std::stoi(c.substr(4));
  return true;
}

// The norms a record stores are of one tensor: l2 is the root of the sum of the squared token_l2 (its rows), and
// each token's head_l2 add up the same way to its token_l2. Written by any writer from one tensor they agree to
// rounding (float rows, double sums); a record that disagrees by more than 1e-3 was edited or written from two
// tensors, and a compare that reads l2 in one place and token_l2 in another would judge two different things.
// Skipped where a non-finite value makes the norms non-finite.
void check_norms_agree(const std::string& w, const ProbeRecord& rec) {
  constexpr double kRel = 1e-3;
  const auto agree = [&](double a, double b) {
    return std::abs(a - b) <= kRel * std::max(a, b) + 1e-30;
  };
  if (rec.nan != 0 || rec.inf != 0 || !std::isfinite(rec.l2)) return;
  double sum = 0;
  for (float v : rec.token_l2) {
    if (!std::isfinite(v)) return;
    sum += static_cast<double>(v) * v;
  }
  if (!agree(rec.l2, std::sqrt(sum)))
    throw UsageError(w + ": l2 " + std::to_string(rec.l2) + " disagrees with its token_l2, whose rows make " +
                     std::to_string(std::sqrt(sum)) + " (the record's norms are not of one tensor: edited, or "
                     "written from two)");
  if (rec.head_l2.empty() || rec.token_l2.empty()) return;
  const size_t T = rec.token_l2.size(), H = rec.head_l2.size() / T;
  for (size_t t = 0; t < T; ++t) {
    double s = 0;
    for (size_t h = 0; h < H; ++h) s += static_cast<double>(rec.head_l2[t * H + h]) * rec.head_l2[t * H + h];
    if (!std::isfinite(s)) return;
    if (!agree(rec.token_l2[t], std::sqrt(s)))
      throw UsageError(w + ": token " + std::to_string(t) + "'s token_l2 " + std::to_string(rec.token_l2[t]) +
                       " disagrees with its head_l2, which make " + std::to_string(std::sqrt(s)) +
                       " (the record's norms are not of one tensor: edited, or written from two)");
  }
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

// layer{l} as write_file writes it (no sign or leading zeros).
bool parse_layer_name(const std::string& name, int* layer) {
  if (name.rfind("layer", 0) != 0 || name.size() == 5 || name.size() > 12) return false;
  if (name.find_first_not_of("0123456789", 5) != std::string::npos) return false;
  if (name[5] == '0' && name.size() > 6) return false;
  *layer = std::stoi(name.substr(5));
  return true;
}

// /weights/layer{l}/{weight}/rank{r}: the same records as probes, checked against build_weights.
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

Dump read_h5(const std::string& path, const DumpReadOptions& opts) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UsageError(path + ": no such file");
  if (fs::is_directory(path, ec)) throw UsageError(path + ": is a directory, not a dump");
  if (!h5::File::is_hdf5(path)) {
    const auto size = fs::file_size(path, ec);
    throw UsageError(path + ": not an HDF5 file (" + std::to_string(ec ? 0 : size) +
                     " bytes without an HDF5 superblock: a foreign file, or a dump truncated at its start)");
  }
  const h5::File f = h5::File::open_read(path);
  const std::string& w = f.where();
  if (!f.has_attr("format"))
    throw UsageError(path + ": an HDF5 file but not an mla-bisect dump (no 'format' attribute on the root group)");
  const std::string format = f.attr_string("format");
  if (format != kFormat)
    throw UsageError(path + ": format is '" + format + "', expected '" + kFormat + "'");
  Dump d;
  d.path = path;
  d.schema_version = static_cast<int>(f.attr_int("schema_version"));
  if (d.schema_version < 1 || d.schema_version > kSchemaVersion)
    throw UsageError(path + ": schema_version " + std::to_string(d.schema_version) +
                     " is not supported (this mla-bisect " MLA_VERSION " reads schema_version 1 to " +
                     std::to_string(kSchemaVersion) + ")");
  if (d.schema_version < 2 && f.has("weights"))
    throw UsageError(f.where() + "weights: a /weights group needs schema_version 2 (the file says " +
                     std::to_string(d.schema_version) + ")");
  d.tool_version = f.attr_string_or("tool_version", "");
  d.git_sha = f.attr_string_or("git_sha", "");
  d.created_utc = f.attr_string_or("created_utc", "");
  auto& m = d.meta;
  m.engine = f.attr_string_or("engine", "");
  m.engine_options = f.attr_string_or("engine_options", "");
  m.engine_dtype = f.attr_string_or("engine_dtype", "");
  check_dtype(w, "engine_dtype", m.engine_dtype, kEngineDtypes);
  m.device = f.attr_string_or("device", "");
  m.model = json_attr(f, "model");
  m.run_options = json_attr(f, "run_options");
  const int64_t tp = f.attr_int_or("tp", 1);
  if (tp < 1 || tp > kMaxTp) throw UsageError(path + ": tp " + std::to_string(tp) + " is out of range");
  m.tp = static_cast<int>(tp);
  m.mode = f.attr_string_or("mode", "");
  if (!m.mode.empty() && m.mode != "prefill" && m.mode != "decode" && m.mode != "chunked")
    throw UsageError(w + ": mode '" + m.mode + "' (expected prefill, decode or chunked)");
  m.seed = f.has_attr("seed") ? f.attr_uint("seed") : 0;
  m.inject = f.attr_string_or("inject", "");
  m.probe_level = f.attr_string_or("probe_level", "");
  if (!m.probe_level.empty() && m.probe_level != "stats" && m.probe_level != "sketch" && m.probe_level != "full")
    throw UsageError(w + ": probe_level '" + m.probe_level + "' (expected stats, sketch or full)");
  m.command = f.attr_string_or("command", "");
  if (f.has_attr("processes")) {
    const int64_t procs = f.attr_int("processes");
    const int64_t own = f.attr_int_or("process_rank", -1);
    if (procs != tp || own < -1 || own >= tp)
      throw UsageError(path + ": process_rank " + std::to_string(own) + " of " + std::to_string(procs) +
                       " processes does not fit tp " + std::to_string(tp));
    m.processes = static_cast<int>(procs);
    m.process_rank = static_cast<int>(own);
    m.launch_id = f.attr_string_or("launch_id", "");
  } else if (f.has_attr("process_rank")) {
    throw UsageError(w + ": attribute 'process_rank' without 'processes' (one process per rank writes both)");
  }
  if (f.has_attr("layer_index") && f.attr_int("layer_index") < 0)
    throw UsageError(w + ": layer_index " + std::to_string(f.attr_int("layer_index")) + " is negative");
  d.status = f.attr_string_or("status", "complete");
  if (d.status != "complete" && d.status.rfind("stopped", 0) != 0)
    throw UsageError(w + ": status '" + d.status + "' (expected 'complete' or 'stopped: <where>')");
  const json ls = json_attr(f, "last_stage");
  if (!ls.is_null() && !ls.is_array()) throw UsageError(w + ": last_stage is not a JSON array");
  for (const auto& s : ls) {
    if (!s.is_string()) throw UsageError(w + ": last_stage holds " + s.dump() + " where a string belongs");
    d.last_stage.push_back(s.get<std::string>());
  }

  // The model and run options, where given, pin down the graph every probe and input is checked against.
  std::optional<MlaConfig> cfg;
  if (!m.model.is_null()) {
    if (!m.model.is_object()) throw UsageError(w + ": attribute 'model' is not a JSON object (HF config.json keys)");
    try {
      QuietStderr quiet;
      cfg = config_from_json(m.model);
    } catch (const UsageError& e) {
      throw UsageError(w + ": attribute 'model': " + e.what());
    } catch (const json::exception& e) {
      throw UsageError(w + ": attribute 'model': " + e.what());
    }
  }
  std::optional<RunSpec> spec;
  if (!m.run_options.is_null()) {
    if (!m.run_options.is_object()) throw UsageError(w + ": attribute 'run_options' is not a JSON object");
    const auto bad = [&](const std::string& what) { throw UsageError(w + ": attribute 'run_options': " + what); };
    try {
      spec = run_spec_from_json(m.run_options);
    } catch (const UsageError& e) {
      bad(e.what());
    }
    if (spec->tokens <= 0 || spec->batch <= 0 || spec->layers <= 0 || spec->tp <= 0)
      bad("tokens, batch, layers and tp must be positive (" + m.run_options.dump() + ")");
    if (m.run_options.contains("tp") && spec->tp != m.tp)
      bad("tp " + std::to_string(spec->tp) + ", the root attribute tp " + std::to_string(m.tp));
    if (m.run_options.contains("mode") && !m.mode.empty() && mode_name(spec->mode) != m.mode)
      bad(std::string("mode ") + mode_name(spec->mode) + ", the root attribute mode " + m.mode);
    if (cfg && cfg->heads % spec->tp != 0)
      bad("tp " + std::to_string(spec->tp) + " does not divide the model's " + std::to_string(cfg->heads) + " heads");
  }
  const MlaConfig* cfg_p = cfg ? &*cfg : nullptr;
  const RunSpec* spec_p = spec ? &*spec : nullptr;

  // The root holds /inputs and /layer{l} groups only: a probe anywhere else would be silently ignored.
  std::vector<std::pair<int, std::string>> layers;
  for (const auto& c : f.children()) {
    int layer = 0;
    const bool is_layer = parse_layer_name(c, &layer);
    if (!is_layer && c != "inputs" && c != "weights")
      throw UsageError(w + c + ": not part of a dump (the root holds /inputs, /weights and /layer{l} groups; a "
                       "probe is /layer{l}/{probe}/rank{r})");
    if (!f.has_group(c)) throw UsageError(w + c + ": is not a group");
    if (is_layer) {
      if (spec && layer >= spec->layers)
        throw UsageError(w + c + ": the run options have " + std::to_string(spec->layers) + " layer" +
                         (spec->layers == 1 ? "" : "s") + " (layer0 ... layer" + std::to_string(spec->layers - 1) + ")");
      layers.emplace_back(layer, c);
    }
  }

  int64_t stored_layers = 0;
  for (const auto& l : layers) stored_layers = std::max<int64_t>(stored_layers, l.first + 1);
  if (opts.inputs && f.has("inputs")) read_inputs(f, d, cfg_p, spec_p, stored_layers);
  // The inputs are the step's real layout: DSA's idx_scores holds their longest context plus the run's tokens (a
  // step whose sequences differ in new tokens is batch 1 of their T tokens, its contexts in the inputs only).
  std::optional<RunSpec> laid_out;
  if (spec && d.has_inputs && spec->keys == 0 && d.inputs.batch.num_seqs() > 0 &&
      spec->graph_shape().keys != d.inputs.batch.longest_context() + spec->tokens) {
    laid_out = *spec;
    laid_out->keys = d.inputs.batch.longest_context() + spec->tokens;
    spec_p = &*laid_out;
  }
  if (opts.probes) {
    const ProbeTable table = make_probe_table(cfg_p, spec_p);
    ProbeContext ctx;
    ctx.tp = m.tp;
    ctx.own = m.process_rank;
    ctx.complete = d.complete();
    ctx.table = &table;
    ctx.opts = &opts;
    if (d.has_inputs) {
      ctx.tokens = d.inputs.x.shape[0];
      ctx.tokens_from = "/inputs/x";
    }
    // Progress ticks: the layer groups read, a probe's share of its layer past them (the weights last).
    const std::string file = std::filesystem::path(path).filename().string();
    const double units = static_cast<double>(layers.size()) + (f.has("weights") ? 1 : 0);
    double done = 0;
    for (const auto& [layer, c] : layers) {
      const h5::Group lg = f.open_group(c);
      const auto names = lg.children();
      for (size_t k = 0; k < names.size(); ++k) {
        const std::string& pn = names[k];
        if (progress_wanted())
          progress_tick("read", "reading " + file + ": layer " + std::to_string(layer) + " " + pn,
                        done + static_cast<double>(k) / static_cast<double>(names.size()), units);
        if (!lg.has_group(pn))
          throw UsageError(lg.where() + "/" + pn + ": is not a group (a layer holds one group per probe)");
        d.probes.push_back(read_probe(lg.open_group(pn), layer, pn, ctx));
        if (ctx.tokens < 0) {
          ctx.tokens = d.probes.back().shape[0];
          ctx.tokens_from = "/" + c + "/" + pn;
        }
      }
      ++done;
    }
    std::stable_sort(d.probes.begin(), d.probes.end(), [](const DumpProbe& a, const DumpProbe& b) {
      return a.layer != b.layer ? a.layer < b.layer : a.order < b.order;
    });
    if (f.has("weights")) {
      progress_tick("read", "reading " + file + ": weights", done, units);
      read_weights(f, d, ctx, cfg_p, spec_p);
    }
  }
  return d;
}

}  // namespace

namespace dump_detail {

namespace {
// A fold that could not be written beside its journal (a read-only directory, or records HDF5 refuses to store):
// written to a temporary directory instead and read back from there, so it is checked as every dump is. The
// journal stays where it is.
Dump read_unwritten_fold(const Dump& fold, const std::string& path, const DumpReadOptions& opts) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string dir = (fs::temp_directory_path(ec) / "mla-bisect-fold.XXXXXX").string();
  if (ec || !::mkdtemp(dir.data()))
    throw UsageError(path + ": cannot be written beside its journal, nor a temporary copy checked: " +
                     std::strerror(errno));
  const std::string copy = (fs::path(dir) / fs::path(path).filename()).string();
  try {
    write_dump_h5(fold, copy);
    Dump d = read_h5(copy, opts);
    d.path = path;
    fs::remove_all(dir, ec);
    return d;
  } catch (const UsageError& e) {
    fs::remove_all(dir, ec);
    throw UsageError(path + ": its journal " + journal::journal_path(path) + " does not fold into a valid dump (" +
                     e.what() + ")");
  } catch (...) {
    fs::remove_all(dir, ec);
    throw;
  }
}
}  // namespace

// One file (FILE.h5, its journal folded first), as read_dump reads it when it is not a set of ranks.
Dump read_one(const std::string& path, const DumpReadOptions& opts) {
  try {
    Dump live;
    const JournalState js = fold_journal(path, &live);
    if (js == JournalState::JournalState_unwritable) return read_unwritten_fold(live, path, opts);
    if (js == JournalState::JournalState_live || js == JournalState::JournalState_headerless) {
      if (!opts.inputs) {
        live.has_inputs = false;
        live.inputs = {};
      }
      if (!opts.probes) live.probes.clear();
      if (!opts.data)
        for (auto& p : live.probes)
          for (auto& r : p.ranks) r.data = {};
      return live;
    }
    return read_h5(path, opts);
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {
    // Anything else (an allocation a corrupt size asked for, a filesystem error) is still a bad input.
    throw UsageError(path + ": cannot read the dump: " + e.what());
  }
}

bool exists_with_journal(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec) || std::filesystem::exists(journal::journal_path(path), ec) ||
         !journal::abandoned_temps(journal::journal_path(path)).empty();
}

}  // namespace dump_detail

const DumpProbe* Dump::find(int layer, const std::string& name) const {
  for (const auto& p : probes)
    if (p.layer == layer && p.name == name) return &p;
  return nullptr;
}

const DumpProbe* Dump::find_weight(int layer, const std::string& name) const {
  for (const auto& p : weights)
    if (p.layer == layer && p.name == name) return &p;
  return nullptr;
}

MlaConfig Dump::config() const {
  if (meta.model.is_null()) throw UsageError(path + ": the dump has no model configuration (root attribute 'model')");
  try {
    return config_from_json(meta.model);
  } catch (const UsageError& e) {
    throw UsageError(path + ": model configuration: " + e.what());
  } catch (const json::exception& e) {
    throw UsageError(path + ": model configuration: " + e.what());
  }
}

RunSpec Dump::spec() const {
  if (meta.run_options.is_null()) throw UsageError(path + ": the dump has no run options (root attribute 'run_options')");
  try {
    return run_spec_from_json(meta.run_options);
  } catch (const UsageError& e) {
    throw UsageError(path + ": " + e.what());
  }
}

Dump read_dump(const std::string& path, const DumpReadOptions& opts) {
  if (!exists_with_journal(path)) {
    const auto ranks = rank_files_beside(path);
    if (ranks.count(0)) return read_rank_set(path, opts);
    if (!ranks.empty())
      throw UsageError(path + ": no such file, and of the one-process-per-rank set that reads as it " +
                       rank_dump_path(path, 0) + " is missing (found " + ranks.begin()->second +
                       (ranks.size() > 1 ? " and " + std::to_string(ranks.size() - 1) + " more" : std::string()) +
                       "); did rank 0's process run with --out " + path + " in this directory?");
  }
  return read_one(path, opts);
}

}  // namespace mla
