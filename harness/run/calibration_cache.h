// Calibrated tolerances (calibrate(), two reference runs) kept on disk, keyed by everything they depend on, so that
// explore, golden check, replay and repeated bisects of the same run do not recompute them.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/model/inputs.h"
#include "core/model/weights.h"
#include "harness/run/calibrate.h"

namespace mla {

// The folder of cached calibrations: $MLA_CALIBRATION_CACHE, else $XDG_CACHE_HOME/mla-bisect/calibration, else
// ~/.cache/mla-bisect/calibration; "" when caching is off (MLA_CALIBRATION_CACHE=off, or no home folder).
std::string calibration_cache_dir();

// A hex key over what calibrate() depends on: the config (its JSON), the run spec, every weight's shape and bytes, the
// inputs (x, batch layout, kv caches), the precision, k, and the tool's version, git commit, compiler, the vector
// instructions and thread count Eigen uses (they change the reference's rounding) and the running binary (path, size, mtime: a rebuild
// with uncommitted changes calibrates anew).
std::string calibration_cache_key(const MlaConfig& cfg, const RunSpec& spec, const std::vector<LayerWeights>& weights,
                                  const Inputs& inputs, Precision precision, double k);

// calibrate(), answered from the cache when it holds this key, else computed and stored (atomically: temp + rename).
// A cache that cannot be read or written is skipped: the calibration is computed as without it. `fp32_full`
// (optional) is asked, only when calibrate() runs, for the FP32 reference's full-level run on these inputs if the
// caller has it or wants it anyway (calibrate's fp32_full). `from_cache` (optional) says which happened. FP32 (no
// calibration) is never cached.
ToleranceModel calibrate_cached(const MlaConfig& cfg, const RunSpec& spec, const std::vector<LayerWeights>& weights,
                                const Inputs& inputs, Precision precision, double k = 4.0,
                                const std::function<const Dump*()>& fp32_full = {}, bool* from_cache = nullptr);

// The weights a calibration runs with, as the cache sees them. `id` non-empty names them completely (synthetic weights:
// their seed and format; this binary, part of the key, makes the same weights from them every time), so that a hit
// neither makes nor hashes them; `make` makes them on a miss. An empty id keys them by their bytes.
struct CalibrationWeights {
  std::string id;
  std::function<std::vector<LayerWeights>()> make;
};

ToleranceModel calibrate_cached(const MlaConfig& cfg, const RunSpec& spec, const CalibrationWeights& weights,
                                const Inputs& inputs, Precision precision, double k = 4.0, bool* from_cache = nullptr);

}  // namespace mla
