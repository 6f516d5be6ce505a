// One process per rank: each rank's dump (FILE.rank<R>.h5) and reading a set of them as the one dump of the run.
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

// The first key of two JSON values that differs ("" when equal), for naming what two parts disagree on.
std::string first_difference(const json& a, const json& b) {
  if (a == b) return "";
  if (!a.is_object() || !b.is_object()) return a.dump() + " vs " + b.dump();
  for (const auto& [k, v] : a.items())
    if (!b.contains(k) || b.at(k) != v)
      return k + " " + v.dump() + " vs " + (b.contains(k) ? b.at(k).dump() : std::string("(absent)"));
  for (const auto& [k, v] : b.items())
    if (!a.contains(k)) return k + " (absent) vs " + v.dump();
  return a.dump() + " vs " + b.dump();
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

bool same_inputs(const Dump& a, const Dump& b) {
  if (a.has_inputs != b.has_inputs) return false;
  if (!a.has_inputs) return true;
  const Inputs &x = a.inputs, &y = b.inputs;
  const Batch &p = x.batch, &q = y.batch;
  if (x.x.shape != y.x.shape || !same_bytes(x.x.data, y.x.data) || p.new_lens != q.new_lens ||
      p.context_lens != q.context_lens || p.positions != q.positions || p.block_table != q.block_table ||
      p.max_blocks != q.max_blocks || p.num_blocks != q.num_blocks || x.kv_cache.size() != y.kv_cache.size())
    return false;
  for (size_t l = 0; l < x.kv_cache.size(); ++l)
    if (x.kv_cache[l].shape != y.kv_cache[l].shape || !same_bytes(x.kv_cache[l].data, y.kv_cache[l].data)) return false;
  return true;
}

}  // namespace

