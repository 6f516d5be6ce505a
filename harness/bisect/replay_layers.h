// Replay of a whole-model capture: every captured MLA layer replayed on its own captured inputs (each layer's h, its
// cache for a decode step) with that layer's checkpoint weights, one line per layer, and the first layer whose MLA
// introduces an error, or "every MLA layer agrees with the reference on its own inputs".
//
// A whole-model capture FILE.h5 is the set FILE.layer<L>.h5 (mla_bisect.hf.capture_model writes it; each file is a
// single-layer capture, also per rank as FILE.layer<L>.rank<R>.h5): one file per layer keeps what a crash leaves
// readable layer by layer, and lets each layer be replayed alone.
#pragma once
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/bisect/replay.h"

namespace mla {

// The per-layer captures of FILE.h5, by checkpoint layer: FILE.layer<L>.h5 (or its journal, or a per-rank set
// FILE.layer<L>.rank0.h5 ...). Empty when there is none.
std::map<int, std::string> layer_capture_files(const std::string& path);
// Whether FILE.h5 names a whole-model capture: FILE.h5 is no dump (no file, journal or rank set) and
// FILE.layer<L>.h5 files sit beside it.
bool is_layer_capture_set(const std::string& path);

struct LayerReplay {
  int layer = 0;
  std::string file;
  int exit_code = 0;     // 0 agrees, 1 diverges, 2 not replayable, 3 the capture stopped
  std::string error;     // why it could not be replayed (exit 2 or 3 before any comparison)
  BisectReport rep;      // the layer's replay (when it ran)
  double worst_ratio = 0;  // the largest rel_l2 / tolerance over its compared probes
  std::string worst_probe;
};

struct ReplayScan {
  std::string capture;
  std::vector<LayerReplay> layers;  // in layer order
  int first_layer = -1;             // the first layer whose MLA diverges on its own inputs
  std::string headline;
  int exit_code = 0;
  double seconds = 0;
  int workers = 1;                  // layers replayed at once
};

// How a scan runs: `workers` layers at once, each reference with `threads` threads. jobs > 0 asks for that many;
// 0 chooses one per core. Either is bounded by the layers and by the host memory (0.8 of
// what is available over an estimate of one layer's replay from the first capture); `why` names the bound.
struct ScanPlan {
  int workers = 1;
  int threads = 1;
  std::string why;
};
ScanPlan plan_replay_scan(int jobs, size_t layers, const std::string& first_file);

// Replays files (layer -> capture), several at once as plan_replay_scan(jobs) says; the report is in layer order
// whatever order they finish in. `only` (A:B) narrows them. `base` gives the weights, tolerances and progress; its
// capture and layer are set per file.
ReplayScan run_replay_layers(const ReplayOptions& base, const std::map<int, std::string>& files,
                             const std::optional<std::pair<int, int>>& only, int jobs = 0);

void print_replay_scan(std::ostream& os, const ReplayScan& scan);
nlohmann::json replay_scan_to_json(const ReplayScan& scan);
std::string replay_scan_to_junit(const ReplayScan& scan);
// The per-layer table and a chart of each layer's worst error against its tolerance (log scale), then the first
// divergent layer's own report.
std::string replay_scan_to_html(const ReplayScan& scan);

}  // namespace mla
