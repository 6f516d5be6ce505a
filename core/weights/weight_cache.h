// Loaded weights shared by the processes of one bisect. A bisect loads its weights once, in the parent; its child
// runs (`run`, the reference and the candidate) find them in a cache folder instead of synthesizing, quantizing and
// dequantizing them again. An entry is the FP32 layers (and, where the load kept them, the packed projections) of one
// load_weights call, in a file named by a hash of everything that call depends on: the model config, the weight
// source (a checkpoint's size and time too), the format, the layer range, the seed, the run's layer count and graph
// start, and the dequantization bugs. Entries are written whole to a temporary name and renamed, so a reader never
// sees half of one; an entry that does not read back whole, or whose sum disagrees with its bytes, is a miss, and the
// weights are loaded as without a cache.
#pragma once
#include <string>
#include <vector>

#include "core/weights/loader.h"

namespace mla {

// The environment variable a bisect sets for its child runs: the cache folder they read.
inline constexpr const char* kWeightCacheEnv = "MLA_WEIGHT_CACHE";

// The folder named by MLA_WEIGHT_CACHE, or "" (no cache) when it is unset or empty.
std::string weight_cache_dir_from_env();

// load_weights through the cache folder `dir`: the entry of this load when `dir` holds one (with the packed
// projections when keep_packed asks for them), else load_weights, its result written to `dir` as a new entry.
// With `dir` empty, exactly load_weights. A cache that cannot be written is said on stderr and left out. `hit`, where
// given, says whether the weights came from the cache.
LoadedWeights load_weights_shared(const std::string& dir, const WeightSpec& ws, const MlaConfig& cfg,
                                  const RunSpec& spec, uint64_t weight_seed,
                                  const std::vector<Injection>& injections = {}, bool keep_packed = false,
                                  bool* hit = nullptr);

// Writes `w`, what load_weights gave for these arguments, to `dir` as their entry (`w`'s packed projections with
// it where it kept them). A cache that cannot be written is said on stderr and left out.
void share_weights(const std::string& dir, const WeightSpec& ws, const MlaConfig& cfg, const RunSpec& spec,
                   uint64_t weight_seed, const std::vector<Injection>& injections, const LoadedWeights& w);

// The same weights dequantized again with the injections' bugs, from the packed projections `from` holds (a load of
// the same weights without injections, with keep_packed): the layers load_weights would give with `injections`,
// without synthesizing or quantizing again. Returns false (and leaves `out` alone) where it cannot: `from` kept no
// packed projections, a GGUF split kv_b, or no projection is of a format the injections corrupt (load_weights then
// says so).
bool redequantize(const LoadedWeights& from, const std::vector<Injection>& injections, bool keep_packed,
                  LoadedWeights& out);

}  // namespace mla
