// `mla-bisect inspect FILE`: what a file holds. Dumps (.h5): provenance, status (where a run stopped),
// inputs, and a table of probes per layer. Each kind of file is one entry of kInspectors, chosen by extension;
// weight files (.safetensors, .gguf) are added there as further entries.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <set>

#include <nlohmann/json.hpp>

#include "harness/cli/commands.h"
#include "core/model/errors.h"
#include "core/weights/inspect_weights.h"
#include "probes/dump.h"

namespace mla::cli {

namespace {

struct InspectOptions {
  std::string file;
  int layer = -1;  // only this layer's probes (-1: all)
};

std::string or_dash(const std::string& s) { return s.empty() ? "-" : s; }

std::string join_ints(const std::vector<int>& v, size_t max_items = 8) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max_items; ++i) s += (i ? "," : "") + std::to_string(v[i]);
  if (v.size() > max_items) s += ",... (" + std::to_string(v.size()) + ")";
  return s;
}

std::string model_line(const nlohmann::json& m) {
  if (!m.is_object()) return "-";
  const auto num = [&](const char* k) {
    if (!m.contains(k) || m.at(k).is_null()) return std::string("-");
    return m.at(k).dump();
  };
  return m.value("name", std::string("?")) + " (hidden " + num("hidden_size") + ", heads " +
         num("num_attention_heads") + ", q_lora " + num("q_lora_rank") + ", kv_lora " + num("kv_lora_rank") +
         ", qk_nope " + num("qk_nope_head_dim") + ", qk_rope " + num("qk_rope_head_dim") + ", v " +
         num("v_head_dim") + ")";
}

std::string run_line(const Dump& d) {
  const auto& r = d.meta.run_options;
  std::string s = "mode " + or_dash(d.meta.mode);
  if (r.is_object()) {
    const auto get = [&](const char* k) { return r.contains(k) ? r.at(k).dump() : std::string("-"); };
    const bool no_context = !r.contains("context") || (r.at("context").is_array() && r.at("context").empty());
    s += ", attention " + r.value("form", std::string("-")) + ", tokens " + get("tokens") + " x batch " +
         get("batch") + ", context " + (no_context ? std::string("0") : get("context")) + ", layers " + get("layers");
  }
  s += ", tp " + std::to_string(d.meta.tp) + ", seed " + std::to_string(d.meta.seed) + ", inject " +
       (d.meta.inject.empty() ? "none" : d.meta.inject) + ", probe level " + or_dash(d.meta.probe_level);
  return s;
}

// L2 of the gathered (global) tensor from what the ranks recorded: heads blocks add in squares; replicas
// are rank 0's; partial sums need the sum itself, so they are estimated from the summed sketches
// (E|S x|^2 = |x|^2 for the ±1/sqrt(k) projection), marked with "~".
std::string gathered_l2(const DumpProbe& p, int tp, bool* replicas_differ) {
  char buf[48];
  *replicas_differ = false;
  if (p.ranks.empty()) return "-";
  if (p.contract == "heads") {
    if (static_cast<int>(p.ranks.size()) < tp) return "-";
    double s = 0;
    for (const auto& r : p.ranks) s += r.l2 * r.l2;
    std::snprintf(buf, sizeof buf, "%.6g", std::sqrt(s));
    return buf;
  }
  if (p.contract == "partial") {
    if (static_cast<int>(p.ranks.size()) < tp) return "-";
    if (tp == 1) {
      std::snprintf(buf, sizeof buf, "%.6g", p.ranks[0].l2);
      return buf;
    }
    const size_t n = p.ranks[0].sketch.size();
    if (n == 0) return "-";
    std::vector<double> sum(n, 0.0);
    for (const auto& r : p.ranks) {
      if (r.sketch.size() != n) return "-";
      for (size_t i = 0; i < n; ++i) sum[i] += r.sketch[i];
    }
    double s = 0;
    for (double v : sum) s += v * v;
    std::snprintf(buf, sizeof buf, "~%.4g", std::sqrt(s));
    return buf;
  }
  for (const auto& r : p.ranks) *replicas_differ = *replicas_differ || r.checksum != p.ranks[0].checksum;
  std::snprintf(buf, sizeof buf, "%.6g", p.ranks[0].l2);
  return buf;
}

