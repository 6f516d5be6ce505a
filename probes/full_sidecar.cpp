// Full tensors kept beside a dump (probes/full_sidecar.h).
#include "probes/full_sidecar.h"

#include <filesystem>

namespace mla {

namespace {
constexpr const char* kOfKey = "full_sidecar_of";  // run_options key: the dump the sidecar belongs to

nlohmann::json identity(const Dump& d) {
  return {{"command", d.meta.command}, {"created_utc", d.created_utc}, {"engine", d.meta.engine},
          {"seed", d.meta.seed}};
}

bool has_tensors(const DumpProbe& p) {
  if (p.ranks.empty()) return false;
  for (const auto& r : p.ranks)
    if (r.level != ProbeLevel::ProbeLevel_full) return false;
  return true;
}
}  // namespace

std::string full_sidecar_path(const std::string& dump_path) {
  const std::string ext = ".h5";
  if (dump_path.size() > ext.size() && dump_path.compare(dump_path.size() - ext.size(), ext.size(), ext) == 0)
    return dump_path.substr(0, dump_path.size() - ext.size()) + ".full.h5";
  return dump_path + ".full.h5";
}

size_t write_full_sidecar(const Dump& of, const Dump& full, int layer, const std::set<std::string>& names) {
  Dump side;
  side.meta = of.meta;
  side.meta.run_options = of.meta.run_options.is_object() ? of.meta.run_options : nlohmann::json::object();
  side.meta.run_options[kOfKey] = identity(of);
  side.meta.probe_level = "full";
  side.status = "complete";
  for (const auto& p : full.probes)
    if (p.layer == layer && names.count(p.name) && has_tensors(p)) side.probes.push_back(p);
  if (side.probes.empty()) return 0;
  write_dump_h5(side, full_sidecar_path(of.path));
  return side.probes.size();
}

SidecarMerge merge_full_sidecar(Dump& d) {
  SidecarMerge m;
  const std::string path = full_sidecar_path(d.path);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return m;
  m.path = path;
  Dump side;
  try {
    side = read_dump(path);
  } catch (const std::exception& e) {
    m.ignored = std::string("unreadable: ") + e.what();
    return m;
  }
  const auto& ro = side.meta.run_options;
  if (!ro.is_object() || !ro.contains(kOfKey) || ro[kOfKey] != identity(d)) {
    m.ignored = "made for another run of " + path.substr(0, path.size() - 8) + " (its command or creation time differs)";
    return m;
  }
  for (const auto& sp : side.probes) {
    const std::string what = "layer " + std::to_string(sp.layer) + " " + sp.name;
    DumpProbe* p = nullptr;
    for (auto& q : d.probes)
      if (q.layer == sp.layer && q.name == sp.name) p = &q;
    if (!p || has_tensors(*p)) continue;
    if (p->ranks.size() != sp.ranks.size() || p->shape != sp.shape) {
      m.refused.push_back(what + ": shape or ranks differ");
      continue;
    }
    bool same = true;
    for (size_t r = 0; r < sp.ranks.size(); ++r)
      same = same && sp.ranks[r].checksum == p->ranks[r].checksum && sp.ranks[r].shape == p->ranks[r].shape;
    if (!same) {
      m.refused.push_back(what + ": the recomputed tensor's checksum differs from the dump's record");
      continue;
    }
    p->ranks = sp.ranks;
    m.taken.push_back(what);
  }
  return m;
}

}  // namespace mla
