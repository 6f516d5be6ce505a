// Engine spec parsing, the default host-side probe, and the registry of the engines a program can make.
#include "core/engine/engine.h"

#include <mutex>

#include "core/model/errors.h"

namespace mla {

EngineSpec EngineSpec::parse(const std::string& text) {
  EngineSpec s;
  const auto colon = text.find(':');
  s.name = text.substr(0, colon);
  if (s.name.empty()) throw UsageError("empty engine name in '" + text + "'");
  if (colon == std::string::npos) return s;
  std::string rest = text.substr(colon + 1);
  size_t pos = 0;
  while (pos <= rest.size()) {
    const auto comma = rest.find(',', pos);
    const std::string item = rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!item.empty()) {
      const auto eq = item.find('=');
      if (eq == std::string::npos || eq == 0)
        throw UsageError("engine option '" + item + "' in '" + text + "' is not key=value");
      s.options[item.substr(0, eq)] = item.substr(eq + 1);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return s;
}

std::string EngineSpec::to_string() const {
  std::string out = name;
  char sep = ':';
  for (auto& [k, v] : options) {
    out += sep + k + "=" + v;
    sep = ',';
  }
  return out;
}

ProbeRecord Engine::probe(int rank, const ProbeSpec& spec, const ProbeRequest& req) {
  return compute_probe_record(download(rank, spec.name), dtype(), req);
}

void Engine::probe_async(int rank, const ProbeSpec& spec, const ProbeRequest& req) {
  started_probes_.push_back(probe(rank, spec, req));
}

void Engine::collect_probes(std::vector<ProbeRecord>& out, bool /*wait*/) {
  for (auto& r : started_probes_) out.push_back(std::move(r));
  started_probes_.clear();
}

bool Engine::is_generic_injection(const Injection& inj) {
  return inj.name == "nan-at" || inj.name == "hang-at" || inj.name == "crash-at" || inj.name == "slow-at";
}

void Engine::set_injections(const std::vector<Injection>& list) {
  for (auto& inj : list)
    if (!is_generic_injection(inj))
      throw UsageError("engine '" + name() + "' cannot plant injection '" + inj.name + "'");
  injections_ = list;
}

namespace {

struct Registered {
  std::string name;
  EngineMaker make;        // empty: known but not available in this build
  bool per_process = false;
  std::string why;         // why it is not available
};

struct Registry {
  std::mutex mu;
  std::vector<Registered> engines;
  Registered* find(const std::string& name) {
    for (auto& e : engines)
      if (e.name == name) return &e;
    return nullptr;
  }
  void put(Registered r) {
    std::lock_guard lock(mu);
    if (auto* e = find(r.name)) *e = std::move(r);
    else engines.push_back(std::move(r));
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_engine(const std::string& name, EngineMaker make, bool per_process) {
  registry().put({name, std::move(make), per_process, ""});
}

void register_unavailable_engine(const std::string& name, const std::string& why) {
  registry().put({name, nullptr, false, why});
}

std::vector<std::string> engine_names() {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<std::string> out;
  for (auto& e : r.engines) out.push_back(e.name);
  return out;
}

bool engine_runs_per_process(const std::string& name) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  const auto* e = r.find(name);
  return e && e->make && e->per_process;
}

std::unique_ptr<Engine> make_engine(const EngineSpec& spec) {
  EngineMaker make;
  {
    auto& r = registry();
    std::lock_guard lock(r.mu);
    const auto* e = r.find(spec.name);
    if (!e) {
      std::string names;
      for (size_t i = 0; i < r.engines.size(); ++i)
        names += (i == 0 ? "" : i + 1 == r.engines.size() ? " or " : ", ") + r.engines[i].name;
      throw UsageError("unknown engine '" + spec.name + "' (expected " + (names.empty() ? "none: no engine is "
                       "registered in this program" : names) + ")");
    }
    if (!e->make) throw UsageError("--engine " + spec.name + ": " + e->why);
    make = e->make;
  }
  return make(spec.options);
}

}  // namespace mla
