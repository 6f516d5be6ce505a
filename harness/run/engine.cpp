// Engine spec parsing, the default host-side probe, and the engine factory.
#include "harness/run/engine.h"

#include "harness/model/errors.h"
#include "reference/reference_engine.h"

#ifdef MLA_WITH_CUDA
#include "kernels/cuda_engine.h"
#endif

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
  return inj.name == "nan-at" || inj.name == "hang-at" || inj.name == "crash-at";
}

void Engine::set_injections(const std::vector<Injection>& list) {
  for (auto& inj : list)
    if (!is_generic_injection(inj))
      throw UsageError("engine '" + name() + "' cannot plant injection '" + inj.name + "'");
  injections_ = list;
}

std::vector<std::string> engine_names() { return {"reference", "cuda"}; }

bool engine_runs_per_process(const std::string& name) { return name == "reference" || name == "cuda"; }

std::unique_ptr<Engine> make_engine(const EngineSpec& spec) {
  if (spec.name == "reference") return std::make_unique<ReferenceEngine>(spec.options);
  if (spec.name == "cuda") {
#ifdef MLA_WITH_CUDA
    return make_cuda_engine(spec.options);
#else
    throw UsageError("--engine cuda: this build has no CUDA engine (configure with -DMLA_WITH_CUDA=ON on a "
                     "machine with the CUDA toolkit)");
#endif
  }
  throw UsageError("unknown engine '" + spec.name + "' (expected reference or cuda)");
}

}  // namespace mla
