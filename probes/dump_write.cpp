// Writing a Dump as HDF5 (docs/dump-format.md): the layout, then an atomic replace (temporary file, fsync, rename).
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
#include "probes/dump_internal.h"
#include "probes/h5.h"
#include "probes/journal.h"

namespace mla {

using nlohmann::json;
using namespace dump_detail;

namespace {

// HDF5 writing

void write_inputs(h5::Group& root, const Inputs& in) {
  h5::Group g = root.create_group("inputs");
  const auto& b = in.batch;
  const int64_t B = b.num_seqs();
  g.write<float>("x", in.x.shape, in.x.data);
  g.write<int32_t>("positions", {static_cast<int64_t>(b.positions.size())}, b.positions);
  g.write<int32_t>("seq_lens", {B}, b.new_lens);
  g.write<int32_t>("context_lens", {B}, b.context_lens);
  g.write<int32_t>("block_table", {B, b.max_blocks}, b.block_table);
  g.set_attr("num_blocks", static_cast<int64_t>(b.num_blocks));
  // [layers, blocks, 64, L+R] and DSA's [layers, blocks, 64, Di]: one dataset each so h5py slices it per layer
  // (check_consistent: every layer's cache has the first one's shape).
  for (const auto* caches : {&in.kv_cache, &in.index_cache}) {
    if (caches->empty()) continue;
    const auto& s0 = caches->front().shape;
    std::vector<int64_t> shape = {static_cast<int64_t>(caches->size())};
    shape.insert(shape.end(), s0.begin(), s0.end());
    std::vector<float> all;
    all.reserve(caches->size() * caches->front().data.size());
    for (const auto& c : *caches) all.insert(all.end(), c.data.begin(), c.data.end());
    g.write<float>(caches == &in.kv_cache ? "kv_cache" : "index_cache", shape, all);
  }
}

void write_probe(h5::Group& layer, const DumpProbe& p, const Dump& d) {
  h5::Group g = layer.create_group(p.name);
  g.set_attr("order", static_cast<int64_t>(p.order));
  g.set_attr("stage", p.stage);
  g.set_attr("contract", p.contract);
  g.set_attr("shape", p.shape);
  g.set_attr("engine_dtype", p.engine_dtype);
  g.set_attr("heads_axis", static_cast<int64_t>(p.heads_axis));
  g.set_attr("rope_from", static_cast<int64_t>(p.rope_from));
  for (size_t r = 0; r < p.ranks.size(); ++r) {
    const ProbeRecord& rec = p.ranks[r];
    // Rows of this rank's record: the tokens, or a weight's rows (a rows-sharded weight: its block).
    const int64_t T = !rec.shape.empty() ? rec.shape[0] : p.shape.empty() ? 0 : p.shape[0];
    h5::Group rg = g.create_group("rank" + std::to_string(d.rank_of(r)));
    rg.set_attr("l2", rec.l2);
    rg.set_attr("absmax", rec.absmax);
    rg.set_attr("mean", rec.mean);
    rg.set_attr("std", rec.std);
    rg.set_attr("nan", rec.nan);
    rg.set_attr("inf", rec.inf);
    rg.set_attr("checksum", rec.checksum);
    rg.set_attr("level", probe_level_name(rec.level));
    rg.set_attr("shape", rec.shape);
    rg.set_attr("dtype", rec.dtype);
    // check_consistent: each map holds T rows.
    if (!rec.token_l2.empty()) rg.write<float>("token_l2", {T}, rec.token_l2);
    if (!rec.head_l2.empty())
      rg.write<float>("head_l2", {T, static_cast<int64_t>(rec.head_l2.size()) / T}, rec.head_l2);
    if (!rec.sketch.empty()) rg.write<float>("sketch", {T, kSketchDim}, rec.sketch);
    if (!rec.data.empty()) rg.write<float>("data", rec.data.shape, rec.data.data);
  }
}

void write_file(h5::File& f, const Dump& d) {
  const auto& m = d.meta;
  f.set_attr("format", kFormat);
  f.set_attr("schema_version", static_cast<int64_t>(d.weights.empty() ? 1 : kSchemaVersion));
  f.set_attr("tool_version", d.tool_version.empty() ? std::string(MLA_VERSION) : d.tool_version);
  f.set_attr("git_sha", d.git_sha.empty() ? std::string(MLA_GIT_SHA) : d.git_sha);
  f.set_attr("created_utc", d.created_utc.empty() ? utc_now() : d.created_utc);
  f.set_attr("engine", m.engine);
  f.set_attr("engine_options", m.engine_options);
  f.set_attr("engine_dtype", m.engine_dtype);
  f.set_attr("device", m.device);
  f.set_attr("model", m.model.is_null() ? std::string("null") : m.model.dump());
  f.set_attr("run_options", m.run_options.is_null() ? std::string("null") : m.run_options.dump());
  f.set_attr("tp", static_cast<int64_t>(m.tp));
  f.set_attr("mode", m.mode);
  f.set_attr("seed", m.seed);
  f.set_attr("inject", m.inject);
  f.set_attr("probe_level", m.probe_level);
  f.set_attr("command", m.command);
  if (m.processes > 0) {  // one process per rank; absent from one process's dumps (schema_version 1 as before)
    f.set_attr("process_rank", static_cast<int64_t>(m.process_rank));
    f.set_attr("processes", static_cast<int64_t>(m.processes));
    f.set_attr("launch_id", m.launch_id);
  }
  f.set_attr("status", d.status);
  // Stage names from a journal are its bytes: any that are not UTF-8 are written with U+FFFD in their place.
  f.set_attr("last_stage", json(d.last_stage).dump(-1, ' ', false, json::error_handler_t::replace));
  if (d.has_inputs) write_inputs(f, d.inputs);
  std::map<int, h5::Group> layers;
  for (const auto& p : d.probes) {
    auto it = layers.find(p.layer);
    if (it == layers.end()) it = layers.emplace(p.layer, f.create_group("layer" + std::to_string(p.layer))).first;
    write_probe(it->second, p, d);
  }
  if (!d.weights.empty()) {
    h5::Group wg = f.create_group("weights");
    std::map<int, h5::Group> wl;
    for (const auto& p : d.weights) {
      auto it = wl.find(p.layer);
      if (it == wl.end()) it = wl.emplace(p.layer, wg.create_group("layer" + std::to_string(p.layer))).first;
      write_probe(it->second, p, d);
    }
  }
}

}  // namespace

namespace dump_detail {

namespace {
// A tensor's extents are non-negative and multiply to the values it holds (the product formed only up to them; no
// extents: one value). `optional`: an empty tensor (no extents, no values) stands for none and is not written.
void check_tensor(const Tensor& t, const std::string& where, const std::string& what, bool optional) {
  if (optional && t.empty()) return;
  int64_t n = 1;
  bool zero = false;
  for (int64_t d : t.shape) {
    if (d < 0) throw UsageError(where + ": " + what + " has a negative extent in shape " + shape_string(t.shape));
    zero = zero || d == 0;
  }
  for (int64_t d : t.shape) {
    if (zero || n > t.numel() / d) {
      n = zero ? 0 : -1;
      break;
    }
    n *= d;
  }
  if (n != t.numel())
    throw UsageError(where + ": " + what + " of shape " + shape_string(t.shape) + " holds " +
                     std::to_string(t.numel()) + " values");
}
}  // namespace

void check_consistent(const Dump& d, const std::string& where) {
  if (d.has_inputs) {
    const Inputs& in = d.inputs;
    const Batch& b = in.batch;
    const int64_t B = b.num_seqs();
    check_tensor(in.x, where, "inputs x", false);
    if (static_cast<int64_t>(b.context_lens.size()) != B)
      throw UsageError(where + ": inputs hold " + std::to_string(B) + " sequence lengths and " +
                       std::to_string(b.context_lens.size()) + " context lengths");
    if (b.max_blocks < 0 || static_cast<int64_t>(b.block_table.size()) != B * b.max_blocks)
      throw UsageError(where + ": inputs' block table holds " + std::to_string(b.block_table.size()) +
                       " entries, not " + std::to_string(B) + " sequences x " + std::to_string(b.max_blocks) +
                       " columns");
    for (const auto* caches : {&in.kv_cache, &in.index_cache}) {
      const char* what = caches == &in.kv_cache ? "inputs kv_cache" : "inputs index_cache";
      for (const auto& c : *caches) {
        check_tensor(c, where, what, false);
        if (c.shape != caches->front().shape)
          throw UsageError(where + ": " + what + " of different shapes per layer (" + shape_string(c.shape) +
                           " and " + shape_string(caches->front().shape) + ")");
      }
    }
  }
  for (const auto* list : {&d.probes, &d.weights})
    for (const auto& p : *list)
      for (const auto& rec : p.ranks) {
        const std::string w = where + ": layer " + std::to_string(p.layer) + " " + p.name;
        check_tensor(rec.data, w, "data", true);
        // The maps' rows: the tokens, or a weight's rows (write_probe's T).
        const int64_t T = !rec.shape.empty() ? rec.shape[0] : p.shape.empty() ? 0 : p.shape[0];
        const auto rows = [&](const std::vector<float>& v, int64_t cols, const char* what) {
          const int64_t n = static_cast<int64_t>(v.size());
          if (v.empty()) return;
          if (T <= 0 || cols <= 0 || n % cols != 0 || n / cols != T)
            throw UsageError(w + ": " + what + " holds " + std::to_string(n) + " values, expected " +
                             std::to_string(T) + " x " + std::to_string(cols));
        };
        rows(rec.token_l2, 1, "token_l2");
        rows(rec.head_l2, T > 0 ? static_cast<int64_t>(rec.head_l2.size()) / T : 0, "head_l2");
        rows(rec.sketch, kSketchDim, "sketch");
      }
}

}  // namespace dump_detail

void write_dump_h5(const Dump& dump, const std::string& path) {
  check_consistent(dump, path);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    {
      h5::File f = h5::File::create(tmp);
      write_file(f, dump);
      f.flush();
      f.close();
    }
    Fd fd(::open(tmp.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0 || ::fsync(fd.get()) != 0)
      throw UsageError(tmp + ": cannot fsync the new dump: " + std::strerror(errno));
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw UsageError(path + ": cannot rename " + tmp + " into place: " + std::strerror(errno));
    journal::sync_dir(path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

}  // namespace mla
