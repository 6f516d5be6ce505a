// What a run's dump says of how it was made: `run --out`, and a bisect's reference run made in the bisect's own
// process, write the same.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "core/engine/engine.h"
#include "probes/dump.h"

namespace mla {

struct RunDescription {
  nlohmann::json options;   // the run spec and the run options as given (RunOptions::dump_options)
  std::string probe_level;  // --probe-level
  std::string inject;       // --inject ("" = none)
  std::string command;      // the command line that makes this run
};

// The dump's meta of `engine`'s run: `weights_loaded` is the loaded weights' description (LoadedWeights; "": none
// recorded).
DumpMeta run_dump_meta(const Engine& engine, const MlaConfig& cfg, const RunSpec& spec, const RunDescription& run,
                       const std::string& weights_loaded);

}  // namespace mla
