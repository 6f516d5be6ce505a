// Reading a dump (schema_versions 1 and 2, docs/dump-format.md: the layout and what the reader refuses), a journal
// folded first: the file, its root and /inputs here; its probe and weight groups and their rank records in
// dump_records.cpp, checked against the model by dump_check.cpp; read_dump also reads a one-process-per-rank set as
// one dump (dump_ranks.cpp).
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
#include "probes/dump_check.h"
#include "probes/dump_internal.h"
#include "probes/dump_records.h"
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

// The layers a stopped run's dump without a stored cache is read with at most (its layer groups may be fewer than
// its run options' layers): the reader makes an empty cache per layer.
constexpr int64_t kMaxLayersUnstored = 1024;

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