namespace dump_detail {

// `path` does not exist; FILE.rank<R>.h5 beside it that do (or their journals), by rank.
std::map<int, std::string> rank_files_beside(const std::string& path) {
  namespace fs = std::filesystem;
  std::map<int, std::string> found;
  const std::string r0 = rank_dump_path(path, 0);
  const fs::path p0(r0);
  const std::string name0 = p0.filename().string();
  const size_t at = name0.rfind(".rank0");
  const std::string prefix = name0.substr(0, at + 5), suffix = name0.substr(at + 6);  // "d.rank", ".h5"
  std::error_code ec;
  const fs::path dir = p0.parent_path().empty() ? fs::path(".") : p0.parent_path();
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    const std::string jsuffix = ".journal";
    if (name.size() > jsuffix.size() && name.compare(name.size() - jsuffix.size(), jsuffix.size(), jsuffix) == 0)
      name.resize(name.size() - jsuffix.size());
    if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (digits.size() > 6 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const int r = std::stoi(digits);
    found[r] = rank_dump_path(path, r);
  }
  return found;
}

// FILE.rank0.h5 ... FILE.rank<N-1>.h5 read as one dump with every rank (read_dump of FILE.h5).
Dump read_rank_set(const std::string& path, const DumpReadOptions& opts) {
  const std::string p0 = rank_dump_path(path, 0);
  Dump first = read_one(p0, opts);
  const auto& m0 = first.meta;
  if (m0.process_rank != 0)
    throw UsageError(p0 + ": " +
                     (m0.process_rank < 0 ? std::string("holds every rank of one process's run")
                                          : "holds rank " + std::to_string(m0.process_rank)) +
                     ", not rank 0 of a one-process-per-rank run, so " + path + " cannot be read as its set");
  const int n = m0.processes;
  const std::string set = path + " (the set " + p0 + (n > 1 ? " ... " + rank_dump_path(path, n - 1) : "") +
                          " of a one-process-per-rank run at tp " + std::to_string(n) + ")";
  std::vector<Dump> parts;
  parts.push_back(std::move(first));
  for (int r = 1; r < n; ++r) {
    const std::string pr = rank_dump_path(path, r);
    if (!exists_with_journal(pr))
      throw UsageError(pr + ": no such file: rank " + std::to_string(r) + "'s dump is missing from " + set +
                       "; did its process run with --out " + path + " in this directory?");
    Dump d = read_one(pr, opts);
    const auto& m = d.meta;
    const auto differs = [&](const std::string& what, const std::string& detail) {
      throw UsageError(pr + " and " + p0 + " differ in " + what + " (" + detail + "): they are not ranks of one "
                       "launch, so " + path + " cannot be read as their set");
    };
    if (m.process_rank != r || m.processes != n)
      differs("which rank they hold", "rank " + std::to_string(m.process_rank) + " of " + std::to_string(m.processes) +
                                          " processes, expected rank " + std::to_string(r) + " of " + std::to_string(n));
    const auto& a = parts.front().meta;
    if (m.launch_id != a.launch_id)  // e.g. a rank file left by an earlier launch whose process did not rerun
      differs("launch", "launch id " + (m.launch_id.empty() ? std::string("(none)") : m.launch_id) + " vs " +
                            (a.launch_id.empty() ? std::string("(none)") : a.launch_id));
    if (m.tp != a.tp) differs("tp", std::to_string(m.tp) + " vs " + std::to_string(a.tp));
    if (m.engine != a.engine || m.engine_options != a.engine_options || m.engine_dtype != a.engine_dtype)
      differs("engine", m.engine + ":" + m.engine_options + " " + m.engine_dtype + " vs " + a.engine + ":" +
                            a.engine_options + " " + a.engine_dtype);
    if (const std::string diff = first_difference(m.model, a.model); !diff.empty()) differs("model", diff);
    if (const std::string diff = first_difference(m.run_options, a.run_options); !diff.empty())
      differs("run options", diff);
    if (m.mode != a.mode) differs("mode", m.mode + " vs " + a.mode);
    if (m.seed != a.seed) differs("seed", std::to_string(m.seed) + " vs " + std::to_string(a.seed));
    if (m.inject != a.inject) differs("injections", "'" + m.inject + "' vs '" + a.inject + "'");
    if (m.probe_level != a.probe_level) differs("probe level", m.probe_level + " vs " + a.probe_level);
    if (opts.inputs && !same_inputs(d, parts.front())) differs("inputs", "/inputs");
    parts.push_back(std::move(d));
  }

  Dump out;
  out.path = path;
  out.meta = parts.front().meta;
  out.meta.process_rank = -1;
  out.meta.processes = n;
  out.schema_version = parts.front().schema_version;
  out.tool_version = parts.front().tool_version;
  out.git_sha = parts.front().git_sha;
  out.created_utc = parts.front().created_utc;
  out.has_inputs = parts.front().has_inputs;
  out.inputs = std::move(parts.front().inputs);
  out.status = "complete";
  std::string stopped;
  out.last_stage.assign(n, "");
  for (int r = 0; r < n; ++r) {
    const Dump& d = parts[r];
    out.parts.push_back(d.path);
    if (d.meta.device != out.meta.device && out.meta.device.find(d.meta.device) == std::string::npos)
      out.meta.device += "; " + d.meta.device;
    if (!d.complete()) stopped += (stopped.empty() ? "" : "; ") + d.status + " (in " + d.path + ")";
    if (r < static_cast<int>(d.last_stage.size())) out.last_stage[r] = d.last_stage[r];
  }
  if (!stopped.empty()) out.status = stopped;

  // The probes every rank recorded, as one process records them (a stage's probes after every rank ran it). When
  // a rank stopped, the other ranks' later probes cannot be gathered; they stay readable in their own files.
  size_t left_out = 0;
  for (auto list : {&Dump::probes, &Dump::weights}) {
  std::map<std::pair<int, std::string>, std::vector<const DumpProbe*>> by_key;
  for (int r = 0; r < n; ++r)
    for (const auto& p : parts[r].*list) {
      auto& v = by_key[{p.layer, p.name}];
      v.resize(n, nullptr);
      if (!p.ranks.empty()) v[r] = &p;
    }
  for (const auto& [key, per_rank] : by_key) {
    if (std::find(per_rank.begin(), per_rank.end(), nullptr) != per_rank.end()) {
      ++left_out;
      continue;
    }
    DumpProbe merged = *per_rank[0];
    merged.ranks.clear();
    for (int r = 0; r < n; ++r) {
      const DumpProbe& p = *per_rank[r];
      if (p.shape != merged.shape || p.contract != merged.contract || p.order != merged.order)
        throw UsageError(parts[r].path + ": layer " + std::to_string(p.layer) + " probe " + p.name + " is " +
                         p.contract + " " + shape_string(p.shape) + " at graph position " + std::to_string(p.order) +
                         ", in " + p0 + " " + merged.contract + " " + shape_string(merged.shape) + " at " +
                         std::to_string(merged.order));
      merged.ranks.push_back(p.ranks.front());
    }
    (out.*list).push_back(std::move(merged));
  }
  std::stable_sort((out.*list).begin(), (out.*list).end(), [](const DumpProbe& a, const DumpProbe& b) {
    return a.layer != b.layer ? a.layer < b.layer : a.order < b.order;
  });
  }
  if (left_out > 0)
    out.status += "; " + std::to_string(left_out) + " probe" + (left_out == 1 ? "" : "s") +
                  " recorded by only some ranks left out (inspect the rank files for them)";
  return out;
}

}  // namespace dump_detail

std::string rank_dump_path(const std::string& path, int rank) {
  std::filesystem::path p(path);
  const std::string ext = p.extension().string();
  p.replace_extension();
  return p.string() + ".rank" + std::to_string(rank) + ext;
}

void require_every_rank(const Dump& d, const std::string& command) {
  const int own = d.meta.process_rank;
  if (own < 0) return;
  const int n = d.meta.processes;
  // FILE.rank<R>.h5 -> FILE.h5, the name that reads the whole set.
  std::string set;
  const std::filesystem::path p(d.path);
  const std::string ext = p.extension().string(), tag = ".rank" + std::to_string(own);
  std::string stem = std::filesystem::path(p).replace_extension().string();
  if (stem.size() > tag.size() && stem.compare(stem.size() - tag.size(), tag.size(), tag) == 0)
    set = stem.substr(0, stem.size() - tag.size()) + ext;
  const std::string how = set.empty() ? std::string("pass the --out name of the run (FILE.h5), which reads "
                                                    "FILE.rank0.h5 ... as one dump")
                                      : "pass " + set + ", which reads " + rank_dump_path(set, 0) +
                                            (n > 1 ? " ... " + rank_dump_path(set, n - 1) : std::string()) +
                                            " as one dump";
  throw UsageError(d.path + " holds only rank " + std::to_string(own) + " of a tp " + std::to_string(d.meta.tp) +
                   " run made with one process per rank; " + command + " needs every rank: " + how);
}

}  // namespace mla
