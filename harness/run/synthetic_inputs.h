// The synthetic inputs of a run: seeded layer-0 activations and a context cache made by the reference's own
// kv path, so that a cache looks like one a model wrote.
#pragma once
#include <vector>

#include "core/model/config.h"
#include "core/model/inputs.h"
#include "core/model/weights.h"

namespace mla {

// Builds the batch and, for each layer, a cache whose context rows come from the reference kv path
// (input_norm if present, kv_a_proj, kv_a_norm, rope) applied to seeded context hidden states; bf16-exact.
Inputs synthetic_inputs(const MlaConfig& cfg, const RunSpec& spec, const std::vector<LayerWeights>& weights);

}  // namespace mla