int inspect_dump(const InspectOptions& o) {
  DumpReadOptions ro;
  ro.data = false;  // stats, maps and sketches say enough; full tensors can be gigabytes
  const Dump d = read_dump(o.file, ro);
  auto& os = std::cout;
  const auto& m = d.meta;
  os << "dump      " << d.path << "\n"
     << "format    mla-bisect-dump schema_version " << d.schema_version << ", written by mla-bisect "
     << or_dash(d.tool_version) << " (git " << or_dash(d.git_sha) << ") at " << or_dash(d.created_utc) << "\n"
     << "engine    " << or_dash(m.engine) << (m.engine_options.empty() ? "" : ":" + m.engine_options) << "  dtype "
     << or_dash(m.engine_dtype) << "  device " << or_dash(m.device) << "\n"
     << "model     " << model_line(m.model) << "\n"
     << "run       " << run_line(d) << "\n"
     << "command   " << or_dash(m.command) << "\n"
     << "status    " << d.status << "\n";
  const bool one_rank = m.process_rank >= 0;  // one process per rank: this file holds that rank only
  if (one_rank)
    os << "process   rank " << m.process_rank << " of " << m.processes << " (one process per rank): this file holds "
       << "rank " << m.process_rank << "'s records only; the run's --out name reads the whole set\n";
  if (!d.parts.empty()) {
    os << "parts     " << d.parts.size() << " processes, one per rank:";
    for (const auto& part : d.parts) os << " " << part;
    os << "\n";
  }
  if (!d.complete()) {
    os << "last stage";
    bool first = true;
    for (size_t r = 0; r < d.last_stage.size(); ++r) {
      if (d.last_stage[r].empty()) continue;  // not this file's rank
      os << (first ? "" : ";") << " rank " << r << ": " << d.last_stage[r];
      first = false;
    }
    os << "\n";
  }
  if (d.has_inputs) {
    const auto& in = d.inputs;
    const auto& b = in.batch;
    os << "inputs    x " << shape_string(in.x.shape) << ", " << b.num_seqs() << " sequence"
       << (b.num_seqs() == 1 ? "" : "s") << " (new " << join_ints(b.new_lens) << ", context "
       << join_ints(b.context_lens) << "), positions " << (b.positions.empty() ? 0 : b.positions.front()) << ".."
       << (b.positions.empty() ? 0 : b.positions.back()) << ", block table [" << b.num_seqs() << "," << b.max_blocks
       << "] over " << b.num_blocks << " pages";
    if (!in.kv_cache.empty())
      os << ", kv_cache " << in.kv_cache.size() << " x " << shape_string(in.kv_cache.front().shape);
    os << "\n";
  } else {
    os << "inputs    none\n";
  }

  std::set<int> layers;
  size_t records = 0;
  for (const auto& p : d.probes) {
    layers.insert(p.layer);
    records += p.ranks.size();
  }
  os << "probes    " << d.probes.size() << " over " << layers.size() << " layer" << (layers.size() == 1 ? "" : "s")
     << ", " << records << " rank records\n\n";
  if (d.probes.empty()) return 0;

  char line[256];
  std::snprintf(line, sizeof line, "%-5s %-12s %-16s %-10s %-5s %-6s %-6s %12s %12s %s\n", "layer", "probe", "shape",
                "contract", "ranks", "level", "dtype", "L2", "absmax", "nan/inf");
  os << line;
  bool any_partial = false, any_differ = false;
  for (const auto& p : d.probes) {
    if (o.layer >= 0 && p.layer != o.layer) continue;
    bool differ = false;
    std::string l2 = one_rank ? "-" : gathered_l2(p, m.tp, &differ);
    if (one_rank && !p.ranks.empty()) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.6g", p.ranks[0].l2);
      l2 = buf;
    }
    any_partial = any_partial || l2.rfind("~", 0) == 0;
    any_differ = any_differ || differ;
    double absmax = 0;
    int64_t nan = 0, inf = 0;
    for (const auto& r : p.ranks) {
      absmax = std::max(absmax, r.absmax);
      nan += r.nan;
      inf += r.inf;
    }
    char absmax_text[32] = "-";  // a partial sum's absmax is not the max of the ranks' absmax
    if (!p.ranks.empty() && (p.contract != "partial" || m.tp == 1 || one_rank))
      std::snprintf(absmax_text, sizeof absmax_text, "%.6g", absmax);
    const std::string ranks = one_rank ? "#" + std::to_string(m.process_rank)
                                       : std::to_string(p.ranks.size()) + "/" + std::to_string(m.tp);
    const char* level = p.ranks.empty() ? "-" : probe_level_name(p.ranks[0].level);
    std::snprintf(line, sizeof line, "%-5d %-12s %-16s %-10s %-5s %-6s %-6s %12s %12s %lld/%lld%s\n", p.layer,
                  p.name.c_str(), shape_string(p.shape).c_str(), p.contract.c_str(), ranks.c_str(), level,
                  or_dash(p.engine_dtype).c_str(), l2.c_str(), absmax_text, static_cast<long long>(nan),
                  static_cast<long long>(inf), differ ? "  replicas differ" : "");
    os << line;
  }
  if (o.layer >= 0 && !layers.count(o.layer)) os << "(no probes of layer " << o.layer << ")\n";
  if (any_partial)
    os << "\n~: partial sums (o_partial) are not stored summed; L2 estimated from the summed sketches (the all-reduced "
          "probe o is exact)\n";
  if (any_differ) os << "replicas differ: a replicated probe's ranks have different checksums\n";
  if (one_rank && m.tp > 1)
    os << "\n#" << m.process_rank << ": L2 and absmax are rank " << m.process_rank << "'s own record: its block of "
       << "heads (heads), its partial sum (partial), its copy (replicated)\n";
  return 0;
}

