#include "harness/run/run_meta.h"

namespace mla {

DumpMeta run_dump_meta(const Engine& engine, const MlaConfig& cfg, const RunSpec& spec, const RunDescription& run,
                       const std::string& weights_loaded) {
  DumpMeta meta;
  meta.engine = engine.name();
  meta.engine_options = engine.options();
  meta.engine_dtype = engine.dtype();
  meta.device = engine.device();
  meta.model = cfg.to_json();
  meta.run_options = run.options;
  if (!weights_loaded.empty()) meta.run_options["weights_loaded"] = weights_loaded;
  meta.tp = spec.tp;
  meta.mode = mode_name(spec.mode);
  meta.seed = spec.seed;
  meta.inject = run.inject;
  meta.probe_level = run.probe_level;
  meta.command = run.command;
  return meta;
}

}  // namespace mla