struct Inspector {
  const char* what;
  std::vector<std::string> extensions;  // lower case, with the dot
  int (*run)(const InspectOptions&);
};

// Exit 2 when the checkpoint's config or its checked layer cannot be loaded: a run on it would fail.
int inspect_weights(const InspectOptions& o) {
  const std::string problem = describe_weights(o.file, std::cout, o.layer);
  if (problem.empty()) return ExitCode_ok;
  std::cout.flush();
  std::cerr << "error: " << o.file << " cannot be used as a checkpoint: " << problem << "\n";
  return ExitCode_usage;
}

// Unknown extensions go to the dump reader, which says clearly what the file is not.
const Inspector kInspectors[] = {
    {"mla-bisect dump", {".h5", ".hdf5"}, inspect_dump},
    {"weights", {".gguf", ".safetensors"}, inspect_weights},
};

int run_inspect(const InspectOptions& o) {
  if (std::filesystem::is_directory(o.file) || std::filesystem::path(o.file).filename() == "model.safetensors.index.json")
    return inspect_weights(o);  // a checkpoint directory
  std::string ext = std::filesystem::path(o.file).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto& i : kInspectors)
    if (std::find(i.extensions.begin(), i.extensions.end(), ext) != i.extensions.end()) return i.run(o);
  return inspect_dump(o);
}

}  // namespace

void setup_inspect(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<InspectOptions>();
  auto* cmd = app.add_subcommand("inspect", "Describe a dump (.h5): provenance, status (complete, or where the run "
                                            "stopped and each rank's last stage), inputs, and every probe per layer; "
                                            "or a weight file (.gguf, .safetensors, checkpoint directory)");
  cmd->add_option("file", o->file, "The file to describe: an mla-bisect dump (FILE.h5; a crashed run's "
                                   "FILE.h5.journal is folded into it first), or weights: model.gguf, "
                                   "model.safetensors or a checkpoint directory (tensors, types, shapes, the detected "
                                   "MLA config, and for DSA models the indexer's constants, shared layers and, in "
                                   "safetensors, the layer's indexer weights against them)")
      ->required();
  cmd->add_option("--layer", o->layer, "Only list the probes (or a checkpoint's tensors) of this layer")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([o, &exit_code] { exit_code = run_inspect(*o); });
}

}  // namespace mla::cli
